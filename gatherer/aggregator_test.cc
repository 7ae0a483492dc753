// Bad input, for every method: each refused result leaves the aggregate
// exactly as it was (add good, add bad, add good == add the two good ones,
// bit for bit), with an error naming the tensor or the rule. Also the
// checking sink.
#include "gatherer/aggregator.h"

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gatherer/aggregator_internal.h"
#include "gatherer/aggregator_kernels.h"
#include "gatherer/aggregator_test_util.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm {
namespace {

using agg_test::BitIdentical;
using agg_test::RandomModel;
using agg_test::Shared;
using agg_test::Spec;
using agg_test::StreamThrough;

// A scratch directory, removed with its contents at the end of the test.
class TempDir : public persist::testutil::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("aggregator_test") {}
};

std::vector<TensorSpec> BaseSpecs() {
  return {Spec("conv.weight", v1::DTYPE_F32, {8, 3, 3}),
          Spec("conv.bias", v1::DTYPE_F32, {8}),
          Spec("norm.weight", v1::DTYPE_F16, {8}),
          Spec("norm.steps", v1::DTYPE_I64, {}),
          Spec("head.weight", v1::DTYPE_BF16, {10, 8})};
}

Model WithSpecs(std::vector<TensorSpec> specs, uint64_t seed) {
  return RandomModel(specs, seed);
}

// A model like a good result but with element `i` of tensor `t` set to
// `value`.
Model WithValue(const Model& good, size_t t, uint64_t i, double value) {
  Model bad = *good.Clone();
  agg_test::Set(bad, t, i, value);
  return bad;
}

struct BadCase {
  std::string name;
  // Builds the bad result from a good one.
  std::function<Model(const Model& good)> make;
  int64_t count = 7;
  v1::PayloadKind kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
  // Text the error must contain.
  std::string expect;
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  cases.push_back({"MissingTensor",
                   [](const Model&) {
                     std::vector<TensorSpec> specs = BaseSpecs();
                     specs.erase(specs.begin() + 2);
                     return WithSpecs(specs, 3);
                   },
                   7, v1::PAYLOAD_KIND_FULL_WEIGHTS,
                   "lacks tensor \"norm.weight\""});
  cases.push_back(
      {"ExtraTensor",
       [](const Model&) {
         std::vector<TensorSpec> specs = BaseSpecs();
         specs.push_back(Spec("extra.weight", v1::DTYPE_F32, {2}));
         return WithSpecs(specs, 3);
       },
       7, v1::PAYLOAD_KIND_FULL_WEIGHTS,
       "tensor \"extra.weight\" that the base model does not have"});
  cases.push_back({"ReorderedTensors",
                   [](const Model&) {
                     std::vector<TensorSpec> specs = BaseSpecs();
                     std::swap(specs[0], specs[1]);
                     return WithSpecs(specs, 3);
                   },
                   7, v1::PAYLOAD_KIND_FULL_WEIGHTS,
                   "tensor \"conv.weight\" is at position 1"});
  cases.push_back({"OtherShape",
                   [](const Model&) {
                     std::vector<TensorSpec> specs = BaseSpecs();
                     specs[0] = Spec("conv.weight", v1::DTYPE_F32, {8, 9});
                     return WithSpecs(specs, 3);
                   },
                   7, v1::PAYLOAD_KIND_FULL_WEIGHTS,
                   "tensor \"conv.weight\" has shape [8, 9]"});
  cases.push_back({"SameSizeOtherShape",
                   [](const Model&) {
                     std::vector<TensorSpec> specs = BaseSpecs();
                     specs[4] = Spec("head.weight", v1::DTYPE_BF16, {8, 10});
                     return WithSpecs(specs, 3);
                   },
                   7, v1::PAYLOAD_KIND_FULL_WEIGHTS,
                   "tensor \"head.weight\" has shape [8, 10]"});
  cases.push_back({"OtherDType",
                   [](const Model&) {
                     std::vector<TensorSpec> specs = BaseSpecs();
                     specs[2] = Spec("norm.weight", v1::DTYPE_BF16, {8});
                     return WithSpecs(specs, 3);
                   },
                   7, v1::PAYLOAD_KIND_FULL_WEIGHTS,
                   "tensor \"norm.weight\" has dtype BF16"});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  cases.push_back(
      {"NaNInF32",
       [=](const Model& good) { return WithValue(good, 0, 40, nan); }, 7,
       v1::PAYLOAD_KIND_FULL_WEIGHTS,
       "tensor \"conv.weight\" has a NaN or Inf value at element 40"});
  cases.push_back(
      {"InfInLastElement",
       [=](const Model& good) { return WithValue(good, 1, 7, inf); }, 7,
       v1::PAYLOAD_KIND_FULL_WEIGHTS,
       "tensor \"conv.bias\" has a NaN or Inf value at element 7"});
  cases.push_back(
      {"MinusInfInF16",
       [=](const Model& good) { return WithValue(good, 2, 0, -inf); }, 7,
       v1::PAYLOAD_KIND_FULL_WEIGHTS,
       "tensor \"norm.weight\" has a NaN or Inf value at element 0"});
  cases.push_back(
      {"NaNInBF16Diff",
       [=](const Model& good) { return WithValue(good, 4, 79, nan); }, 7,
       v1::PAYLOAD_KIND_WEIGHT_DIFF,
       "tensor \"head.weight\" has a NaN or Inf value at element 79"});
  cases.push_back({"ZeroSamples",
                   [](const Model& good) { return *good.Clone(); }, 0,
                   v1::PAYLOAD_KIND_FULL_WEIGHTS, "sample count 0"});
  cases.push_back({"NegativeSamples",
                   [](const Model& good) { return *good.Clone(); }, -5,
                   v1::PAYLOAD_KIND_FULL_WEIGHTS, "sample count -5"});
  cases.push_back({"UnknownKind",
                   [](const Model& good) { return *good.Clone(); }, 7,
                   static_cast<v1::PayloadKind>(9), "unknown payload kind 9"});
  return cases;
}

