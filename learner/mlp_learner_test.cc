#include "learner/mlp_learner.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/status_macros.h"
#include "learner/learner_factory.h"
#include "learner/random.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// 10 classes of 16-pixel images, class c bright in pixels c..c+5.
std::shared_ptr<const ImageDataset> Synthetic(size_t n) {
  auto data = std::make_shared<ImageDataset>();
  data->pixels_per_image = 16;
  data->num_classes = 10;
  PortableRng rng(77);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t label = static_cast<uint8_t>(i % 10);
    data->labels.push_back(label);
    for (uint32_t p = 0; p < 16; ++p) {
      const bool on = p >= label && p < label + 6u;
      data->pixels.push_back(
          static_cast<uint8_t>((on ? 140 : 10) + rng.Bounded(100)));
    }
  }
  return data;
}

MlpLearnerOptions SmallOptions(uint32_t sites, uint32_t index) {
  MlpLearnerOptions o;
  o.site = "site-" + std::to_string(index);
  o.sites = sites;
  o.site_index = index;
  o.hidden = {12};
  o.batch_size = 16;
  return o;
}

bool SameBytes(const Model& a, const Model& b) {
  if (!a.SameLayout(b)) return false;
  for (size_t t = 0; t < a.num_tensors(); ++t) {
    if (a.tensor_data(t) != b.tensor_data(t)) return false;
  }
  return true;
}

TEST(MlpLearnerOptionsTest, Defaults) {
  absl::StatusOr<MlpLearnerOptions> o = ParseMlpLearnerOptions("a", {});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->site, "a");
  EXPECT_EQ(o->data_dir, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(o->sites, 1u);
  EXPECT_EQ(o->site_index, 0u);
  EXPECT_EQ(o->partition, PartitionKind::kDirichlet);
  EXPECT_EQ(o->alpha, 0.5);
  EXPECT_EQ(o->validation_fraction, 0.1);
  EXPECT_EQ(o->max_train_samples, 0u);
  EXPECT_THAT(o->hidden, ElementsAre(128));
  EXPECT_EQ(o->lr, 0.05f);
  EXPECT_EQ(o->lr_decay, 0.95f);
  EXPECT_EQ(o->momentum, 0.9f);
  EXPECT_TRUE(o->balanced_softmax);
  EXPECT_EQ(o->batch_size, 64u);
  EXPECT_EQ(o->epochs, 1u);
}

TEST(MlpLearnerOptionsTest, ReadsParamsWithSiteOverrides) {
  const std::map<std::string, std::string> params = {
      {"sites", "4"},
      {"site_index.a", "2"},
      {"site_index.b", "3"},
      {"partition", "IID"},
      {"alpha", "0.1"},
      {"data_seed", "9"},
      {"hidden", "256,64"},
      {"lr", "0.02"},
      {"lr_decay", "1"},
      {"balanced_softmax", "false"},
      {"lr.b", "0.03"},
      {"momentum", "0"},
      {"batch_size", "32"},
      {"epochs", "3"},
      {"seed", "5"},
      {"validation_fraction", "0.2"},
      {"max_train_samples", "5000"},
      {"data_dir", "/data/fm"},
  };
  absl::StatusOr<MlpLearnerOptions> a = ParseMlpLearnerOptions("a", params);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->sites, 4u);
  EXPECT_EQ(a->site_index, 2u);
  EXPECT_EQ(a->partition, PartitionKind::kIid);
  EXPECT_EQ(a->alpha, 0.1);
  EXPECT_EQ(a->data_seed, 9u);
  EXPECT_THAT(a->hidden, ElementsAre(256, 64));
  EXPECT_EQ(a->lr, 0.02f);
  EXPECT_EQ(a->momentum, 0.0f);
  EXPECT_EQ(a->lr_decay, 1.0f);
  EXPECT_FALSE(a->balanced_softmax);
  EXPECT_EQ(a->batch_size, 32u);
  EXPECT_EQ(a->epochs, 3u);
  EXPECT_EQ(a->seed, 5u);
  EXPECT_EQ(a->validation_fraction, 0.2);
  EXPECT_EQ(a->max_train_samples, 5000u);
  EXPECT_EQ(a->data_dir, "/data/fm");
  absl::StatusOr<MlpLearnerOptions> b = ParseMlpLearnerOptions("b", params);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->site_index, 3u);
  EXPECT_EQ(b->lr, 0.03f);
}

