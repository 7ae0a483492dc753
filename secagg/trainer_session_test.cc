#include "secagg/trainer_session.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "secagg/neighbours.h"
#include "secagg/test_mask_generator.h"
#include "secagg/unmask_plan.h"

namespace swarm::secagg {
namespace {

using ::testing::HasSubstr;

// A symmetric stand-in for ECDH + HKDF: the same seed for (a, b) and (b, a).
Seed FakePairSeed(const std::string& a, const std::string& b, uint32_t round,
                  uint32_t attempt) {
  const std::string key = absl::StrCat(std::min(a, b), "|", std::max(a, b), "|",
                                       round, "|", attempt);
  std::seed_seq sequence(key.begin(), key.end());
  std::mt19937 engine(sequence);
  Seed seed;
  for (uint8_t& byte : seed) byte = static_cast<uint8_t>(engine() & 0xFF);
  return seed;
}

RandomBytes Random(uint32_t seed) {
  auto engine = std::make_shared<std::mt19937>(seed);
  return [engine](absl::Span<uint8_t> out) {
    for (uint8_t& b : out) b = static_cast<uint8_t>((*engine)() & 0xFF);
  };
}

// One round at one attempt, every trainer's session, shares exchanged.
struct Swarm {
  std::vector<std::string> names;
  std::map<std::string, std::vector<std::string>> neighbours;
  std::map<std::string, TrainerSession> sessions;
  std::map<std::string, RevealLedger> ledgers;
  std::map<std::string, std::vector<uint32_t>> inputs;
  TestGenerator prg;
  int degree = 0;
  uint32_t round = 0;

  Swarm(int n, int degree_in, int threshold, uint32_t round_in,
        uint32_t attempt)
      : degree(degree_in), round(round_in) {
    for (int i = 0; i < n; ++i) names.push_back(absl::StrCat("site-", i));
    std::mt19937 engine(n * 100 + degree);
    for (const std::string& name : names) {
      neighbours[name] = *Neighbours(names, name, degree, /*seed=*/42);
      TrainerSession::Options options{name, round, attempt, neighbours[name],
                                      threshold};
      absl::StatusOr<TrainerSession> session = TrainerSession::Start(
          options,
          [&](const std::string& peer) -> absl::StatusOr<Seed> {
            return FakePairSeed(name, peer, round, attempt);
          },
          Random(engine()));
      EXPECT_TRUE(session.ok()) << session.status();
      sessions.emplace(name, *std::move(session));
      std::vector<uint32_t>& input = inputs[name];
      input.resize(48);
      for (uint32_t& w : input) w = engine();
    }
    for (const auto& [owner, session] : sessions) {
      for (const auto& [to, share] : session.shares_to_send()) {
        EXPECT_TRUE(sessions.at(to).KeepShare(owner, share).ok());
      }
    }
  }

