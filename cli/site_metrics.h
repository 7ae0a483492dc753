// The site's Prometheus metrics, derived from outside the controller: a
// StatusWatcher thread long-polls the site's status (SiteDriver's
// WaitForStatusChange) and hands every new status to SiteMetrics, which
// turns state transitions into phase and round histograms, the status's
// counters into _total counters and the rest into gauges.
//
//   MetricsRegistry registry;
//   absl::StatusOr<std::unique_ptr<SiteMetrics>> metrics =
//       SiteMetrics::Create(&registry, "site-a");
//   StatusWatcher watcher(
//       [&driver](uint64_t version, uint64_t after, absl::Time deadline) {
//         StatusWatcher::Watched watched;
//         watched.reply = driver.WaitForStatusChange(version, deadline, after,
//                                                    &watched.changes);
//         return watched;
//       },
//       [&](const v1::StatusReply& reply, absl::Time now) {
//         (*metrics)->Observe(reply, now);
//       });
//   watcher.Start();
//
// A scrape reads the registry only: it never takes the driver's lock. Phase
// times are the machine's own (the watcher replays the journal of state
// changes); counters are as of the watcher's last look (at most its
// interval, 50 ms, old). Every metric has the label `site`. README
// "Monitoring" lists them.
#ifndef SWARM_CLI_SITE_METRICS_H_
#define SWARM_CLI_SITE_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "controller/state_change.h"
#include "metrics/metrics.h"
#include "proto/swarm.pb.h"
#include "report/round_recorder.h"

namespace swarm {

// The phase a state counts as, for swarm_phase_seconds: report::PhaseOf
// (the job report counts phases alike).

class SiteMetrics {
 public:
  // Registers the families in `registry` (AlreadyExists / InvalidArgument
  // from the registry on a clash). REQUIRES: `registry` outlives the result.
  static absl::StatusOr<std::unique_ptr<SiteMetrics>> Create(
      MetricsRegistry* registry, std::string site);
  ~SiteMetrics();
  SiteMetrics(const SiteMetrics&) = delete;
  SiteMetrics& operator=(const SiteMetrics&) = delete;

  // Folds one status, seen at `now`, into the metrics. Statuses come in the
  // order seen; `now` does not go back. Thread-safe.
  void Observe(const v1::StatusReply& reply, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Families;
  SiteMetrics(std::string site, std::unique_ptr<Families> families);

  // Adds what `value` grew by since `*last` (all of it after a reset).
  void Count(CounterFamily* family, uint64_t value, uint64_t* last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ObserveCounters(const v1::SiteCounters& counters)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ObserveGauges(const v1::SiteStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ObservePhases(const v1::SiteStatus& status, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string site_;
  const std::unique_ptr<Families> families_;

  absl::Mutex mu_;
  std::string job_ ABSL_GUARDED_BY(mu_);
  // The job has been in a round state (so idle means waiting for a task).
  bool job_running_ ABSL_GUARDED_BY(mu_) = false;
  // The last status's state and round, and since when.
  v1::SiteState state_ ABSL_GUARDED_BY(mu_) = v1::SITE_STATE_IDLE;
  uint32_t state_round_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time state_since_ ABSL_GUARDED_BY(mu_);
  bool seen_ ABSL_GUARDED_BY(mu_) = false;
  // The round under way at this site, and when this site first saw it.
  std::optional<uint32_t> round_ ABSL_GUARDED_BY(mu_);
  absl::Time round_since_ ABSL_GUARDED_BY(mu_);
  // The counters as last seen, for the job in job_.
  uint64_t last_granted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_accepted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_trained_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_failovers_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_taken_over_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_discarded_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_rejoins_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_retries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_expired_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_late_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_error_time_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

// A thread that long-polls a status source and hands each new status to
// `observe`, at most once per `min_interval`: a site changes status several
// times a round, and waking for each cost the daemon a tenth of its round
// time in a 16-site job. The status source also returns its journal of state
// and round changes (controller/state_change.h), and the watcher hands each
// change it did not see to `observe` first, as the new status with that
// change's state, round, counters and metrics, at that change's time; so
// phase and round times, and the round each counter grew in, stay exact
// whatever the interval. Every wait is bounded (`poll`), so Stop()
// returns within about one poll.
class StatusWatcher {
 public:
  struct Watched {
    v1::StatusReply reply;
    std::vector<StateChange> changes;  // After the change asked about.
  };
  // Blocks until the status version differs from `known_version` or
  // `deadline` passes, then returns the status and the journaled changes
  // numbered after `after_change` (SiteDriver's WaitForStatusChange).
  using WaitFn = std::function<Watched(
      uint64_t known_version, uint64_t after_change, absl::Time deadline)>;
  using ObserveFn = std::function<void(const v1::StatusReply&, absl::Time)>;

  StatusWatcher(WaitFn wait, ObserveFn observe,
                absl::Duration poll = absl::Milliseconds(250),
                absl::Duration min_interval = absl::Milliseconds(50));
  ~StatusWatcher();  // Stops.
  StatusWatcher(const StatusWatcher&) = delete;
  StatusWatcher& operator=(const StatusWatcher&) = delete;

  // REQUIRES: not started.
  void Start();
  // Idempotent.
  void Stop();
  // Brings the observer up to date before returning, from any thread: for a
  // reader that must see the latest status (the History RPC). Does not
  // block on the status source beyond taking its lock.
  void LookNow() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  // Hands `watched` to observe_: first its changes not yet delivered, then
  // the status itself unless a newer one was.
  void Deliver(const Watched& watched, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WaitFn wait_;
  const ObserveFn observe_;
  const absl::Duration poll_;
  const absl::Duration min_interval_;
  // Held while delivering: the watcher's thread and LookNow take turns.
  absl::Mutex mu_;
  std::optional<v1::StatusReply> last_ ABSL_GUARDED_BY(mu_);
  absl::Time last_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t last_change_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace swarm

#endif  // SWARM_CLI_SITE_METRICS_H_