TEST(MlpLearnerOptionsTest, ErrorsNameTheParam) {
  struct Case {
    std::map<std::string, std::string> params;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"alpha", "0"}}, "learner param \"alpha\": \"0\" must be > 0"},
      {{{"alpha.a", "-1"}}, "learner param \"alpha.a\": \"-1\" must be > 0"},
      {{{"alpha", "x"}}, "learner param \"alpha\": \"x\" is not a finite"},
      {{{"sites", "4"}}, "\"site_index\" (or \"site_index.a\") is required"},
      {{{"sites", "4"}, {"site_index", "4"}},
       "learner param \"site_index\": \"4\" is out of range for 4 sites "
       "(0..3)"},
      {{{"sites", "0"}}, "learner param \"sites\": \"0\" is not in"},
      {{{"partition", "shards"}}, "learner param \"partition\": \"shards\""},
      {{{"hidden", "12,x"}}, "learner param \"hidden\": \"12,x\""},
      {{{"lr", "0"}}, "learner param \"lr\""},
      {{{"momentum", "1"}}, "learner param \"momentum\""},
      {{{"lr_decay", "0"}},
       "learner param \"lr_decay\": \"0\" is not in (0, 1]"},
      {{{"balanced_softmax", "yes"}}, "learner param \"balanced_softmax\""},
      {{{"batch_size", "0"}}, "learner param \"batch_size\""},
      {{{"epochs", "-1"}}, "learner param \"epochs\""},
      {{{"validation_fraction", "0.95"}}, "learner param \"validation_frac"},
      {{{"data_dir", " "}}, "learner param \"data_dir\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<MlpLearnerOptions> o = ParseMlpLearnerOptions("a", c.params);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_THAT(o.status().message(), HasSubstr(c.message));
  }
}

TEST(MlpLearnerOptionsTest, ProxMu) {
  absl::StatusOr<MlpLearnerOptions> off = ParseMlpLearnerOptions("a", {});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->prox_mu, 0.0f);
  absl::StatusOr<MlpLearnerOptions> on = ParseMlpLearnerOptions(
      "a", {{"prox_mu", " 0.01 "}, {"prox_mu.b", "0"}});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->prox_mu, 0.01f);
  absl::StatusOr<MlpLearnerOptions> b = ParseMlpLearnerOptions(
      "b", {{"prox_mu", "0.01"}, {"prox_mu.b", "0"}});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->prox_mu, 0.0f);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"-0.1", "learner param \"prox_mu\": \"-0.1\" must be >= 0"},
      {"-1e-9", "learner param \"prox_mu\": \"-1e-9\" must be >= 0"},
      {"nan", "learner param \"prox_mu\": \"nan\" is not a finite number"},
      {"inf", "learner param \"prox_mu\": \"inf\" is not a finite number"},
      {"1e300", "learner param \"prox_mu\": \"1e300\" is not a finite"},
      {"x", "learner param \"prox_mu\": \"x\" is not a finite number"},
      {"", "learner param \"prox_mu\": \"\" is not a finite number"},
  };
  for (const auto& [value, message] : bad) {
    absl::StatusOr<MlpLearnerOptions> o =
        ParseMlpLearnerOptions("a", {{"prox_mu", value}});
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(o.status().message(), HasSubstr(message));
  }
  // The per-site key is named when it is the one used.
  EXPECT_THAT(
      ParseMlpLearnerOptions("a", {{"prox_mu.a", "-2"}}).status().message(),
      HasSubstr("learner param \"prox_mu.a\": \"-2\" must be >= 0"));
}