  std::vector<uint32_t> Upload(const std::string& name) const {
    std::vector<uint32_t> upload = inputs.at(name);
    EXPECT_TRUE(sessions.at(name).Mask(prg, 0, absl::MakeSpan(upload)).ok());
    return upload;
  }
  bool Adjacent(const std::string& a, const std::string& b) const {
    const std::vector<std::string>& n = neighbours.at(a);
    return std::find(n.begin(), n.end(), b) != n.end();
  }
};

// Every trainer but `dropped` counted; `silent` answer nothing.
void ExpectUnmasks(Swarm& swarm, const std::set<std::string>& dropped,
                   const std::set<std::string>& silent, int threshold) {
  std::vector<std::string> counted;
  for (const std::string& name : swarm.names) {
    if (dropped.count(name) == 0) counted.push_back(name);
  }
  const std::vector<std::string> dropped_list(dropped.begin(), dropped.end());
  std::vector<uint32_t> sum(48, 0);
  std::vector<uint32_t> plain(48, 0);
  for (const std::string& name : counted) {
    const std::vector<uint32_t> upload = swarm.Upload(name);
    for (size_t k = 0; k < sum.size(); ++k) {
      sum[k] += upload[k];
      plain[k] += swarm.inputs[name][k];
    }
  }
  std::vector<UnmaskAnswer> answers;
  for (const std::string& name : counted) {
    if (silent.count(name) > 0) continue;
    absl::StatusOr<UnmaskAnswer> answer = swarm.sessions.at(name).Answer(
        counted, dropped_list, "agg", &swarm.ledgers[name]);
    ASSERT_TRUE(answer.ok()) << answer.status();
    answers.push_back(*answer);
  }
  UnmaskRequest request;
  request.counted = counted;
  request.dropped = dropped_list;
  request.threshold = threshold;
  request.adjacent = [&](const std::string& a, const std::string& b) {
    return swarm.Adjacent(a, b);
  };
  absl::StatusOr<Unmasking> plan = PlanUnmasking(request, answers);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(UnmaskSum(swarm.prg, *plan, 0, absl::MakeSpan(sum)).ok());
  EXPECT_EQ(sum, plain);
}

TEST(TrainerSessionTest, CompleteGraphWithATrainerDroppedBeforeItsUpload) {
  Swarm swarm(6, /*degree=*/0, /*threshold=*/3, 5, 0);
  // site-5 dropped before its upload: every counted trainer gives its
  // pairwise seed with site-5, and its shares of the others' self seeds.
  ExpectUnmasks(swarm, {"site-5"}, {}, 3);
}

TEST(TrainerSessionTest, NoDropoutToleratesSilentSurvivorsDownToT) {
  Swarm swarm(6, 0, 3, 5, 0);
  ExpectUnmasks(swarm, {}, {"site-1", "site-4", "site-5"}, 3);
}

TEST(TrainerSessionTest, SparseGraphMasksOnlyWithNeighbours) {
  Swarm swarm(10, /*degree=*/4, /*threshold=*/3, 2, 0);
  for (const auto& [name, neighbours] : swarm.neighbours) {
    EXPECT_EQ(neighbours.size(), 4u) << name;
    for (const std::string& other : neighbours) {
      EXPECT_TRUE(swarm.Adjacent(other, name)) << name << " " << other;
    }
  }
  ExpectUnmasks(swarm, {"site-3", "site-7"}, {}, 3);
}

TEST(TrainerSessionTest, ABackupCannotAskForWhatTheFirstAttemptWasNotGiven) {
  // Attempt 0: site-2 counted; its neighbours reveal their shares of its
  // self seed to agg-0.
  Swarm first(4, 0, 2, 9, 0);
  std::map<std::string, RevealLedger>& ledgers = first.ledgers;
  const std::vector<std::string> all = first.names;
  for (const std::string& name : {"site-0", "site-1"}) {
    ASSERT_TRUE(
        first.sessions.at(name).Answer(all, {}, "agg-0", &ledgers[name]).ok());
  }
  // Attempt 1 at the backup: it now says site-2 dropped and asks site-0
  // for its pairwise seed with site-2: with the share given before, that
  // would unmask site-2. Refused, naming the rule and what was given.
  Swarm second(4, 0, 2, 9, 1);
  const size_t recorded = ledgers["site-0"].size();
  const absl::StatusOr<UnmaskAnswer> refused =
      second.sessions.at("site-0").Answer({"site-0", "site-1", "site-3"},
                                          {"site-2"}, "agg-1",
                                          &ledgers["site-0"]);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("self-share of site-2 went to agg-0 at attempt 0"));
  // Nothing of the refused request was recorded.
  EXPECT_EQ(ledgers["site-0"].size(), recorded);
  // Another round is another matter.
  EXPECT_TRUE(ledgers["site-0"].Check(10, "site-2", Reveal::kPairSeed).ok());
}

TEST(TrainerSessionTest, ARequestNamingATrainerBothWaysIsRefused) {
  Swarm swarm(4, 0, 2, 1, 0);
  absl::StatusOr<UnmaskAnswer> both = swarm.sessions.at("site-0").Answer(
      {"site-0", "site-1"}, {"site-1"}, "agg", &swarm.ledgers["site-0"]);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  // The same aggregator asking twice, the other way the second time.
  ASSERT_TRUE(swarm.sessions.at("site-0")
                  .Answer({"site-0", "site-1", "site-2", "site-3"}, {}, "agg",
                          &swarm.ledgers["site-0"])
                  .ok());
  EXPECT_EQ(swarm.sessions.at("site-0")
                .Answer({"site-0", "site-2", "site-3"}, {"site-1"}, "agg",
                        &swarm.ledgers["site-0"])
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(TrainerSessionTest, SharesOnlyFromNeighboursAndOnlyOnce) {
  Swarm swarm(6, 2, 2, 1, 0);
  const std::string& self = "site-0";
  std::string stranger;
  for (const std::string& name : swarm.names) {
    if (name != self && !swarm.Adjacent(self, name)) stranger = name;
  }
  ASSERT_FALSE(stranger.empty());
  Share share{1, std::string(32, 'x')};
  EXPECT_THAT(swarm.sessions.at(self).KeepShare(stranger, share).message(),
              HasSubstr("not a neighbour"));
  const std::string neighbour = swarm.neighbours.at(self).front();
  EXPECT_THAT(swarm.sessions.at(self).KeepShare(neighbour, share).message(),
              HasSubstr("second, different"));
}

TEST(NeighboursTest, BadDegreesAreRefusedAndLargeOnesAreComplete) {
  const std::vector<std::string> names = {"a", "b", "c", "d", "e", "f"};
  EXPECT_THAT(Neighbours(names, "a", 3, 1).status().message(),
              HasSubstr("even and at least 2"));
  EXPECT_FALSE(Neighbours(names, "z", 2, 1).ok());
  EXPECT_EQ(Neighbours(names, "a", 5, 1)->size(), 5u);
  EXPECT_EQ(Neighbours(names, "a", 0, 1)->size(), 5u);
  // The same graph for the same seed, another for another seed (likely).
  EXPECT_EQ(*Neighbours(names, "c", 2, 7), *Neighbours(names, "c", 2, 7));
}

}  // namespace
}  // namespace swarm::secagg
