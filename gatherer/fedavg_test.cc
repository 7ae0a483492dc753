// FedAvg against a plain double-precision reference, across dtypes, payload
// kinds, accumulators, thread counts and the two ways in (Add of a model,
// the result sink); and its memory behaviour.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/storage_error.h"
#include "gatherer/aggregator.h"
#include "gatherer/aggregator_kernels.h"
#include "gatherer/aggregator_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm {
namespace {

using agg_test::BitIdentical;
using agg_test::Input;
using agg_test::Near;
using agg_test::RandomModel;
using agg_test::ReferenceFedAvg;
using agg_test::Shared;
using agg_test::Spec;
using agg_test::StreamThrough;

// A scratch directory, removed with its contents at the end of the test.
class TempDir : public persist::testutil::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("fedavg_test") {}
};

// Several tensors of `dtype` with awkward sizes, a scalar, an empty tensor.
std::vector<TensorSpec> SpecsOf(DType dtype) {
  return {Spec("a.weight", dtype, {37, 19}), Spec("a.bias", dtype, {37}),
          Spec("scalar", dtype, {}), Spec("empty", dtype, {0, 3}),
          Spec("b.weight", dtype, {1031})};
}

enum class Path { kAdd, kSink };
enum class Kinds { kFull, kDiff, kMixed };

struct Case {
  DType dtype;
  F32Accumulator accumulator;
  Path path;
  Kinds kinds;
  int threads;
};

// How far FedAvg may be from the exact mean: half an ulp of the output
// (rounding) plus the accumulated sum's error, which scales with the terms'
// magnitude (it shows when terms cancel). Per added result the compensated
// F32 sum loses at most 2^-10 ulp of the running sum (2^-33 relative), F64
// sums 2^-53, F32 sums (F16, BF16, F8) 2^-24. With 5 results, with margin:
double MagnitudeTolerance(DType dtype, F32Accumulator accumulator) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return accumulator == F32Accumulator::kCompensated ? std::ldexp(1, -30)
                                                         : std::ldexp(1, -48);
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
    case v1::DTYPE_F8_E4M3:
    case v1::DTYPE_F8_E5M2:
      return std::ldexp(1, -21);
    default:
      return std::ldexp(1, -48);
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(
      DTypeName(c.dtype),
      c.accumulator == F32Accumulator::kCompensated ? "_Compensated" : "_F64",
      c.path == Path::kAdd ? "_Add" : "_Sink",
      c.kinds == Kinds::kFull ? "_Full"
                              : (c.kinds == Kinds::kDiff ? "_Diff" : "_Mixed"),
      "_T", c.threads);
}

absl::Status Feed(Aggregator& aggregator, const Model& result, int64_t count,
                  v1::PayloadKind kind, Path path) {
  if (path == Path::kAdd) return aggregator.Add(result, count, kind);
  absl::StatusOr<std::unique_ptr<TensorSink>> sink = aggregator.NewResultSink();
  if (!sink.ok()) return sink.status();
  // Chunks that cut elements in two exercise the sink's edge checks.
  absl::StatusOr<Model> received = StreamThrough(**sink, result, 1001);
  if (!received.ok()) return received.status();
  EXPECT_FALSE(received->writable());
  return aggregator.Add(*received, count, kind);
}

class FedAvgReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(FedAvgReferenceTest, MatchesPlainDoubleComputation) {
  const Case& c = GetParam();
  const std::vector<TensorSpec> specs = SpecsOf(c.dtype);
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1, 0.5, 1.0));
  AggregatorOptions options;
  options.f32_accumulator = c.accumulator;
  options.num_threads = c.threads;
  absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
      Aggregator::Create(options, base);
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();

  std::mt19937 random(5);
  std::uniform_int_distribution<int64_t> count(1, 100000);
  std::vector<Model> results;
  std::vector<Input> inputs;
  for (int r = 0; r < 5; ++r) {
    const bool diff =
        c.kinds == Kinds::kDiff || (c.kinds == Kinds::kMixed && r % 2 == 1);
    results.push_back(diff ? RandomModel(specs, 100 + r, 0.0, 0.01)
                           : RandomModel(specs, 100 + r, 0.5, 1.0));
    inputs.push_back(
        {nullptr, count(random),
         diff ? v1::PAYLOAD_KIND_WEIGHT_DIFF : v1::PAYLOAD_KIND_FULL_WEIGHTS});
  }
  for (size_t r = 0; r < results.size(); ++r) {
    inputs[r].model = &results[r];
    ASSERT_TRUE(
        Feed(**aggregator, results[r], inputs[r].count, inputs[r].kind, c.path)
            .ok());
  }
  EXPECT_EQ((*aggregator)->num_added(), 5);
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->SameLayout(*base));
  EXPECT_TRUE(Near(*out, ReferenceFedAvg(*base, inputs), 0.5,
                   MagnitudeTolerance(c.dtype, c.accumulator)));
  EXPECT_EQ(out->metadata().at("aggregation"), "fedavg");
  EXPECT_EQ(out->metadata().at("num_results"), "5");
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType dtype :
       {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64}) {
    for (Kinds kinds : {Kinds::kFull, Kinds::kDiff, Kinds::kMixed}) {
      for (Path path : {Path::kAdd, Path::kSink}) {
        cases.push_back({dtype, F32Accumulator::kCompensated, path, kinds, 1});
      }
    }
  }
  for (Kinds kinds : {Kinds::kFull, Kinds::kDiff}) {
    cases.push_back(
        {v1::DTYPE_F32, F32Accumulator::kFloat64, Path::kAdd, kinds, 1});
  }
  for (DType dtype : {v1::DTYPE_F8_E4M3, v1::DTYPE_F8_E5M2, v1::DTYPE_I32,
                      v1::DTYPE_I64, v1::DTYPE_U8, v1::DTYPE_BOOL}) {
    cases.push_back(
        {dtype, F32Accumulator::kCompensated, Path::kAdd, Kinds::kFull, 1});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, FedAvgReferenceTest,
                         ::testing::ValuesIn(AllCases()), CaseName);

// Above kMinParallelBytes, so both threads work on each tensor.
std::vector<TensorSpec> LargeSpecs() {
  return {Spec("big", v1::DTYPE_F32, {1000003}),
          Spec("matrix", v1::DTYPE_F32, {517, 1031}),
          Spec("half", v1::DTYPE_F16, {700001}),
          Spec("wide", v1::DTYPE_F64, {100003}),
          Spec("count", v1::DTYPE_I64, {}),
          Spec("bias", v1::DTYPE_F32, {3})};
}

TEST(FedAvgThreadsTest, TwoThreadsGiveTheSameBitsAsOne) {
  const std::vector<TensorSpec> specs = LargeSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  std::vector<Model> results;
  std::vector<Input> inputs;
  for (int r = 0; r < 4; ++r) {
    results.push_back(RandomModel(specs, 50 + r, r % 2 ? 0.0 : 1.0, 1.0));
  }
  for (int r = 0; r < 4; ++r) {
    inputs.push_back(
        {&results[r], 10 + 7 * r,
         r % 2 ? v1::PAYLOAD_KIND_WEIGHT_DIFF : v1::PAYLOAD_KIND_FULL_WEIGHTS});
  }
  std::vector<Model> outs;
  for (int threads : {1, 2, 3}) {
    for (Path path : {Path::kAdd, Path::kSink}) {
      AggregatorOptions options;
      options.num_threads = threads;
      auto aggregator = Aggregator::Create(options, base);
      ASSERT_TRUE(aggregator.ok());
      for (const Input& input : inputs) {
        ASSERT_TRUE(
            Feed(**aggregator, *input.model, input.count, input.kind, path)
                .ok());
      }
      absl::StatusOr<Model> out = (*aggregator)->Finish();
      ASSERT_TRUE(out.ok()) << out.status();
      outs.push_back(std::move(*out));
    }
  }
  EXPECT_TRUE(
      Near(outs[0], ReferenceFedAvg(*base, inputs), 0.5, std::ldexp(1, -21)));
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_TRUE(BitIdentical(outs[0], outs[i])) << i;
  }
}