// A job's learner_params with a bad prox_mu refuse the job at configure
// (the daemon prefixes "learner_params: ", controller/site_driver_calls.cc),
// before any data is loaded.
TEST(MlpLearnerOptionsTest, ConfigureRefusesABadProxMu) {
  v1::LearnerConfig config;
  config.set_kind("mlp");
  (*config.mutable_params())["data_dir"] = "/nonexistent/fashion-mnist";
  absl::Status refused =
      CreateLearner(config, "a", {{"prox_mu", "-0.5"}}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("learner param \"prox_mu\": \"-0.5\" must be >= 0"));
}

TEST(MlpLearnerOptionsTest, UnknownParams) {
  EXPECT_THAT(UnknownMlpLearnerParams({{"lr", "1"},
                                       {"lr.a", "1"},
                                       {"delta", "1"},
                                       {"site_indexes", "1"},
                                       {"hidden.b", "3"}}),
              UnorderedElementsAre("delta", "site_indexes"));
}

TEST(MlpLearnerTest, RoundTripThroughModels) {
  auto data = Synthetic(800);
  absl::StatusOr<std::unique_ptr<MlpLearner>> a =
      MlpLearner::Create(SmallOptions(2, 0), data);
  absl::StatusOr<std::unique_ptr<MlpLearner>> b =
      MlpLearner::Create(SmallOptions(2, 1), data);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT((*a)->sizes(), ElementsAre(16, 12, 10));
  // The two shards and their hold-outs share the 800 examples.
  const size_t total =
      (*a)->train_data().size() + (*a)->validation_data().size() +
      (*b)->train_data().size() + (*b)->validation_data().size();
  EXPECT_EQ(total, 800u);

  // Every site computes the same initial model.
  absl::StatusOr<Model> global = (*a)->InitialModel();
  absl::StatusOr<Model> global_b = (*b)->InitialModel();
  ASSERT_TRUE(global.ok() && global_b.ok());
  EXPECT_TRUE(SameBytes(*global, *global_b));
  EXPECT_EQ(global->spec(0).name, "fc0.weight");

  absl::StatusOr<Metrics> before = (*a)->Validate(*global, 0);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->size(), 2u);
  EXPECT_GE(before->at("accuracy"), 0.0);
  EXPECT_LE(before->at("accuracy"), 1.0);

  std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> out = (*a)->Train(*global, 0, cancel);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, v1::PAYLOAD_KIND_FULL_WEIGHTS);
  EXPECT_EQ(out->sample_count, (*a)->train_data().size());
  EXPECT_TRUE(out->model.SameLayout(*global));
  EXPECT_FALSE(SameBytes(out->model, *global));
  absl::StatusOr<Metrics> after = (*a)->Validate(out->model, 1);
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->at("loss"), before->at("loss"));

  // Through a safetensors file (a read-only mapping) and back.
  char tmpl[] = "/tmp/mlp_learner_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/model.safetensors";
  ASSERT_TRUE(out->model.SaveSafetensors(path).ok());
  absl::StatusOr<Model> loaded = Model::LoadSafetensors(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(SameBytes(*loaded, out->model));
  absl::StatusOr<Metrics> reloaded = (*a)->Validate(*loaded, 1);
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(*reloaded, *after);
  absl::StatusOr<TrainOutput> next = (*b)->Train(*loaded, 1, cancel);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->sample_count, (*b)->train_data().size());
  std::system(("rm -rf '" + std::string(tmpl) + "'").c_str());
}

