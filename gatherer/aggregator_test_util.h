// Test helpers for the aggregators: models with reproducible values of any
// dtype, and plain reference computations in double.
#ifndef SWARM_GATHERER_AGGREGATOR_TEST_UTIL_H_
#define SWARM_GATHERER_AGGREGATOR_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gatherer/aggregator.h"
#include "gatherer/aggregator_kernels.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/tensor_sink.h"

namespace swarm {
namespace agg_test {

inline TensorSpec Spec(const std::string& name, DType dtype,
                       std::vector<uint64_t> shape) {
  absl::StatusOr<TensorSpec> spec = MakeTensorSpec(name, dtype, shape);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

inline uint64_t Elements(const TensorSpec& spec) {
  return spec.byte_size / DTypeSize(spec.dtype);
}

// Value `i` of tensor `t` as a double.
inline double Get(const Model& model, size_t t, uint64_t i) {
  return agg_internal::LoadAsDouble(model.spec(t).dtype,
                                    model.tensor_data(t).data(), i);
}
inline void Set(Model& model, size_t t, uint64_t i, double value) {
  agg_internal::StoreFromDouble(model.spec(t).dtype, value,
                                model.mutable_tensor_data(t).data(), i);
}

// A writable model with values drawn from N(mean, stddev) (rounded into
// each dtype; integers in [0, 100), BOOL 0/1).
inline Model RandomModel(const std::vector<TensorSpec>& specs, uint64_t seed,
                         double mean = 0.0, double stddev = 1.0) {
  absl::StatusOr<Model> model = Model::Create(specs);
  EXPECT_TRUE(model.ok()) << model.status();
  std::mt19937_64 random(seed);
  std::normal_distribution<double> normal(mean, stddev);
  std::uniform_int_distribution<int> small(0, 99);
  for (size_t t = 0; t < specs.size(); ++t) {
    const DType dtype = specs[t].dtype;
    for (uint64_t i = 0; i < Elements(specs[t]); ++i) {
      double value;
      if (agg_internal::IsFloatDType(dtype)) {
        value = normal(random);
      } else if (dtype == v1::DTYPE_BOOL) {
        value = small(random) % 2;
      } else {
        value = small(random);
      }
      Set(*model, t, i, value);
    }
  }
  return std::move(*model);
}

inline std::shared_ptr<const Model> Shared(Model model) {
  return std::make_shared<const Model>(std::move(model));
}

struct Input {
  const Model* model;
  int64_t count;
  v1::PayloadKind kind;
};

// A reference result: per tensor, the exact-ish value of every element and
// the magnitude of the terms it came from (for FedAvg, the weighted mean of
// |x|): a sum's rounding errors scale with that, not with the result, when
// terms cancel.
struct Reference {
  std::vector<std::vector<double>> value;
  std::vector<std::vector<double>> magnitude;
};

// Plain weighted FedAvg in double, unrounded.
inline Reference ReferenceFedAvg(const Model& base,
                                 const std::vector<Input>& inputs) {
  Reference out;
  out.value.resize(base.num_tensors());
  out.magnitude.resize(base.num_tensors());
  double total = 0;
  for (const Input& input : inputs) total += input.count;
  for (size_t t = 0; t < base.num_tensors(); ++t) {
    const uint64_t n = Elements(base.spec(t));
    for (uint64_t i = 0; i < n; ++i) {
      double sum = 0;
      double magnitude = 0;
      for (const Input& input : inputs) {
        double value = Get(*input.model, t, i);
        if (input.kind == v1::PAYLOAD_KIND_WEIGHT_DIFF) {
          value += Get(base, t, i);
        }
        sum += static_cast<double>(input.count) * value;
        magnitude += static_cast<double>(input.count) * std::fabs(value);
      }
      out.value[t].push_back(sum / total);
      out.magnitude[t].push_back(magnitude / total);
    }
  }
  return out;
}

// Plain coordinate-wise median / trimmed mean in double, unrounded.
inline std::vector<std::vector<double>> ReferenceCoordinate(
    const Model& base, const std::vector<Input>& inputs, bool median,
    double trim_fraction) {
  std::vector<std::vector<double>> out(base.num_tensors());
  const size_t n = inputs.size();
  for (size_t t = 0; t < base.num_tensors(); ++t) {
    const uint64_t elements = Elements(base.spec(t));
    for (uint64_t i = 0; i < elements; ++i) {
      std::vector<double> values;
      for (const Input& input : inputs) {
        double value = Get(*input.model, t, i);
        if (input.kind == v1::PAYLOAD_KIND_WEIGHT_DIFF) {
          value += Get(base, t, i);
        }
        values.push_back(value);
      }
      std::sort(values.begin(), values.end());
      double result;
      if (median) {
        result = n % 2 == 1 ? values[n / 2]
                            : (values[n / 2 - 1] + values[n / 2]) / 2;
      } else {
        const size_t k = static_cast<size_t>(
            std::floor(trim_fraction * static_cast<double>(n) + 1e-9));
        double sum = 0;
        for (size_t j = k; j < n - k; ++j) sum += values[j];
        result = sum / static_cast<double>(n - 2 * k);
      }
      out[t].push_back(result);
    }
  }
  return out;
}

// Spacing of `dtype`'s values around `value` (its ulp); 1 for integers.
inline double Ulp(DType dtype, double value) {
  const double magnitude = std::max(std::fabs(value), 1e-300);
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(e-1), 2^e)
  switch (dtype) {
    case v1::DTYPE_F32:
      return std::ldexp(1.0, std::max(exponent - 24, -149));
    case v1::DTYPE_F64:
      return std::ldexp(1.0, std::max(exponent - 53, -1074));
    case v1::DTYPE_F16:
      return std::ldexp(1.0, std::max(exponent - 11, -24));
    case v1::DTYPE_BF16:
      return std::ldexp(1.0, std::max(exponent - 8, -133));
    case v1::DTYPE_F8_E4M3:
      return std::ldexp(1.0, std::max(exponent - 4, -9));
    case v1::DTYPE_F8_E5M2:
      return std::ldexp(1.0, std::max(exponent - 3, -16));
    default:
      return 1.0;
  }
}

// Every value of `actual` within `ulps` ulps (of its dtype) of `expected`,
// plus `relative` times the element's term magnitude when given; integers
// within `ulps` (the reference is unrounded).
inline ::testing::AssertionResult Near(
    const Model& actual, const std::vector<std::vector<double>>& expected,
    double ulps, const std::vector<std::vector<double>>* magnitude = nullptr,
    double relative = 0) {
  for (size_t t = 0; t < actual.num_tensors(); ++t) {
    const DType dtype = actual.spec(t).dtype;
    for (uint64_t i = 0; i < expected[t].size(); ++i) {
      const double got = Get(actual, t, i);
      const double want = expected[t][i];
      double tolerance = ulps * Ulp(dtype, want);
      if (magnitude != nullptr) tolerance += relative * (*magnitude)[t][i];
      if (dtype == v1::DTYPE_BOOL) tolerance = 0.5;
      if (std::isnan(want) ? !std::isnan(got)
                           : !(std::fabs(got - want) <= tolerance)) {
        return ::testing::AssertionFailure()
               << "tensor " << actual.spec(t).name << " (" << DTypeName(dtype)
               << ") element " << i << ": got " << got << ", want " << want
               << " within " << tolerance << " ("
               << (want - got) / Ulp(dtype, want) << " ulp)";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult Near(const Model& actual,
                                       const Reference& expected, double ulps,
                                       double relative) {
  return Near(actual, expected.value, ulps, &expected.magnitude, relative);
}

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

// Streams `model` into `sink` in chunks of `chunk` bytes (as an Assembler
// would) and returns what the sink produced.
inline absl::StatusOr<Model> StreamThrough(TensorSink& sink, const Model& model,
                                           uint64_t chunk) {
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_RESULT);
  absl::Status status = sink.Begin(header, model.specs());
  if (!status.ok()) {
    sink.Abort();
    return status;
  }
  for (uint32_t t = 0; t < model.num_tensors(); ++t) {
    const absl::string_view bytes = model.tensor_data(t);
    for (uint64_t offset = 0; offset < bytes.size(); offset += chunk) {
      const uint64_t n = std::min<uint64_t>(chunk, bytes.size() - offset);
      absl::StatusOr<char*> out = sink.WritableRange(t, offset, n);
      if (!out.ok()) {
        sink.Abort();
        return out.status();
      }
      std::memcpy(*out, bytes.data() + offset, n);
      status = sink.CommitRange(t, offset, n);
      if (!status.ok()) {
        sink.Abort();
        return status;
      }
    }
  }
  return sink.Finish();
}

}  // namespace agg_test
}  // namespace swarm

#endif  // SWARM_GATHERER_AGGREGATOR_TEST_UTIL_H_
