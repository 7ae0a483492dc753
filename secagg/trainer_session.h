// TrainerSession: a trainer's secrets of one round and attempt under secure
// aggregation (design section 10), and what it may tell of them.
//
//   1. Start: the pairwise seed with each neighbour (from the caller: ECDH
//      with the neighbour's verified key, security/secagg_crypto.h), a fresh
//      self-mask seed, and Shamir shares of it, one per neighbour and one
//      kept by this trainer.
//   2. The shares go to the neighbours before the upload (the caller sends
//      shares_to_send()); the neighbours' shares come back (KeepShare).
//   3. Mask: the encoded update, masked, is what the trainer uploads.
//   4. Answer: the aggregator, once the gather closed, asks each survivor
//      about the counted and the dropped trainers: the survivor gives its
//      shares of the counted ones' self seeds and, being counted itself, its
//      pairwise seeds with the dropped ones. Every reveal is first checked
//      against and recorded in the trainer's RevealLedger (the caller
//      persists it before the answer leaves): a request that would break
//      the rule for any peer is refused whole.
//
// Pure: the seeds' cryptography and the randomness are the caller's.
#ifndef SWARM_SECAGG_TRAINER_SESSION_H_
#define SWARM_SECAGG_TRAINER_SESSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "secagg/masking.h"
#include "secagg/reveal_ledger.h"
#include "secagg/shamir.h"
#include "secagg/unmask_plan.h"

namespace swarm::secagg {

class TrainerSession {
 public:
  struct Options {
    std::string self;
    uint32_t round = 0;
    uint32_t attempt = 0;
    std::vector<std::string> neighbours;  // secagg/neighbours.h
    int threshold = 0;                    // 1..neighbours + 1
  };
  // The seed this trainer shares with `peer` for this round and attempt.
  using PairSeedFn =
      std::function<absl::StatusOr<Seed>(const std::string& peer)>;

  // INVALID_ARGUMENT for a threshold out of range or `self` among its own
  // neighbours; the error of `pair_seed` for a peer, naming it.
  static absl::StatusOr<TrainerSession> Start(Options options,
                                              const PairSeedFn& pair_seed,
                                              const RandomBytes& random);

  // This trainer's shares of its self seed, by neighbour.
  const std::map<std::string, Share>& shares_to_send() const {
    return shares_to_send_;
  }
  // A neighbour's share of its own self seed. INVALID_ARGUMENT from a site
  // that is not a neighbour, or for a second, different share from one.
  absl::Status KeepShare(const std::string& from, const Share& share);

  // Masks this trainer's encoded update (words offset.. of the model).
  absl::Status Mask(const MaskGenerator& prg, uint64_t offset,
                    absl::Span<uint32_t> encoded) const;

  // The answer to `aggregator`'s unmasking request at this session's
  // attempt. INVALID_ARGUMENT when a name is both counted and dropped;
  // PERMISSION_DENIED (nothing recorded, nothing answered) when any reveal
  // would break the rule (RevealLedger::Check). REQUIRES: the caller
  // persists `ledger` before the answer leaves this site.
  absl::StatusOr<UnmaskAnswer> Answer(const std::vector<std::string>& counted,
                                      const std::vector<std::string>& dropped,
                                      const std::string& aggregator,
                                      RevealLedger* ledger) const;

 private:
  explicit TrainerSession(Options options) : options_(std::move(options)) {}
  bool IsNeighbour(const std::string& site) const;

  Options options_;
  Seed self_seed_{};
  std::map<std::string, Seed> pair_seeds_;  // By neighbour.
  std::map<std::string, Share> shares_to_send_;
  Share own_share_;                           // Of its own seed.
  std::map<std::string, Share> held_shares_;  // Neighbours' shares, by owner.
};

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_TRAINER_SESSION_H_
