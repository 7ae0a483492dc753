#include "cli/site_metrics.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The value of the sample line that starts with `series` ("name{labels}"),
// or -1 when there is none.
double Sample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      return std::strtod(std::string(line.substr(series.size() + 1)).c_str(),
                         nullptr);
    }
  }
  return -1;
}

struct Step {
  double at;  // Seconds since the start of the test.
  v1::SiteState state;
  uint32_t round;
};

v1::StatusReply Reply(const std::string& job, v1::SiteState state,
                      uint32_t round, uint64_t version) {
  v1::StatusReply reply;
  reply.set_version(version);
  v1::SiteStatus* status = reply.mutable_status();
  status->set_site("site-a");
  status->set_job_id(job);
  status->set_state(state);
  status->set_round(round);
  return reply;
}

class SiteMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SiteMetrics>> created =
        SiteMetrics::Create(&registry_, "site-a");
    ASSERT_TRUE(created.ok()) << created.status();
    metrics_ = std::move(*created);
  }
  void See(const v1::StatusReply& reply, double at) {
    metrics_->Observe(reply, start_ + absl::Seconds(at));
  }
  double Value(const std::string& series) {
    return Sample(registry_.Exposition(), series);
  }

  MetricsRegistry registry_;
  std::unique_ptr<SiteMetrics> metrics_;
  const absl::Time start_ = absl::FromUnixSeconds(1800000000);
};

TEST_F(SiteMetricsTest, BeforeAnyJobEverythingIsZero) {
  const std::string text = registry_.Exposition();
  EXPECT_EQ(Sample(text, "swarm_rounds_completed_total{site=\"site-a\"}"), 0);
  EXPECT_EQ(Sample(text, "swarm_results_accepted_total{site=\"site-a\"}"), 0);
  EXPECT_EQ(Sample(text, "swarm_round_duration_seconds_count{site=\"site-a\"}"),
            0);
  EXPECT_EQ(Sample(text, "swarm_state{site=\"site-a\",state=\"idle\"}"), 1);
  EXPECT_EQ(Sample(text, "swarm_state{site=\"site-a\",state=\"training\"}"), 0);
  EXPECT_THAT(text, Not(HasSubstr("swarm_best_metric{")));
}

TEST_F(SiteMetricsTest, StateChangesBecomePhaseAndRoundHistograms) {
  const Step steps[] = {
      {0, v1::SITE_STATE_CONFIGURED, 0},
      {1, v1::SITE_STATE_TRAINING, 0},
      {3, v1::SITE_STATE_WAITING_FOR_PERMISSION, 0},
      {3.5, v1::SITE_STATE_SUBMITTING, 0},
      {4, v1::SITE_STATE_GATHERING, 0},
      {6, v1::SITE_STATE_AGGREGATING, 0},
      {6.25, v1::SITE_STATE_TRAINING, 1},
      {8, v1::SITE_STATE_IDLE, 1},
      {9, v1::SITE_STATE_DISTRIBUTING, 1},
      {10, v1::SITE_STATE_DONE, 1},
  };
  uint64_t version = 1;
  for (const Step& step : steps) {
    See(Reply("job-1", step.state, step.round, version++), step.at);
  }
  auto phase = [this](const char* name, const char* suffix) {
    return Value(absl::StrCat("swarm_phase_seconds_", suffix,
                              "{site=\"site-a\",phase=\"", name, "\"}"));
  };
  EXPECT_EQ(phase("training", "count"), 2);
  EXPECT_EQ(phase("training", "sum"), 2 + 1.75);
  EXPECT_EQ(phase("waiting_for_permission", "sum"), 0.5);
  EXPECT_EQ(phase("submitting", "sum"), 0.5);
  EXPECT_EQ(phase("gathering", "sum"), 2);
  EXPECT_EQ(phase("aggregating", "sum"), 0.25);
  EXPECT_EQ(phase("waiting_for_task", "sum"), 1);
  EXPECT_EQ(phase("distributing", "sum"), 1);
  // No phase for "configured" (before the job ran) or "done".
  EXPECT_EQ(phase("configured", "count"), -1);
  EXPECT_EQ(phase("done", "count"), -1);
  // Round 0: 1 s .. 6.25 s; round 1: 6.25 s .. done at 10 s.
  EXPECT_EQ(Value("swarm_round_duration_seconds_count{site=\"site-a\"}"), 2);
  EXPECT_EQ(Value("swarm_round_duration_seconds_sum{site=\"site-a\"}"),
            5.25 + 3.75);
  EXPECT_EQ(Value("swarm_round_duration_seconds_bucket{site=\"site-a\","
                  "le=\"5\"}"),
            1);
  EXPECT_EQ(Value("swarm_jobs_ended_total{site=\"site-a\",outcome=\"done\"}"),
            1);
  EXPECT_EQ(Value("swarm_state{site=\"site-a\",state=\"done\"}"), 1);
  EXPECT_EQ(Value("swarm_state{site=\"site-a\",state=\"idle\"}"), 0);
  EXPECT_EQ(Value("swarm_round{site=\"site-a\"}"), 1);
  EXPECT_EQ(Value("swarm_job_info{site=\"site-a\",job=\"job-1\"}"), 1);
  EXPECT_EQ(Value("swarm_status_changes_total{site=\"site-a\"}"), 10);
}

