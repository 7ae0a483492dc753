// Attack modes over the test learner (whose sites train global + delta), by
// hand: the attacker's result, sample count and metrics.
#include "learner/attack.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/learner_factory.h"
#include "learner/test_learner.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

// Site "x" with the given params (test learner: size 4, starts at 0).
absl::StatusOr<std::unique_ptr<Learner>> Make(
    std::map<std::string, std::string> params) {
  v1::LearnerConfig config;
  config.set_kind("test");
  (*config.mutable_params())["size"] = "16";
  for (const auto& [key, value] : params)
    (*config.mutable_params())[key] = value;
  return CreateLearner(config, "x", {});
}

struct Trained {
  std::vector<float> values;
  uint64_t samples = 0;
  v1::PayloadKind kind;
};

Trained TrainOnce(Learner& learner) {
  absl::StatusOr<Model> global = learner.InitialModel();
  EXPECT_TRUE(global.ok()) << global.status();
  std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> out = learner.Train(*global, 3, cancel);
  EXPECT_TRUE(out.ok()) << out.status();
  Trained trained;
  const auto bytes = out->model.tensor_data(0);
  trained.values.resize(bytes.size() / sizeof(float));
  std::memcpy(trained.values.data(), bytes.data(), bytes.size());
  trained.samples = out->sample_count;
  trained.kind = out->kind;
  return trained;
}

TEST(AttackTest, SignFlipAndScaling) {
  // Honest: 0 + 0.5. Sign flip with scale 2: 0 - 2 * 0.5.
  auto learner =
      Make({{"delta", "0.5"}, {"attack", "sign_flip"}, {"attack_scale", "2"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  EXPECT_FLOAT_EQ(TrainOnce(**learner).values[0], -1.0f);
  // Scaling, default factor 10.
  learner = Make({{"delta", "0.5"}, {"attack", "scaling"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  EXPECT_FLOAT_EQ(TrainOnce(**learner).values[0], 5.0f);
  // A weight difference stays one: the diff is the attacked update.
  learner = Make({{"delta", "0.5"},
                  {"payload", "diff"},
                  {"init_offset", "1"},
                  {"attack", "sign_flip"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  const Trained diff = TrainOnce(**learner);
  EXPECT_EQ(diff.kind, v1::PAYLOAD_KIND_WEIGHT_DIFF);
  EXPECT_FLOAT_EQ(diff.values[0], -0.5f);
}

TEST(AttackTest, GaussianNoise) {
  auto learner = Make({{"attack", "noise"}, {"attack_noise", "2"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  const Trained trained = TrainOnce(**learner);
  double sum = 0;
  double squares = 0;
  for (float v : trained.values) {
    sum += v;
    squares += v * v;
  }
  const double n = trained.values.size();
  EXPECT_GT(std::sqrt(squares / n), 0.8);  // N(0, 4): clearly not 0.
  EXPECT_LT(std::abs(sum / n), 2.0);
}

// Honest sites b and c train deltas 1 and 3: mean 2, deviation 1.
TEST(AttackTest, AlieAndIpmUseTheHonestSitesStatistics) {
  const std::map<std::string, std::string> honest = {
      {"delta.b", "1"}, {"delta.c", "3"}, {"attack_honest_sites", "b, c"}};
  std::map<std::string, std::string> params = honest;
  params["attack"] = "alie";
  params["attack_z"] = "1.5";
  auto learner = Make(params);
  ASSERT_TRUE(learner.ok()) << learner.status();
  EXPECT_FLOAT_EQ(TrainOnce(**learner).values[0], 2.0f - 1.5f);
  params = honest;
  params["attack"] = "ipm";  // Default epsilon 0.5: 0 - 0.5 * 2.
  learner = Make(params);
  ASSERT_TRUE(learner.ok()) << learner.status();
  EXPECT_FLOAT_EQ(TrainOnce(**learner).values[0], -1.0f);
}

TEST(AttackTest, AlieZFromNAndF) {
  // n = 8, f = 2: s = 5 - 2 = 3, Phi^-1(5 / 8) = 0.3186.
  EXPECT_NEAR(AlieZ(8, 2), 0.3186, 1e-3);
  // n = 50, f = 12 (Baruch et al.'s setting): Phi^-1(36 / 50) = 0.5828.
  EXPECT_NEAR(AlieZ(50, 12), 0.5828, 1e-3);
}

TEST(AttackTest, InflatedSamplesAndLyingMetrics) {
  auto learner = Make({{"sample_count", "7"},
                       {"attack_samples", "5"},
                       {"attack_metric", "0.99"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  EXPECT_EQ(TrainOnce(**learner).samples, 35u);
  absl::StatusOr<Model> global = (*learner)->InitialModel();
  ASSERT_TRUE(global.ok());
  absl::StatusOr<Metrics> metrics = (*learner)->Validate(*global, 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_DOUBLE_EQ(metrics->at("accuracy"), 0.99);
}

TEST(AttackTest, OnlyTheNamedSiteAttacks) {
  auto learner = Make({{"attack.y", "sign_flip"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  // Site x does not attack: the plain test learner.
  EXPECT_NE(dynamic_cast<TestLearner*>(learner->get()), nullptr);
  EXPECT_TRUE(IsAttackParam("attack.y"));
  EXPECT_TRUE(IsAttackParam("attack_scale"));
  EXPECT_FALSE(IsAttackParam("attacker"));
}

TEST(AttackTest, BadParamsAreNamed) {
  EXPECT_THAT(Make({{"attack", "flip"}}).status().message(),
              HasSubstr("learner param \"attack\": \"flip\" is not an attack"));
  EXPECT_THAT(Make({{"attack", "alie"}}).status().message(),
              HasSubstr("\"attack_honest_sites\": required by the alie"));
  EXPECT_THAT(Make({{"attack_samples", "0"}}).status().message(),
              HasSubstr("\"attack_samples\": \"0\" is not a multiplier"));
  EXPECT_THAT(Make({{"attack_scale", "x"}}).status().message(),
              HasSubstr("\"attack_scale\": \"x\" is not a finite number"));
}

}  // namespace
}  // namespace swarm