TEST(FedAvgThreadsTest, EveryKernelVariantGivesTheSameBits) {
  // The product error is exact with FMA and with double products alike.
  const std::vector<TensorSpec> specs = LargeSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  std::vector<Model> results;
  for (int r = 0; r < 3; ++r) results.push_back(RandomModel(specs, 70 + r));
  std::vector<Model> outs;
  for (int variant : {0, 1, 2}) {
    agg_internal::LimitKernelIsaForTesting(variant);
    AggregatorOptions options;
    options.num_threads = 2;
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(Feed(**aggregator, results[r], 3 + r,
                       v1::PAYLOAD_KIND_FULL_WEIGHTS,
                       r == 1 ? Path::kSink : Path::kAdd)
                      .ok());
    }
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    outs.push_back(std::move(*out));
  }
  agg_internal::LimitKernelIsaForTesting(2);
  EXPECT_TRUE(BitIdentical(outs[0], outs[1]));
  EXPECT_TRUE(BitIdentical(outs[0], outs[2]));
}

TEST(FedAvgMemoryTest, ResultsAreNotKept) {
  const std::vector<TensorSpec> specs = LargeSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  TempDir dir;
  for (bool offload : {false, true}) {
    AggregatorOptions options;
    options.num_threads = 2;
    if (offload) options.offload_dir = dir.path();
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    for (int r = 0; r < 12; ++r) {
      std::weak_ptr<ModelStorage> storage;
      {
        Model result = RandomModel(specs, 200 + r);
        if (r % 2 == 0) {
          storage = result.storage();
          ASSERT_TRUE((*aggregator)
                          ->Add(result, 10, v1::PAYLOAD_KIND_FULL_WEIGHTS)
                          .ok());
        } else {
          auto sink = (*aggregator)->NewResultSink();
          ASSERT_TRUE(sink.ok());
          absl::StatusOr<Model> received =
              StreamThrough(**sink, result, 1 << 20);
          ASSERT_TRUE(received.ok()) << received.status();
          storage = received->storage();
          if (offload) {
            EXPECT_EQ(dir.CountFiles(), 1);
          }
          ASSERT_TRUE((*aggregator)
                          ->Add(*received, 10, v1::PAYLOAD_KIND_FULL_WEIGHTS)
                          .ok());
        }
      }
      // Nothing of the result outlives the caller's copy.
      EXPECT_TRUE(storage.expired()) << r;
      EXPECT_EQ(dir.CountFiles(), 0);
    }
    ASSERT_TRUE((*aggregator)->Finish().ok());
  }
}

TEST(FedAvgMemoryTest, WithOffloadTheSumLivesInUnlinkedFilesSameBits) {
  const std::vector<TensorSpec> specs = LargeSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  std::vector<Model> results;
  for (int r = 0; r < 3; ++r) results.push_back(RandomModel(specs, 90 + r));
  TempDir dir;
  std::vector<Model> outs;
  for (bool offload : {false, true}) {
    AggregatorOptions options;
    options.num_threads = 2;
    if (offload) options.offload_dir = dir.path();
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(Feed(**aggregator, results[r], 4 + r,
                       r == 1 ? v1::PAYLOAD_KIND_WEIGHT_DIFF
                              : v1::PAYLOAD_KIND_FULL_WEIGHTS,
                       r == 2 ? Path::kSink : Path::kAdd)
                      .ok());
      EXPECT_EQ(dir.CountFiles(), 0);  // The sums' files are unlinked.
    }
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(dynamic_cast<const ScratchFileStorage*>(out->storage().get()) !=
                  nullptr,
              offload);
    EXPECT_TRUE(out->writable());
    outs.push_back(std::move(*out));
  }
  EXPECT_TRUE(BitIdentical(outs[0], outs[1]));
  EXPECT_EQ(outs[0].metadata(), outs[1].metadata());
  EXPECT_EQ(dir.CountFiles(), 0);
}

