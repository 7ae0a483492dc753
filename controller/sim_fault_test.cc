// Simulated jobs under faults: lost, duplicated and delayed messages,
// isolated sites, aborts.
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

TEST(SimTest, DuplicatedMessagesChangeNothing) {
  // Every call is delivered twice. The model is 12 KB in 4 KiB chunks, so
  // each stream is assembled from several chunks.
  SimConfig config = Config(
      8, 5, [](v1::JobConfig* job) { job->set_chunk_size(4096); },
      [](int, TestLearnerOptions* options) { options->size = 3000; });
  Sim plain(config);
  plain.RunJob();
  const JobOutcome expected = Outcome(plain);

  Sim doubled(config);
  doubled.network().AddFault(CallMatcher(), Fault::kDuplicate);
  doubled.RunJob();
  const JobOutcome outcome = Outcome(doubled);

  int duplicated = 0;
  std::set<CallKind> kinds;
  for (const CallRecord& call : doubled.network().Log()) {
    if (call.deliveries == 2) {
      ++duplicated;
      kinds.insert(call.kind);
    }
  }
  EXPECT_GT(duplicated, 0);
  // (No ShareBest: the last aggregator trained on the best model and
  // sends BEST itself.)
  EXPECT_EQ(kinds, (std::set<CallKind>{
                       CallKind::kLearnTask, CallKind::kRequestToSubmit,
                       CallKind::kSubmitResult, CallKind::kFinalResult}))
      << "every kind of call was duplicated";
  for (int i = 0; i < doubled.size(); ++i) {
    EXPECT_EQ(doubled.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_TRUE(MessageDifferencer::Equals(doubled.Status(i).best(),
                                           plain.Status(i).best()));
    EXPECT_LE(doubled.Status(i).counters().max_submissions_in_flight(), 1u);
  }
  EXPECT_TRUE(outcome.globals == expected.globals);
  EXPECT_TRUE(outcome.best == expected.best) << "BEST differs";
  EXPECT_TRUE(outcome.last == expected.last) << "LAST differs";
  EXPECT_EQ(outcome.accepted, expected.accepted);
  ExpectExactRounds(
      doubled, [&](uint32_t) { return AllTrainers(doubled); },
      AllSites(doubled));
}

TEST(SimTest, LostRepliesAreRetriedWithoutLosingAnything) {
  // The first reply of every kind of call to every site is lost after the
  // message was handled (the caller sees DeadlineExceeded and retries): a
  // re-sent learn task must still count as acknowledged, and the job ends
  // as if nothing happened.
  SimConfig config = Config(8, 5);
  Sim plain(config);
  plain.RunJob();
  const JobOutcome expected = Outcome(plain);

  Sim lossy(config);
  for (int i = 0; i < lossy.size(); ++i) {
    for (CallKind kind : {CallKind::kLearnTask, CallKind::kRequestToSubmit,
                          CallKind::kSubmitResult, CallKind::kShareBest,
                          CallKind::kFinalResult}) {
      lossy.network().AddFault(Calls(kind, "", Sim::Name(i)), Fault::kDropReply,
                               1);
    }
  }
  lossy.RunJob();
  int lost = 0;
  for (const CallRecord& call : lossy.network().Log()) {
    lost += call.fault == "drop_reply";
  }
  EXPECT_GT(lost, 0);
  for (int i = 0; i < lossy.size(); ++i) {
    EXPECT_EQ(lossy.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  const JobOutcome outcome = Outcome(lossy);
  EXPECT_TRUE(outcome.globals == expected.globals);
  EXPECT_TRUE(outcome.best == expected.best) << "BEST differs";
  EXPECT_TRUE(outcome.last == expected.last) << "LAST differs";
  ExpectExactRounds(
      lossy, [&](uint32_t) { return AllTrainers(lossy); }, AllSites(lossy));
}

TEST(SimTest, AResultInWhoseAnswerWasLostIsKept) {
  // A trainer's upload is accepted but the answer is lost: it asks again
  // while the round is still open (another trainer's upload takes a while)
  // and hears its result is already in (REJECTED with result_in). That is
  // no refusal: it keeps the result for a failover, as after an answered
  // upload, and the job goes on as if nothing happened.
  const SimConfig config = Config(4, 3);
  Sim probe(config);
  const uint32_t round = 1;
  int trainer = 0;
  while (Sim::Name(trainer) == probe.Aggregator(round)) ++trainer;
  int slow = trainer + 1;
  while (Sim::Name(slow) == probe.Aggregator(round)) ++slow;
  Sim sim(config);
  sim.network().AddFault(
      Calls(CallKind::kSubmitResult, Sim::Name(trainer), "", round),
      Fault::kDropReply, 1);
  sim.network().AddDelay(
      Calls(CallKind::kSubmitResult, Sim::Name(slow), "", round),
      absl::Seconds(5));
  sim.RunJob();
  bool lost = false;
  int told_in = 0;
  for (const CallRecord& call : sim.network().Log()) {
    lost |= call.kind == CallKind::kSubmitResult && call.fault == "drop_reply";
    told_in += call.kind == CallKind::kRequestToSubmit &&
               call.from == Sim::Name(trainer) && call.round == round &&
               call.result == "OUTCOME_REJECTED";
  }
  ASSERT_TRUE(lost);
  EXPECT_EQ(told_in, 1);
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    // The lost answer itself is reported; a refusal would come after it.
    EXPECT_THAT(sim.Status(i).last_error(),
                ::testing::Not(::testing::HasSubstr("refused")))
        << Sim::Name(i);
  }
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
}

TEST(SimTest, LostAckOfTheAggregatorsTaskDoesNotFailTheJob) {
  // The aggregator's learn task of round r arrives but its acknowledgement
  // is lost. Before the scatterer's retry (after a backoff) the aggregator
  // has already closed round r and moved on to round r + 1, so the retry is
  // refused as stale; that must not count as "aggregator unreachable".
  // All submissions at once: a round takes no virtual time, less than the
  // scatterer's backoff.
  const SimConfig config = Config(
      4, 4, [](v1::JobConfig* job) { job->set_max_concurrent_submissions(4); });
  Sim probe(config);
  uint32_t round = 0;
  auto scatterer = [&](uint32_t r) {
    return r == 0 ? probe.job().starting_site() : probe.Aggregator(r - 1);
  };
  while (round < 4 && scatterer(round) == probe.Aggregator(round)) ++round;
  ASSERT_LT(round, 4u) << "every aggregator scatters to itself";
  Sim sim(config);
  sim.network().AddFault(
      Calls(CallKind::kLearnTask, "", sim.Aggregator(round), round),
      Fault::kDropReply, 1);
  // Round r + 1's results take a second, so the retry finds the aggregator
  // in round r + 1.
  sim.network().AddDelay(Calls(CallKind::kSubmitResult, "", "", round + 1),
                         absl::Seconds(1));
  sim.RunJob();
  bool refused_as_stale = false;
  for (const CallRecord& call : sim.network().Log()) {
    refused_as_stale |= call.kind == CallKind::kLearnTask &&
                        call.round == round &&
                        call.to == sim.Aggregator(round) &&
                        absl::StrContains(call.result, "already has");
  }
  EXPECT_TRUE(refused_as_stale);
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_EQ(sim.Status(i).last_error(), "") << Sim::Name(i);
  }
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
}

// The first round after round 0 whose elected aggregator differs from the
// previous round's (so that its learn task crosses the network), or
// `rounds` when there is none.
uint32_t FirstRoundWithNewAggregator(Sim& sim, uint32_t rounds) {
  uint32_t round = 1;
  while (round < rounds && sim.Aggregator(round) == sim.Aggregator(round - 1)) {
    ++round;
  }
  return round;
}

TEST(SimTest, EveryCandidateUnreachableFailsTheJobVisibly) {
  // Right after round r's election, every aggregator candidate but the
  // starting site is cut off, and the starting site is not a candidate: no
  // backup is left. Every reachable site must end FAILED, naming the
  // failure, in bounded virtual time, instead of waiting forever.
  SimConfig config = Config(5, 4);
  config.job = [](v1::JobConfig* job) {
    job->add_aggregator_candidates("site-03");
    job->add_aggregator_candidates("site-04");
  };
  Sim sim(config);
  bool cut = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!cut && call.kind == CallKind::kLearnTask && call.round == 1) {
      cut = true;
      sim.network().Isolate("site-03");
      sim.network().Isolate("site-04");
    }
  });
  sim.Configure();
  sim.Start();
  const absl::Time started = sim.runner().Now();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(cut);
  for (int i = 0; i < 3; ++i) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_FAILED) << Sim::Name(i);
    EXPECT_THAT(status.last_error(), HasSubstr("no aggregator reachable"))
        << Sim::Name(i);
    EXPECT_THAT(status.end_reason(), HasSubstr("failed: ")) << Sim::Name(i);
    // Within a few failover timeouts (5 s) of the cut, plus round 0.
    EXPECT_LT(absl::FromUnixMillis(status.last_error_time_ms()) - started,
              absl::Seconds(40))
        << Sim::Name(i);
  }
}

