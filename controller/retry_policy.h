// When an outgoing call is tried again, as data: exponential backoff from
// `first_backoff`, doubled each attempt up to `max_backoff`, times a jitter
// factor in [0.5, 1.5) that the caller draws (from a seeded generator in
// simulations, so a run replays exactly). Pure: no clock, no sleeping; the
// caller arms its own timer for the delay it is given.
#ifndef SWARM_CONTROLLER_RETRY_POLICY_H_
#define SWARM_CONTROLLER_RETRY_POLICY_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace swarm {

struct RetryPolicy {
  // Attempts a call gets in any case before it counts as failed (by default
  // about 1.5 s of retrying, so a brief outage or an overloaded peer does not
  // end a job); a budget (`until` below) may allow more.
  int attempts = 6;
  absl::Duration first_backoff = absl::Milliseconds(50);
  // The longest wait between two attempts, before jitter.
  absl::Duration max_backoff = absl::Seconds(5);

  // Whether a call that failed with `status` may be tried again: transport
  // failures, deadlines and overload; never a refusal (permission, bad
  // request, precondition) or a cancellation.
  static bool Retryable(const absl::Status& status);

  // The wait after failed attempt `attempt` (1-based), for a jitter draw
  // `unit` in [0, 1).
  absl::Duration Backoff(int attempt, double unit) const;

  // After attempt `attempt` failed with `status` at `now`: the wait before
  // the next attempt, or nullopt to give up. Retries while the status is
  // retryable and either fewer than `attempts` were made or the next attempt
  // would still start by `until`.
  std::optional<absl::Duration> NextDelay(const absl::Status& status,
                                          int attempt, double unit,
                                          absl::Time now,
                                          absl::Time until) const;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_RETRY_POLICY_H_
