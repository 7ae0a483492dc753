// Multi-Krum, Bulyan, centered clipping, geometric median and bucketing over
// models (small cases computed by hand), their fallback with too few
// results, and the sample-count cap and equal weights of FedAvg.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gatherer/aggregator.h"
#include "gatherer/aggregator_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm {
namespace {

using agg_test::Get;
using agg_test::Set;
using agg_test::Shared;
using agg_test::Spec;
using ::testing::HasSubstr;

class TempDir : public persist::testutil::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("robust_test") {}
};

// A model of one F32 tensor "w" holding `values`.
Model Vector(const std::vector<double>& values) {
  absl::StatusOr<Model> model = Model::Create(
      {Spec("w", v1::DTYPE_F32, {static_cast<uint64_t>(values.size())})});
  EXPECT_TRUE(model.ok()) << model.status();
  for (size_t i = 0; i < values.size(); ++i) Set(*model, 0, i, values[i]);
  return std::move(*model);
}

class RobustAggregatorTest : public ::testing::Test {
 protected:
  AggregatorOptions Options(v1::AggregationMethod method, int f) {
    AggregatorOptions options;
    options.method = method;
    options.tolerated_attackers = f;
    options.offload_dir = offload_.path();
    options.block_coordinates = 1;  // A block per coordinate: many passes.
    return options;
  }

  // Aggregates `results` (full weights, or diffs against `base`).
  absl::StatusOr<Model> Run(
      const AggregatorOptions& options,
      const std::vector<std::vector<double>>& results,
      const std::vector<double>& base,
      v1::PayloadKind kind = v1::PAYLOAD_KIND_FULL_WEIGHTS,
      std::vector<int64_t> counts = {}) {
    absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
        Aggregator::Create(options, Shared(Vector(base)));
    if (!aggregator.ok()) return aggregator.status();
    aggregator_ = std::move(*aggregator);
    for (size_t k = 0; k < results.size(); ++k) {
      const int64_t count = counts.empty() ? 10 : counts[k];
      absl::Status added = aggregator_->Add(Vector(results[k]), count, kind);
      if (!added.ok()) return added;
    }
    return aggregator_->Finish();
  }

  TempDir offload_;
  std::unique_ptr<Aggregator> aggregator_;
};

