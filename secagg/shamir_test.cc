#include "secagg/shamir.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm::secagg {
namespace {

using ::testing::HasSubstr;

RandomBytes Seeded(uint32_t seed) {
  auto engine = std::make_shared<std::mt19937>(seed);
  return [engine](absl::Span<uint8_t> out) {
    for (uint8_t& b : out) b = static_cast<uint8_t>((*engine)() & 0xFF);
  };
}

std::string Secret32(uint32_t seed) {
  std::mt19937 engine(seed);
  std::string secret(32, '\0');
  for (char& c : secret) c = static_cast<char>(engine() & 0xFF);
  return secret;
}

TEST(ShamirTest, AnyThresholdOfSharesRebuildsTheSecretAtEveryThreshold) {
  const std::string secret = Secret32(1);
  for (int count = 1; count <= 9; ++count) {
    for (int threshold = 1; threshold <= count; ++threshold) {
      absl::StatusOr<std::vector<Share>> shares =
          SplitSecret(secret, threshold, count, Seeded(count * 31 + threshold));
      ASSERT_TRUE(shares.ok()) << shares.status();
      ASSERT_EQ(shares->size(), static_cast<size_t>(count));
      // Several subsets of exactly `threshold`, in several orders.
      std::mt19937 pick(threshold);
      for (int trial = 0; trial < 5; ++trial) {
        std::vector<Share> subset = *shares;
        std::shuffle(subset.begin(), subset.end(), pick);
        subset.resize(threshold);
        absl::StatusOr<std::string> rebuilt = CombineShares(subset, threshold);
        ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
        EXPECT_EQ(*rebuilt, secret) << threshold << " of " << count;
      }
    }
  }
}

TEST(ShamirTest, FewerSharesThanTheThresholdDoNotRebuildIt) {
  const std::string secret = Secret32(2);
  absl::StatusOr<std::vector<Share>> shares =
      SplitSecret(secret, 4, 7, Seeded(5));
  ASSERT_TRUE(shares.ok());
  const std::vector<Share> three(shares->begin(), shares->begin() + 3);
  EXPECT_FALSE(CombineShares(three, 4).ok());
  // Combined as if the threshold were 3: a wrong secret, not this one.
  absl::StatusOr<std::string> wrong = CombineShares(three, 3);
  ASSERT_TRUE(wrong.ok());
  EXPECT_NE(*wrong, secret);
}

TEST(ShamirTest, BelowTheThresholdEverySecretIsEquallyLikely) {
  // With threshold 2, one share's byte is the secret's byte plus a random
  // coefficient times x: over many splits it is uniform whatever the secret.
  std::vector<int> counts(256, 0);
  const RandomBytes random = Seeded(9);
  const int splits = 256 * 64;
  for (int i = 0; i < splits; ++i) {
    absl::StatusOr<std::vector<Share>> shares =
        SplitSecret(std::string(1, '\x2a'), 2, 3, random);
    ASSERT_TRUE(shares.ok());
    ++counts[static_cast<uint8_t>((*shares)[1].y[0])];
  }
  // Chi-square with 255 degrees of freedom: 99.9% below ~330.
  double chi2 = 0;
  for (int c : counts) chi2 += (c - 64.0) * (c - 64.0) / 64.0;
  EXPECT_LT(chi2, 330.0);
}

TEST(ShamirTest, BadArgumentsAreRefused) {
  EXPECT_THAT(SplitSecret("s", 0, 3, Seeded(1)).status().message(),
              HasSubstr("threshold"));
  EXPECT_FALSE(SplitSecret("s", 4, 3, Seeded(1)).ok());
  EXPECT_FALSE(SplitSecret("s", 2, 256, Seeded(1)).ok());
  absl::StatusOr<std::vector<Share>> shares =
      SplitSecret("ab", 2, 3, Seeded(1));
  ASSERT_TRUE(shares.ok());
  std::vector<Share> twice = {(*shares)[0], (*shares)[0]};
  EXPECT_THAT(CombineShares(twice, 2).status().message(),
              HasSubstr("appears twice"));
  std::vector<Share> uneven = {(*shares)[0], (*shares)[1]};
  uneven[1].y.pop_back();
  EXPECT_THAT(CombineShares(uneven, 2).status().message(),
              HasSubstr("different lengths"));
}

}  // namespace
}  // namespace swarm::secagg
