#include "controller/retry_policy.h"

#include "gtest/gtest.h"

namespace swarm {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(100);

TEST(RetryPolicyTest, BackoffDoublesUpToTheCapTimesJitter) {
  RetryPolicy policy;  // 50 ms, doubled, capped at 5 s.
  EXPECT_EQ(policy.Backoff(1, 0.5), absl::Milliseconds(50));
  EXPECT_EQ(policy.Backoff(2, 0.5), absl::Milliseconds(100));
  EXPECT_EQ(policy.Backoff(4, 0.5), absl::Milliseconds(400));
  EXPECT_EQ(policy.Backoff(20, 0.5), absl::Seconds(5));
  EXPECT_EQ(policy.Backoff(1, 0.0), absl::Milliseconds(25));
  EXPECT_EQ(policy.Backoff(20, 0.999), absl::Seconds(5) * 1.499);
}

TEST(RetryPolicyTest, OnlyTransportAndOverloadFailuresAreRetried) {
  for (absl::Status s :
       {absl::UnavailableError(""), absl::DeadlineExceededError(""),
        absl::ResourceExhaustedError(""), absl::AbortedError(""),
        absl::InternalError(""), absl::UnknownError("")}) {
    EXPECT_TRUE(RetryPolicy::Retryable(s)) << s;
  }
  for (absl::Status s :
       {absl::OkStatus(), absl::PermissionDeniedError(""),
        absl::InvalidArgumentError(""), absl::FailedPreconditionError(""),
        absl::CancelledError(""), absl::NotFoundError("")}) {
    EXPECT_FALSE(RetryPolicy::Retryable(s)) << s;
  }
}

TEST(RetryPolicyTest, GivesUpAfterTheAttemptsUnlessTheBudgetAllowsMore) {
  RetryPolicy policy;
  policy.attempts = 3;
  const absl::Status down = absl::UnavailableError("connection refused");
  const absl::Time no_budget = absl::InfinitePast();
  EXPECT_TRUE(policy.NextDelay(down, 1, 0.5, kNow, no_budget).has_value());
  EXPECT_TRUE(policy.NextDelay(down, 2, 0.5, kNow, no_budget).has_value());
  EXPECT_FALSE(policy.NextDelay(down, 3, 0.5, kNow, no_budget).has_value());
  // A budget until a later time keeps the call going past the attempts.
  const absl::Time until = kNow + absl::Seconds(30);
  std::optional<absl::Duration> more =
      policy.NextDelay(down, 10, 0.5, kNow, until);
  ASSERT_TRUE(more.has_value());
  EXPECT_EQ(*more, absl::Seconds(5));
  EXPECT_FALSE(
      policy.NextDelay(down, 10, 0.5, kNow + absl::Seconds(26), until));
  // A refusal is never retried, whatever the budget.
  EXPECT_FALSE(
      policy.NextDelay(absl::PermissionDeniedError("no"), 1, 0.5, kNow, until));
}

}  // namespace
}  // namespace swarm
