// Simulated jobs: the submission limit, slow and failing trainers,
// determinism, and the same jobs over real thread pools.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "controller/fake_network.h"
#include "controller/sim_expect.h"
#include "controller/sim_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace sim {
namespace {

class MaxConcurrentTest
    : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(MaxConcurrentTest, SubmissionsInFlightNeverExceedTheLimit) {
  // Uploads take 50 ms of virtual time, so they overlap unless the
  // aggregator's permissions keep them apart.
  const auto [limit, hold] = GetParam();
  Sim sim(Config(8, 3, [limit = limit](v1::JobConfig* job) {
    job->set_max_concurrent_submissions(limit);
  }));
  sim.network().AddDelay(Calls(CallKind::kSubmitResult), absl::Milliseconds(5),
                         absl::Milliseconds(50));
  sim.network().set_hold_permission_retries(hold);
  sim.RunJob();
  uint64_t most = 0;
  for (int i = 0; i < sim.size(); ++i) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_LE(status.counters().max_submissions_in_flight(), limit);
    EXPECT_EQ(status.counters().submissions_in_flight(), 0u);
    most = std::max(most, status.counters().max_submissions_in_flight());
  }
  // The limit was reached (the uploads did compete) and enforced.
  EXPECT_EQ(most, limit);
  int retries = 0;
  for (const CallRecord& call : sim.network().Log()) {
    retries += call.kind == CallKind::kRequestToSubmit &&
               call.result == "OUTCOME_RETRY";
  }
  if (!hold) {
    EXPECT_GT(retries, 0) << "no trainer ever had to wait";
  }
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
}

INSTANTIATE_TEST_SUITE_P(Limits, MaxConcurrentTest,
                         ::testing::Combine(::testing::Values(1u, 3u),
                                            ::testing::Bool()));

TEST(SimTest, SlowTrainerIsCutOffAfterGraceWait) {
  // min_responses_required = 4 of 5 and a 10 s grace wait. One trainer
  // answers 30 s late (its permission request is that slow): the round
  // closes 10 s after the fourth result, without it; its late request is
  // not granted for the closed round, and the job goes on and completes.
  Sim probe(Config(5, 3));
  const int slow = BystanderTrainer(probe);
  ASSERT_GE(slow, 0);
  Sim sim(Config(
      5, 3, [](v1::JobConfig* job) { job->set_min_responses_required(4); },
      [&](int i, TestLearnerOptions* options) {
        options->sample_count = i == slow ? 4 : 1;
      }));
  const std::string name = Sim::Name(slow);
  sim.network().AddDelay(Calls(CallKind::kRequestToSubmit, name, "", 1),
                         absl::Seconds(30));
  sim.RunJob();
  const absl::Time closed = RoundClosedAt(sim, 1);
  const std::vector<absl::Time> results = ResultTimes(sim, 1);
  ASSERT_FALSE(results.empty());
  EXPECT_EQ(closed, results.back() + absl::Seconds(10));
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kSubmitResult && call.from == name) {
      EXPECT_NE(call.round, 1u) << "the slow result reached the aggregator";
    }
  }
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  ExpectExactRounds(
      sim,
      [&](uint32_t round) { return round == 1 ? Without(all, slow) : all; },
      all);
}

TEST(SimTest, FailedTrainingIsNotCountedAndTheRoundCloses) {
  // One trainer's training fails in round 1 (scripted): it tells the
  // aggregator, is not counted, and the round closes with the others'
  // results at once (it does not wait for the grace time or the timeout).
  Sim probe(Config(5, 3));
  const int failing = BystanderTrainer(probe);
  ASSERT_GE(failing, 0);
  Sim sim(Config(5, 3, nullptr, [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == failing ? 4 : 1;
    if (i == failing) options->fail_rounds = {1};
  }));
  sim.RunJob();
  const std::string name = Sim::Name(failing);
  bool told = false;
  for (const CallRecord& call : sim.network().Log()) {
    told |= call.kind == CallKind::kSubmitResult && call.from == name &&
            call.round == 1 && call.failed_result && call.result == "OK";
  }
  EXPECT_TRUE(told);
  EXPECT_LT(RoundClosedAt(sim, 1) - RoundOpenedAt(sim, 1), absl::Seconds(10));
  EXPECT_THAT(sim.Status(failing).last_error(),
              HasSubstr("scripted training failure"));
  EXPECT_EQ(sim.Status(failing).counters().rounds_trained(), 2u);
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  ExpectExactRounds(
      sim,
      [&](uint32_t round) { return round == 1 ? Without(all, failing) : all; },
      all);
}