TEST(MlpLearnerTest, TrainingIsDeterministic) {
  auto data = Synthetic(400);
  auto one = MlpLearner::Create(SmallOptions(2, 1), data);
  auto two = MlpLearner::Create(SmallOptions(2, 1), data);
  ASSERT_TRUE(one.ok() && two.ok());
  absl::StatusOr<Model> global = (*one)->InitialModel();
  ASSERT_TRUE(global.ok());
  std::atomic<bool> cancel{false};
  auto x = (*one)->Train(*global, 3, cancel);
  auto y = (*two)->Train(*global, 3, cancel);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_TRUE(SameBytes(x->model, y->model));
  // Another round shuffles differently.
  auto z = (*two)->Train(*global, 4, cancel);
  ASSERT_TRUE(z.ok());
  EXPECT_FALSE(SameBytes(x->model, z->model));
}

TEST(MlpLearnerTest, EpochsAndCallback) {
  auto data = Synthetic(300);
  MlpLearnerOptions o = SmallOptions(1, 0);
  o.epochs = 3;
  auto learner = MlpLearner::Create(o, data);
  ASSERT_TRUE(learner.ok());
  std::vector<uint32_t> epochs;
  (*learner)->set_epoch_callback(
      [&](const EpochReport& r) { epochs.push_back(r.epoch); });
  std::atomic<bool> cancel{false};
  ASSERT_TRUE((*learner)->Train(*(*learner)->InitialModel(), 0, cancel).ok());
  EXPECT_THAT(epochs, ElementsAre(1, 2, 3));
}

TEST(MlpLearnerTest, CancelledTrainingReturnsCancelled) {
  auto data = Synthetic(300);
  auto learner = MlpLearner::Create(SmallOptions(1, 0), data);
  ASSERT_TRUE(learner.ok());
  std::atomic<bool> cancel{true};
  auto out = (*learner)->Train(*(*learner)->InitialModel(), 0, cancel);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled);
}

