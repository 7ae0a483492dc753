// Simulations of aggregator failover (design section 6): the elected
// aggregator of a round is cut off for good at each point of the round, or
// a partition lets two sites aggregate one round; the job must complete on
// every other site with exact aggregates (nothing accepted is lost) and
// identical final models, in bounded virtual time.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <tuple>

#include "absl/strings/str_join.h"
#include "controller/sim_expect.h"
#include "controller/sim_harness.h"

namespace swarm {
namespace sim {
namespace {

using ::testing::Gt;

// The first round (>= 1) whose aggregator is neither the starting site nor
// the aggregator of the round before.
uint32_t RoundToBreak(Sim& sim) {
  for (uint32_t round = 1; round + 1 < sim.rounds(); ++round) {
    const std::string aggregator = sim.Aggregator(round);
    if (aggregator != sim.job().starting_site() &&
        aggregator != sim.Aggregator(round - 1) &&
        aggregator != sim.Aggregator(round + 1)) {
      return round;
    }
  }
  return sim.rounds();
}

// Where in round r its aggregator is cut off for good.
enum class KillPoint {
  kBeforeItsTask,       // As the round's first learn task goes out.
  kWhileTrainersTrain,  // At the first call a trainer makes to it.
  kWhileGathering,      // As its second result starts (one is in).
  kBeforeItsScatter,    // As it sends round r+1's first learn task.
};

std::string Name(KillPoint point) {
  switch (point) {
    case KillPoint::kBeforeItsTask:
      return "BeforeItsTask";
    case KillPoint::kWhileTrainersTrain:
      return "WhileTrainersTrain";
    case KillPoint::kWhileGathering:
      return "WhileGathering";
    case KillPoint::kBeforeItsScatter:
      return "BeforeItsScatter";
  }
  return "?";
}

// Every round's global model, as the sites in `sites` received it, is
// exactly the weighted average of the round before over every site before
// round `cut` and over `sites` from it on; the last one is their LAST.
void ExpectExactAmong(Sim& sim, const std::vector<int>& sites, uint32_t cut) {
  std::map<uint32_t, std::vector<float>> globals;
  for (int i : sites) {
    for (const auto& [r, values] : sim.learner(i).globals()) {
      auto [it, inserted] = globals.emplace(r, values);
      if (!inserted) {
        EXPECT_TRUE(it->second == values)
            << Sim::Name(i) << " got another global model in round " << r;
      }
    }
  }
  std::shared_ptr<const Model> last = sim.Final(sites[0], v1::MODEL_KIND_LAST);
  ASSERT_NE(last, nullptr);
  globals[sim.rounds()] = Floats(*last);
  const std::vector<int> all = AllSites(sim);
  for (uint32_t r = 0; r < sim.rounds(); ++r) {
    SCOPED_TRACE(absl::StrCat("round ", r));
    ASSERT_EQ(globals.count(r), 1u);
    ASSERT_EQ(globals.count(r + 1), 1u);
    const std::vector<float> expected =
        ExpectedAggregate(sim, globals[r], r < cut ? all : sites);
    EXPECT_TRUE(globals[r + 1] == expected);
  }
}

// (kill point, sites): 4, 5, 8 or 9 sites.
class FailoverTest
    : public ::testing::TestWithParam<std::tuple<KillPoint, int>> {};

TEST_P(FailoverTest, RoundMovesToTheBackupAndNothingAcceptedIsLost) {
  // N sites, 5 rounds. The survivors weigh 1 each but one, which makes
  // their total the power of two P at or above N - 1; the dead aggregator
  // weighs P: every round's total weight is then a power of two with or
  // without it (the aggregates are exact to the bit).
  const KillPoint point = std::get<0>(GetParam());
  const int sites = std::get<1>(GetParam());
  SimConfig config = Config(sites, 5);
  Sim probe(config);
  const uint32_t round = RoundToBreak(probe);
  ASSERT_LT(round, probe.rounds()) << "change the seed";
  const int dead = probe.Index(probe.Aggregator(round));
  uint64_t power = 1;
  while (power < static_cast<uint64_t>(sites - 1)) power *= 2;
  const int heavy = dead == 0 ? 1 : 0;  // The survivor that tops up.
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == dead ? power
                            : i == heavy
                                ? power - static_cast<uint64_t>(sites - 2)
                                : 1;
  };
  Sim sim(config);
  const std::string aggregator = Sim::Name(dead);
  int seen = 0;
  absl::Time killed = absl::InfiniteFuture();
  sim.network().SetObserver([&](const CallRecord& call) {
    if (killed != absl::InfiniteFuture()) return;
    bool kill = false;
    switch (point) {
      case KillPoint::kBeforeItsTask:
        kill = call.kind == CallKind::kLearnTask && call.round == round;
        break;
      case KillPoint::kWhileTrainersTrain:
        kill = call.kind == CallKind::kRequestToSubmit && call.round == round &&
               call.to == aggregator;
        break;
      case KillPoint::kWhileGathering:
        kill = call.kind == CallKind::kSubmitResult && call.round == round &&
               call.to == aggregator && ++seen == 2;
        break;
      case KillPoint::kBeforeItsScatter:
        kill = call.kind == CallKind::kLearnTask && call.round == round + 1 &&
               call.from == aggregator;
        break;
    }
    if (kill) {
      sim.network().Isolate(aggregator);
      killed = sim.runner().Now();
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_NE(killed, absl::InfiniteFuture()) << "the kill point never came";

  const std::vector<int> alive = Without(AllSites(sim), dead);
  for (int i : alive) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  // The round moved to the next site of its election order, and every
  // site that saw it says so.
  const std::string backup = ElectionOrder(sim.job(), round).at(1);
  int saw = 0;
  for (int i : alive) {
    const v1::SiteStatus status = sim.Status(i);
    for (const v1::Failover& failover : status.failovers()) {
      if (failover.round() != round) continue;
      EXPECT_EQ(failover.from(), aggregator);
      EXPECT_EQ(failover.to(), backup);
      ++saw;
    }
  }
  EXPECT_THAT(saw, Gt(0));
  EXPECT_THAT(sim.Status(sim.Index(backup)).counters().rounds_taken_over(),
              Gt(0u));
  // Exact aggregates: every round before the kill had every trainer; from
  // round r on, every trainer but the dead one (a result it accepted before
  // dying is resubmitted to the backup, its own is lost with it).
  ExpectExactAmong(sim, alive, round);
  for (v1::ModelKind kind : {v1::MODEL_KIND_BEST, v1::MODEL_KIND_LAST}) {
    std::shared_ptr<const Model> reference = sim.Final(alive[0], kind);
    ASSERT_NE(reference, nullptr);
    for (int i : alive) {
      std::shared_ptr<const Model> model = sim.Final(i, kind);
      ASSERT_NE(model, nullptr) << Sim::Name(i);
      EXPECT_EQ(model->tensor_data(0), reference->tensor_data(0))
          << Sim::Name(i);
    }
  }
  // Bounded: the round completed at the backup within the failover bounds
  // (two failover timeouts: the trainers' detection and the backup's wait
  // for trainers to come forward) plus one ordinary round.
  const absl::Duration failover =
      absl::Milliseconds(sim.job().failover_timeout_ms());
  // The backup closed the round when it scattered the next one.
  absl::Time closed = absl::InfiniteFuture();
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round + 1 &&
        call.from == backup) {
      closed = std::min(closed, call.start);
    }
  }
  ASSERT_NE(closed, absl::InfiniteFuture()) << "the backup never scattered";
  std::printf(
      "[ failover ] %d sites, %s: round %u closed at the backup %s after the "
      "kill\n",
      sites, Name(point).c_str(), round,
      absl::FormatDuration(closed - killed).c_str());
  EXPECT_LE(closed - killed, 2 * failover + absl::Seconds(10))
      << "round " << round << " closed " << RoundClosedAt(sim, round) - killed
      << " after the kill";
}

INSTANTIATE_TEST_SUITE_P(
    KillPoints, FailoverTest,
    ::testing::Combine(::testing::Values(KillPoint::kBeforeItsTask,
                                         KillPoint::kWhileTrainersTrain,
                                         KillPoint::kWhileGathering,
                                         KillPoint::kBeforeItsScatter),
                       ::testing::Values(4, 5, 8, 9)),
    [](const ::testing::TestParamInfo<std::tuple<KillPoint, int>>& info) {
      return absl::StrCat(Name(std::get<0>(info.param)), "_",
                          std::get<1>(info.param), "Sites");
    });

// Server momentum (lr 1, beta1 0.5) through a failover: the optimizer's
// state travels with the global model, so the backup that takes round r
// over (from round r's learn task, whose model carries the state) steps
// with the same momentum the dead aggregator would have. Every round's
// global model must follow the recurrence m = beta1 m + (mean - x),
// x' = x + m over the exact means, with no restart of m at the failover
// (a restart would make the step after it d instead of beta1 m + d). The
// final models carry no state.
class MomentumFailoverTest : public ::testing::TestWithParam<KillPoint> {};

TEST_P(MomentumFailoverTest, StateSurvivesTheMoveToTheBackup) {
  const KillPoint point = GetParam();
  constexpr int kSites = 5;
  auto momentum = [](v1::JobConfig* job) {
    job->set_server_optimizer(v1::SERVER_OPTIMIZER_MOMENTUM);
  };
  SimConfig config = Config(kSites, 5, momentum);
  Sim probe(config);
  const uint32_t round = RoundToBreak(probe);
  ASSERT_LT(round, probe.rounds()) << "change the seed";
  const int dead = probe.Index(probe.Aggregator(round));
  // Exact means (ExpectedAggregate): the four survivors weigh 1 each, the
  // dead site 4, so the totals are 4 without it and 8 with it. Different
  // deltas per site make the mean depend on who is in it.
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == dead ? 4 : 1;
    options->delta = 0.125f * static_cast<float>(i + 1);
  };
  Sim sim(config);
  const std::string aggregator = Sim::Name(dead);
  bool killed = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (killed) return;
    const bool kill =
        point == KillPoint::kBeforeItsScatter
            ? call.kind == CallKind::kLearnTask && call.round == round + 1 &&
                  call.from == aggregator
            : call.kind == CallKind::kRequestToSubmit && call.round == round &&
                  call.to == aggregator;
    if (kill) {
      sim.network().Isolate(aggregator);
      killed = true;
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(killed) << "the kill point never came";
  const std::vector<int> alive = Without(AllSites(sim), dead);
  for (int i : alive) {
    ASSERT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  std::map<uint32_t, std::vector<float>> globals;
  for (int i : alive) {
    for (const auto& [r, values] : sim.learner(i).globals()) {
      globals.emplace(r, values);
    }
  }
  std::shared_ptr<const Model> last = sim.Final(alive[0], v1::MODEL_KIND_LAST);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->num_tensors(), 1u) << "LAST carries optimizer state";
  globals[sim.rounds()] = Floats(*last);
  const std::vector<int> all = AllSites(sim);
  std::vector<double> m;
  for (uint32_t r = 0; r < sim.rounds(); ++r) {
    SCOPED_TRACE(absl::StrCat("round ", r));
    ASSERT_EQ(globals.count(r), 1u);
    ASSERT_EQ(globals.count(r + 1), 1u);
    const std::vector<float>& x = globals[r];
    const std::vector<float> mean =
        ExpectedAggregate(sim, x, r < round ? all : alive);
    m.resize(x.size(), 0.0);
    for (size_t i = 0; i < x.size(); ++i) {
      m[i] = 0.5 * m[i] + (static_cast<double>(mean[i]) - x[i]);
      EXPECT_NEAR(globals[r + 1][i], x[i] + m[i], 1e-4)
          << "element " << i << " of round " << r + 1 << "'s global model";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    KillPoints, MomentumFailoverTest,
    ::testing::Values(KillPoint::kWhileTrainersTrain,
                      KillPoint::kBeforeItsScatter),
    [](const ::testing::TestParamInfo<KillPoint>& info) {
      return Name(info.param);
    });

// Every site of `sites` holds BEST and LAST, the same at each.
void ExpectIdenticalFinals(Sim& sim, const std::vector<int>& sites) {
  for (v1::ModelKind kind : {v1::MODEL_KIND_BEST, v1::MODEL_KIND_LAST}) {
    std::shared_ptr<const Model> reference = sim.Final(sites[0], kind);
    ASSERT_NE(reference, nullptr);
    for (int i : sites) {
      std::shared_ptr<const Model> model = sim.Final(i, kind);
      ASSERT_NE(model, nullptr) << Sim::Name(i);
      EXPECT_EQ(model->tensor_data(0), reference->tensor_data(0))
          << Sim::Name(i) << " " << v1::ModelKind_Name(kind);
    }
  }
}

// Every site of `sites` that kept round r's model (keep_round_models) holds
// the same bits: a kept model of a chain that lost was set aside.
void ExpectKeptRoundsAgree(Sim& sim, const std::vector<int>& sites) {
  for (uint32_t r = 1; r <= sim.rounds(); ++r) {
    std::shared_ptr<const Model> first;
    std::string holder;
    for (int i : sites) {
      absl::StatusOr<std::shared_ptr<const Model>> kept =
          sim.store(i).LoadRound(kJobId, r);
      if (!kept.ok()) continue;
      if (first == nullptr) {
        first = *kept;
        holder = Sim::Name(i);
        continue;
      }
      EXPECT_EQ((*kept)->tensor_data(0), first->tensor_data(0))
          << "round " << r << ": " << Sim::Name(i) << " and " << holder
          << " kept different models";
    }
  }
}

TEST(SimTest, PartitionThatLetsTwoSitesAggregateOneRoundEndsInOneChain) {
  // Round r's aggregator A and one trainer are cut off from the other three
  // sites for 20 s: the three fail over to the backup B, so A (attempt 0)
  // and B (attempt 1) both aggregate round r. After the heal, the lower
  // attempt's chain wins everywhere: every site ends with the same BEST
  // and LAST, and the sites on B's side report the aggregate they dropped.
  SimConfig config = Config(5, 6);
  Sim probe(config);
  const uint32_t round = RoundToBreak(probe);
  ASSERT_LT(round, probe.rounds());
  Sim sim(config);
  const std::vector<std::string> order = ElectionOrder(sim.job(), round);
  std::set<std::string> side = {order[0]};
  // One more trainer with A: not B, not the scatterer of round r.
  for (const std::string& name : order) {
    if (name != order[0] && name != order[1] &&
        name != sim.Aggregator(round - 1)) {
      side.insert(name);
      break;
    }
  }
  ASSERT_EQ(side.size(), 2u);
  bool cut = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    // Once A holds its task (it asks nobody; the first result goes to it).
    if (!cut && call.kind == CallKind::kSubmitResult && call.round == round) {
      cut = true;
      sim.network().Partition(side);
      sim.runner().PostAfter(absl::Seconds(20), [&] { sim.network().Heal(); });
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(cut);
  const std::vector<int> all = AllSites(sim);
  uint64_t dropped = 0;
  for (int i : all) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << status.last_error();
    dropped += status.counters().discarded_aggregates();
  }
  ExpectIdenticalFinals(sim, all);
  // Both attempts aggregated round r, and one was dropped.
  bool backup_aggregated = false;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round + 1 &&
        call.from == order[1]) {
      backup_aggregated = true;
    }
  }
  EXPECT_TRUE(backup_aggregated) << "the partition never split the round";
  EXPECT_THAT(dropped, Gt(0u));
  ExpectKeptRoundsAgree(sim, all);
  // The lower attempt's chain won: the final models' chain has round r at
  // attempt 0 on every site.
  for (int i : all) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.attempt(), 0u) << Sim::Name(i);
  }
}

// Found on a real network (four hosts, iptables): while round r's
// aggregator A gathers (it has B's result and its own), A is cut from the
// two other sites C and D for 45 s, but B still reaches everyone. C and D
// fail round r over to the backup; B, a bridge, trains in both chains, and
// may aggregate a round of the losing one. After the heal the lower
// attempt wins: every site must end done (none fails itself for being on
// the losing side, its own loopback task included), with identical BEST
// and LAST and identical kept round models.
TEST(SimTest, CutThatLeavesABridgeBetweenTwoChainsEndsWithEverySiteDone) {
  SimConfig config = Config(4, 10, [](v1::JobConfig* job) {
    job->set_failover_timeout_ms(5'000);
    job->set_round_timeout_ms(60'000);
  });
  Sim probe(config);
  const uint32_t round = RoundToBreak(probe);
  ASSERT_LT(round, probe.rounds());
  Sim sim(config);
  const std::string aggregator = sim.Aggregator(round);
  bool cut = false;
  std::string bridge;
  std::set<std::string> others;
  // Rounds of about 5 s, as on the real network (where training took
  // seconds): the cut then spans a few rounds, and the job goes on after it.
  sim.network().AddDelay(Calls(CallKind::kLearnTask), absl::Seconds(5));
  sim.network().SetObserver([&](const CallRecord& call) {
    if (cut || call.kind != CallKind::kSubmitResult || call.round != round ||
        call.to != aggregator) {
      return;
    }
    cut = true;
    bridge = call.from;
    for (int i : AllSites(sim)) {
      if (Sim::Name(i) != aggregator && Sim::Name(i) != bridge) {
        others.insert(Sim::Name(i));
      }
    }
    sim.network().CutLinks(aggregator, others);
    sim.runner().PostAfter(absl::Seconds(45), [&] { sim.network().Heal(); });
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(cut);
  SCOPED_TRACE(absl::StrCat("round ", round, ": ", aggregator, " cut from ",
                            absl::StrJoin(others, ","), "; bridge ", bridge));
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << status.last_error();
  }
  ExpectIdenticalFinals(sim, all);
  ExpectKeptRoundsAgree(sim, all);
}

// Found on a real network (NetFaults.AggregatorKilledBeforeItsTaskArrives-
// Restarts): round r's aggregator A came back from a restart in time to get
// round r's learn task at attempt 0, and the backup B (a trainer) submitted
// its result to it; but trainer T could not reach A yet (its connection
// was still refused) and handed the round over to B. Had B opened attempt
// 1, attempt 0 would have won everywhere without T's result. B knows A
// holds the round (A answered it within the failover bounds), so it
// declines the handoff; T goes back to A and submits there once it can
// reach it again (2 s after the handoff here).
TEST(SimTest, HandoffToABackupThatStillReachesTheAggregatorIsDeclined) {
  SimConfig config = Config(4, 5);
  Sim probe(config);
  const uint32_t round = RoundToBreak(probe);
  ASSERT_LT(round, probe.rounds());
  Sim sim(config);
  const std::vector<std::string> order = ElectionOrder(sim.job(), round);
  const std::string aggregator = order[0];
  const std::string backup = order[1];
  std::string trainer;  // Not A, not B, not the scatterer of round r.
  for (const std::string& name : order) {
    if (name != aggregator && name != backup &&
        name != sim.Aggregator(round - 1)) {
      trainer = name;
      break;
    }
  }
  ASSERT_FALSE(trainer.empty());
  bool cut = false;
  bool handed = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!cut && call.kind == CallKind::kLearnTask && call.round == round) {
      cut = true;
      sim.network().CutLinks(trainer, {aggregator});
    }
    if (cut && !handed && call.kind == CallKind::kLearnTask &&
        call.round == round && call.from == trainer && call.to == backup) {
      handed = true;
      sim.runner().PostAfter(absl::Seconds(2), [&] { sim.network().Heal(); });
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(handed) << trainer << " never handed round " << round
                      << " over to " << backup;
  SCOPED_TRACE(absl::StrCat("round ", round, ": ", trainer, " cut from ",
                            aggregator, "; backup ", backup));
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << status.last_error();
    EXPECT_EQ(status.counters().discarded_aggregates(), 0u) << Sim::Name(i);
  }
  EXPECT_EQ(sim.Status(sim.Index(backup)).counters().rounds_taken_over(), 0u);
  // Nothing lost: every round's aggregate has every site's result.
  ExpectExactAmong(sim, all, sim.rounds());
  ExpectIdenticalFinals(sim, all);
}

TEST(SimTest, TrainerDeadMidRoundIsDroppedWithinTwoFailoverTimeouts) {
  // A bystander trainer acknowledges round 1's task and dies at once (cut
  // off for good): it never probes its aggregator again. The round must
  // not wait for it until round_timeout (600 s): it closes once the trainer
  // has been silent for two failover timeouts (10 s), reporting it.
  SimConfig config = Config(5, 3);
  Sim probe(config);
  const int dead = BystanderTrainer(probe);
  ASSERT_GE(dead, 0);
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == dead ? 4 : 1;
  };
  Sim sim(config);
  const std::string name = Sim::Name(dead);
  bool cut = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    // Its own call after the task: the first probe of round 1.
    if (!cut && call.kind == CallKind::kRequestToSubmit && call.round == 1 &&
        call.from == name) {
      cut = true;
      sim.network().Isolate(name);
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(cut);
  const std::vector<int> alive = Without(AllSites(sim), dead);
  for (int i : alive) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  const absl::Duration took = RoundClosedAt(sim, 1) - RoundOpenedAt(sim, 1);
  EXPECT_LE(took, absl::Seconds(25)) << took;
  const v1::SiteStatus aggregator = sim.Status(sim.Index(sim.Aggregator(1)));
  EXPECT_EQ(aggregator.counters().trainers_dropped(), 1u);
  ExpectExactAmong(sim, alive, /*cut=*/1);
}

// Disk faults (issue 11, item 6), through FaultInjectionModelStore and a
// real offload directory that goes away.

// A site whose workspace is full fails at its first write (the state file
// at its first learn task), naming the path; the job goes on without it,
// including the round it was elected to aggregate, with exact aggregates.
TEST(DiskFaultTest, TrainerWithAFullWorkspaceLeavesAndTheOthersFinish) {
  SimConfig config = Config(5, 4);
  Sim probe(config);
  const uint32_t round = RoundToBreak(probe);
  ASSERT_LT(round, probe.rounds()) << "change the seed";
  const int full = probe.Index(probe.Aggregator(round));
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == full ? 4 : 1;
  };
  Sim sim(config);
  sim.Configure();
  sim.disk(full).FailWrites(absl::ResourceExhaustedError(
      "write /ws/jobs/sim/state.json: No space left on device"));
  sim.Start();
  sim.runner().RunUntilIdle();
  const v1::SiteStatus failed = sim.Status(full);
  EXPECT_EQ(failed.state(), v1::SITE_STATE_FAILED);
  EXPECT_THAT(failed.last_error(), HasSubstr("saving"));
  EXPECT_THAT(failed.last_error(), HasSubstr("/ws/jobs/sim/state.json"));
  EXPECT_THAT(failed.end_reason(), HasSubstr("No space left on device"));
  EXPECT_GT(sim.disk(full).failed_writes(), 0);
  const std::vector<int> alive = Without(AllSites(sim), full);
  for (int i : alive) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  // The round it was elected for went to the backup.
  int saw = 0;
  for (int i : alive) {
    const v1::SiteStatus status = sim.Status(i);
    for (const v1::Failover& f : status.failovers()) {
      if (f.round() == round && f.from() == Sim::Name(full)) ++saw;
    }
  }
  EXPECT_GT(saw, 0);
  ExpectExactAmong(sim, alive, /*cut=*/0);
}

// The aggregator's offload directory disappears while it gathers (a disk
// unmounted, a cleanup gone wrong): the next result cannot be stored. That
// result is not refused as the trainer's fault nor RETRY forever: the
// aggregator fails naming the path, and the round moves to the backup with
// every result (the trainers kept theirs).
TEST(DiskFaultTest, AggregatorWhoseOffloadDiskFailsWhileGatheringIsPassedOver) {
  const int sites = 5;
  SimConfig config =
      Config(sites, 5, [](v1::JobConfig* job) { job->set_disk_offload(true); });
  Sim probe(config);
  const uint32_t round = RoundToBreak(probe);
  ASSERT_LT(round, probe.rounds()) << "change the seed";
  const int broken = probe.Index(probe.Aggregator(round));
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == broken ? static_cast<uint64_t>(sites - 1) : 1;
  };
  Sim sim(config);
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("swarm-disk-fault-", getpid());
  std::filesystem::remove_all(root);
  for (int i = 0; i < sim.size(); ++i) {
    const std::filesystem::path dir = root / Sim::Name(i);
    std::filesystem::create_directories(dir);
    sim.disk(i).set_offload_dir(dir.string());
  }
  const std::string name = Sim::Name(broken);
  const std::filesystem::path gone = root / name;
  int seen = 0;
  bool removed = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!removed && call.kind == CallKind::kSubmitResult &&
        call.round == round && call.to == name && ++seen == 2) {
      removed = true;
      std::filesystem::remove_all(gone);
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(removed) << "round " << round << " never got a second result";
  const v1::SiteStatus failed = sim.Status(broken);
  EXPECT_EQ(failed.state(), v1::SITE_STATE_FAILED);
  EXPECT_THAT(failed.last_error(), HasSubstr("storing the result"));
  EXPECT_THAT(failed.last_error(), HasSubstr(gone.string()));
  const std::vector<int> alive = Without(AllSites(sim), broken);
  for (int i : alive) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  EXPECT_THAT(sim.Status(sim.Index(ElectionOrder(sim.job(), round).at(1)))
                  .counters()
                  .rounds_taken_over(),
              Gt(0u));
  // Nothing accepted is lost: the result the broken aggregator had stored
  // before its disk went, and the one it could not store, are in the
  // backup's aggregate (only the broken site's own result is not).
  ExpectExactAmong(sim, alive, round);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace sim
}  // namespace swarm
