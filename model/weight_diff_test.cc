#include "model/weight_diff.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

Model Filled(DType dtype, double value) {
  absl::StatusOr<Model> model = Model::Create({TensorSpec{"w", dtype, {3}, 3 * DTypeSize(dtype)}});
  EXPECT_TRUE(model.ok()) << model.status();
  absl::Span<char> data = model->mutable_tensor_data(0);
  for (int i = 0; i < 3; ++i) {
    if (dtype == v1::DTYPE_F32) {
      const float v = static_cast<float>(value * (i + 1));
      std::memcpy(data.data() + i * 4, &v, 4);
    } else if (dtype == v1::DTYPE_F64) {
      const double v = value * (i + 1);
      std::memcpy(data.data() + i * 8, &v, 8);
    }
  }
  return std::move(*model);
}

TEST(WeightDiffTest, SubtractsTheGlobalModel) {
  Model global = Filled(v1::DTYPE_F32, 1.0);
  Model trained = Filled(v1::DTYPE_F32, 3.5);
  ASSERT_TRUE(ToWeightDiff(global, &trained).ok());
  float v[3];
  std::memcpy(v, trained.tensor_data(0).data(), sizeof(v));
  EXPECT_FLOAT_EQ(v[0], 2.5f);
  EXPECT_FLOAT_EQ(v[2], 7.5f);

  Model global64 = Filled(v1::DTYPE_F64, 0.25);
  Model trained64 = Filled(v1::DTYPE_F64, 1.0);
  ASSERT_TRUE(ToWeightDiff(global64, &trained64).ok());
  double d[3];
  std::memcpy(d, trained64.tensor_data(0).data(), sizeof(d));
  EXPECT_DOUBLE_EQ(d[1], 1.5);
}

TEST(WeightDiffTest, OtherDtypesAndLayoutsAreRefusedUntouched) {
  Model global = Filled(v1::DTYPE_I32, 0);
  Model trained = Filled(v1::DTYPE_I32, 0);
  absl::Status refused = ToWeightDiff(global, &trained);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("\"w\""));

  Model other = Filled(v1::DTYPE_F64, 1.0);
  Model mine = Filled(v1::DTYPE_F32, 2.0);
  EXPECT_EQ(ToWeightDiff(other, &mine).code(),
            absl::StatusCode::kFailedPrecondition);
  float v;
  std::memcpy(&v, mine.tensor_data(0).data(), 4);
  EXPECT_FLOAT_EQ(v, 2.0f);
}

}  // namespace
}  // namespace swarm
