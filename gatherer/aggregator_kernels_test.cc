#include "gatherer/aggregator_kernels.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#ifdef SWARM_HAVE_EIGEN
#include <Eigen/Core>
#endif

namespace swarm {
namespace agg_internal {
namespace {

// Nearest value among `candidates` (decoded by `decode`), ties to the even
// code: a brute-force reference for correct rounding.
template <typename Decode>
uint32_t NearestCode(double value, uint32_t lo_code, uint32_t hi_code,
                     Decode decode) {
  uint32_t best = lo_code;
  double best_error = std::fabs(decode(lo_code) - value);
  for (uint32_t code = lo_code + 1; code <= hi_code; ++code) {
    const double error = std::fabs(decode(code) - value);
    if (error < best_error || (error == best_error && (code & 1) == 0)) {
      best = code;
      best_error = error;
    }
  }
  return best;
}

TEST(ConversionTest, F16DecodeIsExactForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float value = F16ToF32(static_cast<uint16_t>(h));
    const uint32_t exponent = (h >> 10) & 0x1f;
    const uint32_t mantissa = h & 0x3ff;
    double expected;
    if (exponent == 31) {
      expected = mantissa == 0 ? std::numeric_limits<double>::infinity()
                               : std::numeric_limits<double>::quiet_NaN();
    } else if (exponent == 0) {
      expected = std::ldexp(static_cast<double>(mantissa), -24);
    } else {
      expected = std::ldexp(static_cast<double>(mantissa + 1024),
                            static_cast<int>(exponent) - 25);
    }
    if (h & 0x8000) expected = -expected;
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(value)) << h;
    } else {
      EXPECT_EQ(value, expected) << h;
      EXPECT_EQ(std::signbit(value), std::signbit(expected)) << h;
    }
  }
}

TEST(ConversionTest, F16EncodeRoundsToNearestEvenAtEveryMidpoint) {
  // Each finite positive F16 value and the midpoint to its successor.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double value = F16ToF32(static_cast<uint16_t>(h));
    EXPECT_EQ(F32ToF16(static_cast<float>(value)), h);
    EXPECT_EQ(F32ToF16(static_cast<float>(-value)), h | 0x8000);
    const double next = h + 1 == 0x7c00 ? 65536.0 : F16ToF32(h + 1);
    const float mid = static_cast<float>((value + next) / 2);  // Exact.
    const uint32_t even = (h & 1) == 0 ? h : h + 1;
    EXPECT_EQ(F32ToF16(mid), even) << h;
    // Just above / below the midpoint.
    EXPECT_EQ(F32ToF16(std::nextafter(mid, 1e9f)), h + 1) << h;
    EXPECT_EQ(F32ToF16(std::nextafter(mid, 0.0f)), h) << h;
  }
  EXPECT_EQ(F32ToF16(1e9f), 0x7c00);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
  EXPECT_EQ(F32ToF16(1e-10f), 0);  // Below half the smallest subnormal.
}

TEST(ConversionTest, Bf16EncodeRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x7f80; h += 3) {
    const double value = Bf16ToF32(static_cast<uint16_t>(h));
    EXPECT_EQ(F32ToBf16(static_cast<float>(value)), h);
    const double next = Bf16ToF32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((value + next) / 2);
    EXPECT_EQ(F32ToBf16(mid), (h & 1) == 0 ? h : h + 1) << h;
    EXPECT_EQ(
        F32ToBf16(std::nextafter(mid, std::numeric_limits<float>::infinity())),
        h + 1)
        << h;
    EXPECT_EQ(F32ToBf16(std::nextafter(mid, 0.0f)), h) << h;
  }
  EXPECT_TRUE(std::isnan(
      Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(Bf16ToF32(F32ToBf16(3.4e38f))));
}

#ifdef SWARM_HAVE_EIGEN
TEST(ConversionTest, AgreesWithEigen) {
  std::mt19937 random(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    const float value = BitsToF32(bits(random));
    if (std::isnan(value)) continue;
    EXPECT_EQ(F32ToF16(value),
              Eigen::numext::bit_cast<uint16_t>(Eigen::half(value)))
        << value;
    EXPECT_EQ(F32ToBf16(value),
              Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(value)))
        << value;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = F16ToF32(static_cast<uint16_t>(h));
    const float eigen = static_cast<float>(
        Eigen::numext::bit_cast<Eigen::half>(static_cast<uint16_t>(h)));
    if (std::isnan(ours)) {
      EXPECT_TRUE(std::isnan(eigen));
    } else {
      EXPECT_EQ(F32ToBits(ours), F32ToBits(eigen)) << h;
    }
  }
}
#endif