TEST(FedAvgMemoryTest, ASumTheOffloadDiskCannotHoldIsAStorageError) {
  const std::vector<TensorSpec> specs = LargeSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  Model result = RandomModel(specs, 2);
  TempDir dir;
  const std::string offload = dir.path() + "/offload";
  AggregatorOptions options;
  options.offload_dir = offload;
  auto aggregator = Aggregator::Create(options, base);
  ASSERT_TRUE(aggregator.ok());
  std::filesystem::remove_all(offload);  // The disk under it went away.
  absl::Status added =
      (*aggregator)->Add(result, 5, v1::PAYLOAD_KIND_FULL_WEIGHTS);
  EXPECT_TRUE(IsStorageError(added)) << added;
  EXPECT_NE(added.message().find(offload), std::string::npos) << added;
  EXPECT_EQ((*aggregator)->num_added(), 0);
  // Nothing was folded in: once the directory is back the round goes on.
  std::filesystem::create_directories(offload);
  ASSERT_TRUE(
      (*aggregator)->Add(result, 5, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  auto in_memory = Aggregator::Create(AggregatorOptions(), base);
  ASSERT_TRUE(in_memory.ok());
  ASSERT_TRUE((*in_memory)->Add(result, 5, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> expected = (*in_memory)->Finish();
  ASSERT_TRUE(expected.ok());
  EXPECT_TRUE(BitIdentical(*out, *expected));
}

TEST(FedAvgPrecisionTest, ManyResultsStayNearTheExactMean) {
  // 300 results near 1 whose weighted mean needs more than F32's 24 bits
  // along the way: both accumulators stay within rounding of the exact
  // mean.
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {4099})};
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  std::vector<Model> results;
  std::vector<Input> inputs;
  std::mt19937 random(9);
  std::uniform_int_distribution<int64_t> count(1, 1 << 20);
  for (int r = 0; r < 300; ++r) {
    results.push_back(RandomModel(specs, 1000 + r, 1.0, 1e-3));
  }
  for (int r = 0; r < 300; ++r) {
    inputs.push_back(
        {&results[r], count(random), v1::PAYLOAD_KIND_FULL_WEIGHTS});
  }
  const auto expected = ReferenceFedAvg(*base, inputs);
  for (F32Accumulator accumulator :
       {F32Accumulator::kCompensated, F32Accumulator::kFloat64}) {
    AggregatorOptions options;
    options.f32_accumulator = accumulator;
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    for (const Input& input : inputs) {
      ASSERT_TRUE(
          (*aggregator)->Add(*input.model, input.count, input.kind).ok());
    }
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    EXPECT_TRUE(Near(*out, expected, 0.5,
                     MagnitudeTolerance(v1::DTYPE_F32, accumulator) * 60));
  }
}

TEST(FedAvgWeightsTest, ExtremeSampleCounts) {
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {257})};
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  std::vector<Model> results;
  for (int r = 0; r < 3; ++r) {
    results.push_back(RandomModel(specs, 10 + r, 1.0, 0.01));
  }
  // Counts up to 2^24 are exact weights.
  {
    std::vector<Input> inputs = {
        {&results[0], 1, v1::PAYLOAD_KIND_FULL_WEIGHTS},
        {&results[1], 1 << 24, v1::PAYLOAD_KIND_FULL_WEIGHTS},
        {&results[2], 3, v1::PAYLOAD_KIND_FULL_WEIGHTS}};
    auto aggregator = Aggregator::Create({}, base);
    ASSERT_TRUE(aggregator.ok());
    for (const Input& input : inputs) {
      ASSERT_TRUE(
          (*aggregator)->Add(*input.model, input.count, input.kind).ok());
    }
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    EXPECT_TRUE(
        Near(*out, ReferenceFedAvg(*base, inputs), 0.5, std::ldexp(1, -30)));
    EXPECT_EQ((*aggregator)->total_samples(), (1 << 24) + 4);
  }
  // Larger counts are rounded to 24 significant bits (relative 6e-8).
  {
    std::vector<Input> inputs = {
        {&results[0], 1000000000001, v1::PAYLOAD_KIND_FULL_WEIGHTS},
        {&results[1], 3000000000007, v1::PAYLOAD_KIND_FULL_WEIGHTS},
        {&results[2], 7, v1::PAYLOAD_KIND_FULL_WEIGHTS}};
    auto aggregator = Aggregator::Create({}, base);
    ASSERT_TRUE(aggregator.ok());
    for (const Input& input : inputs) {
      ASSERT_TRUE(
          (*aggregator)->Add(*input.model, input.count, input.kind).ok());
    }
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    EXPECT_TRUE(
        Near(*out, ReferenceFedAvg(*base, inputs), 0.5, std::ldexp(1, -22)));
  }
  // A total beyond int64 is refused and changes nothing.
  {
    auto aggregator = Aggregator::Create({}, base);
    ASSERT_TRUE(aggregator.ok());
    ASSERT_TRUE(
        (*aggregator)
            ->Add(results[0], INT64_MAX - 5, v1::PAYLOAD_KIND_FULL_WEIGHTS)
            .ok());
    absl::Status status =
        (*aggregator)->Add(results[1], 6, v1::PAYLOAD_KIND_FULL_WEIGHTS);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("overflows"), std::string::npos);
    EXPECT_EQ((*aggregator)->num_added(), 1);
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    EXPECT_TRUE(Near(*out,
                     ReferenceFedAvg(*base, {{&results[0], 1,
                                              v1::PAYLOAD_KIND_FULL_WEIGHTS}}),
                     0.5, 0));
  }
}