enum class Path { kAdd, kSink, kFile };

struct Param {
  v1::AggregationMethod method;
  Path path;
};

class BadInputTest
    : public ::testing::TestWithParam<std::tuple<Param, BadCase>> {
 protected:
  std::unique_ptr<Aggregator> Make(std::shared_ptr<const Model> base) {
    AggregatorOptions options;
    options.method = std::get<0>(GetParam()).method;
    options.trim_fraction = 0.25;
    options.offload_dir = dir_.path() + "/offload";
    options.num_threads = 2;
    absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
        Aggregator::Create(options, std::move(base));
    EXPECT_TRUE(aggregator.ok()) << aggregator.status();
    return std::move(*aggregator);
  }

  absl::Status Feed(Aggregator& aggregator, const Model& result, int64_t count,
                    v1::PayloadKind kind) {
    switch (std::get<0>(GetParam()).path) {
      case Path::kAdd:
        return aggregator.Add(result, count, kind);
      case Path::kSink: {
        auto sink = aggregator.NewResultSink();
        if (!sink.ok()) return sink.status();
        // 6-byte chunks cut F32 elements: exercises the edge checks.
        absl::StatusOr<Model> received = StreamThrough(**sink, result, 6);
        if (!received.ok()) return received.status();
        return aggregator.Add(*received, count, kind);
      }
      case Path::kFile: {
        const std::string path =
            absl::StrCat(dir_.path(), "/input", files_++, ".safetensors");
        absl::Status saved = result.SaveSafetensors(path);
        if (!saved.ok()) return saved;
        return aggregator.AddFile(path, count, kind);
      }
    }
    return absl::InternalError("unreachable");
  }

  TempDir dir_;
  int files_ = 0;
};