TEST(ConversionTest, DoubleToHalfHasNoDoubleRounding) {
  // Values just above an F16 midpoint by less than a float ulp: rounding
  // to float first would land on the midpoint and then tie to even.
  std::mt19937_64 random(2);
  std::uniform_int_distribution<uint32_t> code(0, 0x7bfe);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t h = code(random);
    const double value = F16ToF32(static_cast<uint16_t>(h));
    const double next = F16ToF32(static_cast<uint16_t>(h + 1));
    const double mid = (value + next) / 2;
    const double nudge = (next - value) * std::ldexp(1.0, -40);
    double above = mid + nudge;
    double below = mid - nudge;
    EXPECT_EQ(F32ToF16(RoundToOddF32(above)), h + 1) << h;
    EXPECT_EQ(F32ToF16(RoundToOddF32(below)), h) << h;
    // And plain random doubles against a brute-force nearest search.
    const double any =
        value +
        (next - value) * std::uniform_real_distribution<double>(0, 1)(random);
    EXPECT_EQ(F32ToF16(RoundToOddF32(any)),
              NearestCode(any, h, h + 1, [](uint32_t c) {
                return static_cast<double>(F16ToF32(static_cast<uint16_t>(c)));
              }));
  }
  // BF16 likewise.
  for (uint32_t h = 0x0080; h < 0x7f00; h += 97) {
    const double value = Bf16ToF32(static_cast<uint16_t>(h));
    const double next = Bf16ToF32(static_cast<uint16_t>(h + 1));
    const double mid = (value + next) / 2;
    const double nudge = (next - value) * std::ldexp(1.0, -40);
    EXPECT_EQ(F32ToBf16(RoundToOddF32(mid + nudge)), h + 1) << h;
    EXPECT_EQ(F32ToBf16(RoundToOddF32(mid - nudge)), h) << h;
  }
}

TEST(ConversionTest, F8Formats) {
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0xff)));
  EXPECT_EQ(F8E5M2ToF32(0x7b), 57344.0f);
  EXPECT_EQ(F8E5M2ToF32(0x3c), 1.0f);
  EXPECT_TRUE(std::isinf(F8E5M2ToF32(0x7c)));
  EXPECT_TRUE(std::isnan(F8E5M2ToF32(0x7d)));
  // Every finite code round-trips; midpoints tie to the even code.
  for (uint32_t c = 0; c < 0x7e; ++c) {
    EXPECT_EQ(DoubleToF8E4M3(F8E4M3ToF32(c)), c);
    EXPECT_EQ(DoubleToF8E4M3(-F8E4M3ToF32(c)), c | 0x80);
    const double mid = (F8E4M3ToF32(c) + F8E4M3ToF32(c + 1)) / 2;
    EXPECT_EQ(DoubleToF8E4M3(mid), (c & 1) == 0 ? c : c + 1) << c;
  }
  for (uint32_t c = 0; c < 0x7b; ++c) {
    EXPECT_EQ(DoubleToF8E5M2(F8E5M2ToF32(c)), c);
    const double mid = (F8E5M2ToF32(c) + F8E5M2ToF32(c + 1)) / 2;
    EXPECT_EQ(DoubleToF8E5M2(mid), (c & 1) == 0 ? c : c + 1) << c;
  }
  EXPECT_EQ(DoubleToF8E4M3(1e6), 0x7e);  // Saturates.
  EXPECT_EQ(DoubleToF8E5M2(-1e9), 0xfb);
  EXPECT_EQ(DoubleToF8E5M2(std::numeric_limits<double>::infinity()), 0x7c);
}

TEST(ConversionTest, IntegersRoundHalfToEvenAndSaturate) {
  char buffer[8];
  auto store = [&](DType dtype, double value) {
    StoreFromDouble(dtype, value, buffer, 0);
    return LoadAsDouble(dtype, buffer, 0);
  };
  EXPECT_EQ(store(v1::DTYPE_I32, 2.5), 2);
  EXPECT_EQ(store(v1::DTYPE_I32, 3.5), 4);
  EXPECT_EQ(store(v1::DTYPE_I32, -2.5), -2);
  EXPECT_EQ(store(v1::DTYPE_I32, 2.4999), 2);
  EXPECT_EQ(store(v1::DTYPE_I8, 300), 127);
  EXPECT_EQ(store(v1::DTYPE_I8, -300), -128);
  EXPECT_EQ(store(v1::DTYPE_U8, -1), 0);
  EXPECT_EQ(store(v1::DTYPE_U16, 1e9), 65535);
  EXPECT_EQ(store(v1::DTYPE_I64, 1e30), 9223372036854775807.0);
  EXPECT_EQ(store(v1::DTYPE_U64, 1e30), 18446744073709551615.0);
  EXPECT_EQ(store(v1::DTYPE_I32, std::nan("")), 0);
  EXPECT_EQ(store(v1::DTYPE_BOOL, 0.5), 0);
  EXPECT_EQ(store(v1::DTYPE_BOOL, 0.51), 1);
  StoreFromDouble(v1::DTYPE_I64, 4611686018427387904.0, buffer, 0);  // 2^62
  int64_t exact;
  std::memcpy(&exact, buffer, 8);
  EXPECT_EQ(exact, int64_t{1} << 62);
}

