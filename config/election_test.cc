#include "config/election.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAreArray;

v1::JobConfig Job(const std::vector<std::string>& candidates, uint64_t seed) {
  v1::JobConfig job;
  job.set_job_id("j");
  for (const std::string& name : candidates) {
    job.add_aggregator_candidates(name);
  }
  job.set_seed(seed);
  return job;
}

TEST(SplitMix64Test, MatchesTheReferenceSequence) {
  // Published SplitMix64 outputs (e.g. the splitmix64.c test vectors).
  SplitMix64 zero(0);
  EXPECT_EQ(zero.Next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(zero.Next(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(zero.Next(), 0x06c45d188009454full);
  SplitMix64 other(1234567);
  EXPECT_EQ(other.Next(), 6457827717110365317ull);
  EXPECT_EQ(other.Next(), 3203168211198807973ull);
}

TEST(SplitMix64Test, BoundedStaysInRangeAndCoversIt) {
  SplitMix64 rng(99);
  EXPECT_EQ(rng.Bounded(1), 0u);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 7000; ++i) {
    uint64_t v = rng.Bounded(7);
    ASSERT_LT(v, 7u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
  // A bound near 2^64 rejects about half the draws and still terminates.
  const uint64_t big = (1ull << 63) + 1;
  for (int i = 0; i < 100; ++i) EXPECT_LT(rng.Bounded(big), big);
}

TEST(ElectionOrderTest, GoldenValues) {
  // Computed independently (Python) from the algorithm in election.h. These
  // must never change: every site of a job must agree on them.
  v1::JobConfig job = Job({"a", "b", "c", "d", "e"}, 42);
  EXPECT_THAT(ElectionOrder(job, 0), ElementsAre("d", "b", "e", "a", "c"));
  EXPECT_THAT(ElectionOrder(job, 1), ElementsAre("c", "d", "b", "a", "e"));
  EXPECT_THAT(ElectionOrder(job, 2), ElementsAre("a", "b", "e", "c", "d"));
  EXPECT_THAT(ElectionOrder(job, 3), ElementsAre("c", "a", "e", "b", "d"));
  EXPECT_THAT(ElectionOrder(job, 4), ElementsAre("e", "a", "c", "b", "d"));
  EXPECT_THAT(ElectionOrder(job, 5), ElementsAre("c", "e", "b", "d", "a"));
  job.set_seed(~0ull);
  EXPECT_THAT(ElectionOrder(job, 4294967295u),
              ElementsAre("b", "e", "c", "d", "a"));

  const char* expected_first[] = {"s2", "s2", "s1", "s1", "s1", "s1", "s3",
                                  "s3", "s0", "s1", "s0", "s0", "s1", "s1",
                                  "s0", "s3", "s0", "s0", "s3", "s0"};
  v1::JobConfig four = Job({"s0", "s1", "s2", "s3"}, 7);
  for (uint32_t round = 0; round < 20; ++round) {
    EXPECT_EQ(ElectionOrder(four, round).front(), expected_first[round])
        << "round " << round;
  }
}

TEST(ElectionOrderTest, DeterministicForSeedAndRound) {
  v1::JobConfig job = Job({"a", "b", "c", "d", "e", "f"}, 123);
  for (uint32_t round = 0; round < 50; ++round) {
    EXPECT_EQ(ElectionOrder(job, round), ElectionOrder(job, round));
  }
  // Another seed gives another sequence of orders.
  v1::JobConfig other = Job({"a", "b", "c", "d", "e", "f"}, 124);
  int differing = 0;
  for (uint32_t round = 0; round < 20; ++round) {
    differing += ElectionOrder(job, round) != ElectionOrder(other, round);
  }
  EXPECT_GT(differing, 10);
}

TEST(ElectionOrderTest, IsAPermutation) {
  std::vector<std::string> candidates = {"n0", "n1", "n2", "n3",
                                         "n4", "n5", "n6", "n7"};
  v1::JobConfig job = Job(candidates, 5);
  for (uint32_t round = 0; round < 100; ++round) {
    EXPECT_THAT(ElectionOrder(job, round),
                UnorderedElementsAreArray(candidates));
  }
}

TEST(ElectionOrderTest, VariesAcrossRounds) {
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xdeadbeefull}) {
    v1::JobConfig job = Job({"a", "b", "c", "d"}, seed);
    std::set<std::string> aggregators;
    std::set<std::vector<std::string>> orders;
    for (uint32_t round = 0; round < 20; ++round) {
      aggregators.insert(ElectionOrder(job, round).front());
      orders.insert(ElectionOrder(job, round));
    }
    EXPECT_GT(aggregators.size(), 1u) << "seed " << seed;
    EXPECT_GT(orders.size(), 5u) << "seed " << seed;
  }
}

TEST(ElectionOrderTest, RoughlyUniform) {
  // First element over 8000 rounds of 4 candidates: expect 2000 each; the
  // standard deviation is about 39, so 200 is over 5 sigma.
  v1::JobConfig job = Job({"a", "b", "c", "d"}, 2026);
  std::map<std::string, int> first;
  std::map<std::string, int> last;
  for (uint32_t round = 0; round < 8000; ++round) {
    std::vector<std::string> order = ElectionOrder(job, round);
    ++first[order.front()];
    ++last[order.back()];
  }
  ASSERT_EQ(first.size(), 4u);
  for (const auto& [name, count] : first) EXPECT_NEAR(count, 2000, 200) << name;
  for (const auto& [name, count] : last) EXPECT_NEAR(count, 2000, 200) << name;

  // All 6 orders of 3 candidates appear about equally often.
  v1::JobConfig three = Job({"x", "y", "z"}, 11);
  std::map<std::vector<std::string>, int> orders;
  for (uint32_t round = 0; round < 6000; ++round) {
    ++orders[ElectionOrder(three, round)];
  }
  ASSERT_EQ(orders.size(), 6u);
  for (const auto& [order, count] : orders) EXPECT_NEAR(count, 1000, 150);
}

TEST(ElectionOrderTest, SingleCandidateAndNone) {
  v1::JobConfig job = Job({"only"}, 9);
  for (uint32_t round = 0; round < 5; ++round) {
    EXPECT_THAT(ElectionOrder(job, round), ElementsAre("only"));
  }
  v1::JobConfig empty;
  EXPECT_TRUE(ElectionOrder(empty, 0).empty());
}

TEST(ElectionOrderTest, EmptyCandidatesMeanAllSites) {
  v1::JobConfig job = Job({}, 42);
  for (const char* name : {"a", "b", "c", "d", "e"}) {
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
  }
  v1::JobConfig explicit_job = Job({"a", "b", "c", "d", "e"}, 42);
  for (uint32_t round = 0; round < 10; ++round) {
    EXPECT_EQ(ElectionOrder(job, round), ElectionOrder(explicit_job, round));
  }
}

}  // namespace
}  // namespace swarm