// The line case of robust_rules_test: 0, 1, 2, 10, 11 with f = 1 selects
// the first four; their mean is 3.25 (and 0 in the second coordinate).
TEST_F(RobustAggregatorTest, MultiKrumAveragesTheSelected) {
  absl::StatusOr<Model> out =
      Run(Options(v1::AGGREGATION_MULTI_KRUM, 1),
          {{0, 0}, {1, 0}, {2, 0}, {10, 0}, {11, 0}}, {0, 0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ(Get(*out, 0, 0), 3.25);
  EXPECT_DOUBLE_EQ(Get(*out, 0, 1), 0);
  EXPECT_EQ(out->metadata().at("aggregation"), "multi_krum");
  EXPECT_EQ(out->metadata().at("aggregation_detail"), "0,1,2,3");
  EXPECT_EQ(out->metadata().at("num_results"), "5");
}

TEST_F(RobustAggregatorTest, MultiKrumWithM) {
  AggregatorOptions options = Options(v1::AGGREGATION_MULTI_KRUM, 1);
  options.krum_selected = 1;  // Krum itself: the point 1.
  absl::StatusOr<Model> out = Run(options, {{0}, {1}, {2}, {10}, {11}}, {0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ(Get(*out, 0, 0), 1);
}

// Bulyan over 0, 1, 2, 3, 4, 100, -100 (f = 1) selects 0..4 (see
// robust_rules_test); per coordinate the mean of the 3 closest to the
// median. Second coordinate of the selected: 5, 1, 9, 2, 3 -> 2.
TEST_F(RobustAggregatorTest, BulyanByHand) {
  absl::StatusOr<Model> out = Run(
      Options(v1::AGGREGATION_BULYAN, 1),
      {{0, 5}, {1, 1}, {2, 9}, {3, 2}, {4, 3}, {100, 0}, {-100, 0}}, {0, 0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->metadata().at("aggregation_detail"), "0,1,2,3,4");
  EXPECT_DOUBLE_EQ(Get(*out, 0, 0), 2);
  EXPECT_DOUBLE_EQ(Get(*out, 0, 1), 2);
}

// Center 0 (the base), results 1, 2, 4, radius 2, one iteration:
// (1 + 2 + 4 * 2/4) / 3 = 5/3.
TEST_F(RobustAggregatorTest, CenteredClippingByHand) {
  AggregatorOptions options = Options(v1::AGGREGATION_CENTERED_CLIPPING, 1);
  options.clipping_radius = 2;
  options.clipping_iterations = 1;
  absl::StatusOr<Model> out = Run(options, {{1}, {2}, {4}}, {0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 5.0 / 3, 1e-6);
  // The same as weight differences against a base of 10.
  out = Run(options, {{1}, {2}, {4}}, {10}, v1::PAYLOAD_KIND_WEIGHT_DIFF);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 10 + 5.0 / 3, 1e-5);
  // Two iterations: the center 5/3 now has distances 2/3, 1/3, 7/3; only
  // the last is clipped (factor 6/7): 5/3 + (-2/3 + 1/3 + 2) / 3 = 20/9.
  options.clipping_iterations = 2;
  out = Run(options, {{1}, {2}, {4}}, {0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 20.0 / 9, 1e-6);
}

// One attacker far away moves the clipped center by at most radius / n.
TEST_F(RobustAggregatorTest, CenteredClippingBoundsAnOutlier) {
  AggregatorOptions options = Options(v1::AGGREGATION_CENTERED_CLIPPING, 1);
  options.clipping_iterations = 3;
  absl::StatusOr<Model> out =
      Run(options, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, {-1000, 1000}}, {0, 0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 1, 0.5);
  EXPECT_NEAR(Get(*out, 0, 1), 1, 0.5);
}

TEST_F(RobustAggregatorTest, GeometricMedianResistsAnOutlier) {
  AggregatorOptions options = Options(v1::AGGREGATION_GEOMETRIC_MEDIAN, 1);
  options.geometric_median_iterations = 50;
  // Each corner of a square around (1, 1) twice and one point far away:
  // the outlier pulls the geometric median by about a quarter of a unit
  // along the diagonal (the mean is at (12.9, 12.9)).
  absl::StatusOr<Model> out = Run(options,
                                  {{0, 0},
                                   {2, 0},
                                   {0, 2},
                                   {2, 2},
                                   {0, 0},
                                   {2, 0},
                                   {0, 2},
                                   {2, 2},
                                   {100, 100}},
                                  {0, 0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 1, 0.5);
  EXPECT_NEAR(Get(*out, 0, 1), 1, 0.5);
  // Collinear 0, 1, 10: the geometric median is the middle point.
  out = Run(options, {{0}, {1}, {10}}, {0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 1, 1e-3);
}

TEST_F(RobustAggregatorTest, TooFewResultsFallBackToTheMedian) {
  // Multi-Krum with f = 2 needs 7; five results: their median, 2.
  absl::StatusOr<Model> out = Run(Options(v1::AGGREGATION_MULTI_KRUM, 2),
                                  {{0}, {1}, {2}, {10}, {11}}, {0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ(Get(*out, 0, 0), 2);
  EXPECT_THAT(out->metadata().at("aggregation"),
              HasSubstr("fallback: multi_krum with f = 2 needs 7 inputs"));
  // Even count: the mean of the two middle ones.
  out = Run(Options(v1::AGGREGATION_BULYAN, 1), {{0}, {1}, {3}, {10}}, {0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ(Get(*out, 0, 0), 2);
}

// Buckets of 2 over 4 results: the median of two bucket means is their mean,
// the mean of all four, whatever the shuffle.
TEST_F(RobustAggregatorTest, BucketingFeedsBucketMeans) {
  for (v1::AggregationMethod method :
       {v1::AGGREGATION_MEDIAN, v1::AGGREGATION_GEOMETRIC_MEDIAN}) {
    AggregatorOptions options = Options(method, 0);
    options.bucket_size = 2;
    options.bucket_seed = 7;
    absl::StatusOr<Model> out =
        Run(options, {{0, 4}, {1, 8}, {2, 0}, {9, 4}}, {0, 0});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_NEAR(Get(*out, 0, 0), 3, 1e-5);
    EXPECT_NEAR(Get(*out, 0, 1), 4, 1e-5);
    EXPECT_EQ(out->metadata().at("buckets"), "2");
  }
  // One bucket of everything: the plain mean, also for Multi-Krum.
  AggregatorOptions options = Options(v1::AGGREGATION_MEDIAN, 0);
  options.bucket_size = 5;
  absl::StatusOr<Model> out = Run(options, {{0}, {1}, {2}, {10}, {12}}, {0});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 5, 1e-6);
}

// With allow_non_finite, a result at a NaN distance counts as infinitely
// far: Multi-Krum does not select it, the geometric median gives it no
// weight.
TEST_F(RobustAggregatorTest, NanResultsAreFarAway) {
  const double nan = std::nan("");
  for (v1::AggregationMethod method :
       {v1::AGGREGATION_MULTI_KRUM, v1::AGGREGATION_GEOMETRIC_MEDIAN}) {
    AggregatorOptions options = Options(method, 1);
    options.allow_non_finite = true;
    absl::StatusOr<Model> out =
        Run(options, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, {nan, 0}}, {0, 0});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_NEAR(Get(*out, 0, 0), 1, 1e-6) << method;
    EXPECT_NEAR(Get(*out, 0, 1), 1, 1e-6) << method;
  }
}

TEST_F(RobustAggregatorTest, BadOptionsAreNamed) {
  AggregatorOptions options = Options(v1::AGGREGATION_CENTERED_CLIPPING, 1);
  options.clipping_iterations = 0;
  EXPECT_THAT(Run(options, {{1}}, {0}).status().message(),
              HasSubstr("clipping_iterations 0 is not in [1, 100]"));
  options = Options(v1::AGGREGATION_CENTERED_CLIPPING, 1);
  options.clipping_radius = -1;
  EXPECT_THAT(Run(options, {{1}}, {0}).status().message(),
              HasSubstr("clipping_radius -1"));
  options = Options(v1::AGGREGATION_FEDAVG, 0);
  options.bucket_size = 2;
  EXPECT_THAT(Run(options, {{1}}, {0}).status().message(),
              HasSubstr("bucket_size"));
  options = Options(v1::AGGREGATION_BULYAN, 0);
  options.offload_dir.clear();
  EXPECT_THAT(Run(options, {{1}}, {0}).status().message(),
              HasSubstr("AGGREGATION_BULYAN keeps results on disk"));
}

// A claim of 10000 samples capped at 100 weighs as much as an honest 100.
TEST_F(RobustAggregatorTest, FedAvgCapsClaimedSamples) {
  AggregatorOptions options = Options(v1::AGGREGATION_FEDAVG, 0);
  options.max_claimed_samples = 100;
  absl::StatusOr<Model> out = Run(options, {{0}, {10}}, {0},
                                  v1::PAYLOAD_KIND_FULL_WEIGHTS, {100, 10000});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ(Get(*out, 0, 0), 5);
  EXPECT_EQ(aggregator_->sample_claims_clipped(), 1);
  EXPECT_EQ(aggregator_->total_samples(), 200);
  // Uncapped, the liar wins: (0 * 100 + 10 * 10000) / 10100.
  options.max_claimed_samples = 0;
  out = Run(options, {{0}, {10}}, {0}, v1::PAYLOAD_KIND_FULL_WEIGHTS,
            {100, 10000});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Get(*out, 0, 0), 100000.0 / 10100, 1e-5);
  EXPECT_EQ(aggregator_->sample_claims_clipped(), 0);
}

TEST_F(RobustAggregatorTest, FedAvgEqualWeights) {
  AggregatorOptions options = Options(v1::AGGREGATION_FEDAVG, 0);
  options.equal_weights = true;
  absl::StatusOr<Model> out = Run(options, {{0}, {3}, {9}}, {0},
                                  v1::PAYLOAD_KIND_FULL_WEIGHTS, {1, 50, 7000});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ(Get(*out, 0, 0), 4);
  // A partial sum carries its trainers' own weights: refused.
  absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
      Aggregator::Create(options, Shared(Vector({0})));
  ASSERT_TRUE(aggregator.ok());
  EXPECT_THAT((*aggregator)
                  ->AddPartialSum(Vector({1}), 1.0,
                                  {{1, v1::PAYLOAD_KIND_FULL_WEIGHTS}})
                  .message(),
              HasSubstr("refused with max_claimed_samples or equal_weights"));
}

// Robust methods count capped claims in total_samples too.
TEST_F(RobustAggregatorTest, RobustMethodsCountClippedClaims) {
  AggregatorOptions options = Options(v1::AGGREGATION_MULTI_KRUM, 0);
  options.max_claimed_samples = 50;
  absl::StatusOr<Model> out = Run(options, {{0}, {1}, {2}}, {0},
                                  v1::PAYLOAD_KIND_FULL_WEIGHTS, {10, 500, 20});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->metadata().at("total_samples"), "80");
  EXPECT_EQ(aggregator_->sample_claims_clipped(), 1);
}

}  // namespace
}  // namespace swarm
