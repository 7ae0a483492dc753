// Test helpers: models with several dtypes and reproducible contents.
#ifndef SWARM_MODEL_TEST_MODELS_H_
#define SWARM_MODEL_TEST_MODELS_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"

namespace swarm {
namespace testing_models {

// Fills every tensor with bytes from a seeded generator.
inline void FillRandom(Model* model, uint64_t seed) {
  std::mt19937_64 random(seed);
  for (size_t i = 0; i < model->num_tensors(); ++i) {
    absl::Span<char> bytes = model->mutable_tensor_data(i);
    size_t at = 0;
    while (at < bytes.size()) {
      const uint64_t word = random();
      const size_t n = std::min<size_t>(8, bytes.size() - at);
      std::memcpy(bytes.data() + at, &word, n);
      at += n;
    }
  }
}

// A model of about `approx_bytes` bytes spread over F32, F16, BF16, F64, I32,
// I64, U8 and BOOL tensors, plus a scalar and an empty tensor.
inline Model MultiDtypeModel(uint64_t approx_bytes, uint64_t seed) {
  const DType dtypes[] = {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16,
                          v1::DTYPE_F64, v1::DTYPE_I32, v1::DTYPE_I64,
                          v1::DTYPE_U8,  v1::DTYPE_BOOL};
  std::vector<TensorSpec> specs;
  const uint64_t per_tensor = approx_bytes / 8;
  int n = 0;
  for (DType dtype : dtypes) {
    // Odd row counts so tensors do not end on chunk boundaries.
    const uint64_t elements = per_tensor / DTypeSize(dtype);
    const uint64_t cols = 97;
    const uint64_t rows = elements / cols + 1;
    specs.push_back(*MakeTensorSpec("layer" + std::to_string(n++) + ".weight",
                                    dtype, {rows, cols}));
  }
  specs.push_back(*MakeTensorSpec("scalar", v1::DTYPE_F32, {}));
  specs.push_back(*MakeTensorSpec("empty", v1::DTYPE_F32, {0, 4}));
  absl::StatusOr<Model> model = Model::Create(std::move(specs));
  EXPECT_TRUE(model.ok()) << model.status();
  FillRandom(&*model, seed);
  return std::move(*model);
}

// True when both models have the same layout and identical bytes.
inline ::testing::AssertionResult BitIdentical(const Model& a, const Model& b) {
  if (!a.SameLayout(b))
    return ::testing::AssertionFailure() << "layouts differ";
  for (size_t i = 0; i < a.num_tensors(); ++i) {
    if (a.tensor_data(i) != b.tensor_data(i)) {
      return ::testing::AssertionFailure()
             << "tensor " << a.spec(i).name << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing_models
}  // namespace swarm

#endif  // SWARM_MODEL_TEST_MODELS_H_
