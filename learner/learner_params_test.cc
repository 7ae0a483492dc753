#include "learner/learner_params.h"

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

TEST(LearnerParamsTest, SiteKeyWinsOverPlainKey) {
  const std::map<std::string, std::string> params = {{"epochs", "2"},
                                                     {"epochs.site-1", "5"}};
  auto one = LookupLearnerParam(params, "epochs", "site-1");
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->key, "epochs.site-1");
  EXPECT_EQ(one->value, "5");
  auto two = LookupLearnerParam(params, "epochs", "site-2");
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->key, "epochs");
  EXPECT_FALSE(LookupLearnerParam(params, "seed", "site-1").has_value());
}

TEST(LearnerParamsTest, ParsesUintInRange) {
  EXPECT_EQ(*ParseUintParam({"k", "7"}, 0, 10), 7u);
  EXPECT_EQ(*ParseUintParam({"k", " 10 "}, 0, 10), 10u);
  EXPECT_EQ(*ParseUintParam({"k", "0"}, 0, 10), 0u);
  EXPECT_EQ(*ParseUintParam({"k", "18446744073709551615"}, 0,
                            std::numeric_limits<uint64_t>::max()),
            std::numeric_limits<uint64_t>::max());
}

TEST(LearnerParamsTest, RefusesWhatIsNoNonNegativeInteger) {
  for (const char* text :
       {"", " ", "-1", "+1", "1.5", "x", "1x", "18446744073709551616"}) {
    absl::StatusOr<uint64_t> v = ParseUintParam({"size", text}, 0, 100);
    ASSERT_FALSE(v.ok()) << text;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(v.status().message(), HasSubstr("learner param \"size\""));
    EXPECT_THAT(v.status().message(),
                HasSubstr("is not a non-negative integer"))
        << text;
  }
}

TEST(LearnerParamsTest, RefusesOutOfRangeSayingTheRange) {
  absl::StatusOr<uint64_t> low = ParseUintParam({"epochs", "0"}, 1, 10000);
  ASSERT_FALSE(low.ok());
  EXPECT_THAT(low.status().message(), HasSubstr("is not in [1, 10000]"));
  absl::StatusOr<uint64_t> high = ParseUintParam({"epochs", "10001"}, 1, 10000);
  ASSERT_FALSE(high.ok());
  EXPECT_THAT(high.status().message(), HasSubstr("is not in [1, 10000]"));
}

TEST(LearnerParamsTest, ParsesOneEntryOfAListNamingTheParameter) {
  const LearnerParam param{"tensors", "4,x,6"};
  EXPECT_EQ(*ParseUintParam(param, "4", 1, 10), 4u);
  absl::StatusOr<uint64_t> bad = ParseUintParam(param, "x", 1, 10);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("learner param \"tensors\": \"4,x,6\""));
}

TEST(LearnerParamsTest, UnknownKeysAreReported) {
  const char* const known[] = {"size", "seed"};
  const std::map<std::string, std::string> params = {
      {"size", "1"}, {"seed.site-1", "2"}, {"sizes", "3"}, {"seed.", "4"}};
  EXPECT_THAT(UnknownLearnerParams(params, known),
              ::testing::ElementsAre("seed.", "sizes"));
}

}  // namespace
}  // namespace swarm
