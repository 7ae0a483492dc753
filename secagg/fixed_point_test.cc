#include "secagg/fixed_point.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm::secagg {
namespace {

using ::testing::HasSubstr;

TEST(FixedPointTest, ParametersThatCouldWrapAreRefusedNamingTheRule) {
  // 2^16 steps at the clip, weight 2^8, 2^7 trainers: 2^31.
  absl::StatusOr<FixedPointCodec> wraps =
      FixedPointCodec::Create(1.0, 65536.0, 256, 128);
  ASSERT_FALSE(wraps.ok());
  EXPECT_EQ(wraps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wraps.status().message(),
              HasSubstr("modulus 2^32 must exceed the largest possible sum"));
  EXPECT_TRUE(FixedPointCodec::Create(1.0, 65536.0, 256, 127).ok());
  EXPECT_THAT(FixedPointCodec::Create(0, 1, 1, 1).status().message(),
              HasSubstr("clip"));
  EXPECT_THAT(FixedPointCodec::Create(1, -2, 1, 1).status().message(),
              HasSubstr("scale"));
  EXPECT_THAT(FixedPointCodec::Create(0.1, 1, 1, 1).status().message(),
              HasSubstr("round to at least 1"));
}

TEST(FixedPointTest, TheWeightedMeanComesBackWithinHalfAStep) {
  const int trainers = 7;
  const size_t n = 4096;
  absl::StatusOr<FixedPointCodec> codec =
      FixedPointCodec::Create(4.0, 1 << 16, 1000, trainers);
  ASSERT_TRUE(codec.ok()) << codec.status();
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint32_t> sum(n, 0);
  std::vector<double> weighted(n, 0.0);
  uint64_t total_weight = 0;
  for (int t = 0; t < trainers; ++t) {
    std::vector<float> values(n);
    for (float& v : values) v = normal(random);
    const uint32_t weight = 1 + 137 * static_cast<uint32_t>(t);
    std::vector<uint32_t> encoded(n);
    absl::StatusOr<size_t> clipped =
        codec->Encode(values, weight, absl::MakeSpan(encoded));
    ASSERT_TRUE(clipped.ok()) << clipped.status();
    for (size_t i = 0; i < n; ++i) {
      sum[i] += encoded[i];  // mod 2^32
      weighted[i] += weight * std::clamp<double>(values[i], -4.0, 4.0);
    }
    total_weight += weight;
  }
  std::vector<float> mean(n);
  codec->DecodeMean(sum, total_weight, absl::MakeSpan(mean));
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(mean[i] - weighted[i] / total_weight));
  }
  // Half a step, plus the F32 rounding of values up to the clip.
  EXPECT_LE(worst, codec->MaxError() + 4.0 * 6e-8);
  EXPECT_GT(worst, 0.0);  // It is an approximation.
}

TEST(FixedPointTest, ValuesBeyondTheClipAreClippedAndCounted) {
  absl::StatusOr<FixedPointCodec> codec =
      FixedPointCodec::Create(1.0, 1000, 1, 1);
  ASSERT_TRUE(codec.ok());
  const std::vector<float> values = {-3.0f, -1.0f, 0.25f, 1.0f, 2.5f};
  std::vector<uint32_t> encoded(values.size());
  absl::StatusOr<size_t> clipped =
      codec->Encode(values, 1, absl::MakeSpan(encoded));
  ASSERT_TRUE(clipped.ok());
  EXPECT_EQ(*clipped, 2u);
  std::vector<float> decoded(values.size());
  codec->DecodeMean(encoded, 1, absl::MakeSpan(decoded));
  EXPECT_THAT(decoded, ::testing::ElementsAre(-1.0f, -1.0f, 0.25f, 1.0f, 1.0f));
  EXPECT_EQ(encoded[0], 0xFFFFFFFFu - 999u);  // -1000 mod 2^32
}

TEST(FixedPointTest, NonFiniteValuesAndBadWeightsAreRefused) {
  absl::StatusOr<FixedPointCodec> codec =
      FixedPointCodec::Create(1.0, 1000, 10, 3);
  ASSERT_TRUE(codec.ok());
  std::vector<uint32_t> out(2);
  const std::vector<float> nan = {0.0f,
                                  std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THAT(codec->Encode(nan, 1, absl::MakeSpan(out)).status().message(),
              HasSubstr("value 1 is not finite"));
  const std::vector<float> ok = {0.0f, 0.5f};
  EXPECT_THAT(codec->Encode(ok, 11, absl::MakeSpan(out)).status().message(),
              HasSubstr("weight: must be 1..10"));
  EXPECT_FALSE(codec->Encode(ok, 0, absl::MakeSpan(out)).ok());
}

}  // namespace
}  // namespace swarm::secagg
