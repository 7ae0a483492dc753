// Coordinate-wise median and trimmed mean against a plain reference, with
// odd and even numbers of results, through every way in (Add, the sink,
// AddFile), and their offload files.
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/storage_error.h"
#include "gatherer/aggregator.h"
#include "gatherer/aggregator_test_util.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm {
namespace {

using agg_test::Input;
using agg_test::Near;
using agg_test::RandomModel;
using agg_test::ReferenceCoordinate;
using agg_test::Shared;
using agg_test::Spec;
using agg_test::StreamThrough;

// A scratch directory, removed with its contents at the end of the test.
class TempDir : public persist::testutil::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("coordinate_test") {}
};

std::vector<TensorSpec> MixedSpecs() {
  return {
      Spec("w32", v1::DTYPE_F32, {23, 11}), Spec("w16", v1::DTYPE_F16, {97}),
      Spec("wb16", v1::DTYPE_BF16, {5, 7}), Spec("w64", v1::DTYPE_F64, {13}),
      Spec("steps", v1::DTYPE_I32, {9}),    Spec("scalar", v1::DTYPE_F32, {}),
      Spec("empty", v1::DTYPE_F16, {0})};
}

enum class Path { kAdd, kSink, kFile };

struct Case {
  v1::AggregationMethod method;
  double trim_fraction;
  int n;
  Path path;
  int threads;
  bool diffs;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(
      c.method == v1::AGGREGATION_MEDIAN
          ? std::string("Median")
          : absl::StrCat("Trimmed", static_cast<int>(c.trim_fraction * 100)),
      "_N", c.n,
      c.path == Path::kAdd ? "_Add"
                           : (c.path == Path::kSink ? "_Sink" : "_File"),
      "_T", c.threads, c.diffs ? "_Diffs" : "");
}

class CoordinateReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(CoordinateReferenceTest, MatchesPlainComputation) {
  const Case& c = GetParam();
  TempDir offload;
  TempDir inputs_dir;
  const std::vector<TensorSpec> specs = MixedSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  AggregatorOptions options;
  options.method = c.method;
  options.trim_fraction = c.trim_fraction;
  options.offload_dir = offload.path();
  options.num_threads = c.threads;
  options.block_coordinates = 7;  // Many blocks, cut inside tensors.
  absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
      Aggregator::Create(options, base);
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  EXPECT_EQ((*aggregator)->method(), c.method);

