#include "model/dtype_kernels.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace swarm {
namespace {

std::string VariantName(const ::testing::TestParamInfo<int>& info) {
  const char* const kNames[] = {"Portable", "Avx2", "Avx512"};
  return kNames[info.param];
}

class NonFiniteTest : public ::testing::TestWithParam<int> {
 protected:
  void TearDown() override { LimitKernelIsaForTesting(2); }
};

TEST_P(NonFiniteTest, FindsTheFirstNaNOrInfInEveryFloatDType) {
  LimitKernelIsaForTesting(GetParam());
  struct Case {
    DType dtype;
    std::vector<uint64_t> bad_bits;  // Patterns that must be found.
    uint64_t largest_finite;
  };
  const Case cases[] = {
      {v1::DTYPE_F32,
       {0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001},
       0x7f7fffff},
      {v1::DTYPE_F64,
       {0x7ff0000000000000ull, 0xfff8000000000000ull, 0x7ff0000000000001ull},
       0x7fefffffffffffffull},
      {v1::DTYPE_F16, {0x7c00, 0xfc00, 0x7e00, 0x7c01}, 0x7bff},
      {v1::DTYPE_BF16, {0x7f80, 0xff80, 0x7fc0}, 0x7f7f},
      {v1::DTYPE_F8_E5M2, {0x7c, 0xfc, 0x7d}, 0x7b},
      {v1::DTYPE_F8_E4M3, {0x7f, 0xff}, 0x7e},
  };
  for (const Case& c : cases) {
    const uint64_t size = DTypeSize(c.dtype);
    const uint64_t n = 10000;  // Crosses the 4096-element blocks.
    std::vector<char> data(n * size);
    for (uint64_t i = 0; i < n; ++i) {
      std::memcpy(&data[i * size], &c.largest_finite, size);
    }
    EXPECT_EQ(FindNonFinite(c.dtype, data.data(), n), n) << DTypeName(c.dtype);
    for (uint64_t bad : c.bad_bits) {
      for (uint64_t at :
           {uint64_t{0}, uint64_t{4095}, uint64_t{4096}, uint64_t{9999}}) {
        std::vector<char> copy = data;
        std::memcpy(&copy[at * size], &bad, size);
        if (at != 9999) std::memcpy(&copy[9999 * size], &bad, size);
        EXPECT_EQ(FindNonFinite(c.dtype, copy.data(), n), at)
            << DTypeName(c.dtype) << " bits " << bad << " at " << at;
        // Unaligned start.
        std::vector<char> shifted(copy.size() + 1);
        std::memcpy(shifted.data() + 1, copy.data(), copy.size());
        EXPECT_EQ(FindNonFinite(c.dtype, shifted.data() + 1, n), at);
      }
    }
  }
  const char ints[4] = {-1, -1, -1, -1};
  EXPECT_EQ(FindNonFinite(v1::DTYPE_I32, ints, 1), 1u);
}

INSTANTIATE_TEST_SUITE_P(Isa, NonFiniteTest, ::testing::Values(0, 1, 2),
                         VariantName);

TEST(DTypeKernelsTest, FloatDTypes) {
  for (DType dtype : {v1::DTYPE_F32, v1::DTYPE_F64, v1::DTYPE_F16,
                      v1::DTYPE_BF16, v1::DTYPE_F8_E4M3, v1::DTYPE_F8_E5M2}) {
    EXPECT_TRUE(IsFloatDType(dtype)) << DTypeName(dtype);
  }
  for (DType dtype : {v1::DTYPE_I8, v1::DTYPE_U8, v1::DTYPE_I32, v1::DTYPE_U64,
                      v1::DTYPE_BOOL}) {
    EXPECT_FALSE(IsFloatDType(dtype)) << DTypeName(dtype);
  }
}

TEST(DTypeKernelsTest, IsaNameFollowsTheLimit) {
  LimitKernelIsaForTesting(0);
  EXPECT_EQ(std::string(KernelIsaName()), "portable");
  EXPECT_EQ(DetectedKernelIsa(), KernelIsa::kPortable);
  LimitKernelIsaForTesting(2);
}

}  // namespace
}  // namespace swarm
