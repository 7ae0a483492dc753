#include "learner/mlp.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/random.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Three classes of 8-pixel images: class c is bright in pixels 2c..2c+2,
// plus noise.
ImageDataset Blobs(size_t n, uint64_t seed) {
  ImageDataset data;
  data.pixels_per_image = 8;
  data.num_classes = 3;
  PortableRng rng(seed);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t label = static_cast<uint8_t>(rng.Bounded(3));
    data.labels.push_back(label);
    for (uint32_t p = 0; p < 8; ++p) {
      const bool on = p >= 2u * label && p < 2u * label + 3;
      data.pixels.push_back(
          static_cast<uint8_t>((on ? 150 : 20) + rng.Bounded(90)));
    }
  }
  return data;
}

bool SameWeights(const Mlp& a, const Mlp& b) {
  if (a.sizes() != b.sizes()) return false;
  for (size_t i = 0; i < a.num_layers(); ++i) {
    const MlpLayer& x = a.layers()[i];
    const MlpLayer& y = b.layers()[i];
    if (std::memcmp(x.weight.data(), y.weight.data(),
                    x.weight.size() * sizeof(float)) != 0 ||
        std::memcmp(x.bias.data(), y.bias.data(),
                    x.bias.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

TEST(MlpTest, GradientMatchesFiniteDifferences) {
  // Two hidden layers so that backpropagation through a ReLU layer into
  // another is covered.
  absl::StatusOr<Mlp> net = Mlp::Create({6, 5, 4, 3}, 17);
  ASSERT_TRUE(net.ok()) << net.status();
  // Non-zero biases so that they matter.
  PortableRng rng(5);
  for (MlpLayer& layer : net->mutable_layers()) {
    for (Eigen::Index i = 0; i < layer.bias.size(); ++i) {
      layer.bias(i) = 0.2f * (rng.UniformFloat() - 0.5f);
    }
  }
  RowMatrixF x(7, 6);
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    for (Eigen::Index c = 0; c < x.cols(); ++c) x(r, c) = rng.UniformFloat();
  }
  const std::vector<uint8_t> labels = {0, 1, 2, 2, 1, 0, 1};
  std::vector<MlpLayer> grads;
  net->LossAndGradients(x, labels, &grads);
  ASSERT_EQ(grads.size(), 3u);

  const float eps = 1e-3f;
  int checked = 0;
  double worst = 0;
  auto check = [&](float* param, float analytic) {
    const float saved = *param;
    *param = saved + eps;
    const double plus = net->LossAndGradients(x, labels, nullptr);
    *param = saved - eps;
    const double minus = net->LossAndGradients(x, labels, nullptr);
    *param = saved;
    const double numeric = (plus - minus) / (2.0 * eps);
    const double error = std::abs(numeric - analytic);
    worst = std::max(worst, error);
    EXPECT_NEAR(numeric, analytic, 2e-3 + 2e-2 * std::abs(analytic))
        << "parameter " << checked;
    ++checked;
  };
  for (size_t l = 0; l < grads.size(); ++l) {
    MlpLayer& layer = net->mutable_layers()[l];
    ASSERT_EQ(grads[l].weight.rows(), layer.weight.rows());
    ASSERT_EQ(grads[l].weight.cols(), layer.weight.cols());
    for (Eigen::Index i = 0; i < layer.weight.size(); ++i) {
      check(layer.weight.data() + i, grads[l].weight.data()[i]);
    }
    for (Eigen::Index i = 0; i < layer.bias.size(); ++i) {
      check(layer.bias.data() + i, grads[l].bias(i));
    }
  }
  EXPECT_EQ(checked, static_cast<int>(net->num_parameters()));
  EXPECT_EQ(checked, 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
  // Typical agreement is far tighter than the tolerance.
  EXPECT_LT(worst, 2e-3);
}

TEST(MlpTest, LossDecreasesOnASmallProblem) {
  const ImageDataset data = Blobs(600, 1);
  absl::StatusOr<Mlp> net = Mlp::Create({8, 16, 3}, 3);
  ASSERT_TRUE(net.ok());
  absl::StatusOr<Evaluation> before = Evaluate(*net, data);
  ASSERT_TRUE(before.ok()) << before.status();
  SgdOptions sgd;
  sgd.learning_rate = 0.05f;
  sgd.batch_size = 16;
  sgd.epochs = 5;
  std::vector<double> losses;
  ASSERT_TRUE(TrainSgd(*net, data, {}, sgd, nullptr, [&](const EpochReport& r) {
                losses.push_back(r.mean_loss);
                EXPECT_EQ(r.samples, 600u);
                EXPECT_EQ(r.epochs, 5u);
              }).ok());
  ASSERT_EQ(losses.size(), 5u);
  EXPECT_LT(losses.back(), losses.front());
  absl::StatusOr<Evaluation> after = Evaluate(*net, data);
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->loss, before->loss * 0.5);
  EXPECT_GT(after->accuracy, 0.95);
  EXPECT_EQ(after->samples, 600u);
}

TEST(MlpTest, OneMinibatchStepLowersItsLoss) {
  const ImageDataset data = Blobs(32, 2);
  absl::StatusOr<Mlp> net = Mlp::Create({8, 4, 3}, 9);
  ASSERT_TRUE(net.ok());
  const double before = Evaluate(*net, data)->loss;
  SgdOptions sgd;
  sgd.batch_size = 32;
  sgd.learning_rate = 0.1f;
  ASSERT_TRUE(TrainSgd(*net, data, {}, sgd, nullptr, {}).ok());
  EXPECT_LT(Evaluate(*net, data)->loss, before);
}

TEST(MlpTest, SameSeedSameWeights) {
  absl::StatusOr<Mlp> a = Mlp::Create({8, 16, 3}, 42);
  absl::StatusOr<Mlp> b = Mlp::Create({8, 16, 3}, 42);
  absl::StatusOr<Mlp> c = Mlp::Create({8, 16, 3}, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(SameWeights(*a, *b));
  EXPECT_FALSE(SameWeights(*a, *c));
  // Within the init limits: He for the hidden layer, Glorot for the output.
  EXPECT_LE(a->layers()[0].weight.cwiseAbs().maxCoeff(), std::sqrt(6.0f / 8));
  EXPECT_LE(a->layers()[1].weight.cwiseAbs().maxCoeff(), std::sqrt(6.0f / 19));
  EXPECT_EQ(a->layers()[0].bias.cwiseAbs().maxCoeff(), 0.0f);

  const ImageDataset data = Blobs(300, 4);
  SgdOptions sgd;
  sgd.epochs = 2;
  sgd.shuffle_seed = 8;
  ASSERT_TRUE(TrainSgd(*a, data, {}, sgd, nullptr, {}).ok());
  ASSERT_TRUE(TrainSgd(*b, data, {}, sgd, nullptr, {}).ok());
  EXPECT_TRUE(SameWeights(*a, *b));
  sgd.shuffle_seed = 9;
  absl::StatusOr<Mlp> d = Mlp::Create({8, 16, 3}, 42);
  ASSERT_TRUE(TrainSgd(*d, data, {}, sgd, nullptr, {}).ok());
  EXPECT_FALSE(SameWeights(*a, *d));
}

// The initial weights are a pure function of the seed: pin a few.
TEST(MlpTest, InitialWeightsArePinned) {
  absl::StatusOr<Mlp> net = Mlp::Create({784, 128, 10}, 1);
  ASSERT_TRUE(net.ok());
  const RowMatrixF& w0 = net->layers()[0].weight;
  const RowMatrixF& w1 = net->layers()[1].weight;
  EXPECT_EQ(w0(0, 0), 0x1.14b7bep-5f);
  EXPECT_EQ(w0(127, 783), -0x1.fc66ecp-7f);
  EXPECT_EQ(w1(9, 127), -0x1.9ecdeep-5f);
}

TEST(MlpTest, TrainsOnASubsetOfIndices) {
  const ImageDataset data = Blobs(100, 5);
  absl::StatusOr<Mlp> net = Mlp::Create({8, 4, 3}, 1);
  ASSERT_TRUE(net.ok());
  std::vector<uint32_t> indices = {1, 5, 7, 9};
  uint64_t samples = 0;
  ASSERT_TRUE(TrainSgd(*net, data, indices, SgdOptions(), nullptr,
                       [&](const EpochReport& r) { samples = r.samples; })
                  .ok());
  EXPECT_EQ(samples, 4u);
  absl::StatusOr<Evaluation> eval = Evaluate(*net, data, indices);
  ASSERT_TRUE(eval.ok());
  EXPECT_EQ(eval->samples, 4u);
  std::vector<uint32_t> bad = {100};
  EXPECT_EQ(Evaluate(*net, data, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlpTest, LearningRateDecaysPerEpoch) {
  const ImageDataset data = Blobs(50, 5);
  absl::StatusOr<Mlp> net = Mlp::Create({8, 4, 3}, 1);
  ASSERT_TRUE(net.ok());
  SgdOptions sgd;
  sgd.learning_rate = 0.1f;
  sgd.lr_decay = 0.5f;
  sgd.first_epoch = 2;
  sgd.epochs = 2;
  std::vector<float> rates;
  ASSERT_TRUE(TrainSgd(*net, data, {}, sgd, nullptr, [&](const EpochReport& r) {
                rates.push_back(r.learning_rate);
              }).ok());
  EXPECT_THAT(rates, ElementsAre(0.025f, 0.0125f));
  sgd.lr_decay = 0;
  EXPECT_EQ(TrainSgd(*net, data, {}, sgd, nullptr, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

// Balanced softmax shifts every logit of balanced data by the same log(1/3):
// training is unchanged up to rounding.
TEST(MlpTest, BalancedSoftmaxIsANoOpOnBalancedData) {
  ImageDataset data = Blobs(300, 7);
  for (size_t i = 0; i < data.size(); ++i) {
    data.labels[i] = static_cast<uint8_t>(i % 3);
  }
  absl::StatusOr<Mlp> plain = Mlp::Create({8, 6, 3}, 4);
  absl::StatusOr<Mlp> balanced = Mlp::Create({8, 6, 3}, 4);
  ASSERT_TRUE(plain.ok() && balanced.ok());
  SgdOptions sgd;
  sgd.epochs = 2;
  ASSERT_TRUE(TrainSgd(*plain, data, {}, sgd, nullptr, {}).ok());
  sgd.balanced_softmax = true;
  ASSERT_TRUE(TrainSgd(*balanced, data, {}, sgd, nullptr, {}).ok());
  for (size_t l = 0; l < plain->num_layers(); ++l) {
    EXPECT_LT((plain->layers()[l].weight - balanced->layers()[l].weight)
                  .cwiseAbs()
                  .maxCoeff(),
              1e-4f);
  }
}

// On skewed data (class 0 is 90%), balanced softmax recovers more of the
// rare classes than the plain loss.
TEST(MlpTest, BalancedSoftmaxHelpsRareClasses) {
  ImageDataset data = Blobs(2000, 8);
  ImageDataset skewed;
  skewed.pixels_per_image = data.pixels_per_image;
  skewed.num_classes = data.num_classes;
  std::vector<uint32_t> keep;
  uint32_t rare = 0;
  for (uint32_t i = 0; i < data.size(); ++i) {
    if (data.labels[i] == 0 || rare++ % 20 == 0) keep.push_back(i);
  }
  skewed = data.Subset(keep);
  // Balanced evaluation data: the rare classes only.
  std::vector<uint32_t> rare_indices;
  const ImageDataset eval_data = Blobs(600, 9);
  for (uint32_t i = 0; i < eval_data.size(); ++i) {
    if (eval_data.labels[i] != 0) rare_indices.push_back(i);
  }
  auto rare_accuracy = [&](bool balanced) {
    absl::StatusOr<Mlp> net = Mlp::Create({8, 6, 3}, 4);
    EXPECT_TRUE(net.ok());
    SgdOptions sgd;
    sgd.learning_rate = 0.02f;
    sgd.balanced_softmax = balanced;
    EXPECT_TRUE(TrainSgd(*net, skewed, {}, sgd, nullptr, {}).ok());
    return Evaluate(*net, eval_data, rare_indices)->accuracy;
  };
  const double plain = rare_accuracy(false);
  const double balanced = rare_accuracy(true);
  EXPECT_GT(balanced, plain + 0.05) << "plain " << plain;
}

TEST(MlpTest, CancelStopsTraining) {
  const ImageDataset data = Blobs(100, 5);
  absl::StatusOr<Mlp> net = Mlp::Create({8, 4, 3}, 1);
  ASSERT_TRUE(net.ok());
  std::atomic<bool> cancel{true};
  absl::Status status = TrainSgd(*net, data, {}, SgdOptions(), &cancel, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
}

TEST(MlpTest, DivergenceIsReported) {
  const ImageDataset data = Blobs(200, 5);
  absl::StatusOr<Mlp> net = Mlp::Create({8, 4, 3}, 1);
  ASSERT_TRUE(net.ok());
  // A non-finite weight makes the loss non-finite.
  net->mutable_layers()[1].weight(0, 0) =
      std::numeric_limits<float>::infinity();
  SgdOptions sgd;
  absl::Status status = TrainSgd(*net, data, {}, sgd, nullptr, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("learning rate"));
}

TEST(MlpTest, RefusesMismatchedData) {
  const ImageDataset data = Blobs(10, 5);
  absl::StatusOr<Mlp> wide = Mlp::Create({9, 4, 3}, 1);
  ASSERT_TRUE(wide.ok());
  EXPECT_THAT(Evaluate(*wide, data).status().message(),
              HasSubstr("8 inputs per example but the network takes 9"));
  absl::StatusOr<Mlp> two = Mlp::Create({8, 4, 2}, 1);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(TrainSgd(*two, data, {}, SgdOptions(), nullptr, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlpTest, ModelRoundTrip) {
  absl::StatusOr<Mlp> net = Mlp::Create({8, 6, 5, 3}, 7);
  ASSERT_TRUE(net.ok());
  absl::StatusOr<Model> model = net->ToModel();
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->num_tensors(), 6u);
  EXPECT_EQ(model->spec(0).name, "fc0.weight");
  EXPECT_THAT(model->spec(0).shape, ElementsAre(6, 8));
  EXPECT_EQ(model->spec(1).name, "fc0.bias");
  EXPECT_THAT(model->spec(1).shape, ElementsAre(6));
  EXPECT_EQ(model->spec(4).name, "fc2.weight");
  EXPECT_THAT(model->spec(4).shape, ElementsAre(3, 5));
  EXPECT_EQ(model->spec(0).dtype, v1::DTYPE_F32);
  // Row-major [out, in]: element (r, c) at r * in + c.
  float value;
  std::memcpy(&value, model->tensor_data(0).data() + (2 * 8 + 3) * 4, 4);
  EXPECT_EQ(value, net->layers()[0].weight(2, 3));
  absl::StatusOr<Mlp> back = Mlp::FromModel(*model);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_THAT(back->sizes(), ElementsAre(8, 6, 5, 3));
  EXPECT_TRUE(SameWeights(*net, *back));
}

absl::StatusOr<Model> ModelOf(std::vector<TensorSpec> specs) {
  return Model::Create(std::move(specs));
}

TEST(MlpTest, FromModelRefusesOtherModels) {
  auto spec = [](std::string name, DType dtype, std::vector<uint64_t> shape) {
    return *MakeTensorSpec(std::move(name), dtype, std::move(shape));
  };
  struct Case {
    std::vector<TensorSpec> specs;
    std::string why;
  };
  const std::vector<Case> cases = {
      {{spec("weight", v1::DTYPE_F32, {4})}, "no \"fc0.weight\""},
      {{spec("fc0.weight", v1::DTYPE_F32, {3, 4})}, "without \"fc0.bias\""},
      {{spec("fc0.weight", v1::DTYPE_F16, {3, 4}),
        spec("fc0.bias", v1::DTYPE_F32, {3})},
       "is F16"},
      {{spec("fc0.weight", v1::DTYPE_F32, {12}),
        spec("fc0.bias", v1::DTYPE_F32, {3})},
       "expected [out, in]"},
      {{spec("fc0.weight", v1::DTYPE_F32, {3, 4}),
        spec("fc0.bias", v1::DTYPE_F32, {4})},
       "expected [3]"},
      {{spec("fc0.weight", v1::DTYPE_F32, {3, 4}),
        spec("fc0.bias", v1::DTYPE_F32, {3}),
        spec("fc1.weight", v1::DTYPE_F32, {2, 5}),
        spec("fc1.bias", v1::DTYPE_F32, {2})},
       "takes 5 inputs but layer 0 has 3 outputs"},
      {{spec("fc0.weight", v1::DTYPE_F32, {3, 4}),
        spec("fc0.bias", v1::DTYPE_F32, {3}),
        spec("extra", v1::DTYPE_F32, {1})},
       "unexpected tensor \"extra\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Model> model = ModelOf(c.specs);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<Mlp> net = Mlp::FromModel(*model);
    EXPECT_EQ(net.status().code(), absl::StatusCode::kInvalidArgument) << c.why;
    EXPECT_THAT(net.status().message(), HasSubstr(c.why));
  }
}

TEST(MlpTest, CreateAndHiddenSizesValidate) {
  EXPECT_FALSE(Mlp::Create({784}, 1).ok());
  EXPECT_FALSE(Mlp::Create({784, 0, 10}, 1).ok());
  EXPECT_FALSE(Mlp::Create({784, kMaxMlpWidth + 1, 10}, 1).ok());
  EXPECT_TRUE(Mlp::Create({784, 10}, 1).ok());  // Linear.
  EXPECT_THAT(*ParseHiddenSizes("128"), ElementsAre(128));
  EXPECT_THAT(*ParseHiddenSizes(" 256, 128 "), ElementsAre(256, 128));
  EXPECT_TRUE(ParseHiddenSizes("none")->empty());
  EXPECT_TRUE(ParseHiddenSizes("")->empty());
  for (const char* bad : {"0", "-1", "12x", "128,", "1e3", "70000"}) {
    EXPECT_FALSE(ParseHiddenSizes(bad).ok()) << bad;
  }
}

TEST(MlpTest, ShortLastBatchAndSingleExampleBatches) {
  const ImageDataset data = Blobs(37, 6);
  absl::StatusOr<Mlp> net = Mlp::Create({8, 4, 3}, 2);
  ASSERT_TRUE(net.ok());
  SgdOptions sgd;
  sgd.batch_size = 10;  // 3 full batches and one of 7.
  EXPECT_TRUE(TrainSgd(*net, data, {}, sgd, nullptr, {}).ok());
  sgd.batch_size = 1;
  EXPECT_TRUE(TrainSgd(*net, data, {}, sgd, nullptr, {}).ok());
  sgd.batch_size = 1000;  // One batch bigger than the data.
  EXPECT_TRUE(TrainSgd(*net, data, {}, sgd, nullptr, {}).ok());
}

// Fashion-MNIST itself: a brief training run on a subset reaches a sensible
// accuracy. Fails with the install hint when the dataset is missing.
TEST(MlpRealDataTest, LearnsFashionMnistSubset) {
  absl::StatusOr<ImageDataset> train =
      LoadFashionMnist(kDefaultFashionMnistDir, FashionMnistSplit::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  absl::StatusOr<ImageDataset> test =
      LoadFashionMnist(kDefaultFashionMnistDir, FashionMnistSplit::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  const std::vector<uint32_t> subset = SampleSubset(train->size(), 6000, 1);
  const std::vector<uint32_t> test_subset = SampleSubset(test->size(), 2000, 1);
  absl::StatusOr<Mlp> net = Mlp::Create({784, 64, 10}, 1);
  ASSERT_TRUE(net.ok());
  const double before = Evaluate(*net, *test, test_subset)->accuracy;
  SgdOptions sgd;
  sgd.epochs = 2;
  ASSERT_TRUE(TrainSgd(*net, *train, subset, sgd, nullptr, {}).ok());
  absl::StatusOr<Evaluation> after = Evaluate(*net, *test, test_subset);
  ASSERT_TRUE(after.ok());
  EXPECT_LT(before, 0.3);
  EXPECT_GT(after->accuracy, 0.75);
}

}  // namespace
}  // namespace swarm