  std::vector<Model> results;
  std::vector<Input> inputs;
  for (int r = 0; r < c.n; ++r) {
    const bool diff = c.diffs && r % 2 == 0;
    results.push_back(RandomModel(specs, 40 + r, diff ? 0.0 : 0.3, 1.0));
  }
  for (int r = 0; r < c.n; ++r) {
    const bool diff = c.diffs && r % 2 == 0;
    inputs.push_back(
        {&results[r], 10 + r,
         diff ? v1::PAYLOAD_KIND_WEIGHT_DIFF : v1::PAYLOAD_KIND_FULL_WEIGHTS});
    switch (c.path) {
      case Path::kAdd:
        ASSERT_TRUE((*aggregator)
                        ->Add(results[r], inputs[r].count, inputs[r].kind)
                        .ok());
        break;
      case Path::kSink: {
        auto sink = (*aggregator)->NewResultSink();
        ASSERT_TRUE(sink.ok());
        absl::StatusOr<Model> received = StreamThrough(**sink, results[r], 999);
        ASSERT_TRUE(received.ok()) << received.status();
        ASSERT_TRUE((*aggregator)
                        ->Add(*received, inputs[r].count, inputs[r].kind)
                        .ok());
        break;
      }
      case Path::kFile: {
        const std::string path = absl::StrCat(inputs_dir.path(), "/", r);
        ASSERT_TRUE(results[r].SaveSafetensors(path).ok());
        ASSERT_TRUE(
            (*aggregator)->AddFile(path, inputs[r].count, inputs[r].kind).ok());
        break;
      }
    }
  }
  // Results live on disk: in the offload directory unless the caller's.
  EXPECT_EQ(offload.CountFiles(), c.path == Path::kFile ? 0 : c.n);
  EXPECT_EQ((*aggregator)->num_added(), c.n);
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->SameLayout(*base));
  EXPECT_TRUE(Near(
      *out,
      ReferenceCoordinate(*base, inputs, c.method == v1::AGGREGATION_MEDIAN,
                          c.trim_fraction),
      0.5));
  EXPECT_EQ(offload.CountFiles(), 0);
  EXPECT_EQ(inputs_dir.CountFiles(), c.path == Path::kFile ? c.n : 0);
  EXPECT_EQ((*aggregator)->Finish().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (int n : {5, 6}) {
    for (Path path : {Path::kAdd, Path::kSink, Path::kFile}) {
      cases.push_back({v1::AGGREGATION_MEDIAN, 0, n, path, 1, false});
      cases.push_back({v1::AGGREGATION_TRIMMED_MEAN, 0.2, n, path, 1, false});
    }
    cases.push_back({v1::AGGREGATION_MEDIAN, 0, n, Path::kSink, 2, true});
    cases.push_back(
        {v1::AGGREGATION_TRIMMED_MEAN, 0.34, n, Path::kAdd, 2, true});
    cases.push_back(
        {v1::AGGREGATION_TRIMMED_MEAN, 0.0, n, Path::kAdd, 2, false});
    cases.push_back(
        {v1::AGGREGATION_TRIMMED_MEAN, 0.49, n, Path::kSink, 3, false});
  }
  // Sorting networks of awkward sizes.
  for (int n : {3, 4, 7, 9, 16, 17, 33}) {
    cases.push_back({v1::AGGREGATION_MEDIAN, 0, n, Path::kAdd, 2, n % 2 == 1});
    cases.push_back(
        {v1::AGGREGATION_TRIMMED_MEAN, 0.1, n, Path::kAdd, 1, false});
  }
  cases.push_back({v1::AGGREGATION_MEDIAN, 0, 1, Path::kAdd, 1, false});
  cases.push_back({v1::AGGREGATION_MEDIAN, 0, 2, Path::kAdd, 2, false});
  cases.push_back(
      {v1::AGGREGATION_TRIMMED_MEAN, 0.3, 10, Path::kAdd, 2, false});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Small, CoordinateReferenceTest,
                         ::testing::ValuesIn(AllCases()), CaseName);

TEST(CoordinateTest, SmallExamplesByHand) {
  TempDir offload;
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {2})};
  std::shared_ptr<const Model> base = Shared(*Model::Create(specs));
  auto make = [&](float a, float b) {
    Model model = *Model::Create(specs);
    agg_test::Set(model, 0, 0, a);
    agg_test::Set(model, 0, 1, b);
    return model;
  };
  std::vector<Model> results;
  results.push_back(make(1, -100));
  results.push_back(make(2, 4));
  results.push_back(make(100, 5));
  results.push_back(make(3, 6));
  for (auto [method, trim, want0, want1] :
       {std::make_tuple(v1::AGGREGATION_MEDIAN, 0.0, 2.5, 4.5),
        std::make_tuple(v1::AGGREGATION_TRIMMED_MEAN, 0.25, 2.5, 4.5),
        std::make_tuple(v1::AGGREGATION_TRIMMED_MEAN, 0.0, 26.5, -21.25)}) {
    AggregatorOptions options;
    options.method = method;
    options.trim_fraction = trim;
    options.offload_dir = offload.path();
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    for (const Model& result : results) {
      // Counts are ignored: unweighted.
      ASSERT_TRUE((*aggregator)
                      ->Add(result, &result == &results[2] ? 1000000 : 1,
                            v1::PAYLOAD_KIND_FULL_WEIGHTS)
                      .ok());
    }
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(agg_test::Get(*out, 0, 0), want0);
    EXPECT_EQ(agg_test::Get(*out, 0, 1), want1);
    EXPECT_EQ((*aggregator)->total_samples(), 1000003);
  }
}

