// Simulated jobs with the pipelined broadcast of learn tasks
// (JobConfig.broadcast_learn_tasks): the scatterer sends one stream, which
// goes along the round's other trainers; a break in the chain falls back to
// direct sends. The fake network forwards frame by frame as PeerService
// does, through the same RelayProtocol (fake_relay.cc).
#include <map>
#include <optional>
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

void Broadcast(v1::JobConfig* job) { job->set_broadcast_learn_tasks(true); }

// The site that scattered `round`: the starting site, then the previous
// round's aggregator (these tests have no failover).
std::string Scatterer(Sim& sim, uint32_t round) {
  return round == 0 ? sim.job().starting_site() : sim.Aggregator(round - 1);
}

// Learn tasks of `round` sent by a site other than its scatterer: the
// forwards along the chain.
std::vector<CallRecord> Forwards(Sim& sim, uint32_t round) {
  const std::string scatterer = Scatterer(sim, round);
  std::vector<CallRecord> forwards;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round &&
        call.from != scatterer) {
      forwards.push_back(call);
    }
  }
  return forwards;
}

// Learn tasks of `round` from its scatterer to other sites.
std::multiset<std::string> DirectTasks(Sim& sim, uint32_t round) {
  const std::string scatterer = Scatterer(sim, round);
  std::multiset<std::string> targets;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round &&
        call.from == scatterer && call.to != scatterer) {
      targets.insert(call.to);
    }
  }
  return targets;
}

TEST(SimBroadcastTest, GivesTheStarsAggregatesWithOneStreamOutPerRound) {
  Sim star(Config(8, 4));
  star.RunJob();
  Sim broadcast(Config(8, 4, Broadcast));
  broadcast.RunJob();

  ExpectAllDone(broadcast);
  const auto star_globals = ExpectExactRounds(
      star, [&](uint32_t) { return AllTrainers(star); }, AllSites(star));
  const auto globals = ExpectExactRounds(
      broadcast, [&](uint32_t) { return AllTrainers(broadcast); },
      AllSites(broadcast));
  // The same inputs give bit-identical aggregates (the harness's numbers
  // make every sum exact, so the order results arrive in cannot matter).
  EXPECT_TRUE(globals == star_globals);
  ExpectSameFinals(broadcast, AllSites(broadcast), globals, kBestRound);

  const uint64_t model_bytes = globals.at(0).size() * sizeof(float);
  for (uint32_t round = 0; round < 4; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // The scatterer's link carries the model once: the chain's head gets
    // it, the aggregator's own task goes without a body (the aggregator
    // kept the chain's copy).
    const std::string scatterer = Scatterer(broadcast, round);
    uint64_t sent = 0;
    for (const CallRecord& call : broadcast.network().Log()) {
      if (call.kind == CallKind::kLearnTask && call.round == round &&
          call.from == scatterer && call.to != scatterer) {
        sent += call.body_bytes;
      }
    }
    EXPECT_EQ(sent, model_bytes);
    // Out of the scatterer: the chain's head and the aggregator's own task
    // (which names the round's expected set), not one stream per trainer.
    const std::multiset<std::string> direct = DirectTasks(broadcast, round);
    EXPECT_LE(direct.size(), 2u);
    EXPECT_EQ(direct.count(broadcast.Aggregator(round)), 1u);
    // The rest of the trainers got it forwarded, each once.
    std::multiset<std::string> forwarded;
    for (const CallRecord& call : Forwards(broadcast, round)) {
      EXPECT_EQ(call.result, "OK") << call.from << " -> " << call.to;
      forwarded.insert(call.to);
    }
    EXPECT_GE(forwarded.size(), 5u);
    for (const std::string& site : forwarded) {
      EXPECT_EQ(forwarded.count(site), 1u) << site;
    }
  }
}