TEST(FedAvgIntegerTest, IntegersAverageAndRoundBoolsVote) {
  const std::vector<TensorSpec> specs = {Spec("steps", v1::DTYPE_I64, {3}),
                                         Spec("mask", v1::DTYPE_BOOL, {3})};
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  auto make = [&](std::vector<double> steps, std::vector<double> mask) {
    Model model = *Model::Create(specs);
    for (int i = 0; i < 3; ++i) {
      agg_test::Set(model, 0, i, steps[i]);
      agg_test::Set(model, 1, i, mask[i]);
    }
    return model;
  };
  Model a = make({10, 1, 7}, {1, 0, 1});
  Model b = make({20, 2, 7}, {0, 0, 1});
  Model c = make({30, 4, 7}, {0, 1, 1});
  auto aggregator = Aggregator::Create({}, base);
  ASSERT_TRUE(aggregator.ok());
  ASSERT_TRUE((*aggregator)->Add(a, 2, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  ASSERT_TRUE((*aggregator)->Add(b, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  ASSERT_TRUE((*aggregator)->Add(c, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok());
  // (2*10 + 20 + 30) / 4 = 17.5 -> 18 (ties to even); (2+2+4)/4 = 2; 7.
  EXPECT_EQ(agg_test::Get(*out, 0, 0), 18);
  EXPECT_EQ(agg_test::Get(*out, 0, 1), 2);
  EXPECT_EQ(agg_test::Get(*out, 0, 2), 7);
  // Weighted votes: 2/4 (a tie is false), 1/4, 4/4.
  EXPECT_EQ(agg_test::Get(*out, 1, 0), 0);
  EXPECT_EQ(agg_test::Get(*out, 1, 1), 0);
  EXPECT_EQ(agg_test::Get(*out, 1, 2), 1);
}

TEST(FedAvgLifecycleTest, FinishOnceAfterAtLeastOneResult) {
  const std::vector<TensorSpec> specs = SpecsOf(v1::DTYPE_F32);
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  auto aggregator = Aggregator::Create({}, base);
  ASSERT_TRUE(aggregator.ok());
  EXPECT_EQ((*aggregator)->method(), v1::AGGREGATION_FEDAVG);
  EXPECT_EQ((*aggregator)->Finish().status().code(),
            absl::StatusCode::kFailedPrecondition);
  Model result = RandomModel(specs, 2);
  ASSERT_TRUE(
      (*aggregator)->Add(result, 3, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok());
  // One full-weights result: the result itself.
  EXPECT_TRUE(BitIdentical(*out, result));
  EXPECT_EQ((*aggregator)->Finish().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*aggregator)->Add(result, 3, v1::PAYLOAD_KIND_FULL_WEIGHTS).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(FedAvgFileTest, AddFileReadsSafetensorsInAnyTensorOrder) {
  const std::vector<TensorSpec> specs = SpecsOf(v1::DTYPE_BF16);
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  TempDir dir;
  std::vector<Model> results;
  std::vector<Input> inputs;
  for (int r = 0; r < 3; ++r) results.push_back(RandomModel(specs, 30 + r));
  for (int r = 0; r < 3; ++r) {
    inputs.push_back({&results[r], 5 + r, v1::PAYLOAD_KIND_FULL_WEIGHTS});
    // Written with the tensors in reverse order.
    std::vector<TensorSpec> reversed(specs.rbegin(), specs.rend());
    Model copy = *Model::Create(reversed);
    for (size_t t = 0; t < specs.size(); ++t) {
      const absl::string_view from = results[r].tensor_data(t);
      std::memcpy(copy.mutable_tensor_data(specs.size() - 1 - t).data(),
                  from.data(), from.size());
    }
    ASSERT_TRUE(copy.SaveSafetensors(absl::StrCat(dir.path(), "/", r)).ok());
  }
  auto aggregator = Aggregator::Create({}, base);
  ASSERT_TRUE(aggregator.ok());
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE((*aggregator)
                    ->AddFile(absl::StrCat(dir.path(), "/", r), inputs[r].count,
                              inputs[r].kind)
                    .ok());
  }
  EXPECT_EQ(
      (*aggregator)
          ->AddFile(dir.path() + "/missing", 1, v1::PAYLOAD_KIND_FULL_WEIGHTS)
          .code(),
      absl::StatusCode::kNotFound);
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(
      Near(*out, ReferenceFedAvg(*base, inputs), 0.5, std::ldexp(1, -21)));
  EXPECT_EQ(dir.CountFiles(), 3);  // Caller's files are left alone.
}

// ---------------------------------------------------------------------------
// Chain reduction: AddPartialSum.

namespace partial {

// The partial sum of `inputs` as a chain's hops make it: the first
// result as it is with its count as the scale, then at each hop
// out = scale * in + count * result, rounded to F32 (PartialSumSink).
Model ChainSum(const std::vector<TensorSpec>& specs,
               const std::vector<Input>& inputs, double* scale) {
  Model sum = *Model::Create(specs);
  for (size_t t = 0; t < specs.size(); ++t) {
    for (uint64_t i = 0; i < agg_test::Elements(specs[t]); ++i) {
      double value = agg_test::Get(*inputs[0].model, t, i);
      double in_scale = static_cast<double>(inputs[0].count);
      for (size_t k = 1; k < inputs.size(); ++k) {
        value = static_cast<float>(in_scale * value +
                                   static_cast<double>(inputs[k].count) *
                                       agg_test::Get(*inputs[k].model, t, i));
        in_scale = 1;
      }
      agg_test::Set(sum, t, i, value);
    }
  }
  *scale = inputs.size() == 1 ? static_cast<double>(inputs[0].count) : 1;
  return sum;
}

std::vector<Aggregator::PartialTerm> Terms(const std::vector<Input>& inputs) {
  std::vector<Aggregator::PartialTerm> terms;
  for (const Input& input : inputs) terms.push_back({input.count, input.kind});
  return terms;
}

}  // namespace partial

// A partial sum of three results (mixed payload kinds) and one result on
// its own: the mean of all four, within the partial's F32 rounding (one per
// hop, relative to the terms' magnitude), counted as four results.
TEST(FedAvgPartialSumTest, APartialSumCountsAsEachOfItsResults) {
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {1031}),
                                         Spec("b", v1::DTYPE_F32, {37})};
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  std::vector<Model> results;
  for (int r = 0; r < 4; ++r) results.push_back(RandomModel(specs, 60 + r));
  std::vector<Input> inputs;
  for (int r = 0; r < 4; ++r) {
    inputs.push_back({&results[r], 10 + 7 * r,
                      r == 2 ? v1::PAYLOAD_KIND_WEIGHT_DIFF
                             : v1::PAYLOAD_KIND_FULL_WEIGHTS});
  }
  const std::vector<Input> chained(inputs.begin() + 1, inputs.end());
  double scale = 0;
  Model sum = partial::ChainSum(specs, chained, &scale);
  auto aggregator = Aggregator::Create(AggregatorOptions(), base);
  ASSERT_TRUE(aggregator.ok());
  ASSERT_TRUE(
      (*aggregator)->Add(results[0], inputs[0].count, inputs[0].kind).ok());
  ASSERT_TRUE(
      (*aggregator)->AddPartialSum(sum, scale, partial::Terms(chained)).ok());
  EXPECT_EQ((*aggregator)->num_added(), 4);
  EXPECT_EQ((*aggregator)->total_samples(), 10 + 17 + 24 + 31);
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->metadata().at("num_results"), "4");
  EXPECT_TRUE(
      Near(*out, ReferenceFedAvg(*base, inputs), 0.5, std::ldexp(1, -21)));
}

// Values and counts whose products and sums are exact in F32: the partial
// sum gives the same bits as adding each result, whatever the order.
TEST(FedAvgPartialSumTest, ExactInputsGiveTheBitsOfAddingEachResult) {
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {257})};
  std::shared_ptr<const Model> base = Shared(*Model::Create(specs));
  std::vector<Model> results;
  for (int r = 0; r < 4; ++r) {
    Model model = *Model::Create(specs);
    for (uint64_t i = 0; i < 257; ++i) {
      agg_test::Set(model, 0, i, static_cast<double>((i * (r + 3)) % 64) / 8);
    }
    results.push_back(std::move(model));
  }
  std::vector<Input> inputs;
  for (int r = 0; r < 4; ++r) {
    inputs.push_back(
        {&results[r], r % 2 ? 3 : 1, v1::PAYLOAD_KIND_FULL_WEIGHTS});
  }
  auto each = Aggregator::Create(AggregatorOptions(), base);
  for (const Input& input : inputs) {
    ASSERT_TRUE((*each)->Add(*input.model, input.count, input.kind).ok());
  }
  double scale = 0;
  Model sum = partial::ChainSum(specs, inputs, &scale);
  auto chained = Aggregator::Create(AggregatorOptions(), base);
  ASSERT_TRUE(
      (*chained)->AddPartialSum(sum, scale, partial::Terms(inputs)).ok());
  absl::StatusOr<Model> a = (*each)->Finish();
  absl::StatusOr<Model> b = (*chained)->Finish();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(BitIdentical(*a, *b));
}

// Bad partial sums are refused with the rule named, and the aggregate is
// as if they had never been offered.
TEST(FedAvgPartialSumTest, BadPartialSumsLeaveTheAggregateUnchanged) {
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {100})};
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  Model result = RandomModel(specs, 2);
  Model sum = RandomModel(specs, 3);
  Model other = RandomModel({Spec("v", v1::DTYPE_F32, {100})}, 4);
  auto aggregator = Aggregator::Create(AggregatorOptions(), base);
  ASSERT_TRUE(aggregator.ok());
  const std::vector<Aggregator::PartialTerm> two = {
      {5, v1::PAYLOAD_KIND_FULL_WEIGHTS}, {3, v1::PAYLOAD_KIND_FULL_WEIGHTS}};
  EXPECT_THAT((*aggregator)->AddPartialSum(sum, 1, {}).message(),
              ::testing::HasSubstr("a partial sum of no results"));
  EXPECT_THAT((*aggregator)
                  ->AddPartialSum(sum, 1, {{0, v1::PAYLOAD_KIND_FULL_WEIGHTS}})
                  .message(),
              ::testing::HasSubstr("sample count 0 is not positive"));
  EXPECT_THAT((*aggregator)->AddPartialSum(sum, 0, two).message(),
              ::testing::HasSubstr("partial_scale 0 is not a positive number"));
  EXPECT_THAT((*aggregator)->AddPartialSum(sum, std::nan(""), two).message(),
              ::testing::HasSubstr("is not a positive number"));
  EXPECT_FALSE((*aggregator)->AddPartialSum(other, 1, two).ok());
  EXPECT_EQ((*aggregator)->num_added(), 0);
  ASSERT_TRUE(
      (*aggregator)->Add(result, 7, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(BitIdentical(*out, result));
}

TEST(FedAvgPartialSumTest, OnlyFedAvgAddsPartialSums) {
  TempDir dir;
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {10})};
  AggregatorOptions options;
  options.method = v1::AGGREGATION_MEDIAN;
  options.offload_dir = dir.path();
  auto median = Aggregator::Create(options, Shared(RandomModel(specs, 1)));
  ASSERT_TRUE(median.ok()) << median.status();
  absl::Status added = (*median)->AddPartialSum(
      RandomModel(specs, 2), 1, {{1, v1::PAYLOAD_KIND_FULL_WEIGHTS}});
  EXPECT_EQ(added.code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace swarm