TEST_P(BadInputTest, RefusedAndTheAggregateIsUnchanged) {
  const BadCase& bad_case = std::get<1>(GetParam());
  std::shared_ptr<const Model> base = Shared(RandomModel(BaseSpecs(), 1));
  const Model good1 = RandomModel(BaseSpecs(), 2);
  const Model good2 = RandomModel(BaseSpecs(), 3);
  const Model bad = bad_case.make(good1);

  std::unique_ptr<Aggregator> aggregator = Make(base);
  ASSERT_TRUE(Feed(*aggregator, good1, 10, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  const absl::Status status =
      Feed(*aggregator, bad, bad_case.count, bad_case.kind);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(bad_case.expect), std::string::npos)
      << status.message();
  EXPECT_EQ(aggregator->num_added(), 1);
  EXPECT_EQ(aggregator->total_samples(), 10);
  ASSERT_TRUE(Feed(*aggregator, good2, 30, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> out = aggregator->Finish();
  ASSERT_TRUE(out.ok()) << out.status();

  std::unique_ptr<Aggregator> reference = Make(base);
  ASSERT_TRUE(Feed(*reference, good1, 10, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  ASSERT_TRUE(Feed(*reference, good2, 30, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> expected = reference->Finish();
  ASSERT_TRUE(expected.ok());
  EXPECT_TRUE(BitIdentical(*out, *expected));
  EXPECT_EQ(aggregator->total_samples(), 40);
}

std::vector<std::tuple<Param, BadCase>> Params() {
  std::vector<std::tuple<Param, BadCase>> params;
  for (auto method : {v1::AGGREGATION_FEDAVG, v1::AGGREGATION_MEDIAN,
                      v1::AGGREGATION_TRIMMED_MEAN}) {
    for (Path path : {Path::kAdd, Path::kSink, Path::kFile}) {
      for (const BadCase& bad_case : BadCases()) {
        // A safetensors header is unordered: AddFile matches tensors by
        // name, so reordering is no error there (fedavg_test covers it).
        if (path == Path::kFile && bad_case.name == "ReorderedTensors") {
          continue;
        }
        params.push_back({Param{method, path}, bad_case});
      }
    }
  }
  return params;
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<Param, BadCase>>& info) {
  const Param& p = std::get<0>(info.param);
  const char* method =
      p.method == v1::AGGREGATION_FEDAVG
          ? "FedAvg"
          : (p.method == v1::AGGREGATION_MEDIAN ? "Median" : "Trimmed");
  const char* path =
      p.path == Path::kAdd ? "Add" : (p.path == Path::kSink ? "Sink" : "File");
  return absl::StrCat(method, "_", path, "_", std::get<1>(info.param).name);
}

INSTANTIATE_TEST_SUITE_P(AllMethods, BadInputTest,
                         ::testing::ValuesIn(Params()), ParamName);

TEST(NonFiniteOptionTest, AllowNonFiniteLetsNaNThrough) {
  std::shared_ptr<const Model> base = Shared(RandomModel(BaseSpecs(), 1));
  const Model good = RandomModel(BaseSpecs(), 2);
  const Model bad =
      WithValue(good, 0, 5, std::numeric_limits<double>::quiet_NaN());
  AggregatorOptions options;
  options.allow_non_finite = true;
  auto aggregator = Aggregator::Create(options, base);
  ASSERT_TRUE(aggregator.ok());
  ASSERT_TRUE((*aggregator)->Add(good, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  auto sink = (*aggregator)->NewResultSink();
  ASSERT_TRUE(sink.ok());
  absl::StatusOr<Model> received = StreamThrough(**sink, bad, 64);
  ASSERT_TRUE(received.ok()) << received.status();
  ASSERT_TRUE(
      (*aggregator)->Add(*received, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
  absl::StatusOr<Model> out = (*aggregator)->Finish();
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(std::isnan(agg_test::Get(*out, 0, 5)));
  EXPECT_EQ(agg_test::Get(*out, 0, 4),
            static_cast<float>(agg_test::Get(good, 0, 4)));
}

TEST(SinkTest, RefusesABadTableAtBeginAndNaNAtTheChunk) {
  std::shared_ptr<const Model> base = Shared(RandomModel(BaseSpecs(), 1));
  auto aggregator = Aggregator::Create({}, base);
  ASSERT_TRUE(aggregator.ok());
  v1::ModelHeader header;
  {
    auto sink = (*aggregator)->NewResultSink();
    ASSERT_TRUE(sink.ok());
    std::vector<TensorSpec> specs = BaseSpecs();
    specs.pop_back();
    absl::Status status = (*sink)->Begin(header, specs);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("head.weight"), std::string::npos);
  }
  {
    // NaN inside a chunk: refused by that chunk's CommitRange.
    auto sink = (*aggregator)->NewResultSink();
    ASSERT_TRUE(sink.ok());
    const Model bad = WithValue(RandomModel(BaseSpecs(), 2), 0, 30,
                                std::numeric_limits<double>::quiet_NaN());
    ASSERT_TRUE((*sink)->Begin(header, bad.specs()).ok());
    absl::StatusOr<char*> out = (*sink)->WritableRange(0, 0, 288);
    ASSERT_TRUE(out.ok());
    std::memcpy(*out, bad.tensor_data(0).data(), 288);
    absl::Status status = (*sink)->CommitRange(0, 0, 288);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("\"conv.weight\" has a NaN or Inf value "
                                    "at element 30"),
              std::string::npos)
        << status;
    (*sink)->Abort();
  }
  {
    // A NaN cut in two by chunk boundaries is caught once it is whole.
    for (uint64_t chunk : {1, 2, 3, 5}) {
      auto sink = (*aggregator)->NewResultSink();
      ASSERT_TRUE(sink.ok());
      const Model bad = WithValue(RandomModel(BaseSpecs(), 2), 1, 3,
                                  std::numeric_limits<double>::infinity());
      absl::StatusOr<Model> received = StreamThrough(**sink, bad, chunk);
      EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument)
          << chunk;
      EXPECT_NE(received.status().message().find("\"conv.bias\""),
                std::string::npos);
    }
  }
  EXPECT_EQ((*aggregator)->num_added(), 0);
}

TEST(SinkTest, ModelsOfAnotherAggregatorAreCheckedAgain) {
  std::shared_ptr<const Model> base = Shared(RandomModel(BaseSpecs(), 1));
  AggregatorOptions permissive;
  permissive.allow_non_finite = true;
  auto lenient = Aggregator::Create(permissive, base);
  auto strict = Aggregator::Create({}, base);
  ASSERT_TRUE(lenient.ok() && strict.ok());
  auto sink = (*lenient)->NewResultSink();
  ASSERT_TRUE(sink.ok());
  const Model bad = WithValue(RandomModel(BaseSpecs(), 2), 4, 11,
                              std::numeric_limits<double>::quiet_NaN());
  absl::StatusOr<Model> received = StreamThrough(**sink, bad, 100);
  ASSERT_TRUE(received.ok());
  EXPECT_EQ((*strict)->Add(*received, 1, v1::PAYLOAD_KIND_FULL_WEIGHTS).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SinkTest, SinksOnOtherThreadsWhileAdding) {
  // Streams arrive on their own threads (as gRPC delivers them) while the
  // round's thread adds finished results one at a time.
  TempDir dir;
  for (auto method : {v1::AGGREGATION_FEDAVG, v1::AGGREGATION_MEDIAN}) {
    std::shared_ptr<const Model> base = Shared(RandomModel(BaseSpecs(), 1));
    AggregatorOptions options;
    options.method = method;
    options.offload_dir = dir.path();
    options.num_threads = 2;
    auto aggregator = Aggregator::Create(options, base);
    ASSERT_TRUE(aggregator.ok());
    constexpr int kStreams = 4;
    constexpr int kPerStream = 3;
    std::vector<Model> results;
    for (int r = 0; r < kStreams * kPerStream; ++r) {
      results.push_back(RandomModel(BaseSpecs(), 100 + r));
    }
    std::mutex mu;
    std::condition_variable ready;
    std::vector<Model> received;
    std::vector<std::thread> streams;
    for (int s = 0; s < kStreams; ++s) {
      streams.emplace_back([&, s] {
        for (int i = 0; i < kPerStream; ++i) {
          // On failure an empty model goes to the adder, which then fails
          // the test (no thread is left waiting).
          Model model;
          auto sink = (*aggregator)->NewResultSink();
          if (sink.ok()) {
            absl::StatusOr<Model> streamed =
                StreamThrough(**sink, results[s * kPerStream + i], 50);
            EXPECT_TRUE(streamed.ok()) << streamed.status();
            if (streamed.ok()) model = std::move(*streamed);
          }
          std::lock_guard<std::mutex> lock(mu);
          received.push_back(std::move(model));
          ready.notify_one();
        }
      });
    }
    for (int added = 0; added < kStreams * kPerStream; ++added) {
      Model next;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready.wait(lock, [&] { return !received.empty(); });
        next = std::move(received.back());
        received.pop_back();
      }
      EXPECT_TRUE(
          (*aggregator)->Add(next, 5, v1::PAYLOAD_KIND_FULL_WEIGHTS).ok());
    }
    for (std::thread& stream : streams) stream.join();
    absl::StatusOr<Model> out = (*aggregator)->Finish();
    ASSERT_TRUE(out.ok());
    std::vector<agg_test::Input> inputs;
    for (const Model& result : results) {
      inputs.push_back({&result, 5, v1::PAYLOAD_KIND_FULL_WEIGHTS});
    }
    if (method == v1::AGGREGATION_FEDAVG) {
      EXPECT_TRUE(agg_test::Near(*out, agg_test::ReferenceFedAvg(*base, inputs),
                                 0.5, std::ldexp(1, -20)));
    } else {
      EXPECT_TRUE(agg_test::Near(
          *out, agg_test::ReferenceCoordinate(*base, inputs, true, 0), 0.5));
    }
  }
}

TEST(SplitWorkTest, CoversEveryElementOnceInAlignedBalancedShares) {
  std::mt19937 random(4);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint64_t> elements;
    std::vector<uint64_t> cost;
    const int tensors = 1 + trial % 7;
    uint64_t total = 0;
    for (int t = 0; t < tensors; ++t) {
      elements.push_back(random() % (trial % 3 == 0 ? 100 : 100000));
      cost.push_back(random() % 4);  // Cost 0: skipped.
      total += elements.back() * cost.back();
    }
    const int parts = 1 + trial % 4;
    const auto work = agg_internal::SplitWork(elements, cost, parts);
    ASSERT_GE(work.size(), 1u);
    ASSERT_LE(work.size(), static_cast<size_t>(parts));
    std::vector<uint64_t> next(tensors, 0);  // Ranges come in order.
    uint64_t max_share = 0;
    for (const auto& share : work) {
      uint64_t share_cost = 0;
      for (const agg_internal::Range& range : share) {
        ASSERT_LT(range.tensor, elements.size());
        EXPECT_EQ(range.begin, next[range.tensor]);
        EXPECT_LT(range.begin, range.end);
        EXPECT_TRUE(range.end % 64 == 0 || range.end == elements[range.tensor]);
        next[range.tensor] = range.end;
        share_cost += (range.end - range.begin) * cost[range.tensor];
      }
      max_share = std::max(max_share, share_cost);
    }
    for (int t = 0; t < tensors; ++t) {
      EXPECT_EQ(next[t], cost[t] == 0 ? 0 : elements[t]) << t;
    }
    // No share much above its fair part (one aligned cut of slack per part).
    EXPECT_LE(max_share, total / parts + 2 * 64 * 3 * parts + 3);
  }
}

TEST(CreateTest, RefusesBadOptionsAndModels) {
  std::shared_ptr<const Model> base = Shared(RandomModel(BaseSpecs(), 1));
  EXPECT_EQ(Aggregator::Create({}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  AggregatorOptions options;
  options.method = static_cast<v1::AggregationMethod>(42);
  EXPECT_EQ(Aggregator::Create(options, base).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.num_threads = -1;
  EXPECT_EQ(Aggregator::Create(options, base).status().code(),
            absl::StatusCode::kInvalidArgument);
  // FromJobConfig maps the job's settings.
  v1::JobConfig config;
  config.set_aggregation_method(v1::AGGREGATION_TRIMMED_MEAN);
  config.set_allow_non_finite(true);
  const AggregatorOptions from_job =
      AggregatorOptions::FromJobConfig(config, "/tmp/x");
  EXPECT_EQ(from_job.method, v1::AGGREGATION_TRIMMED_MEAN);
  EXPECT_EQ(from_job.trim_fraction, 0.1);
  EXPECT_TRUE(from_job.allow_non_finite);
  EXPECT_EQ(from_job.offload_dir, "/tmp/x");
}

}  // namespace
}  // namespace swarm
