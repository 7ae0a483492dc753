#include "gatherer/metric_comparator.h"

#include <limits>
#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace swarm {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::nullopt_t kMissing = std::nullopt;

struct CompareCase {
  std::string name;
  v1::MetricDirection direction;
  std::optional<double> a;
  std::optional<double> b;
  int expected;  // Sign of Compare(a, b).
};

int Sign(int v) { return (v > 0) - (v < 0); }

class CompareTest : public ::testing::TestWithParam<CompareCase> {};

TEST_P(CompareTest, SignAndAntisymmetry) {
  const CompareCase& c = GetParam();
  MetricComparator cmp(c.direction);
  EXPECT_EQ(Sign(cmp.Compare(c.a, c.b)), c.expected);
  EXPECT_EQ(Sign(cmp.Compare(c.b, c.a)), -c.expected);
  EXPECT_EQ(cmp.IsBetter(c.a, c.b), c.expected > 0);
  EXPECT_EQ(cmp.IsBetter(c.b, c.a), c.expected < 0);
}

constexpr v1::MetricDirection kHigher = v1::METRIC_HIGHER_IS_BETTER;
constexpr v1::MetricDirection kLower = v1::METRIC_LOWER_IS_BETTER;

INSTANTIATE_TEST_SUITE_P(
    Table, CompareTest,
    ::testing::Values(
        CompareCase{"HigherLarger", kHigher, 0.9, 0.8, 1},
        CompareCase{"HigherSmaller", kHigher, 0.1, 0.8, -1},
        CompareCase{"HigherEqual", kHigher, 0.5, 0.5, 0},
        CompareCase{"HigherNegative", kHigher, -1.0, -2.0, 1},
        CompareCase{"HigherSignedZeros", kHigher, 0.0, -0.0, 0},
        CompareCase{"LowerSmaller", kLower, 0.1, 0.8, 1},
        CompareCase{"LowerLarger", kLower, 2.5, 0.8, -1},
        CompareCase{"LowerEqual", kLower, 0.3, 0.3, 0},
        CompareCase{"LowerNegative", kLower, -3.0, -2.0, 1},
        // Unusable metrics never win, in either direction.
        CompareCase{"HigherNaNVsReal", kHigher, kNaN, 0.0, -1},
        CompareCase{"LowerNaNVsReal", kLower, kNaN, 1e9, -1},
        CompareCase{"HigherMissingVsReal", kHigher, kMissing, -1e9, -1},
        CompareCase{"LowerMissingVsReal", kLower, kMissing, 1e9, -1},
        CompareCase{"NaNVsNaN", kHigher, kNaN, kNaN, 0},
        CompareCase{"NaNVsMissing", kLower, kNaN, kMissing, 0},
        CompareCase{"MissingVsMissing", kHigher, kMissing, kMissing, 0},
        CompareCase{"HigherPlusInfVsReal", kHigher, kInf, 0.5, -1},
        CompareCase{"LowerMinusInfVsReal", kLower, -kInf, 0.5, -1},
        CompareCase{"InfVsNaN", kHigher, kInf, kNaN, 0},
        CompareCase{"UnknownDirectionIsHigher",
                    static_cast<v1::MetricDirection>(7), 0.9, 0.8, 1}),
    [](const ::testing::TestParamInfo<CompareCase>& info) {
      return info.param.name;
    });

TEST(MetricComparatorTest, IsUsable) {
  EXPECT_TRUE(MetricComparator::IsUsable(0.0));
  EXPECT_TRUE(MetricComparator::IsUsable(-1e300));
  EXPECT_FALSE(MetricComparator::IsUsable(kMissing));
  EXPECT_FALSE(MetricComparator::IsUsable(kNaN));
  EXPECT_FALSE(MetricComparator::IsUsable(kInf));
  EXPECT_FALSE(MetricComparator::IsUsable(-kInf));
}

TEST(MetricComparatorTest, Direction) {
  EXPECT_FALSE(MetricComparator(kHigher).lower_is_better());
  EXPECT_TRUE(MetricComparator(kLower).lower_is_better());
  EXPECT_EQ(MetricComparator(kLower).direction(), kLower);
}

v1::BestRecord Record(double metric) {
  v1::BestRecord r;
  r.set_present(true);
  r.set_site("site-a");
  r.set_metric(metric);
  r.set_round(3);
  return r;
}

v1::BestRecord Absent() { return v1::BestRecord(); }

struct RecordCase {
  std::string name;
  v1::MetricDirection direction;
  std::optional<double> score;
  v1::BestRecord best;
  bool beats;
};

class BeatsRecordTest : public ::testing::TestWithParam<RecordCase> {};

TEST_P(BeatsRecordTest, Table) {
  const RecordCase& c = GetParam();
  EXPECT_EQ(MetricComparator(c.direction).BeatsRecord(c.score, c.best),
            c.beats);
}

INSTANTIATE_TEST_SUITE_P(
    Table, BeatsRecordTest,
    ::testing::Values(
        RecordCase{"AbsentFiniteWins", kHigher, 0.0, Absent(), true},
        RecordCase{"AbsentFiniteWinsLower", kLower, 1e6, Absent(), true},
        RecordCase{"AbsentNaNLoses", kHigher, kNaN, Absent(), false},
        RecordCase{"AbsentMissingLoses", kLower, kMissing, Absent(), false},
        RecordCase{"AbsentInfLoses", kHigher, kInf, Absent(), false},
        // A record that says "absent" is absent whatever its metric field.
        RecordCase{"AbsentWithStaleMetric", kHigher, 0.1,
                   [] {
                     v1::BestRecord r = Record(0.9);
                     r.set_present(false);
                     return r;
                   }(),
                   true},
        RecordCase{"HigherBetterWins", kHigher, 0.91, Record(0.9), true},
        RecordCase{"HigherWorseLoses", kHigher, 0.89, Record(0.9), false},
        RecordCase{"HigherTieLoses", kHigher, 0.9, Record(0.9), false},
        RecordCase{"LowerBetterWins", kLower, 0.2, Record(0.3), true},
        RecordCase{"LowerWorseLoses", kLower, 0.4, Record(0.3), false},
        RecordCase{"LowerTieLoses", kLower, 0.3, Record(0.3), false},
        RecordCase{"NaNNeverBeatsRecord", kHigher, kNaN, Record(-1e9), false},
        RecordCase{"MissingNeverBeatsRecord", kLower, kMissing, Record(1e9),
                   false},
        RecordCase{"FiniteBeatsNaNRecord", kHigher, 0.0, Record(kNaN), true},
        RecordCase{"NaNDoesNotBeatNaNRecord", kHigher, kNaN, Record(kNaN),
                   false}),
    [](const ::testing::TestParamInfo<RecordCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace swarm