TEST(SimTest, AggregatorCutOffBrieflyRunsItsRoundOnceBack) {
  // The elected aggregator of round r is cut off as round r's scatter
  // begins and is back 5 s later, well past the ordinary retries (about
  // 1.5 s) but within request_to_submit_max_wait (30 s). The scatterer keeps
  // retrying its learn task, so the round runs once it is back, with every
  // trainer (the aggregator trains on that same task), and the job
  // completes with exact aggregates. The failover bounds are set above the
  // cut (20 s, 1000 attempts), so the round is ridden out, not moved.
  SimConfig config = Config(5, 4);
  config.job = [](v1::JobConfig* job) {
    job->set_failover_timeout_ms(20'000);
    job->set_failover_attempts(1000);
  };
  Sim probe(config);
  const uint32_t round = FirstRoundWithNewAggregator(probe, 4);
  ASSERT_LT(round, 4u) << "no round changes aggregator; change the seed";
  // Weights: 1 per site, 4 for the cut aggregator (a total of 8).
  const int cut_site = probe.Index(probe.Aggregator(round));
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == cut_site ? 4 : 1;
  };
  Sim sim(config);
  const std::string aggregator = sim.Aggregator(round);
  bool cut = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!cut && call.kind == CallKind::kLearnTask && call.round == round) {
      cut = true;
      sim.network().Isolate(aggregator);
      sim.runner().PostAfter(absl::Seconds(5),
                             [&] { sim.network().Recover(aggregator); });
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(cut);
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  // The round opened only after the cut healed.
  EXPECT_GE(RoundOpenedAt(sim, round) - RoundOpenedAt(sim, round - 1),
            absl::Seconds(5));
  ExpectExactRounds(
      sim, [&](uint32_t) { return all; }, all);
}

