// The relay protocol in simulation (controller/relay_protocol.h, driven by
// the fake network frame by frame, in virtual time): the three chain and
// relay bugs that only the real-network fault tests had found, each as a
// job that fails on the buggy behaviour.
//   0eb4c64  a chain hop read on from two places after backpressure
//   85e995c  a frozen last hop of a chain reduction held the round
//   e6c2267  broadcast stall budgets must grow toward the chain's head
#include <set>
#include <string>
#include <vector>

#include "controller/fake_network.h"
#include "controller/sim_expect.h"
#include "controller/sim_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace sim {
namespace {

using ::testing::IsEmpty;

// 64 Ki floats: 64 chunks of 4 KiB, so links and queues fill.
void BigModel(int, TestLearnerOptions* options) { options->size = 64 << 10; }

void Chain(v1::JobConfig* job) {
  job->set_reduce_results_in_chain(true);
  job->set_chunk_size(4096);
}
void Broadcast(v1::JobConfig* job) {
  job->set_broadcast_learn_tasks(true);
  job->set_chunk_size(4096);
}

// Partial sums of `round` into its aggregator from other sites.
std::vector<CallRecord> SumsIntoAggregator(Sim& sim, uint32_t round) {
  std::vector<CallRecord> calls;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kSubmitResult && call.round == round &&
        call.model_kind == v1::MODEL_KIND_PARTIAL_SUM &&
        call.to == sim.Aggregator(round)) {
      calls.push_back(call);
    }
  }
  return calls;
}

// 0eb4c64: the link into each aggregator is slow, so every chain's last hop
// runs its queue full and pauses reading many times. Each pause ends with
// exactly one read (two reads at once fed a chunk twice: "overlaps bytes
// already received" at the next hop), and every round is one chain.
TEST(SimRelayTest, AHopUnderBackpressureReadsOnFromOnePlace) {
  Sim sim(Config(8, 3, Chain, BigModel));
  sim.network().set_link_window(2);
  for (uint32_t round = 0; round < 3; ++round) {
    sim.network().AddDelay(
        Calls(CallKind::kSubmitResult, "", sim.Aggregator(round), round),
        absl::ZeroDuration(), absl::Seconds(2));
  }
  sim.RunJob();
  EXPECT_THAT(sim.network().ProtocolErrors(), IsEmpty());
  ExpectAllDone(sim);
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
  for (uint32_t round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::vector<CallRecord> sums = SumsIntoAggregator(sim, round);
    ASSERT_EQ(sums.size(), 1u);
    EXPECT_EQ(sums[0].result, "OK");
  }
}

// 85e995c: round 1's chain's last hop freezes while its partial sum streams
// into the aggregator, for 20 s. The hop before it gives it up (stall), the
// aggregator gives up the silent stream (idle, one failover timeout), and
// the steady trainers submit directly: round 1 closes with them long
// before the frozen site thaws, instead of holding their results with the
// frozen stream.
TEST(SimRelayTest, AFrozenLastHopDoesNotHoldTheRound) {
  Sim sim(Config(8, 3, Chain, BigModel));
  const std::string aggregator = sim.Aggregator(1);
  std::string last_hop;
  absl::Time frozen_at;
  const absl::Duration frozen_for = absl::Seconds(20);
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!last_hop.empty() || call.kind != CallKind::kSubmitResult ||
        call.round != 1 || call.model_kind != v1::MODEL_KIND_PARTIAL_SUM ||
        call.to != aggregator) {
      return;
    }
    last_hop = call.from;
    // A slow last link (the sum takes 4 s), frozen mid-stream.
    sim.network().AddDelay(Calls(CallKind::kSubmitResult, last_hop, aggregator),
                           absl::ZeroDuration(), absl::Seconds(4));
    frozen_at = call.start + absl::Seconds(1);  // Mid-stream.
    sim.runner().PostAt(
        frozen_at, [&sim, site = last_hop] { sim.network().Freeze(site); });
    sim.runner().PostAt(frozen_at + frozen_for,
                        [&sim, site = last_hop] { sim.network().Thaw(site); });
  });
  sim.RunJob();
  ASSERT_FALSE(last_hop.empty()) << "round 1 formed no chain";
  EXPECT_THAT(sim.network().ProtocolErrors(), IsEmpty());
  ExpectAllDone(sim);
  // Round 1 closed before the frozen hop thawed, with every other trainer.
  EXPECT_LT(RoundClosedAt(sim, 1), frozen_at + frozen_for);
  std::set<std::string> direct;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kSubmitResult && call.round == 1 &&
        call.model_kind == v1::MODEL_KIND_RESULT && call.result == "OK") {
      direct.insert(call.from);
    }
  }
  EXPECT_GE(direct.size(), 2u) << "the chain's trainers did not fall back";
  EXPECT_EQ(direct.count(last_hop), 0u);
}

// e6c2267: a trainer in the middle of round 1's broadcast chain freezes as
// the forward reaches it. Backpressure stalls every hop above it; its own
// forwarder must give it up first (the budgets grow toward the head), so
// that the task flows on to the sites before it, and the scatterer sends
// it directly only to the frozen site and the sites after it.
TEST(SimRelayTest, ABroadcastStallGivesUpTheFrozenSiteNotTheHead) {
  Sim sim(Config(8, 3, Broadcast, BigModel));
  sim.network().set_link_window(2);
  const std::string scatterer = sim.Aggregator(0);
  std::vector<std::string> chain;  // Round 1's forwards, in order.
  std::string frozen;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (call.kind != CallKind::kLearnTask || call.round != 1) return;
    if (call.from == scatterer) {
      if (chain.empty() && call.to != sim.Aggregator(1)) {
        chain.push_back(call.to);  // The chain's head.
      }
      return;
    }
    if (chain.empty() || call.from != chain.back()) return;
    chain.push_back(call.to);
    if (frozen.empty() && chain.size() == 4) {
      frozen = call.to;
      sim.network().Freeze(frozen);
      sim.runner().PostAt(call.start + absl::Seconds(60),
                          [&sim, frozen] { sim.network().Thaw(frozen); });
    }
  });
  sim.RunJob();
  ASSERT_FALSE(frozen.empty()) << "round 1's chain is too short";
  EXPECT_THAT(sim.network().ProtocolErrors(), IsEmpty());
  ExpectAllDone(sim);
  // The sites before the frozen one got the task along the chain: no
  // direct send to any of them.
  std::multiset<std::string> direct;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == 1 &&
        call.from == scatterer && call.to != sim.Aggregator(1)) {
      direct.insert(call.to);
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    // The head got the chain's stream, once.
    EXPECT_EQ(direct.count(chain[i]), i == 0 ? 1u : 0u)
        << chain[i] << " (before the frozen " << frozen
        << ") was sent the task directly: the chain was given up above it";
  }
  EXPECT_EQ(direct.count(frozen), 1u) << "no direct send to " << frozen;
}

}  // namespace
}  // namespace sim
}  // namespace swarm