std::string VariantName(const ::testing::TestParamInfo<int>& info) {
  const char* const kNames[] = {"Portable", "Avx2", "Avx512"};
  return kNames[info.param];
}

// The compensated sum against an exact reference: sums of many values with
// heavy cancellation, where a plain F32 sum loses most of its bits.
class CompensatedTest : public ::testing::TestWithParam<int> {};

bool Supported(int variant) {
  const std::string isa = KernelIsaName();
  return variant == 0 || (variant == 1 && isa != "portable") ||
         (variant == 2 && isa == "avx512");
}

TEST_P(CompensatedTest, StaysWithinAFractionOfAnUlpOfTheExactSum) {
  const int variant = GetParam();
  if (!Supported(variant)) GTEST_SKIP() << "CPU lacks the ISA";
  constexpr int kElements = 4099;  // Not a multiple of the vector width.
  constexpr int kResults = 200;
  std::mt19937_64 random(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> count(1, 5000);
  std::vector<float> hi(kElements);
  std::vector<uint16_t> lo(kElements);
  std::vector<float> plain(kElements, 0.0f);
  std::vector<long double> exact(kElements, 0.0L);
  std::vector<float> x(kElements);
  for (int r = 0; r < kResults; ++r) {
    const float w = static_cast<float>(count(random)) / 1024.0f;
    for (int i = 0; i < kElements; ++i) {
      // Big values that mostly cancel, plus a small signal.
      x[i] = (r % 2 == 0 ? 1e4f : -1e4f) * (1.0f + 1e-3f * (i % 7)) +
             normal(random);
      exact[i] += static_cast<long double>(w) * x[i];
      plain[i] += w * x[i];
    }
    AccumulateF32CompensatedVariant(variant, reinterpret_cast<char*>(x.data()),
                                    kElements, w, r == 0, hi.data(), lo.data());
  }
  double worst_compensated = 0;
  double worst_plain = 0;
  for (int i = 0; i < kElements; ++i) {
    const long double value =
        static_cast<long double>(hi[i]) + Bf16ToF32(lo[i]);
    const double ulp = std::ldexp(
        1.0, std::ilogb(static_cast<double>(std::fabs(exact[i]))) - 23);
    worst_compensated =
        std::max(worst_compensated,
                 static_cast<double>(std::fabs(value - exact[i])) / ulp);
    worst_plain = std::max(
        worst_plain, static_cast<double>(std::fabs(plain[i] - exact[i])) / ulp);
  }
  // 200 additions at <= 2^-10 ulp each would allow ~0.2; in practice far
  // less. A plain F32 sum is off by several ulps here.
  EXPECT_LT(worst_compensated, 0.05) << "plain F32: " << worst_plain;
  EXPECT_GT(worst_plain, 2.0);
}

TEST_P(CompensatedTest, FirstAddIsTheExactProduct) {
  const int variant = GetParam();
  if (!Supported(variant)) GTEST_SKIP() << "CPU lacks the ISA";
  const float x[3] = {0.1f, -3.3333333f, 1e-30f};
  float hi[3];
  uint16_t lo[3];
  const float w = 1234.5678f;
  AccumulateF32CompensatedVariant(variant, reinterpret_cast<const char*>(x), 3,
                                  w, true, hi, lo);
  for (int i = 0; i < 3; ++i) {
    const double exact = static_cast<double>(w) * x[i];
    EXPECT_EQ(hi[i], static_cast<float>(exact));
    EXPECT_NEAR(static_cast<double>(hi[i]) + Bf16ToF32(lo[i]), exact,
                std::fabs(exact) * 1e-9);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CompensatedTest, ::testing::Values(0, 1, 2),
                         VariantName);

TEST(AccumulateTest, WideSumsOfEveryDType) {
  const float halves[3] = {1.0f, -2.5f, 65504.0f};
  std::vector<uint16_t> f16, bf16;
  for (float v : halves) {
    f16.push_back(F32ToF16(v));
    bf16.push_back(F32ToBf16(v));
  }
  float acc[3];
  AccumulateToF32(v1::DTYPE_F16, reinterpret_cast<char*>(f16.data()), 3, 2.0f,
                  true, acc);
  AccumulateToF32(v1::DTYPE_BF16, reinterpret_cast<char*>(bf16.data()), 3, 1.0f,
                  false, acc);
  EXPECT_EQ(acc[0], 3.0f);
  EXPECT_EQ(acc[1], -7.5f);
  EXPECT_EQ(acc[2], 65504.0f * 2 + Bf16ToF32(F32ToBf16(65504.0f)));
  const int64_t ints[2] = {-3, int64_t{1} << 40};
  double wide[2];
  AccumulateToF64(v1::DTYPE_I64, reinterpret_cast<const char*>(ints), 2, 0.5,
                  true, wide);
  EXPECT_EQ(wide[0], -1.5);
  EXPECT_EQ(wide[1], std::ldexp(1.0, 39));
}

}  // namespace
}  // namespace agg_internal
}  // namespace swarm
