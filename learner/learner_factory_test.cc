#include "learner/learner_factory.h"

#include <atomic>
#include <cstring>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/test_learner.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

v1::LearnerConfig TestConfig(std::map<std::string, std::string> params) {
  v1::LearnerConfig config;
  config.set_kind("test");
  for (const auto& [key, value] : params)
    (*config.mutable_params())[key] = value;
  return config;
}

float FirstTrainedValue(Learner& learner) {
  absl::StatusOr<Model> global = learner.InitialModel();
  EXPECT_TRUE(global.ok());
  std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> out = learner.Train(*global, 0, cancel);
  EXPECT_TRUE(out.ok()) << out.status();
  float value = 0;
  std::memcpy(&value, out->model.tensor_data(0).data(), sizeof(float));
  return value;
}

TEST(LearnerFactoryTest, CreatesTheTestLearner) {
  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(TestConfig({{"delta", "0.5"}, {"size", "8"}}), "a", {});
  ASSERT_TRUE(learner.ok()) << learner.status();
  auto* test = dynamic_cast<TestLearner*>(learner->get());
  ASSERT_NE(test, nullptr);
  EXPECT_EQ(test->options().site, "a");
  EXPECT_EQ(test->options().size, 8u);
  EXPECT_EQ(FirstTrainedValue(**learner), 0.5f);
}

TEST(LearnerFactoryTest, JobParamsOverrideSiteParams) {
  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(TestConfig({{"delta", "0.5"}, {"sample_count", "3"}}), "a",
                    {{"delta", "2"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  auto* test = dynamic_cast<TestLearner*>(learner->get());
  ASSERT_NE(test, nullptr);
  EXPECT_EQ(test->options().delta, 2.0f);
  EXPECT_EQ(test->options().sample_count, 3u);
}

TEST(LearnerFactoryTest, MergesProtoMaps) {
  v1::JobConfig job;
  (*job.mutable_learner_params())["size"] = "4";
  std::map<std::string, std::string> merged = MergeLearnerParams(
      TestConfig({{"size", "9"}, {"delta", "1"}}), job.learner_params());
  EXPECT_EQ(merged.at("size"), "4");
  EXPECT_EQ(merged.at("delta"), "1");
}

TEST(LearnerFactoryTest, UnknownKindIsNamed) {
  v1::LearnerConfig config;
  config.set_kind("resnet");
  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(config, "a", {});
  EXPECT_EQ(learner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(learner.status().message(),
              HasSubstr("learner.kind: unknown learner \"resnet\""));
  config.clear_kind();
  learner = CreateLearner(config, "a", {});
  EXPECT_EQ(learner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(learner.status().message(), HasSubstr("learner.kind: empty"));
}

TEST(LearnerFactoryTest, ParameterErrorsNameTheParameter) {
  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(TestConfig({}), "a", {{"train_ms", "soon"}});
  EXPECT_EQ(learner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(learner.status().message(),
              HasSubstr("learner param \"train_ms\": \"soon\""));
}

TEST(LearnerFactoryTest, UnknownParamsAreNotFatal) {
  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(TestConfig({{"lr", "0.1"}}), "a", {{"epochs", "3"}});
  EXPECT_TRUE(learner.ok()) << learner.status();
}

}  // namespace
}  // namespace swarm
