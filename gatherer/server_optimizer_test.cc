#include "gatherer/server_optimizer.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gatherer/aggregator_test_util.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm {
namespace {

using agg_test::Get;
using agg_test::RandomModel;
using agg_test::Set;
using agg_test::Spec;

std::vector<TensorSpec> Layout() {
  return {Spec("w", v1::DTYPE_F32, {3, 4}), Spec("b", v1::DTYPE_F16, {4}),
          Spec("count", v1::DTYPE_I64, {1})};
}

ServerOptimizerOptions Options(v1::ServerOptimizer kind, double lr) {
  ServerOptimizerOptions o;
  o.kind = kind;
  o.learning_rate = lr;
  return o;
}

Model Step(const ServerOptimizerOptions& o, const Model& base,
           const Model& mean, const std::string& dir = "") {
  absl::StatusOr<Model> next = ApplyServerOptimizer(o, base, mean, dir);
  EXPECT_TRUE(next.ok()) << next.status();
  return next.ok() ? *std::move(next) : Model();
}

int Find(const Model& model, const std::string& name) {
  const int at = model.FindTensor(name);
  EXPECT_GE(at, 0) << name;
  return at;
}

TEST(ServerOptimizerTest, MomentumFollowsItsRecurrenceOverTwoRounds) {
  const Model x0 = RandomModel(Layout(), 1);
  const Model mean1 = RandomModel(Layout(), 2);
  const ServerOptimizerOptions o = Options(v1::SERVER_OPTIMIZER_MOMENTUM, 0.5);
  const Model x1 = Step(o, x0, mean1);
  // State appended: m for the two float tensors and the step, no v.
  ASSERT_EQ(x1.num_tensors(), 3u + 2u + 1u);
  EXPECT_EQ(x1.FindTensor("swarm.server_optimizer.v/w"), -1);
  const Model mean2 = RandomModel(Layout(), 3);
  const Model x2 = Step(o, x1, mean2);
  const int m_w = Find(x2, "swarm.server_optimizer.m/w");
  for (uint64_t i = 0; i < 12; ++i) {
    const double d1 = Get(mean1, 0, i) - Get(x0, 0, i);
    const double m1 = d1;  // beta1 * 0 + d1
    const double x1_ref = Get(x0, 0, i) + 0.5 * m1;
    EXPECT_NEAR(Get(x1, 0, i), x1_ref, 1e-6);
    const double d2 = Get(mean2, 0, i) - Get(x1, 0, i);
    const double m2 = 0.9 * static_cast<float>(m1) + d2;
    EXPECT_NEAR(Get(x2, m_w, i), m2, 1e-5);
    EXPECT_NEAR(Get(x2, 0, i), Get(x1, 0, i) + 0.5 * m2, 1e-5);
  }
  // Integers take the mean.
  EXPECT_EQ(Get(x2, 2, 0), Get(mean2, 2, 0));
  EXPECT_EQ(x2.metadata().at("server_optimizer_step"), "2");
  EXPECT_EQ(x2.metadata().at("server_optimizer"), "momentum");
}

TEST(ServerOptimizerTest, AdamFirstStepIsANormalizedStepOfLearningRate) {
  const Model x0 = RandomModel(Layout(), 4);
  const Model mean = RandomModel(Layout(), 5);
  ServerOptimizerOptions o = Options(v1::SERVER_OPTIMIZER_ADAM, 0.01);
  o.epsilon = 1e-9;
  const Model x1 = Step(o, x0, mean);
  // Bias-corrected first step: m^ = d, v^ = d^2, so x moves lr * sign(d).
  for (uint64_t i = 0; i < 12; ++i) {
    const double d = Get(mean, 0, i) - Get(x0, 0, i);
    EXPECT_NEAR(Get(x1, 0, i) - Get(x0, 0, i), 0.01 * (d > 0 ? 1 : -1), 1e-6);
  }
  EXPECT_GE(x1.FindTensor("swarm.server_optimizer.v/b"), 0);
}

TEST(ServerOptimizerTest, YogiSecondMomentMovesAdditively) {
  const Model x0 = RandomModel(Layout(), 6);
  const Model mean1 = RandomModel(Layout(), 7);
  const ServerOptimizerOptions o = Options(v1::SERVER_OPTIMIZER_YOGI, 0.01);
  const Model x1 = Step(o, x0, mean1);
  const Model mean2 = RandomModel(Layout(), 8);
  const Model x2 = Step(o, x1, mean2);
  const int v1_at = Find(x1, "swarm.server_optimizer.v/w");
  const int v2_at = Find(x2, "swarm.server_optimizer.v/w");
  for (uint64_t i = 0; i < 12; ++i) {
    const double d1 = Get(mean1, 0, i) - Get(x0, 0, i);
    EXPECT_NEAR(Get(x1, v1_at, i), 0.01 * d1 * d1, 1e-6);
    const double v1 = Get(x1, v1_at, i);
    const double d2 = Get(mean2, 0, i) - Get(x1, 0, i);
    const double sign = v1 > d2 * d2 ? 1 : -1;
    EXPECT_NEAR(Get(x2, v2_at, i), v1 - 0.01 * d2 * d2 * sign, 1e-6);
  }
}

TEST(ServerOptimizerTest, TrainableViewDropsTheStateWithoutCopying) {
  const Model x0 = RandomModel(Layout(), 9);
  auto x1 = std::make_shared<const Model>(Step(
      Options(v1::SERVER_OPTIMIZER_ADAM, 0.01), x0, RandomModel(Layout(), 10)));
  std::shared_ptr<const Model> view = TrainableView(x1);
  ASSERT_EQ(view->num_tensors(), 3u);
  EXPECT_TRUE(view->SameLayout(x0));
  EXPECT_EQ(view->tensor_data(0).data(), x1->tensor_data(0).data());
  EXPECT_EQ(view->metadata(), x1->metadata());
  // A model without state is returned as it is.
  auto plain = std::make_shared<const Model>(RandomModel(Layout(), 11));
  EXPECT_EQ(TrainableView(plain), plain);
  EXPECT_EQ(ServerOptimizerStateBytes(x0, v1::SERVER_OPTIMIZER_ADAM),
            2 * (12 + 4) * sizeof(float) + sizeof(int64_t));
}

TEST(ServerOptimizerTest, StateSurvivesASafetensorsRoundTripBitForBit) {
  // What resume and failover rely on: the state kept with the model on
  // disk gives the same next step as the state held in memory.
  persist::testutil::ScopedTempDir dir;
  const ServerOptimizerOptions o = Options(v1::SERVER_OPTIMIZER_ADAM, 0.05);
  const Model x1 =
      Step(o, RandomModel(Layout(), 12), RandomModel(Layout(), 13));
  const std::string path = dir.path() + "/global.safetensors";
  ASSERT_TRUE(x1.SaveSafetensors(path).ok());
  absl::StatusOr<Model> loaded = Model::LoadSafetensors(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model mean2 = RandomModel(Layout(), 14);
  const Model from_memory = Step(o, x1, mean2);
  const Model from_disk = Step(o, *loaded, mean2, dir.path());
  ASSERT_TRUE(from_memory.SameLayout(from_disk));
  for (size_t t = 0; t < from_memory.num_tensors(); ++t) {
    EXPECT_EQ(from_memory.tensor_data(t), from_disk.tensor_data(t))
        << from_memory.spec(t).name;
  }
}

TEST(ServerOptimizerTest, StateThatDoesNotFitIsRefusedNamingTheTensor) {
  const Model x0 = RandomModel(Layout(), 15);
  const Model mean = RandomModel(Layout(), 16);
  const Model momentum =
      Step(Options(v1::SERVER_OPTIMIZER_MOMENTUM, 1), x0, mean);
  // Momentum's state under Adam lacks the second moments.
  absl::StatusOr<Model> adam = ApplyServerOptimizer(
      Options(v1::SERVER_OPTIMIZER_ADAM, 0.01), momentum, mean, "");
  EXPECT_EQ(adam.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(adam.status().message().find("swarm.server_optimizer.v/w"),
            std::string::npos)
      << adam.status();
  // Adam's state under momentum has second moments it does not keep.
  const Model with_v = Step(Options(v1::SERVER_OPTIMIZER_ADAM, 0.01), x0, mean);
  absl::StatusOr<Model> back = ApplyServerOptimizer(
      Options(v1::SERVER_OPTIMIZER_MOMENTUM, 1), with_v, mean, "");
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("does not keep"), std::string::npos);
  // State for a tensor the model lacks.
  std::vector<TensorSpec> odd = Layout();
  odd.push_back(Spec("swarm.server_optimizer.m/ghost", v1::DTYPE_F32, {2}));
  absl::StatusOr<Model> ghost =
      ApplyServerOptimizer(Options(v1::SERVER_OPTIMIZER_MOMENTUM, 1),
                           RandomModel(odd, 17), mean, "");
  EXPECT_NE(ghost.status().message().find("ghost"), std::string::npos);
  // A mean of another layout.
  const Model other = RandomModel({Spec("w", v1::DTYPE_F32, {12})}, 18);
  EXPECT_FALSE(ApplyServerOptimizer(Options(v1::SERVER_OPTIMIZER_MOMENTUM, 1),
                                    x0, other, "")
                   .ok());
  // No step for NONE.
  EXPECT_FALSE(
      ApplyServerOptimizer(Options(v1::SERVER_OPTIMIZER_NONE, 1), x0, mean, "")
          .ok());
}

TEST(ServerOptimizerTest, MomentumZeroAndLearningRateOneIsFedAvg) {
  const Model x0 = RandomModel(Layout(), 19);
  const Model mean = RandomModel(Layout(), 20);
  ServerOptimizerOptions o = Options(v1::SERVER_OPTIMIZER_MOMENTUM, 1);
  o.beta1 = 0;
  const Model x1 = Step(o, x0, mean);
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(x1.tensor_data(t), mean.tensor_data(t)) << x1.spec(t).name;
  }
}

// A model above the parallel threshold (4 MiB) is stepped in shares on
// several threads: the result, state included, is the one-thread result
// bit for bit, over two rounds of Adam (both moments and the step).
TEST(ServerOptimizerTest, ThreadsChangeNothingButTheTime) {
  const std::vector<TensorSpec> big = {
      Spec("w", v1::DTYPE_F32, {1000, 1100}), Spec("h", v1::DTYPE_F16, {777}),
      Spec("b", v1::DTYPE_BF16, {300001}), Spec("n", v1::DTYPE_I64, {5})};
  const Model x0 = RandomModel(big, 31);
  const Model mean0 = RandomModel(big, 32);
  const Model mean1 = RandomModel(big, 33);
  std::vector<Model> last;
  for (int threads : {1, 2, 3}) {
    ServerOptimizerOptions o = Options(v1::SERVER_OPTIMIZER_ADAM, 0.03);
    o.num_threads = threads;
    const Model x1 = Step(o, x0, mean0);
    last.push_back(Step(o, x1, mean1));
  }
  ASSERT_EQ(last[0].num_tensors(), big.size() + 2 * 3 + 1);
  for (size_t k = 1; k < last.size(); ++k) {
    for (size_t t = 0; t < last[0].num_tensors(); ++t) {
      ASSERT_EQ(last[k].tensor_data(t), last[0].tensor_data(t))
          << last[0].spec(t).name << " with " << k + 1 << " threads";
    }
  }
}

TEST(ServerOptimizerTest, OptionsTakeTheDocumentedDefaults) {
  v1::JobConfig config;
  config.set_server_optimizer(v1::SERVER_OPTIMIZER_MOMENTUM);
  EXPECT_EQ(ServerOptimizerOptions::FromJobConfig(config).learning_rate, 1.0);
  EXPECT_EQ(ServerOptimizerOptions::FromJobConfig(config).beta1, 0.5);
  config.set_server_optimizer(v1::SERVER_OPTIMIZER_ADAM);
  ServerOptimizerOptions adam = ServerOptimizerOptions::FromJobConfig(config);
  EXPECT_EQ(adam.learning_rate, 0.03);
  EXPECT_EQ(adam.beta1, 0.9);
  EXPECT_EQ(adam.beta2, 0.99);
  EXPECT_EQ(adam.epsilon, 1e-3);
  config.set_server_beta1(0);
  EXPECT_EQ(ServerOptimizerOptions::FromJobConfig(config).beta1, 0);
}

}  // namespace
}  // namespace swarm
