#include "learner/dp_sgd.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/random.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

// Three classes of 8-pixel images: class c is bright in pixels 2c..2c+2.
ImageDataset Blobs(size_t n, uint64_t seed) {
  ImageDataset data;
  data.pixels_per_image = 8;
  data.num_classes = 3;
  PortableRng rng(seed);
  for (size_t i = 0; i < n; ++i) {
    const auto label = static_cast<uint8_t>(rng.Bounded(3));
    data.labels.push_back(label);
    for (uint32_t p = 0; p < 8; ++p) {
      const bool on = p >= 2u * label && p < 2u * label + 3;
      data.pixels.push_back(
          static_cast<uint8_t>((on ? 150 : 20) + rng.Bounded(90)));
    }
  }
  return data;
}

RowMatrixF Inputs(const ImageDataset& data, size_t i) {
  RowMatrixF x(1, data.pixels_per_image);
  for (uint32_t p = 0; p < data.pixels_per_image; ++p) {
    x(0, p) = data.image(i)[p] / 255.0f;
  }
  return x;
}

// One example's gradient, flattened, from Mlp::LossAndGradients.
std::vector<float> ExampleGradient(const Mlp& net, const ImageDataset& data,
                                   size_t i) {
  std::vector<MlpLayer> grads;
  const uint8_t label = data.labels[i];
  net.LossAndGradients(Inputs(data, i), absl::MakeConstSpan(&label, 1), &grads);
  std::vector<float> flat;
  for (const MlpLayer& g : grads) {
    flat.insert(flat.end(), g.weight.data(), g.weight.data() + g.weight.size());
    flat.insert(flat.end(), g.bias.data(), g.bias.data() + g.bias.size());
  }
  return flat;
}

std::vector<float> Flatten(const Mlp& net) {
  std::vector<float> flat;
  for (const MlpLayer& l : net.layers()) {
    flat.insert(flat.end(), l.weight.data(), l.weight.data() + l.weight.size());
    flat.insert(flat.end(), l.bias.data(), l.bias.data() + l.bias.size());
  }
  return flat;
}

SgdOptions PlainStep(float lr) {
  SgdOptions sgd;
  sgd.learning_rate = lr;
  sgd.momentum = 0.0f;
  sgd.balanced_softmax = false;
  return sgd;
}

// One step with q = 1 and (almost) no noise moves the weights by lr times
// the mean of the clipped per-example gradients, each computed on its own.
void CheckOneStep(float clip, bool expect_clipping) {
  const ImageDataset data = Blobs(40, 2);
  Mlp net = *Mlp::Create({8, 6, 3}, 5);
  const std::vector<float> before = Flatten(net);
  std::vector<double> expected(before.size(), 0.0);
  bool clipped_any = false;
  for (size_t i = 0; i < data.size(); ++i) {
    const std::vector<float> g = ExampleGradient(net, data, i);
    double norm2 = 0;
    for (float v : g) norm2 += double{v} * v;
    const double norm = std::sqrt(norm2);
    const double scale = norm > clip ? clip / norm : 1.0;
    clipped_any |= norm > clip;
    for (size_t k = 0; k < g.size(); ++k) expected[k] += g[k] * scale / 40.0;
  }
  EXPECT_EQ(clipped_any, expect_clipping);
  DpSgdOptions dp;
  dp.clip_norm = clip;
  dp.noise_multiplier = 1e-9 / clip;  // Noise of σ C = 1e-9.
  dp.sampling_rate = 1.0;
  dp.steps = 1;
  absl::StatusOr<DpSgdReport> report =
      TrainDpSgd(net, data, {}, PlainStep(0.5f), dp, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->examples, 40u);
  const std::vector<float> after = Flatten(net);
  for (size_t k = 0; k < after.size(); ++k) {
    EXPECT_NEAR(before[k] - after[k], 0.5 * expected[k], 1e-5) << k;
  }
}

TEST(DpSgdTest, UnclippedStepIsTheMeanGradient) { CheckOneStep(1e6f, false); }

TEST(DpSgdTest, ClipsEachExampleToTheNorm) { CheckOneStep(0.05f, true); }

