// What the simulations check about a finished job (sim_*_test.cc): exact
// aggregates round by round, elections, identical final models, and when
// things happened, read from the fake network's log.
#ifndef SWARM_CONTROLLER_SIM_EXPECT_H_
#define SWARM_CONTROLLER_SIM_EXPECT_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "config/election.h"
#include "config/job_config.h"
#include "controller/fake_network.h"
#include "controller/model_store.h"
#include "controller/sim_harness.h"
#include "controller/site_driver.h"
#include "controller/task_runner.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "learner/test_learner.h"

namespace swarm {
namespace sim {

// sum_k c_k * (prev + d_k) / sum_k c_k over the trainers `included`, as the
// trainers (F32 addition) and FedAvg compute it when everything is exact.
inline std::vector<float> ExpectedAggregate(Sim& sim,
                                            const std::vector<float>& prev,
                                            const std::vector<int>& included) {
  double total = 0;
  for (int k : included) {
    total += static_cast<double>(sim.learner(k).options().sample_count);
  }
  int exponent = 0;
  EXPECT_EQ(std::frexp(total, &exponent), 0.5)
      << "the test's weights must total a power of two (exactness)";
  std::vector<float> next(prev.size());
  for (size_t i = 0; i < prev.size(); ++i) {
    double sum = 0;
    for (int k : included) {
      const TestLearnerOptions& options = sim.learner(k).options();
      const float trained = prev[i] + options.delta;
      sum += static_cast<double>(options.sample_count) * trained;
    }
    next[i] = static_cast<float>(sum / total);
  }
  return next;
}

inline std::vector<int> AllTrainers(Sim& sim) {
  std::vector<int> trainers;
  for (int i = 0; i < sim.size(); ++i) {
    if (sim.IsTrainer(i)) trainers.push_back(i);
  }
  return trainers;
}

// Every round's aggregate is exactly the weighted average of the results of
// `included(round)` over that round's global model; the last one is the
// LAST model of every site in `done_sites`; each aggregate is also what
// that round's elected aggregator stored. Returns the globals.
inline std::map<uint32_t, std::vector<float>> ExpectExactRounds(
    Sim& sim, const std::function<std::vector<int>(uint32_t)>& included,
    const std::vector<int>& done_sites) {
  std::map<uint32_t, std::vector<float>> globals = sim.Globals();
  const uint32_t first = sim.job().start_round();
  const uint32_t end = first + sim.rounds();
  std::vector<float> initial;
  {
    absl::StatusOr<Model> model = sim.learner(0).InitialModel();
    EXPECT_TRUE(model.ok());
    initial = Floats(*model);
  }
  EXPECT_TRUE(globals[first] == initial) << "round " << first;
  for (int i : done_sites) {
    std::shared_ptr<const Model> last = sim.Final(i, v1::MODEL_KIND_LAST);
    EXPECT_NE(last, nullptr) << Sim::Name(i) << " has no LAST model";
    if (last == nullptr) continue;
    auto [it, inserted] = globals.emplace(end, Floats(*last));
    if (!inserted) {
      EXPECT_TRUE(it->second == Floats(*last))
          << Sim::Name(i) << ": LAST differs";
    }
  }
  for (uint32_t round = first; round < end; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto prev = globals.find(round);
    auto next = globals.find(round + 1);
    if (prev == globals.end() || next == globals.end()) {
      ADD_FAILURE() << "no global model seen for round " << round << " or "
                    << round + 1;
      continue;
    }
    const std::vector<float> expected =
        ExpectedAggregate(sim, prev->second, included(round));
    EXPECT_TRUE(next->second == expected)
        << "aggregate of round " << round << ": element 0 is "
        << next->second[0] << ", expected " << expected[0];
    // The elected aggregator kept exactly this model (keep_round_models).
    const int aggregator = sim.Index(sim.Aggregator(round));
    absl::StatusOr<std::shared_ptr<const Model>> kept =
        sim.store(aggregator).LoadRound(kJobId, round + 1);
    EXPECT_TRUE(kept.ok()) << sim.Aggregator(round) << ": " << kept.status();
    if (kept.ok()) {
      EXPECT_TRUE(Floats(**kept) == expected);
    }
  }
  return globals;
}

// Learn tasks name, and results go to, each round's elected aggregator; a
// site completes exactly the rounds it was elected for.
inline void ExpectElectedAggregators(Sim& sim) {
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask ||
        call.kind == CallKind::kSubmitResult) {
      EXPECT_EQ(call.aggregator, sim.Aggregator(call.round))
          << CallKindName(call.kind) << " " << call.from << "->" << call.to;
    }
    if (call.kind == CallKind::kSubmitResult) {
      EXPECT_EQ(call.to, sim.Aggregator(call.round));
    }
  }
  const uint32_t first = sim.job().start_round();
  for (int i = 0; i < sim.size(); ++i) {
    uint64_t elected = 0;
    for (uint32_t round = first; round < first + sim.rounds(); ++round) {
      if (sim.Aggregator(round) == Sim::Name(i)) ++elected;
    }
    EXPECT_EQ(sim.Status(i).counters().rounds_completed(), elected)
        << Sim::Name(i);
  }
}