TEST_F(SiteMetricsTest, CountersGrowByTheStatusCountersAndRestartPerJob) {
  v1::StatusReply reply = Reply("job-1", v1::SITE_STATE_GATHERING, 2, 1);
  v1::SiteCounters* counters = reply.mutable_status()->mutable_counters();
  counters->set_submissions_granted(3);
  counters->set_results_accepted(2);
  counters->set_results_rejected(1);
  counters->set_rounds_completed(2);
  counters->set_rounds_trained(3);
  counters->set_submissions_in_flight(1);
  counters->set_max_submissions_in_flight(2);
  See(reply, 1);
  counters->set_results_accepted(5);
  counters->set_rounds_completed(3);
  See(reply, 2);
  See(reply, 3);  // The same values again add nothing.
  EXPECT_EQ(Value("swarm_results_accepted_total{site=\"site-a\"}"), 5);
  EXPECT_EQ(Value("swarm_rounds_completed_total{site=\"site-a\"}"), 3);
  EXPECT_EQ(Value("swarm_rounds_trained_total{site=\"site-a\"}"), 3);
  EXPECT_EQ(Value("swarm_results_rejected_total{site=\"site-a\"}"), 1);
  EXPECT_EQ(Value("swarm_permissions_granted_total{site=\"site-a\"}"), 3);
  EXPECT_EQ(Value("swarm_submissions_in_flight{site=\"site-a\"}"), 1);
  EXPECT_EQ(Value("swarm_submissions_in_flight_max{site=\"site-a\"}"), 2);

  // A new job's counters start at 0 in the status; the totals keep growing.
  v1::StatusReply next = Reply("job-2", v1::SITE_STATE_GATHERING, 0, 2);
  next.mutable_status()->mutable_counters()->set_results_accepted(2);
  See(next, 4);
  EXPECT_EQ(Value("swarm_results_accepted_total{site=\"site-a\"}"), 7);
  EXPECT_EQ(Value("swarm_job_info{site=\"site-a\",job=\"job-1\"}"), 0);
  EXPECT_EQ(Value("swarm_job_info{site=\"site-a\",job=\"job-2\"}"), 1);
}

TEST_F(SiteMetricsTest, FailoverAndRejoinCountersFollowTheStatus) {
  for (const char* name :
       {"swarm_failovers_total", "swarm_rounds_taken_over_total",
        "swarm_discarded_aggregates_total", "swarm_trainers_dropped_total",
        "swarm_rejoins_total"}) {
    EXPECT_EQ(Value(std::string(name) + "{site=\"site-a\"}"), 0) << name;
  }
  v1::StatusReply reply = Reply("job-1", v1::SITE_STATE_TRAINING, 3, 1);
  v1::SiteCounters* counters = reply.mutable_status()->mutable_counters();
  counters->set_failovers(1);
  counters->set_rounds_taken_over(2);
  counters->set_discarded_aggregates(1);
  counters->set_trainers_dropped(4);
  counters->set_rejoins(1);
  See(reply, 1);
  counters->set_failovers(3);
  counters->set_trainers_dropped(5);
  See(reply, 2);
  EXPECT_EQ(Value("swarm_failovers_total{site=\"site-a\"}"), 3);
  EXPECT_EQ(Value("swarm_rounds_taken_over_total{site=\"site-a\"}"), 2);
  EXPECT_EQ(Value("swarm_discarded_aggregates_total{site=\"site-a\"}"), 1);
  EXPECT_EQ(Value("swarm_trainers_dropped_total{site=\"site-a\"}"), 5);
  EXPECT_EQ(Value("swarm_rejoins_total{site=\"site-a\"}"), 1);
  // A new job starts its counters at 0: its failover adds one.
  v1::StatusReply next = Reply("job-2", v1::SITE_STATE_TRAINING, 0, 2);
  next.mutable_status()->mutable_counters()->set_failovers(1);
  See(next, 3);
  EXPECT_EQ(Value("swarm_failovers_total{site=\"site-a\"}"), 4);
  EXPECT_EQ(Value("swarm_rejoins_total{site=\"site-a\"}"), 1);
}