TEST(SimTest, IsolatedTrainerIsNotWaitedForAndRejoinsAfterRecovery) {
  // A trainer is cut off from round 1 to round 3: its learn tasks are not
  // acknowledged, so rounds 1 and 2 neither wait for it nor count it, and
  // the scatterers report it. It recovers before round 3 and takes part
  // again. Weights: 1 per site, 4 for it (4 without it, 8 with it). The
  // same with the learn tasks broadcast: wherever the cut site sits in the
  // chain, the sites after it still get the task.
  for (const bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "broadcast" : "star");
    SimConfig config = Config(5, 5, [broadcast](v1::JobConfig* job) {
      job->set_broadcast_learn_tasks(broadcast);
    });
    Sim probe(config);
    const int cut = BystanderTrainer(probe);
    ASSERT_GE(cut, 0);
    config.learner = [&](int i, TestLearnerOptions* options) {
      options->sample_count = i == cut ? 4 : 1;
    };
    Sim sim(config);
    const std::string name = Sim::Name(cut);
    sim.network().SetObserver([&](const CallRecord& call) {
      if (call.kind == CallKind::kLearnTask && call.round == 1) {
        sim.network().Isolate(name);
      }
      if (call.kind == CallKind::kLearnTask && call.round == 3) {
        sim.network().Recover(name);
      }
    });
    sim.Configure();
    sim.Start();
    ASSERT_TRUE(sim.RunUntil([&] { return !ResultTimes(sim, 1).empty(); }));
    EXPECT_THAT(sim.Status(sim.Index(sim.Aggregator(0))).last_error(),
                HasSubstr(absl::StrCat("learn task to ", name)));
    sim.runner().RunUntilIdle();

    const std::vector<int> all = AllSites(sim);
    for (int i : all) {
      EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    }
    for (uint32_t round : {1u, 2u}) {
      // Closed on the last result of the others: no grace wait (10 s), no
      // timeout.
      EXPECT_EQ(RoundClosedAt(sim, round), ResultTimes(sim, round).back());
      EXPECT_LT(RoundClosedAt(sim, round) - RoundOpenedAt(sim, round),
                absl::Seconds(10));
      EXPECT_EQ(sim.learner(cut).globals().count(round), 0u);
    }
    EXPECT_EQ(sim.learner(cut).globals().count(3), 1u);
    ExpectExactRounds(
        sim,
        [&](uint32_t round) {
          return round == 1 || round == 2 ? Without(all, cut) : all;
        },
        all);
  }
}

