// RoundRecorder: a site's per-round record of its jobs (round, attempt,
// aggregator, whether it trained or aggregated, the counters that grew,
// its validation metrics, time per phase, model bytes sent and received),
// derived from outside the controller: the daemon's status watcher
// (cli/site_metrics.h StatusWatcher) hands every status change to Observe,
// with the site's traffic totals at that moment.
//
//   RoundRecorder recorder;
//   ... watcher: recorder.Observe(reply, now, {sent_bytes, received_bytes});
//   ... History RPC: v1::HistoryReply reply = recorder.History(job_id);
//
// Counter growth between two statuses is credited to the round of the
// earlier one when the round changed in between (e.g. rounds_completed grows
// as the aggregator closes round r and moves on to r+1). Phase times are as
// precise as the statuses handed in: the daemon's watcher replays the site's
// journal of state changes with their times, so it misses none; a caller
// that skips states has their time counted in the one seen before them.
// Thread-safe.
#ifndef SWARM_REPORT_ROUND_RECORDER_H_
#define SWARM_REPORT_ROUND_RECORDER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/swarm.pb.h"

namespace swarm {
namespace report {

// Model bytes a site has sent and received since it started.
struct Traffic {
  uint64_t sent = 0;
  uint64_t received = 0;
};

// The phase a state counts as ("training" for SITE_STATE_TRAINING); null for
// states outside a round. Idle is "waiting_for_task" once the job has run.
const char* PhaseOf(v1::SiteState state, bool job_running);

class RoundRecorder {
 public:
  // Keeps the records of the last `max_jobs` jobs, at most `max_rounds`
  // rounds each (the oldest rounds go first).
  explicit RoundRecorder(int max_jobs = 4, int max_rounds = 10000);
  RoundRecorder(const RoundRecorder&) = delete;
  RoundRecorder& operator=(const RoundRecorder&) = delete;

  // Folds one status, seen at `now` with the traffic totals `traffic`.
  // Statuses come in the order seen; `now` does not go back.
  void Observe(const v1::StatusReply& reply, absl::Time now, Traffic traffic)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The history of `job_id` (empty: the latest job), `known` false when
  // there is none. A round still under way counts up to `now`.
  v1::HistoryReply History(const std::string& job_id, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::string id;
    std::map<uint32_t, v1::RoundRecord> rounds;
    v1::SiteStatus last;   // The last status seen.
    bool running = false;  // Has been in a round state.
    bool seen = false;
    v1::SiteState state = v1::SITE_STATE_IDLE;
    uint32_t state_round = 0;
    absl::Time state_since;
    // The round under way and when it began here, with the traffic then.
    std::optional<uint32_t> open_round;
    absl::Time round_since;
    Traffic round_traffic;
    Traffic last_traffic;  // At the last status.
  };

  Job* JobFor(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::RoundRecord* Record(Job* job, uint32_t round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void CloseRound(Job* job, v1::RoundRecord* record, absl::Time now,
                         Traffic traffic);
  // Credits what the counters of `s` grew by since the status before to
  // that status's round.
  void CreditCounters(Job* job, const v1::SiteStatus& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the round of `s` when it is a new one in a round state (closing
  // the one before), or closes the open round when the job ended.
  void TrackOpenRound(Job* job, const v1::SiteStatus& s, bool round_state,
                      absl::Time now, Traffic traffic)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_jobs_;
  const int max_rounds_;
  mutable absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);  // Oldest first.
  std::string site_ ABSL_GUARDED_BY(mu_);
};

}  // namespace report
}  // namespace swarm

#endif  // SWARM_REPORT_ROUND_RECORDER_H_