TEST_F(SiteMetricsTest, PermissionAndResultOutcomesFollowTheStatus) {
  for (const char* name :
       {"swarm_permission_retries_total", "swarm_permissions_expired_total",
        "swarm_results_late_total", "swarm_results_failed_total"}) {
    EXPECT_EQ(Value(std::string(name) + "{site=\"site-a\"}"), 0) << name;
  }
  v1::StatusReply reply = Reply("job-1", v1::SITE_STATE_GATHERING, 2, 1);
  v1::SiteCounters* counters = reply.mutable_status()->mutable_counters();
  counters->set_permission_retries(7);
  counters->set_permissions_expired(1);
  counters->set_results_late(2);
  counters->set_results_failed(3);
  See(reply, 1);
  counters->set_permission_retries(9);
  See(reply, 2);
  EXPECT_EQ(Value("swarm_permission_retries_total{site=\"site-a\"}"), 9);
  EXPECT_EQ(Value("swarm_permissions_expired_total{site=\"site-a\"}"), 1);
  EXPECT_EQ(Value("swarm_results_late_total{site=\"site-a\"}"), 2);
  EXPECT_EQ(Value("swarm_results_failed_total{site=\"site-a\"}"), 3);
}

TEST_F(SiteMetricsTest, GaugesFollowTheStatus) {
  v1::StatusReply reply = Reply("job-1", v1::SITE_STATE_TRAINING, 4, 1);
  v1::SiteStatus* status = reply.mutable_status();
  status->mutable_role()->set_aggregator(true);
  status->mutable_best()->set_present(true);
  status->mutable_best()->set_metric(0.875);
  status->mutable_best()->set_round(3);
  (*status->mutable_metrics())["accuracy"] = 0.5;
  (*status->mutable_metrics())["loss"] = 1.25;
  status->set_last_error_time_ms(1800000000500);
  See(reply, 1);
  EXPECT_EQ(Value("swarm_round{site=\"site-a\"}"), 4);
  EXPECT_EQ(Value("swarm_state{site=\"site-a\",state=\"training\"}"), 1);
  EXPECT_EQ(Value("swarm_is_aggregator{site=\"site-a\"}"), 1);
  EXPECT_EQ(Value("swarm_best_metric{site=\"site-a\"}"), 0.875);
  EXPECT_EQ(Value("swarm_best_metric_round{site=\"site-a\"}"), 3);
  EXPECT_EQ(
      Value("swarm_validation_metric{site=\"site-a\",metric=\"accuracy\"}"),
      0.5);
  EXPECT_EQ(Value("swarm_validation_metric{site=\"site-a\",metric=\"loss\"}"),
            1.25);
  EXPECT_EQ(Value("swarm_last_error_timestamp_seconds{site=\"site-a\"}"),
            1800000000.5);
}

TEST_F(SiteMetricsTest, AFailedJobEndsItsRoundUnmeasured) {
  See(Reply("job-1", v1::SITE_STATE_TRAINING, 0, 1), 0);
  See(Reply("job-1", v1::SITE_STATE_FAILED, 0, 2), 5);
  EXPECT_EQ(Value("swarm_round_duration_seconds_count{site=\"site-a\"}"), 0);
  EXPECT_EQ(
      Value("swarm_phase_seconds_sum{site=\"site-a\",phase=\"training\"}"), 5);
  EXPECT_EQ(Value("swarm_jobs_ended_total{site=\"site-a\",outcome=\"failed\"}"),
            1);
}

TEST_F(SiteMetricsTest, ASecondRegistrationClashes) {
  EXPECT_TRUE(SiteMetrics::Create(&registry_, "site-a").ok());  // Same shape.
  MetricsRegistry other;
  ASSERT_TRUE(other.AddGauge("swarm_round", "something else").ok());
  EXPECT_EQ(SiteMetrics::Create(&other, "site-a").status().code(),
            absl::StatusCode::kAlreadyExists);
}

// The watcher hands each new version to the observer and stops promptly.
TEST(StatusWatcherTest, ObservesEachNewVersionAndStops) {
  absl::Mutex mu;
  uint64_t current = 1;  // Guarded by mu.
  std::vector<uint64_t> seen;
  StatusWatcher watcher(
      [&](uint64_t known, uint64_t, absl::Time deadline) {
        absl::MutexLock lock(&mu);
        auto changed = [&] { return current != known; };
        mu.AwaitWithDeadline(absl::Condition(&changed), deadline);
        return StatusWatcher::Watched{
            Reply("job-1", v1::SITE_STATE_TRAINING, 0, current), {}};
      },
      [&](const v1::StatusReply& reply, absl::Time) {
        absl::MutexLock lock(&mu);
        seen.push_back(reply.version());
      },
      absl::Milliseconds(50));
  watcher.Start();
  for (uint64_t version = 2; version <= 4; ++version) {
    absl::MutexLock lock(&mu);
    auto caught_up = [&] { return !seen.empty() && seen.back() == current; };
    ASSERT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&caught_up), absl::Seconds(10)));
    current = version;
  }
  {
    absl::MutexLock lock(&mu);
    auto caught_up = [&] { return !seen.empty() && seen.back() == current; };
    ASSERT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&caught_up), absl::Seconds(10)));
  }
  const absl::Time stopping = absl::Now();
  watcher.Stop();
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(2));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2, 3, 4}));
}