// BEST and LAST are byte-identical (data and metadata) on every site in
// `sites`, and BEST is round `best_round`'s global model.
inline void ExpectSameFinals(
    Sim& sim, const std::vector<int>& sites,
    const std::map<uint32_t, std::vector<float>>& globals,
    uint32_t best_round) {
  ASSERT_FALSE(sites.empty());
  for (v1::ModelKind kind : {v1::MODEL_KIND_BEST, v1::MODEL_KIND_LAST}) {
    std::shared_ptr<const Model> reference = sim.Final(sites[0], kind);
    ASSERT_NE(reference, nullptr) << v1::ModelKind_Name(kind);
    for (int i : sites) {
      std::shared_ptr<const Model> model = sim.Final(i, kind);
      ASSERT_NE(model, nullptr) << Sim::Name(i) << v1::ModelKind_Name(kind);
      EXPECT_TRUE(model->SameLayout(*reference));
      EXPECT_EQ(model->tensor_data(0), reference->tensor_data(0))
          << Sim::Name(i) << " " << v1::ModelKind_Name(kind);
      EXPECT_EQ(model->metadata(), reference->metadata()) << Sim::Name(i);
    }
  }
  std::shared_ptr<const Model> best = sim.Final(sites[0], v1::MODEL_KIND_BEST);
  auto it = globals.find(best_round);
  ASSERT_NE(it, globals.end());
  EXPECT_TRUE(Floats(*best) == it->second)
      << "BEST is not round " << best_round << "'s model";
  EXPECT_EQ(best->metadata().at("round"), absl::StrCat(best_round));
  EXPECT_EQ(best->metadata().at("best_site"), sim.Aggregator(best_round));
}

// Virtual time at which the first call of `kind` for `round` started, or
// InfiniteFuture.
inline absl::Time FirstCall(Sim& sim, CallKind kind, uint32_t round) {
  absl::Time first = absl::InfiniteFuture();
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == kind && call.round == round) {
      first = std::min(first, call.start);
    }
  }
  return first;
}

// When round `round` closed: its aggregator then scatters the next round
// (or distributes the final models) at once, at the same virtual time.
inline absl::Time RoundClosedAt(Sim& sim, uint32_t round) {
  if (round + 1 < sim.job().start_round() + sim.rounds()) {
    return FirstCall(sim, CallKind::kLearnTask, round + 1);
  }
  absl::Time first = absl::InfiniteFuture();
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kFinalResult)
      first = std::min(first, call.start);
  }
  return first;
}

// When round `round` opened: the aggregator got its learn task after every
// other trainer's (phase two of the scatter).
inline absl::Time RoundOpenedAt(Sim& sim, uint32_t round) {
  const std::string aggregator = sim.Aggregator(round);
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round &&
        call.to == aggregator && call.result == "OK") {
      return call.end;
    }
  }
  // The aggregator scattered to itself: the round opened when its last
  // learn task to a trainer returned.
  absl::Time last = absl::InfinitePast();
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round) {
      last = std::max(last, call.end);
    }
  }
  return last;
}

// Times at which results of `round` were accepted (the calls' returns).
inline std::vector<absl::Time> ResultTimes(Sim& sim, uint32_t round) {
  std::vector<absl::Time> times;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kSubmitResult && call.round == round &&
        call.result == "OK") {
      times.push_back(call.end);
    }
  }
  std::sort(times.begin(), times.end());
  return times;
}

// A trainer that is neither the starting site nor elected in any round
// (so the job does not depend on it), preferring the heaviest weight.
inline int BystanderTrainer(Sim& sim) {
  std::set<std::string> busy = {sim.job().starting_site()};
  const uint32_t first = sim.job().start_round();
  for (uint32_t round = first; round < first + sim.rounds(); ++round) {
    busy.insert(sim.Aggregator(round));
  }
  for (int i = sim.size() - 1; i >= 0; --i) {
    if (busy.count(Sim::Name(i)) == 0 && sim.IsTrainer(i)) return i;
  }
  ADD_FAILURE() << "every site aggregates some round; change the seed";
  return -1;
}

inline std::vector<int> AllSites(Sim& sim) {
  std::vector<int> all;
  for (int i = 0; i < sim.size(); ++i) all.push_back(i);
  return all;
}

inline std::vector<int> Without(std::vector<int> sites, int site) {
  sites.erase(std::remove(sites.begin(), sites.end(), site), sites.end());
  return sites;
}

// Every site ended DONE.
inline void ExpectAllDone(Sim& sim) {
  for (int i : AllSites(sim)) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << status.last_error();
  }
}

// Runs `config` on real thread pools (Threaded): every site ends DONE and
// every round's aggregate holds every trainer's result, exactly.
inline void ExpectThreadedJobExact(SimConfig config) {
  Sim sim(Threaded(std::move(config)));
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(120)));
  ExpectAllDone(sim);
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
}

// The final models and every round's global model of a job.
struct JobOutcome {
  std::map<uint32_t, std::vector<float>> globals;
  std::vector<std::string> best;
  std::vector<std::string> last;
  uint64_t accepted = 0;
};

inline JobOutcome Outcome(Sim& sim) {
  JobOutcome outcome;
  outcome.globals = sim.Globals();
  for (int i = 0; i < sim.size(); ++i) {
    std::shared_ptr<const Model> best = sim.Final(i, v1::MODEL_KIND_BEST);
    std::shared_ptr<const Model> last = sim.Final(i, v1::MODEL_KIND_LAST);
    outcome.best.push_back(best ? std::string(best->tensor_data(0)) : "");
    outcome.last.push_back(last ? std::string(last->tensor_data(0)) : "");
    outcome.accepted += sim.Status(i).counters().results_accepted();
  }
  return outcome;
}

}  // namespace sim
}  // namespace swarm

#endif  // SWARM_CONTROLLER_SIM_EXPECT_H_