// A job with a bit of everything: dropped calls (retried with backoff),
// delays, duplicates, lost replies.
std::vector<std::string> FaultyRunLog() {
  Sim sim(Config(6, 4));
  sim.network().AddFault(Calls(CallKind::kLearnTask, "", Sim::Name(3)),
                         Fault::kDrop, 2);
  sim.network().AddFault(Calls(CallKind::kSubmitResult), Fault::kDrop, 3);
  sim.network().AddFault(Calls(CallKind::kRequestToSubmit), Fault::kDuplicate,
                         5);
  sim.network().AddFault(Calls(CallKind::kFinalResult), Fault::kDropReply, 2);
  sim.network().AddDelay(Calls(CallKind::kSubmitResult), absl::Milliseconds(7),
                         absl::Milliseconds(13));
  sim.RunJob();
  std::vector<std::string> lines;
  for (const CallRecord& call : sim.network().Log()) {
    lines.push_back(absl::StrCat(
        absl::FormatTime(call.start), " ", absl::FormatTime(call.end), " ",
        CallKindName(call.kind), " ", call.from, "->", call.to, " r",
        call.round, " ", call.fault, " ", call.deliveries, " ", call.result));
  }
  for (int i = 0; i < sim.size(); ++i) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  return lines;
}

TEST(SimTest, RunsAreDeterministic) {
  const std::vector<std::string> first = FaultyRunLog();
  const std::vector<std::string> second = FaultyRunLog();
  EXPECT_GT(first.size(), 50u);
  EXPECT_EQ(first, second);
}

// ---------------------------------------------------------------------------
// Real threads (run under ThreadSanitizer: ctest -L concurrency).

TEST(ThreadedSimTest, EightSitesCompleteWithThreadPools) {
  Sim sim(Threaded(Config(8, 5, [](v1::JobConfig* job) {
    job->set_max_concurrent_submissions(2);
  })));
  sim.network().AddDelay(Calls(CallKind::kSubmitResult), absl::ZeroDuration(),
                         absl::Milliseconds(1));
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(120)));
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << status.last_error();
    EXPECT_LE(status.counters().max_submissions_in_flight(), 2u);
  }
  const auto globals = ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
  ExpectElectedAggregators(sim);
  ExpectSameFinals(sim, all, globals, kBestRound);
}

TEST(ThreadedSimTest, DuplicatesAndLostRepliesWithThreadPools) {
  Sim sim(Threaded(Config(8, 4, [](v1::JobConfig* job) {
    job->set_max_concurrent_submissions(3);
  })));
  sim.network().AddFault(Calls(CallKind::kSubmitResult), Fault::kDropReply, 3);
  sim.network().AddFault(CallMatcher(), Fault::kDuplicate);
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(120)));
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  const auto globals = ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
  ExpectSameFinals(sim, all, globals, kBestRound);
}

TEST(ThreadedSimTest, AbortWhileRunning) {
  Sim sim(Threaded(Config(6, 50)));
  sim.Configure();
  sim.Start();
  // Let a few rounds go by, then abort every site while work is under way.
  const int starter = sim.Index(sim.job().starting_site());
  while (sim.Status(starter).round() < 3) {
    const v1::StatusReply reply = sim.controller(starter).Status();
    sim.controller(starter).WaitForStatusChange(
        reply.version(), absl::Now() + absl::Seconds(10));
  }
  for (int i = 0; i < sim.size(); ++i) {
    sim.controller(i).Abort(sim.AbortRequest());
  }
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(30)));
  std::vector<int> trains;
  for (int i = 0; i < sim.size(); ++i) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_ABORTED);
    trains.push_back(sim.learner(i).trains());
  }
  // Nothing trains after the abort (a training already running may finish).
  absl::SleepFor(absl::Milliseconds(200));
  for (int i = 0; i < sim.size(); ++i) {
    EXPECT_LE(sim.learner(i).trains(), trains[i] + 1) << Sim::Name(i);
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_ABORTED);
  }
}

// A daemon shutting down right after its job ended (swarm-client stops its
// runner, which drops the tasks it has not run) keeps the DONE state: the
// driver's FinishWrites waits for the writes asked for so far. With a slow
// disk the DONE state write is still queued when status says DONE.
TEST(ThreadedSimTest, FinishWritesLandsTheDoneStateOfAJobThatJustEnded) {
  Sim sim(Threaded(Config(3, 2)));
  for (int i = 0; i < sim.size(); ++i) {
    sim.disk(i).SlowWrites(absl::Milliseconds(40));
  }
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(120)));
  for (int i = 0; i < sim.size(); ++i) {
    ASSERT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_EQ(sim.controller(i).FinishWrites(absl::Now() + absl::Seconds(30)),
              0u)
        << Sim::Name(i);
    EXPECT_EQ(sim.store(i).state().state(), v1::SITE_STATE_DONE)
        << Sim::Name(i);
  }
}

}  // namespace
}  // namespace sim
}  // namespace swarm
