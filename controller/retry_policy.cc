#include "controller/retry_policy.h"

#include <algorithm>

namespace swarm {

bool RetryPolicy::Retryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

absl::Duration RetryPolicy::Backoff(int attempt, double unit) const {
  const int doublings = std::clamp(attempt - 1, 0, 16);
  const absl::Duration cap = std::max(max_backoff, first_backoff);
  return std::min(first_backoff * (1 << doublings), cap) * (0.5 + unit);
}

std::optional<absl::Duration> RetryPolicy::NextDelay(const absl::Status& status,
                                                     int attempt, double unit,
                                                     absl::Time now,
                                                     absl::Time until) const {
  if (status.ok() || !Retryable(status)) return std::nullopt;
  const absl::Duration delay = Backoff(attempt, unit);
  if (attempt >= attempts && now + delay > until) return std::nullopt;
  return delay;
}

}  // namespace swarm
