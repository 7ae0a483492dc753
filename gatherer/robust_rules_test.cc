// The robust methods' decisions on small cases computed by hand.
#include "gatherer/robust_rules.h"

#include <cmath>
#include <vector>

#include "common/robust_requirements.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace agg_internal {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;

// Squared distances between points on a line.
DistanceMatrix LineDistances(const std::vector<double>& points) {
  const size_t n = points.size();
  DistanceMatrix d(n * n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      d[i * n + j] = (points[i] - points[j]) * (points[i] - points[j]);
    }
  }
  return d;
}

TEST(RobustRulesTest, RequirementsOnNAndF) {
  EXPECT_EQ(RobustRequiredInputs(v1::AGGREGATION_MULTI_KRUM, 2), 7);
  EXPECT_EQ(RobustRequiredInputs(v1::AGGREGATION_BULYAN, 1), 7);
  EXPECT_EQ(RobustRequiredInputs(v1::AGGREGATION_BULYAN, 2), 11);
  EXPECT_EQ(RobustRequiredInputs(v1::AGGREGATION_CENTERED_CLIPPING, 2), 5);
  EXPECT_EQ(RobustRequiredInputs(v1::AGGREGATION_GEOMETRIC_MEDIAN, 3), 7);
  EXPECT_EQ(RobustRequiredInputs(v1::AGGREGATION_MEDIAN, 2), 5);
  EXPECT_EQ(RobustRequiredInputs(v1::AGGREGATION_FEDAVG, 2), 1);
  EXPECT_STREQ(RobustRequirementText(v1::AGGREGATION_BULYAN), "n >= 4f + 3");
}

// Points 0, 1, 2, 10, 11 with f = 1: each scores its n - f - 2 = 2 nearest
// squared distances: 0 -> 1 + 4 = 5, 1 -> 1 + 1 = 2, 2 -> 1 + 4 = 5,
// 10 -> 1 + 64 = 65, 11 -> 1 + 81 = 82.
TEST(RobustRulesTest, KrumScoresByHand) {
  const DistanceMatrix d = LineDistances({0, 1, 2, 10, 11});
  EXPECT_THAT(KrumScores(d, 5, {0, 1, 2, 3, 4}, 1),
              ElementsAre(5, 2, 5, 65, 82));
  // Among {0, 10, 11} alone, k = max(1, 3 - 1 - 2) = 1.
  EXPECT_THAT(KrumScores(d, 5, {0, 3, 4}, 1), ElementsAre(100, 1, 1));
}

TEST(RobustRulesTest, MultiKrumSelectsTheBestScored) {
  const DistanceMatrix d = LineDistances({0, 1, 2, 10, 11});
  // m = 0: n - f = 4 best: scores 2, 5, 5, 65.
  EXPECT_THAT(MultiKrumSelect(d, 5, 1, 0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(MultiKrumSelect(d, 5, 1, 1), ElementsAre(1));  // Krum.
  EXPECT_THAT(MultiKrumSelect(d, 5, 1, 3), ElementsAre(0, 1, 2));
}

// Points 0, 1, 2, 3, 4, 100, -100 with f = 1: theta = 5 by repeated Krum.
// Round 1 (k = 4): 2 scores 1 + 1 + 4 + 4 = 10, the least. Round 2 (k = 3)
// over {0, 1, 3, 4, 100, -100}: 1 and 3 tie at 14, the lower index wins.
// Round 3 (k = 2): 3 scores 1 + 9. Round 4 (k = 1) over {0, 4, 100, -100}:
// 0 and 4 tie at 16, 0 wins. Round 5 (k = 1) over {4, 100, -100}: 4 and
// 100 tie at 96^2, 4 wins.
TEST(RobustRulesTest, BulyanSelectionByHand) {
  const DistanceMatrix d = LineDistances({0, 1, 2, 3, 4, 100, -100});
  EXPECT_THAT(BulyanSelect(d, 7, 1), ElementsAre(0, 1, 2, 3, 4));
  // f = 0: every input, in index order.
  EXPECT_THAT(BulyanSelect(d, 7, 0), ElementsAre(0, 1, 2, 3, 4, 5, 6));
}

TEST(RobustRulesTest, MeanClosestToMedianByHand) {
  // Sorted 1 2 3 5 9, median 3: 3 (0 away), 2 (1 away), then 1 and 5 are
  // both 2 away: the lower. (3 + 2 + 1) / 3 = 2.
  std::vector<double> values = {5, 1, 9, 2, 3};
  EXPECT_DOUBLE_EQ(MeanClosestToMedian(values, 3), 2.0);
  // Even count: 1 2 6 100, median 4: 2 and 6 are both 2 away: 2 first,
  // then 6 (1 is 3 away). (2 + 6) / 2 = 4.
  values = {100, 6, 2, 1};
  EXPECT_DOUBLE_EQ(MeanClosestToMedian(values, 2), 4.0);
  values = {100, 6, 2, 1};
  EXPECT_DOUBLE_EQ(MedianOf(values), 4.0);
  values = {7, -1, 3};
  EXPECT_DOUBLE_EQ(MedianOf(values), 3.0);
}

// Distances 1, 2, 4 with tau = 2: clip factors 1, 1, 1/2, so
// z' = z + ((x1 - z) + (x2 - z) + (x3 - z) / 2) / 3: w = 1/3, 1/3, 1/6 and
// a = 1 - 5/6.
TEST(RobustRulesTest, CenteredClippingStepByHand) {
  StepWeights step = CenteredClippingStep({1, 2, 4}, 2);
  EXPECT_THAT(step.w, ElementsAre(DoubleNear(1.0 / 3, 1e-15),
                                  DoubleNear(1.0 / 3, 1e-15),
                                  DoubleNear(1.0 / 6, 1e-15)));
  EXPECT_NEAR(step.a, 1.0 / 6, 1e-15);
  // Adaptive radius: the median distance, 2.
  step = CenteredClippingStep({4, 1, 2}, 0);
  EXPECT_DOUBLE_EQ(step.radius, 2);
  EXPECT_NEAR(step.w[0], 1.0 / 6, 1e-15);
  // Nothing beyond the radius: the plain mean (a = 0).
  step = CenteredClippingStep({1, 2}, 10);
  EXPECT_NEAR(step.a, 0, 1e-15);
}

// Weiszfeld weights are 1 / d normalized: 1, 1/2, 1/4 over 7/4.
TEST(RobustRulesTest, WeiszfeldStepByHand) {
  const StepWeights step = WeiszfeldStep({1, 2, 4});
  EXPECT_THAT(step.w, ElementsAre(DoubleNear(4.0 / 7, 1e-15),
                                  DoubleNear(2.0 / 7, 1e-15),
                                  DoubleNear(1.0 / 7, 1e-15)));
  EXPECT_EQ(step.a, 0);
  // A point on the estimate does not divide by zero.
  const StepWeights at = WeiszfeldStep({0, 1});
  EXPECT_GT(at.w[0], 0.99);
  // An infinitely far result (NaN values) gets none.
  const StepWeights far = WeiszfeldStep({1, HUGE_VAL, 1});
  EXPECT_THAT(far.w, ElementsAre(0.5, 0, 0.5));
}

}  // namespace
}  // namespace agg_internal
}  // namespace swarm