TEST(CoordinateTest, AllowedNaNSortsLast) {
  TempDir offload;
  const std::vector<TensorSpec> specs = {Spec("w", v1::DTYPE_F32, {1})};
  std::shared_ptr<const Model> base = Shared(*Model::Create(specs));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto [method, want] :
       {std::make_pair(v1::AGGREGATION_MEDIAN, 3.0),
        std::make_pair(v1::AGGREGATION_TRIMMED_MEAN, 10.0 / 3)}) {
    AggregatorOptions options;
    options.method = method;
    options.trim_fraction = 0.2;
    options.allow_non_finite = true;
    options.offload_dir = offload.path();
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    for (double value : {1.0, nan, 3.0, 2.0, 5.0}) {
      Model model = *Model::Create(specs);
      agg_test::Set(model, 0, 0, value);
      ASSERT_TRUE(
          (*aggregator)->Add(model, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
    }
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(agg_test::Get(*out, 0, 0), static_cast<float>(want));
  }
}

TEST(CoordinateTest, OptionsAreChecked) {
  TempDir offload;
  std::shared_ptr<const Model> base =
      Shared(*Model::Create({Spec("w", v1::DTYPE_F32, {2})}));
  AggregatorOptions options;
  options.method = v1::AGGREGATION_TRIMMED_MEAN;
  options.offload_dir = offload.path();
  for (double bad : {0.5, 0.7, -0.1, std::nan("")}) {
    options.trim_fraction = bad;
    absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
        Aggregator::Create(options, base);
    EXPECT_EQ(aggregator.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(aggregator.status().message().find("trim_fraction"),
              std::string::npos);
  }
  options.trim_fraction = 0.1;
  options.offload_dir.clear();
  EXPECT_EQ(Aggregator::Create(options, base).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.method = v1::AGGREGATION_MEDIAN;
  EXPECT_NE(
      Aggregator::Create(options, base).status().message().find("offload_dir"),
      std::string::npos);
  // A missing directory is created.
  options.offload_dir = offload.path() + "/a/b";
  EXPECT_TRUE(Aggregator::Create(options, base).ok());
  EXPECT_TRUE(std::filesystem::is_directory(options.offload_dir));
}

TEST(CoordinateTest, FilesGoAwayWithTheAggregatorAndUnusedSinkResults) {
  TempDir offload;
  const std::vector<TensorSpec> specs = MixedSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  AggregatorOptions options;
  options.method = v1::AGGREGATION_MEDIAN;
  options.offload_dir = offload.path();
  {
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    Model result = RandomModel(specs, 2);
    ASSERT_TRUE(
        (*aggregator)->Add(result, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
    {
      // Received but never added (e.g. a duplicate): removed with the model.
      auto sink = (*aggregator)->NewResultSink();
      ASSERT_TRUE(sink.ok());
      absl::StatusOr<Model> received = StreamThrough(**sink, result, 4096);
      ASSERT_TRUE(received.ok());
      EXPECT_EQ(offload.CountFiles(), 2);
    }
    EXPECT_EQ(offload.CountFiles(), 1);
    {
      // An aborted stream leaves nothing.
      auto sink = (*aggregator)->NewResultSink();
      ASSERT_TRUE(sink.ok());
      v1::ModelHeader header;
      ASSERT_TRUE((*sink)->Begin(header, specs).ok());
      (*sink)->Abort();
    }
    EXPECT_EQ(offload.CountFiles(), 1);
  }
  // Destroyed without Finish.
  EXPECT_EQ(offload.CountFiles(), 0);
}

// A result held in memory (the aggregator's own, with disk offload) that
// the offload disk cannot hold is a storage error, so that the site fails
// and its trainers take their results elsewhere (ABORTED), never RETRY.
TEST(CoordinateTest, AnOwnResultTheOffloadDiskCannotHoldIsAStorageError) {
  TempDir dir;
  const std::string offload = dir.path() + "/offload";
  const std::vector<TensorSpec> specs = MixedSpecs();
  std::shared_ptr<const Model> base = Shared(RandomModel(specs, 1));
  AggregatorOptions options;
  options.method = v1::AGGREGATION_MEDIAN;
  options.offload_dir = offload;
  auto aggregator = Aggregator::Create(options, base);
  ASSERT_TRUE(aggregator.ok());
  std::filesystem::remove_all(offload);  // The disk under it went away.
  Model result = RandomModel(specs, 2);
  absl::Status added =
      (*aggregator)->Add(result, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS);
  EXPECT_TRUE(IsStorageError(added)) << added;
  EXPECT_NE(added.message().find(offload), std::string::npos) << added;
  EXPECT_EQ((*aggregator)->num_added(), 0);
}

}  // namespace
}  // namespace swarm