StateChange Change(uint64_t seq, v1::SiteState state, uint32_t round,
                   absl::Time at) {
  StateChange change;
  change.seq = seq;
  change.state = state;
  change.round = round;
  change.at = at;
  return change;
}

// Changes made between two looks reach the observer one by one, with the
// machine's times and the counters as they were after each; the status
// itself comes last. The watcher looks at most once per
// interval however often the status changes.
TEST(StatusWatcherTest, ReplaysJournaledChangesWithTheirTimes) {
  const absl::Time t0 = absl::Now();
  absl::Mutex mu;
  int looks = 0;    // Guarded by mu.
  absl::Time base;  // Guarded by mu.
  struct Seen {
    v1::SiteState state;
    uint32_t round;
    absl::Time at;
    uint64_t trained;
  };
  std::vector<Seen> seen;  // Guarded by mu.
  StatusWatcher watcher(
      [&](uint64_t known, uint64_t after, absl::Time deadline) {
        absl::MutexLock lock(&mu);
        ++looks;
        StatusWatcher::Watched watched;
        if (known == ~uint64_t{0}) {  // The first look: round 0, training.
          watched.reply = Reply("job-1", v1::SITE_STATE_TRAINING, 0, 1);
          watched.changes = {Change(1, v1::SITE_STATE_TRAINING, 0, t0)};
          return watched;
        }
        if (known == 1) {
          // Four changes since the first look, one a round later.
          EXPECT_EQ(after, 1u);
          watched.reply = Reply("job-1", v1::SITE_STATE_TRAINING, 1, 2);
          watched.reply.mutable_status()
              ->mutable_counters()
              ->set_rounds_trained(7);
          // The interval (200 ms) separates the looks: these times are
          // after the first one.
          base = absl::Now() - absl::Milliseconds(50);
          watched.changes = {
              Change(2, v1::SITE_STATE_WAITING_FOR_PERMISSION, 0, base),
              Change(3, v1::SITE_STATE_SUBMITTING, 0,
                     base + absl::Milliseconds(10)),
              Change(4, v1::SITE_STATE_IDLE, 0, base + absl::Milliseconds(20)),
              Change(5, v1::SITE_STATE_TRAINING, 1,
                     base + absl::Milliseconds(30))};
          // Counters as they were after each change.
          for (StateChange& change : watched.changes) {
            change.counters.set_rounds_trained(change.seq);
          }
          return watched;
        }
        EXPECT_EQ(after, 5u);
        mu.AwaitWithDeadline(absl::Condition::kTrue, deadline);
        watched.reply = Reply("job-1", v1::SITE_STATE_TRAINING, 1, 2);
        return watched;
      },
      [&](const v1::StatusReply& reply, absl::Time at) {
        absl::MutexLock lock(&mu);
        seen.push_back({reply.status().state(), reply.status().round(), at,
                        reply.status().counters().rounds_trained()});
      },
      absl::Milliseconds(20), absl::Milliseconds(200));
  watcher.Start();
  {
    absl::MutexLock lock(&mu);
    auto both = [&] { return seen.size() >= 6; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&both), absl::Seconds(10)));
  }
  // Within the interval the watcher does not look again.
  absl::SleepFor(absl::Milliseconds(100));
  watcher.Stop();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[0].state, v1::SITE_STATE_TRAINING);
  const v1::SiteState states[] = {v1::SITE_STATE_WAITING_FOR_PERMISSION,
                                  v1::SITE_STATE_SUBMITTING,
                                  v1::SITE_STATE_IDLE, v1::SITE_STATE_TRAINING};
  for (int i = 0; i < 4; ++i) {
    const Seen& step = seen[1 + i];
    EXPECT_EQ(step.state, states[i]) << i;
    EXPECT_EQ(step.round, i == 3 ? 1u : 0u) << i;
    EXPECT_EQ(step.at, base + absl::Milliseconds(10 * i)) << i;
    EXPECT_EQ(step.trained, 2u + i) << i;  // Counters after the change.
  }
  EXPECT_EQ(seen[5].state, v1::SITE_STATE_TRAINING);
  EXPECT_EQ(seen[5].trained, 7u);
  EXPECT_LE(looks, 3);
}

}  // namespace
}  // namespace swarm
