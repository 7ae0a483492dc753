#include "common/dtype.h"

#include "gtest/gtest.h"

namespace swarm {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (DType dtype :
       {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64,
        v1::DTYPE_I32, v1::DTYPE_I64, v1::DTYPE_U8, v1::DTYPE_BOOL}) {
    absl::StatusOr<DType> parsed = ParseDTypeName(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
    EXPECT_GT(DTypeSize(dtype), 0u);
  }
}

TEST(DTypeTest, UnknownNameIsNamedInError) {
  absl::StatusOr<DType> parsed = ParseDTypeName("F31");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("F31"), absl::string_view::npos);
}

TEST(DTypeTest, ByteSizeChecksOverflow) {
  EXPECT_EQ(*TensorByteSize(v1::DTYPE_BF16, {3, 5}), 30u);
  EXPECT_EQ(*TensorByteSize(v1::DTYPE_F32, {}), 4u);
  EXPECT_EQ(*TensorByteSize(v1::DTYPE_F32, {0, 7}), 0u);
  EXPECT_FALSE(TensorByteSize(v1::DTYPE_F64, {1ull << 61}).ok());
  EXPECT_FALSE(TensorByteSize(v1::DTYPE_U8, {1ull << 32, 1ull << 32}).ok());
  EXPECT_FALSE(TensorByteSize(v1::DTYPE_UNSPECIFIED, {1}).ok());
}

}  // namespace
}  // namespace swarm
