// RevealLedger: the cross-attempt rule of secure aggregation (design
// section 10), on the trainer's side. For one round, a trainer may reveal
// about a peer either the peer's self-mask share (the peer's upload was
// counted: its self mask must come off) or the pairwise seed it shares with
// the peer (the peer's upload was not counted: the mask this trainer added
// for it must come off), but never both, to any attempt of the round, any
// aggregator, ever: the two together unmask the peer's upload. With failover
// a backup asks again at attempt a+1; what attempt a was told binds it, and
// so does what was told before a restart.
//
// The ledger is the trainer's memory of what it revealed. REQUIRES of the
// caller: persist Serialize() (an atomic, fsynced write) after Record and
// before the reveal leaves the site, and load it at restart.
#ifndef SWARM_SECAGG_REVEAL_LEDGER_H_
#define SWARM_SECAGG_REVEAL_LEDGER_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swarm::secagg {

enum class Reveal {
  kSelfShare,  // This trainer's share of the peer's self-mask seed.
  kPairSeed,   // The pairwise seed of this trainer and the peer.
};
const char* RevealName(Reveal reveal);

class RevealLedger {
 public:
  RevealLedger() = default;

  // OK when revealing `reveal` about `peer` in `round` keeps the rule (a
  // repeat of what was revealed before is allowed: it tells nothing new);
  // PERMISSION_DENIED naming the rule, the peer, and the attempt and
  // aggregator that were told the other kind.
  absl::Status Check(uint32_t round, const std::string& peer,
                     Reveal reveal) const;

  // Records a reveal at `attempt` to `aggregator`. Returns Check's error,
  // recording nothing, when it breaks the rule.
  absl::Status Record(uint32_t round, uint32_t attempt, const std::string& peer,
                      Reveal reveal, const std::string& aggregator);

  size_t size() const { return entries_.size(); }

  // One line per entry: "round attempt kind peer aggregator"; names have
  // no spaces (site names: config/). Parse refuses anything else, naming
  // the line.
  std::string Serialize() const;
  static absl::StatusOr<RevealLedger> Parse(absl::string_view text);

 private:
  struct Entry {
    Reveal reveal;
    uint32_t attempt;
    std::string aggregator;
  };
  // By (round, peer): what was revealed first (a repeat adds nothing).
  std::map<std::pair<uint32_t, std::string>, Entry> entries_;
};

// The ledger in the file at `path` (a job's workspace folder holds it); an
// empty ledger when the file does not exist yet. DataLoss naming the file
// for a damaged one.
absl::StatusOr<RevealLedger> LoadRevealLedger(const std::string& path);

// Writes `ledger` to `path` atomically and durably (the file and its
// folder are synced before this returns): what it records may leave the
// site only after this succeeded.
absl::Status SaveRevealLedger(const std::string& path,
                              const RevealLedger& ledger);

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_REVEAL_LEDGER_H_
