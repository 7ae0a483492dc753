// FanOut: one message sent to many sites at once, and their answers (design
// sections 3 and 5): a round's learn tasks to its trainers, and the final
// models to every site. Whoever answers OK is acknowledged, in the order the
// answers came; whoever fails is missed, with why. The first acknowledgement
// that counts starts a grace: the caller arms a timer for it (NoteAnswer
// says when), and when it fires either gives up on the sites still silent
// (GiveUpWaiting: a scatter goes on without them) or goes on with the
// acknowledged ones while still waiting for the rest (EndGrace: BEST follows
// LAST to each site as it acknowledges).
//
// Pure: no timer, no time, no sends of its own.
#ifndef SWARM_CONTROLLER_FAN_OUT_H_
#define SWARM_CONTROLLER_FAN_OUT_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace swarm {

class FanOut {
 public:
  FanOut() = default;

  // Waits for `target` too. REQUIRES: no answer of `target` noted yet.
  void Expect(const std::string& target) { waiting_.insert(target); }

  struct Noted {
    bool counted = false;      // `target` was waited for (else ignored).
    bool start_grace = false;  // The caller arms the grace timer now.
  };
  // How `target` answered. An OK answer is an acknowledgement; with
  // `may_start_grace` the first one, while others are still waited for,
  // starts the grace (at most once).
  Noted NoteAnswer(const std::string& target, const absl::Status& status,
                   bool may_start_grace = true);
  // The grace ran out: the fan-out goes on with the acknowledged sites; the
  // silent ones are still waited for. Returns false if it had ended.
  bool EndGrace();
  // The grace ran out and the silent sites are not waited for any more:
  // each is missed with `why`. Returns them.
  std::vector<std::string> GiveUpWaiting(absl::string_view why);

  bool done() const { return waiting_.empty(); }
  bool grace_started() const { return grace_started_; }
  bool grace_ended() const { return grace_ended_; }
  const std::set<std::string>& waiting() const { return waiting_; }
  // In the order the acknowledgements came.
  const std::vector<std::string>& acked() const { return acked_; }
  // The same, sorted by name.
  std::vector<std::string> AckedByName() const;
  const std::map<std::string, std::string>& missed() const { return missed_; }
  // The first failed answer, as "target: message" (OK: none failed).
  const absl::Status& first_error() const { return first_error_; }

 private:
  std::set<std::string> waiting_;
  std::vector<std::string> acked_;
  std::map<std::string, std::string> missed_;
  absl::Status first_error_;
  bool grace_started_ = false;
  bool grace_ended_ = false;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_FAN_OUT_H_