TEST(SimTest, AbortStopsEveryActivityPromptly) {
  Sim sim(Config(6, 5));
  sim.Configure();
  sim.Start();
  // Mid-job: round 2 has results coming in.
  ASSERT_TRUE(sim.RunUntil([&] { return !ResultTimes(sim, 2).empty(); }));
  for (int i = 0; i < sim.size(); ++i) {
    const v1::Reply reply = sim.controller(i).Abort(sim.AbortRequest());
    EXPECT_EQ(reply.outcome(), v1::OUTCOME_OK) << reply.message();
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_ABORTED);
  }
  std::vector<v1::SiteStatus> before;
  std::vector<int> trains;
  for (int i = 0; i < sim.size(); ++i) {
    before.push_back(sim.Status(i));
    trains.push_back(sim.learner(i).trains());
  }
  const size_t calls = sim.network().Log().size();
  sim.runner().RunUntilIdle();
  for (int i = 0; i < sim.size(); ++i) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_TRUE(MessageDifferencer::Equals(status, before[i]))
        << Sim::Name(i) << ": " << status.ShortDebugString() << " vs "
        << before[i].ShortDebugString();
    EXPECT_EQ(status.state(), v1::SITE_STATE_ABORTED);
    EXPECT_THAT(status.last_error(), HasSubstr("aborted by operator"));
    EXPECT_EQ(sim.learner(i).trains(), trains[i]) << Sim::Name(i);
    EXPECT_EQ(sim.Final(i, v1::MODEL_KIND_LAST), nullptr);
    EXPECT_EQ(sim.store(i).state().state(), v1::SITE_STATE_ABORTED);
  }
  // Whatever was still on its way was refused.
  const std::vector<CallRecord> log = sim.network().Log();
  for (size_t k = calls; k < log.size(); ++k) {
    EXPECT_NE(log[k].result, "OK")
        << CallKindName(log[k].kind) << " " << log[k].from << "->" << log[k].to
        << " round " << log[k].round;
  }
}

TEST(SimTest, AbortedAggregatorIsPassedOverAndTheOthersFinish) {
  // Only the aggregator of round 1 is aborted, in the middle of its round:
  // the other sites' requests are answered ABORTED, nothing more is
  // aggregated there, and its trainers take the round to the next backup
  // (as from a dead aggregator) and finish the job without it.
  Sim sim(Config(5, 3));
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.RunUntil([&] { return !ResultTimes(sim, 1).empty(); }));
  const int aggregator = sim.Index(sim.Aggregator(1));
  const uint64_t accepted =
      sim.Status(aggregator).counters().results_accepted();
  sim.controller(aggregator).Abort(sim.AbortRequest());
  sim.runner().RunUntilIdle();
  EXPECT_EQ(sim.Status(aggregator).state(), v1::SITE_STATE_ABORTED);
  EXPECT_EQ(sim.Status(aggregator).counters().results_accepted(), accepted);
  std::shared_ptr<const Model> last;
  int failed_over = 0;
  for (int i = 0; i < sim.size(); ++i) {
    if (i == aggregator) continue;
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << status.last_error();
    for (const v1::Failover& f : status.failovers()) {
      if (f.round() == 1 && f.from() == sim.Aggregator(1)) ++failed_over;
    }
    std::shared_ptr<const Model> mine = sim.Final(i, v1::MODEL_KIND_LAST);
    ASSERT_NE(mine, nullptr) << Sim::Name(i);
    if (last == nullptr) last = mine;
    EXPECT_EQ(mine->tensor_data(0), last->tensor_data(0)) << Sim::Name(i);
  }
  EXPECT_GT(failed_over, 0) << "round 1 never left the aborted aggregator";
}

}  // namespace
}  // namespace sim
}  // namespace swarm