TEST(MlpLearnerTest, RefusesAGlobalModelOfAnotherShape) {
  auto data = Synthetic(300);
  MlpLearnerOptions wide = SmallOptions(1, 0);
  wide.hidden = {20};
  auto a = MlpLearner::Create(SmallOptions(1, 0), data);
  auto b = MlpLearner::Create(wide, data);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<Model> other = (*b)->InitialModel();
  ASSERT_TRUE(other.ok());
  auto metrics = (*a)->Validate(*other, 2);
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(metrics.status().message(),
              HasSubstr("round 2: global model is an MLP [16, 20, 10] but "
                        "this site is configured for [16, 12, 10]"));
  std::atomic<bool> cancel{false};
  EXPECT_EQ((*a)->Train(*other, 2, cancel).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*a)->Validate(Model(), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlpLearnerTest, NoValidationData) {
  auto data = Synthetic(300);
  MlpLearnerOptions o = SmallOptions(1, 0);
  o.validation_fraction = 0;
  auto learner = MlpLearner::Create(o, data);
  ASSERT_TRUE(learner.ok());
  EXPECT_EQ((*learner)->train_data().size(), 300u);
  auto metrics = (*learner)->Validate(*(*learner)->InitialModel(), 0);
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MlpLearnerTest, ImpossibleSplitFailsAtCreate) {
  auto data = Synthetic(100);  // 10 per class.
  auto learner = MlpLearner::Create(SmallOptions(11, 0), data);
  EXPECT_EQ(learner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(learner.status().message(), HasSubstr("it has 10 samples"));
  MlpLearnerOptions o = SmallOptions(2, 0);
  o.alpha = 0;
  EXPECT_EQ(MlpLearner::Create(o, data).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlpLearnerTest, MissingDatasetNamesThePackage) {
  v1::LearnerConfig config;
  config.set_kind("mlp");
  (*config.mutable_params())["data_dir"] = "/nonexistent/fashion-mnist";
  auto learner = CreateLearner(config, "a", {});
  EXPECT_EQ(learner.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(learner.status().message(),
              HasSubstr("install the Debian package dataset-fashion-mnist"));
  EXPECT_THAT(learner.status().message(),
              HasSubstr("apt-get install dataset-fashion-mnist"));
}

// The factory on the installed dataset: four non-IID sites whose shards
// cover the training set; a short round on a subset. Fails with the install
// hint when the dataset package is missing.
TEST(MlpLearnerRealDataTest, FactoryBuildsSitesOverTheRealDataset) {
  v1::LearnerConfig config;
  config.set_kind("mlp");
  (*config.mutable_params())["sites"] = "4";
  (*config.mutable_params())["max_train_samples"] = "4000";
  (*config.mutable_params())["hidden"] = "32";
  std::map<std::string, std::string> job = {{"site_index.a", "0"},
                                            {"site_index.b", "1"},
                                            {"site_index.c", "2"},
                                            {"site_index.d", "3"}};
  size_t total = 0;
  std::unique_ptr<Learner> first;
  for (const char* site : {"a", "b", "c", "d"}) {
    auto learner = CreateLearner(config, site, job);
    ASSERT_TRUE(learner.ok()) << learner.status();
    auto* mlp = dynamic_cast<MlpLearner*>(learner->get());
    ASSERT_NE(mlp, nullptr);
    EXPECT_THAT(mlp->sizes(), ElementsAre(784, 32, 10));
    total += mlp->train_data().size() + mlp->validation_data().size();
    if (first == nullptr) first = *std::move(learner);
  }
  EXPECT_EQ(total, 4000u);
  absl::StatusOr<Model> global = first->InitialModel();
  ASSERT_TRUE(global.ok());
  std::atomic<bool> cancel{false};
  auto out = first->Train(*global, 0, cancel);
  ASSERT_TRUE(out.ok()) << out.status();
  auto metrics = first->Validate(out->model, 1);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  auto* mlp = dynamic_cast<MlpLearner*>(first.get());
  auto test = mlp->EvaluateTest(out->model);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->samples, 10000u);
  EXPECT_GT(test->accuracy, 0.2);
}

// L2 distance between the float tensors of two models of one layout.
double L2Distance(const Model& a, const Model& b) {
  double sum = 0;
  for (size_t t = 0; t < a.num_tensors(); ++t) {
    const size_t n = a.spec(t).byte_size / sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float x, y;
      std::memcpy(&x, a.tensor_data(t).data() + i * sizeof(float), 4);
      std::memcpy(&y, b.tensor_data(t).data() + i * sizeof(float), 4);
      sum += (static_cast<double>(x) - y) * (static_cast<double>(x) - y);
    }
  }
  return std::sqrt(sum);
}

// A trained starting point (so the round's global model is not the initial
// one) and the sites' learner options: prox_mu is the only difference.
MlpLearnerOptions ProxOptions(float mu) {
  MlpLearnerOptions o = SmallOptions(2, 0);
  o.epochs = 4;
  o.prox_mu = mu;
  return o;
}

absl::StatusOr<Model> TrainWithMu(std::shared_ptr<const ImageDataset> data,
                                  float mu, const Model& global) {
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<MlpLearner> learner,
                         MlpLearner::Create(ProxOptions(mu), data));
  std::atomic<bool> cancel{false};
  SWARM_ASSIGN_OR_RETURN(TrainOutput out, learner->Train(global, 2, cancel));
  return std::move(out.model);
}

// prox_mu 0 is plain local SGD, bit for bit: the same weights as a learner
// without the parameter, and as TrainSgd without the proximal fields.
TEST(MlpLearnerProxTest, ZeroMuIsBitIdenticalToPlainSgd) {
  auto data = Synthetic(600);
  auto plain = MlpLearner::Create(SmallOptions(2, 0), data);
  ASSERT_TRUE(plain.ok());
  absl::StatusOr<MlpLearnerOptions> parsed = ParseMlpLearnerOptions(
      "site-0", {{"sites", "2"},
                 {"site_index", "0"},
                 {"hidden", "12"},
                 {"batch_size", "16"},
                 {"prox_mu", "0"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto zero = MlpLearner::Create(*parsed, data);
  ASSERT_TRUE(zero.ok());
  const Model global = *(*plain)->InitialModel();
  std::atomic<bool> cancel{false};
  auto x = (*plain)->Train(global, 1, cancel);
  auto y = (*zero)->Train(global, 1, cancel);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_TRUE(SameBytes(x->model, y->model));

  // TrainSgd: mu 0 with an anchor given changes nothing either.
  absl::StatusOr<Mlp> a = Mlp::FromModel(global);
  absl::StatusOr<Mlp> b = Mlp::FromModel(global);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<MlpLayer> anchor = a->layers();
  SgdOptions sgd;
  sgd.shuffle_seed = 5;
  sgd.batch_size = 16;
  ASSERT_TRUE(TrainSgd(*a, *data, {}, sgd, nullptr, {}).ok());
  sgd.prox_anchor = &anchor;
  sgd.prox_mu = 0;
  ASSERT_TRUE(TrainSgd(*b, *data, {}, sgd, nullptr, {}).ok());
  EXPECT_TRUE(SameBytes(*a->ToModel(), *b->ToModel()));
}

// The proximal term keeps the local model near the global one: the L2
// distance of the trained weights from the global model shrinks as mu grows.
TEST(MlpLearnerProxTest, LargerMuStaysCloserToTheGlobalModel) {
  auto data = Synthetic(800);
  auto start = MlpLearner::Create(SmallOptions(1, 0), data);
  ASSERT_TRUE(start.ok());
  std::atomic<bool> cancel{false};
  auto warm = (*start)->Train(*(*start)->InitialModel(), 0, cancel);
  ASSERT_TRUE(warm.ok());
  const Model& global = warm->model;

  absl::StatusOr<Model> mu0 = TrainWithMu(data, 0.0f, global);
  absl::StatusOr<Model> mu_small = TrainWithMu(data, 0.1f, global);
  absl::StatusOr<Model> mu_large = TrainWithMu(data, 2.0f, global);
  ASSERT_TRUE(mu0.ok()) << mu0.status();
  ASSERT_TRUE(mu_small.ok()) << mu_small.status();
  ASSERT_TRUE(mu_large.ok()) << mu_large.status();
  const double d0 = L2Distance(*mu0, global);
  const double d_small = L2Distance(*mu_small, global);
  const double d_large = L2Distance(*mu_large, global);
  EXPECT_GT(d0, 0);
  EXPECT_LT(d_small, d0);
  EXPECT_LT(d_large, 0.5 * d0) << "d(mu=0) " << d0 << ", d(mu=2) " << d_large;
  EXPECT_LT(d_large, d_small);
  // Deterministic like plain training.
  absl::StatusOr<Model> again = TrainWithMu(data, 2.0f, global);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(SameBytes(*again, *mu_large));
}

TEST(MlpLearnerProxTest, TrainSgdRefusesAMissingOrMismatchedAnchor) {
  auto data = Synthetic(100);
  absl::StatusOr<Mlp> net = Mlp::Create({16, 12, 10}, 1);
  absl::StatusOr<Mlp> other = Mlp::Create({16, 8, 10}, 1);
  ASSERT_TRUE(net.ok() && other.ok());
  SgdOptions sgd;
  sgd.prox_mu = 0.5f;
  absl::Status no_anchor = TrainSgd(*net, *data, {}, sgd, nullptr, {});
  EXPECT_EQ(no_anchor.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_anchor.message(), HasSubstr("anchor"));
  sgd.prox_anchor = &other->layers();
  EXPECT_EQ(TrainSgd(*net, *data, {}, sgd, nullptr, {}).code(),
            absl::StatusCode::kInvalidArgument);
  sgd.prox_anchor = &net->layers();
  sgd.prox_mu = -1.0f;
  EXPECT_EQ(TrainSgd(*net, *data, {}, sgd, nullptr, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swarm
