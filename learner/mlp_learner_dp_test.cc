// The MLP learner's DP-SGD mode: its parameters and the privacy cost it
// reports with each round's result.
#include <cmath>
#include <map>
#include <string>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/mlp_learner.h"
#include "learner/random.h"
#include "privacy/rdp.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

// 10 classes of 16-pixel images, class c bright in pixels c..c+5.
std::shared_ptr<const ImageDataset> Synthetic(size_t n) {
  auto data = std::make_shared<ImageDataset>();
  data->pixels_per_image = 16;
  data->num_classes = 10;
  PortableRng rng(78);
  for (size_t i = 0; i < n; ++i) {
    const auto label = static_cast<uint8_t>(i % 10);
    data->labels.push_back(label);
    for (uint32_t p = 0; p < 16; ++p) {
      const bool on = p >= label && p < label + 6u;
      data->pixels.push_back(
          static_cast<uint8_t>((on ? 140 : 10) + rng.Bounded(100)));
    }
  }
  return data;
}

absl::StatusOr<std::unique_ptr<MlpLearner>> Learner(
    std::map<std::string, std::string> params) {
  params["hidden"] = "12";
  params["validation_fraction"] = "0.2";
  params["batch_size"] = "25";
  params["lr"] = "0.1";
  absl::StatusOr<MlpLearnerOptions> options =
      ParseMlpLearnerOptions("site-a", params);
  if (!options.ok()) return options.status();
  return MlpLearner::Create(*options, Synthetic(1250));
}

TEST(MlpLearnerDpTest, ReportsItsPrivacyCost) {
  absl::StatusOr<std::unique_ptr<MlpLearner>> learner =
      Learner({{"dp_noise_multiplier", "1.0"}, {"dp_clip_norm", "2"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  const Model global = *(*learner)->InitialModel();
  std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> out = (*learner)->Train(global, 0, cancel);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->privacy.has_value());
  EXPECT_EQ(out->sample_count, 1000u);
  EXPECT_DOUBLE_EQ(out->privacy->sampling_rate(), 25.0 / 1000.0);
  EXPECT_DOUBLE_EQ(out->privacy->noise_multiplier(), 1.0);
  EXPECT_EQ(out->privacy->steps(), 40u);  // One epoch: 1 / q.
}

TEST(MlpLearnerDpTest, PlainTrainingReportsNoCost) {
  absl::StatusOr<std::unique_ptr<MlpLearner>> learner = Learner({});
  ASSERT_TRUE(learner.ok()) << learner.status();
  std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> out =
      (*learner)->Train(*(*learner)->InitialModel(), 0, cancel);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->privacy.has_value());
}

// dp_target_epsilon: the noise multiplier that spends the target over the
// planned rounds, and no less.
TEST(MlpLearnerDpTest, TargetEpsilonChoosesTheNoise) {
  absl::StatusOr<std::unique_ptr<MlpLearner>> learner =
      Learner({{"dp_target_epsilon", "3"},
               {"dp_rounds", "10"},
               {"dp_sampling_rate", "0.05"}});
  ASSERT_TRUE(learner.ok()) << learner.status();
  std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> out =
      (*learner)->Train(*(*learner)->InitialModel(), 0, cancel);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->privacy.has_value());
  EXPECT_EQ(out->privacy->steps(), 20u);
  const double eps = *privacy::DpSgdEpsilon(
      0.05, out->privacy->noise_multiplier(), 10 * 20, 1e-5);
  EXPECT_LE(eps, 3.0);
  EXPECT_GT(eps, 2.97);
}

TEST(MlpLearnerDpTest, RefusesInconsistentParameters) {
  EXPECT_THAT(
      Learner({{"dp_noise_multiplier", "1"}, {"dp_target_epsilon", "2"}})
          .status()
          .message(),
      HasSubstr("dp_target_epsilon"));
  EXPECT_THAT(Learner({{"dp_noise_multiplier", "-1"}}).status().message(),
              HasSubstr("dp_noise_multiplier"));
  EXPECT_THAT(Learner({{"dp_delta", "0.5"}}).status().message(),
              HasSubstr("dp_delta"));
  absl::StatusOr<std::unique_ptr<MlpLearner>> no_rounds =
      Learner({{"dp_target_epsilon", "2"}});
  ASSERT_TRUE(no_rounds.ok());
  std::atomic<bool> cancel{false};
  EXPECT_THAT((*no_rounds)
                  ->Train(*(*no_rounds)->InitialModel(), 0, cancel)
                  .status()
                  .message(),
              HasSubstr("dp_rounds"));
}

double L2Distance(const Model& a, const Model& b) {
  double sum = 0;
  for (size_t t = 0; t < a.num_tensors(); ++t) {
    const auto* x = reinterpret_cast<const float*>(a.tensor_data(t).data());
    const auto* y = reinterpret_cast<const float*>(b.tensor_data(t).data());
    for (size_t i = 0; i < a.spec(t).byte_size / sizeof(float); ++i) {
      sum += (static_cast<double>(x[i]) - y[i]) * (x[i] - y[i]);
    }
  }
  return std::sqrt(sum);
}

// FedProx composes with DP-SGD: the proximal term (added after clipping and
// noise) still pulls towards the global model, and the privacy cost is the
// same as without it.
TEST(MlpLearnerDpTest, ProxMuComposesWithDpSgd) {
  const std::map<std::string, std::string> dp = {{"dp_noise_multiplier", "1"},
                                                 {"epochs", "2"}};
  std::map<std::string, std::string> prox = dp;
  prox["prox_mu"] = "4";
  absl::StatusOr<std::unique_ptr<MlpLearner>> plain = Learner(dp);
  absl::StatusOr<std::unique_ptr<MlpLearner>> proximal = Learner(prox);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(proximal.ok()) << proximal.status();
  const Model global = *(*plain)->InitialModel();
  std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> a = (*plain)->Train(global, 0, cancel);
  absl::StatusOr<TrainOutput> b = (*proximal)->Train(global, 0, cancel);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(a->privacy.has_value() && b->privacy.has_value());
  EXPECT_EQ(a->privacy->SerializeAsString(), b->privacy->SerializeAsString());
  const double d_plain = L2Distance(a->model, global);
  const double d_prox = L2Distance(b->model, global);
  EXPECT_LT(d_prox, 0.7 * d_plain)
      << "mu=0: " << d_plain << ", mu=4: " << d_prox;
}

}  // namespace
}  // namespace swarm