// The noise of one step: N(0, (σ C)^2) per coordinate, over q n.
TEST(DpSgdTest, NoiseHasTheConfiguredScale) {
  const ImageDataset data = Blobs(50, 3);
  Mlp clean = *Mlp::Create({8, 64, 3}, 7);
  Mlp noisy = *Mlp::Create({8, 64, 3}, 7);
  DpSgdOptions dp;
  dp.clip_norm = 0.5f;
  dp.sampling_rate = 1.0;
  dp.steps = 1;
  dp.noise_multiplier = 1e-7;
  ASSERT_TRUE(TrainDpSgd(clean, data, {}, PlainStep(1.0f), dp, nullptr).ok());
  dp.noise_multiplier = 2.0;
  ASSERT_TRUE(TrainDpSgd(noisy, data, {}, PlainStep(1.0f), dp, nullptr).ok());
  const std::vector<float> a = Flatten(clean);
  const std::vector<float> b = Flatten(noisy);
  double sum2 = 0;
  for (size_t k = 0; k < a.size(); ++k) sum2 += (b[k] - a[k]) * (b[k] - a[k]);
  const double std = std::sqrt(sum2 / a.size());
  EXPECT_NEAR(std, 2.0 * 0.5 / 50.0, 0.1 * 2.0 * 0.5 / 50.0);
}

TEST(DpSgdTest, LearnsUnderModerateNoise) {
  const ImageDataset data = Blobs(2000, 4);
  Mlp net = *Mlp::Create({8, 16, 3}, 3);
  SgdOptions sgd = PlainStep(0.1f);
  sgd.momentum = 0.9f;
  DpSgdOptions dp;
  dp.clip_norm = 1.0f;
  dp.noise_multiplier = 1.0;
  dp.sampling_rate = 0.05;
  dp.steps = DpSgdSteps(5, dp.sampling_rate);
  EXPECT_EQ(dp.steps, 100u);
  absl::StatusOr<DpSgdReport> report =
      TrainDpSgd(net, data, {}, sgd, dp, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_NEAR(static_cast<double>(report->examples), 100 * 0.05 * 2000,
              0.1 * 100 * 0.05 * 2000);
  EXPECT_GT(Evaluate(net, data)->accuracy, 0.9);
}

TEST(DpSgdTest, RefusesBadOptions) {
  const ImageDataset data = Blobs(10, 1);
  Mlp net = *Mlp::Create({8, 4, 3}, 1);
  DpSgdOptions dp;
  dp.sampling_rate = 0.5;
  dp.steps = 1;
  SgdOptions balanced = PlainStep(0.1f);
  balanced.balanced_softmax = true;
  EXPECT_THAT(
      TrainDpSgd(net, data, {}, balanced, dp, nullptr).status().message(),
      HasSubstr("balanced softmax"));
  dp.sampling_rate = 0.0;
  EXPECT_THAT(TrainDpSgd(net, data, {}, PlainStep(0.1f), dp, nullptr)
                  .status()
                  .message(),
              HasSubstr("sampling rate"));
  dp.sampling_rate = 0.5;
  dp.clip_norm = 0.0f;
  EXPECT_FALSE(TrainDpSgd(net, data, {}, PlainStep(0.1f), dp, nullptr).ok());
  std::atomic<bool> cancel{true};
  dp.clip_norm = 1.0f;
  EXPECT_EQ(
      TrainDpSgd(net, data, {}, PlainStep(0.1f), dp, &cancel).status().code(),
      absl::StatusCode::kCancelled);
}

// DP-SGD's cost per epoch against plain minibatch SGD on the same data in
// the same run (Fashion-MNIST, 784-128-10, batch 64 / q = 64 / n). Prints
// the ratio; fails only when DP-SGD is unreasonably slow.
TEST(DpSgdRealDataTest, CostPerEpochAgainstPlainTraining) {
  absl::StatusOr<ImageDataset> train =
      LoadFashionMnist(kDefaultFashionMnistDir, FashionMnistSplit::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  const std::vector<uint32_t> subset = SampleSubset(train->size(), 15000, 1);
  Mlp plain = *Mlp::Create({784, 128, 10}, 1);
  Mlp dp_net = *Mlp::Create({784, 128, 10}, 1);
  SgdOptions sgd;
  sgd.balanced_softmax = false;
  sgd.epochs = 1;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(TrainSgd(plain, *train, subset, sgd, nullptr, {}).ok());
  const double plain_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  DpSgdOptions dp;
  dp.sampling_rate = 64.0 / subset.size();
  dp.steps = DpSgdSteps(1, dp.sampling_rate);
  dp.noise_multiplier = 1.0;
  absl::StatusOr<DpSgdReport> report =
      TrainDpSgd(dp_net, *train, subset, sgd, dp, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  std::printf(
      "one epoch of %zu examples: plain SGD %.3f s, DP-SGD %.3f s (%d steps): "
      "ratio %.2f\n",
      subset.size(), plain_s, report->seconds, static_cast<int>(report->steps),
      report->seconds / plain_s);
  EXPECT_LT(report->seconds, 20 * plain_s);
}

}  // namespace
}  // namespace swarm
