// Simulated jobs with chain reduction of results
// (JobConfig.reduce_results_in_chain): the aggregator answers the trainers'
// requests together with a chain, the partial sum goes from trainer to
// trainer and reaches the aggregator as one stream; a break sends the
// trainers it did not carry back to direct submissions. The fake network
// passes the sum on chunk by chunk as PeerService does, through the same
// RelayProtocol (fake_relay.cc).
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/fake_network.h"
#include "controller/sim_expect.h"
#include "controller/sim_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace sim {
namespace {

void Chain(v1::JobConfig* job) { job->set_reduce_results_in_chain(true); }

// Result and partial-sum streams into `round`'s aggregator from other sites.
std::vector<CallRecord> IntoAggregator(Sim& sim, uint32_t round) {
  std::vector<CallRecord> calls;
  const std::string aggregator = sim.Aggregator(round);
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kSubmitResult && call.round == round &&
        call.to == aggregator && call.from != aggregator) {
      calls.push_back(call);
    }
  }
  return calls;
}

// Differential privacy: each hop adds its site's epsilon spent to the
// partial sum's header, so the aggregator (one stream in) still learns every
// trainer's, and the final models carry them all, the same at every site.
TEST(SimChainTest, CarriesEveryTrainersEpsilonIntoTheFinals) {
  Sim chain(Config(6, 3, Chain));
  for (int i = 0; i < 6; ++i) {
    chain.learner(i).SimulatePrivacy(0.5 * (i + 1), std::nullopt);
  }
  chain.RunJob();
  ExpectAllDone(chain);
  // Partial sums carried the results (not direct submissions).
  int partial = 0;
  for (const CallRecord& call : chain.network().Log()) {
    if (call.model_kind == v1::MODEL_KIND_PARTIAL_SUM) ++partial;
  }
  EXPECT_GT(partial, 0);
  for (v1::ModelKind kind : {v1::MODEL_KIND_LAST, v1::MODEL_KIND_BEST}) {
    std::shared_ptr<const Model> reference = chain.Final(0, kind);
    ASSERT_NE(reference, nullptr);
    for (int i : AllSites(chain)) {
      const std::string key = absl::StrCat("privacy.", Sim::Name(i));
      ASSERT_EQ(reference->metadata().count(key), 1u)
          << v1::ModelKind_Name(kind) << " " << key;
      EXPECT_EQ(reference->metadata().at(key),
                absl::StrFormat("epsilon=%g delta=1e-05 rounds=3",
                                0.5 * (i + 1) * 3));
      EXPECT_EQ(chain.Final(i, kind)->metadata(), reference->metadata());
    }
  }
}

TEST(SimChainTest, GivesTheStarsAggregatesWithOneModelIntoTheAggregator) {
  Sim star(Config(8, 4));
  star.RunJob();
  Sim chain(Config(8, 4, Chain));
  chain.RunJob();

  ExpectAllDone(chain);
  const auto star_globals = ExpectExactRounds(
      star, [&](uint32_t) { return AllTrainers(star); }, AllSites(star));
  const auto globals = ExpectExactRounds(
      chain, [&](uint32_t) { return AllTrainers(chain); }, AllSites(chain));
  // Bit-identical: the harness's values and sample counts (1 and 3) make
  // every product and sum exact in F32, so neither the order of the terms
  // nor the partial sum's F32 rounding on its way can change a bit.
  EXPECT_TRUE(globals == star_globals);
  ExpectSameFinals(chain, AllSites(chain), globals, kBestRound);

  const uint64_t model_bytes = globals.at(0).size() * sizeof(float);
  for (uint32_t round = 0; round < 4; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // One stream into the aggregator: the partial sum of the 7 others.
    const std::vector<CallRecord> in = IntoAggregator(chain, round);
    ASSERT_EQ(in.size(), 1u);
    EXPECT_EQ(in[0].model_kind, v1::MODEL_KIND_PARTIAL_SUM);
    EXPECT_EQ(in[0].body_bytes, model_bytes);
    EXPECT_EQ(in[0].result, "OK");
    // Along the chain: each other trainer sends one partial sum.
    std::multiset<std::string> senders;
    for (const CallRecord& call : chain.network().Log()) {
      if (call.kind == CallKind::kSubmitResult && call.round == round &&
          call.from != chain.Aggregator(round)) {
        EXPECT_EQ(call.model_kind, v1::MODEL_KIND_PARTIAL_SUM)
            << call.from << " -> " << call.to;
        senders.insert(call.from);
      }
    }
    EXPECT_EQ(senders.size(), 7u);
    for (const std::string& site : senders) {
      EXPECT_EQ(senders.count(site), 1u) << site;
    }
  }
}

// A trainer on the chain is cut off when the partial sum comes to it, and
// back a moment later: the trainers before it get the failure back and
// submit directly, those after it wait out the chain and submit directly,
// and it submits its own. Every round has every trainer's result, exactly.
TEST(SimChainTest, AHopDownMidChainSendsEveryoneBackToDirectSubmission) {
  Sim sim(Config(8, 3, Chain));
  std::string down;
  bool recovered = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (call.kind != CallKind::kSubmitResult || call.round != 1) return;
    if (down.empty() && call.model_kind == v1::MODEL_KIND_PARTIAL_SUM &&
        call.to != sim.Aggregator(1)) {
      down = call.to;
      sim.network().Isolate(down);
    } else if (!down.empty() && !recovered &&
               call.model_kind == v1::MODEL_KIND_RESULT) {
      recovered = true;  // The first direct submission after the break.
      sim.network().Recover(down);
    }
  });
  sim.RunJob();
  ASSERT_FALSE(down.empty()) << "round 1 had no chain";
  EXPECT_TRUE(recovered) << "nobody submitted directly after the break";

  ExpectAllDone(sim);
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
  // Round 1: direct results into the aggregator, none of them twice.
  std::multiset<std::string> direct;
  for (const CallRecord& call : IntoAggregator(sim, 1)) {
    if (call.model_kind == v1::MODEL_KIND_RESULT && call.result == "OK") {
      direct.insert(call.from);
    }
  }
  EXPECT_GE(direct.size(), 2u);
  EXPECT_EQ(direct.count(down), 1u) << down << " did not submit its own";
  for (const std::string& site : direct) {
    EXPECT_EQ(direct.count(site), 1u) << site;
  }
  // Rounds without a fault still went as one chain.
  EXPECT_EQ(IntoAggregator(sim, 2).size(), 1u);
}

// The last hop's stream to the aggregator is lost: every trainer of the
// chain gets the failure back, submits directly, and the round loses
// nothing.
TEST(SimChainTest, APartialSumLostOnItsLastHopLosesNothing) {
  Sim sim(Config(8, 2, Chain));
  bool cut = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!cut && call.kind == CallKind::kSubmitResult && call.round == 0 &&
        call.model_kind == v1::MODEL_KIND_PARTIAL_SUM &&
        call.to == sim.Aggregator(0)) {
      cut = true;  // The last hop's stream never arrives.
      CallMatcher match;
      match.kind = CallKind::kSubmitResult;
      match.from = call.from;
      match.to = call.to;
      match.round = 0;
      sim.network().AddFault(match, Fault::kDrop, 1);
    }
  });
  sim.RunJob();
  ASSERT_TRUE(cut);
  ExpectAllDone(sim);
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
}

TEST(ThreadedSimChainTest, CompletesWithExactAggregates) {
  ExpectThreadedJobExact(Config(8, 3, Chain));
}

}  // namespace
}  // namespace sim
}  // namespace swarm
