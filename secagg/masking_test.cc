#include "secagg/masking.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "secagg/test_mask_generator.h"

namespace swarm::secagg {
namespace {

Seed RandomSeed(std::mt19937& engine) {
  Seed seed;
  for (uint8_t& b : seed) b = static_cast<uint8_t>(engine() & 0xFF);
  return seed;
}

struct Swarm {
  std::vector<std::string> names;
  std::vector<Seed> self_seeds;
  std::map<std::pair<int, int>, Seed> pair_seeds;  // (i < j)
  const Seed& PairOf(int i, int j) const {
    return pair_seeds.at({std::min(i, j), std::max(i, j)});
  }
};

Swarm MakeSwarm(int n, std::mt19937& engine) {
  Swarm swarm;
  for (int i = 0; i < n; ++i) {
    // Names whose order differs from their index, so the sign rule is
    // exercised both ways.
    swarm.names.push_back(absl::StrCat("site-", (i * 7) % n));
    swarm.self_seeds.push_back(RandomSeed(engine));
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j)
      swarm.pair_seeds[{i, j}] = RandomSeed(engine);
  }
  return swarm;
}

// Every dropout set of n trainers (n <= 6), with chunked masking at an
// offset: the unmasked sum equals the sum of the counted encodings exactly.
TEST(MaskingTest, MasksCancelExactlyForEveryDropoutSet) {
  const TestGenerator prg;
  std::mt19937 engine(3);
  for (int n = 2; n <= 6; ++n) {
    Swarm swarm = MakeSwarm(n, engine);
    const size_t words = 97;
    const uint64_t offset = 1000003;
    std::vector<std::vector<uint32_t>> inputs(n, std::vector<uint32_t>(words));
    std::vector<std::vector<uint32_t>> uploads = inputs;
    for (int i = 0; i < n; ++i) {
      for (uint32_t& w : inputs[i]) w = engine();
      uploads[i] = inputs[i];
      std::vector<PairSeed> pairs;
      for (int j = 0; j < n; ++j) {
        if (j != i) pairs.push_back({swarm.names[j], swarm.PairOf(i, j)});
      }
      // In two chunks, as a stream would be.
      absl::Span<uint32_t> all = absl::MakeSpan(uploads[i]);
      EXPECT_TRUE(MaskUpdate(prg, swarm.names[i], swarm.self_seeds[i], pairs,
                             offset, all.subspan(0, 40))
                      .ok());
      EXPECT_TRUE(MaskUpdate(prg, swarm.names[i], swarm.self_seeds[i], pairs,
                             offset + 40, all.subspan(40))
                      .ok());
      EXPECT_NE(uploads[i], inputs[i]);
    }
    for (uint32_t counted_set = 1; counted_set < (1u << n); ++counted_set) {
      std::vector<uint32_t> sum(words, 0);
      std::vector<uint32_t> expected(words, 0);
      Unmasking unmasking;
      for (int i = 0; i < n; ++i) {
        if ((counted_set & (1u << i)) == 0) continue;
        for (size_t k = 0; k < words; ++k) {
          sum[k] += uploads[i][k];
          expected[k] += inputs[i][k];
        }
        unmasking.self_seeds.push_back(swarm.self_seeds[i]);
        for (int j = 0; j < n; ++j) {
          if ((counted_set & (1u << j)) != 0) continue;
          unmasking.dropped_pairs.push_back(
              {swarm.names[i], swarm.names[j], swarm.PairOf(i, j)});
        }
      }
      EXPECT_TRUE(UnmaskSum(prg, unmasking, offset, absl::MakeSpan(sum)).ok());
      ASSERT_EQ(sum, expected) << n << " trainers, counted set " << counted_set;
    }
  }
}

TEST(MaskingTest, AMissingSeedLeavesTheSumMasked) {
  const TestGenerator prg;
  std::mt19937 engine(4);
  Swarm swarm = MakeSwarm(3, engine);
  std::vector<uint32_t> sum(16, 0);
  for (int i = 0; i < 3; ++i) {
    std::vector<uint32_t> upload(16, 5);
    std::vector<PairSeed> pairs;
    for (int j = 0; j < 3; ++j) {
      if (j != i) pairs.push_back({swarm.names[j], swarm.PairOf(i, j)});
    }
    EXPECT_TRUE(MaskUpdate(prg, swarm.names[i], swarm.self_seeds[i], pairs, 0,
                           absl::MakeSpan(upload))
                    .ok());
    for (size_t k = 0; k < 16; ++k) sum[k] += upload[k];
  }
  Unmasking two_of_three;
  two_of_three.self_seeds = {swarm.self_seeds[0], swarm.self_seeds[1]};
  EXPECT_TRUE(UnmaskSum(prg, two_of_three, 0, absl::MakeSpan(sum)).ok());
  EXPECT_NE(sum, std::vector<uint32_t>(16, 15));
}

}  // namespace
}  // namespace swarm::secagg