// A forward that fails (the link between two trainers drops it): the
// scatterer sends the task straight to the sites the chain did not reach,
// and the round has every trainer.
TEST(SimBroadcastTest, ABrokenForwardFallsBackToDirectSends) {
  Sim sim(Config(8, 3, Broadcast));
  std::string dropped_to;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (dropped_to.empty() && call.kind == CallKind::kLearnTask &&
        call.round == 1 && call.to != sim.Aggregator(1) &&
        call.from != sim.Aggregator(0)) {
      // A forward (not from round 1's scatterer, round 0's aggregator).
      dropped_to = call.to;
      CallMatcher match;
      match.kind = CallKind::kLearnTask;
      match.from = call.from;
      match.to = call.to;
      match.round = 1;
      sim.network().AddFault(match, Fault::kDrop, 1);
    }
  });
  sim.RunJob();
  ASSERT_FALSE(dropped_to.empty()) << "round 1 was not broadcast";

  ExpectAllDone(sim);
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
  // The scatterer sent round 1's task to the site the forward missed.
  EXPECT_EQ(DirectTasks(sim, 1).count(dropped_to), 1u)
      << "no direct learn task to " << dropped_to;
}

// The aggregator acknowledged the chain's copy and lost it (the network
// acknowledged the forward and never delivered it): its task without a body
// is refused, and the scatterer sends it again with the body.
TEST(SimBroadcastTest, AnAggregatorWithoutItsCopyGetsTheTaskWithItsBody) {
  Sim sim(Config(8, 3, Broadcast));
  bool lost = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!lost && call.kind == CallKind::kLearnTask && call.round == 1 &&
        call.to == sim.Aggregator(1) && call.from != sim.Aggregator(0)) {
      lost = true;
      CallMatcher match;
      match.kind = CallKind::kLearnTask;
      match.from = call.from;
      match.to = call.to;
      match.round = 1;
      sim.network().AddFault(match, Fault::kLoseAfterAck, 1);
    }
  });
  sim.RunJob();
  ASSERT_TRUE(lost) << "round 1's aggregator was not on the chain";
  ExpectAllDone(sim);
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
  // Round 1's aggregator got a header-only task (refused), then the body.
  std::vector<std::pair<uint64_t, std::string>> tasks;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == 1 &&
        call.from == Scatterer(sim, 1) && call.to == sim.Aggregator(1)) {
      tasks.emplace_back(call.body_bytes, call.result);
    }
  }
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].first, 0u);
  EXPECT_NE(tasks[0].second, "OK");
  EXPECT_GT(tasks[1].first, 0u);
  EXPECT_EQ(tasks[1].second, "OK");
}

// A trainer down when the forward reaches it (its forwarder cannot connect)
// and back a moment later: the scatterer's direct send reaches it and the
// sites after it, and it trains in that round.
TEST(SimBroadcastTest, ASiteDownMidChainGetsTheTaskDirectlyOnceBack) {
  Sim sim(Config(8, 3, Broadcast));
  std::string down;
  bool recovered = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (call.kind != CallKind::kLearnTask || call.round != 1) return;
    const std::string scatterer = sim.Aggregator(0);
    if (down.empty() && call.from != scatterer &&
        call.to != sim.Aggregator(1)) {
      down = call.to;  // Fails: the site is isolated for this call.
      sim.network().Isolate(down);
    } else if (!down.empty() && !recovered && call.from == scatterer &&
               call.to == down) {
      recovered = true;  // The direct send finds it back.
      sim.network().Recover(down);
    }
  });
  sim.RunJob();
  ASSERT_FALSE(down.empty()) << "round 1 was not broadcast";
  EXPECT_TRUE(recovered) << "no direct learn task to " << down;

  ExpectAllDone(sim);
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
}

TEST(ThreadedSimBroadcastTest, CompletesWithExactAggregates) {
  ExpectThreadedJobExact(Config(8, 3, Broadcast));
}

}  // namespace
}  // namespace sim
}  // namespace swarm
