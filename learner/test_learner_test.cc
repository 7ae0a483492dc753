#include "learner/test_learner.h"

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Params = std::map<std::string, std::string>;

std::unique_ptr<TestLearner> MakeLearner(const Params& params,
                                         const std::string& site = "site-a") {
  absl::StatusOr<TestLearnerOptions> options =
      ParseTestLearnerOptions(site, params);
  EXPECT_TRUE(options.ok()) << options.status();
  if (!options.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<TestLearner>> learner =
      TestLearner::Create(*options);
  EXPECT_TRUE(learner.ok()) << learner.status();
  return learner.ok() ? std::move(learner).value() : nullptr;
}

std::vector<float> Floats(const Model& model, size_t tensor = 0) {
  absl::string_view bytes = model.tensor_data(tensor);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// Read-only storage, like a mapped safetensors file.
class ReadOnlyStorage final : public ModelStorage {
 public:
  explicit ReadOnlyStorage(std::string bytes) : bytes_(std::move(bytes)) {}
  const char* data() const override { return bytes_.data(); }
  char* mutable_data() override { return nullptr; }
  uint64_t size() const override { return bytes_.size(); }

 private:
  std::string bytes_;
};

const std::atomic<bool> kNotCancelled{false};

TEST(TestLearnerTest, InitialModelDefaults) {
  auto learner = MakeLearner({});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> model = learner->InitialModel();
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->num_tensors(), 1u);
  EXPECT_EQ(model->spec(0).name, "weight");
  EXPECT_EQ(model->spec(0).dtype, v1::DTYPE_F32);
  EXPECT_THAT(model->spec(0).shape, ElementsAre(256u));
  EXPECT_EQ(model->total_bytes(), 1024u);
  std::vector<float> values = Floats(*model);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(values[i], static_cast<float>(i) * 0.001f) << i;
    ASSERT_EQ(values[i], learner->InitialValue(i));
  }
}

TEST(TestLearnerTest, InitialModelFromParams) {
  auto learner = MakeLearner(
      {{"size", "5"}, {"init_scale", "0.5"}, {"init_offset", "-1"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> model = learner->InitialModel();
  ASSERT_TRUE(model.ok());
  EXPECT_THAT(Floats(*model), ElementsAre(-1.0f, -0.5f, 0.0f, 0.5f, 1.0f));
}

TEST(TestLearnerTest, SeveralTensorsSplitOneTensorsValues) {
  auto learner = MakeLearner({{"tensors", "3,1,2"}, {"size", "99"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> model = learner->InitialModel();
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->num_tensors(), 3u);
  EXPECT_EQ(model->spec(0).name, "weight");
  EXPECT_EQ(model->spec(1).name, "weight_1");
  EXPECT_EQ(model->spec(2).name, "weight_2");
  EXPECT_THAT(model->spec(2).shape, ElementsAre(2u));
  EXPECT_EQ(model->total_bytes(), 24u);
  EXPECT_THAT(Floats(*model, 0), ElementsAre(0.0f, 0.001f, 0.002f));
  EXPECT_THAT(Floats(*model, 1), ElementsAre(3 * 0.001f));
  EXPECT_THAT(Floats(*model, 2), ElementsAre(4 * 0.001f, 5 * 0.001f));
  absl::StatusOr<TrainOutput> out = learner->Train(*model, 0, kNotCancelled);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(Floats(out->model, 2),
              ElementsAre(4 * 0.001f + 0.125f, 5 * 0.001f + 0.125f));
}

TEST(TestLearnerOptionsTest, BadTensors) {
  for (const char* bad : {"", "3,,1", "0", "-1", "x", "1,1073741825"}) {
    absl::StatusOr<TestLearnerOptions> options =
        ParseTestLearnerOptions("a", {{"tensors", bad}});
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(options.status().message(), HasSubstr("tensors")) << bad;
  }
  TestLearnerOptions options;
  options.tensor_sizes = {4, TestLearner::kMaxSize + 1};
  EXPECT_EQ(TestLearner::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TestLearnerTest, TrainAddsDeltaAndReportsSamples) {
  auto learner = MakeLearner({{"delta", "0.25"}, {"sample_count", "40"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  absl::StatusOr<TrainOutput> out = learner->Train(*global, 0, kNotCancelled);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->sample_count, 40u);
  EXPECT_EQ(out->kind, v1::PAYLOAD_KIND_FULL_WEIGHTS);
  ASSERT_TRUE(out->model.SameLayout(*global));
  std::vector<float> before = Floats(*global);
  std::vector<float> after = Floats(out->model);
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_EQ(after[i], before[i] + 0.25f) << i;
    ASSERT_EQ(before[i], learner->InitialValue(i)) << "global changed";
  }
  // Training again from the result adds the delta again.
  absl::StatusOr<TrainOutput> again =
      learner->Train(out->model, 1, kNotCancelled);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Floats(again->model)[10], (10 * 0.001f + 0.25f) + 0.25f);
}

TEST(TestLearnerTest, DefaultDeltaAndSamples) {
  auto learner = MakeLearner({{"size", "3"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  absl::StatusOr<TrainOutput> out = learner->Train(*global, 0, kNotCancelled);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->sample_count, 1u);
  EXPECT_THAT(Floats(out->model),
              ElementsAre(0.125f, 0.001f + 0.125f, 0.002f + 0.125f));
}

TEST(TestLearnerTest, TrainsAReadOnlyModelWithAnyF32Layout) {
  std::vector<TensorSpec> specs;
  specs.push_back(*MakeTensorSpec("a", v1::DTYPE_F32, {2}));
  specs.push_back(*MakeTensorSpec("b", v1::DTYPE_F32, {1}));
  float values[3] = {1.0f, 2.0f, 3.0f};
  auto storage = std::make_shared<ReadOnlyStorage>(
      std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  absl::StatusOr<Model> global =
      Model::FromStorage(std::move(specs), {0, 8}, storage);
  ASSERT_TRUE(global.ok()) << global.status();
  ASSERT_FALSE(global->writable());
  auto learner = MakeLearner({{"delta", "1"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<TrainOutput> out = learner->Train(*global, 0, kNotCancelled);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(Floats(out->model, 0), ElementsAre(2.0f, 3.0f));
  EXPECT_THAT(Floats(out->model, 1), ElementsAre(4.0f));
}

TEST(TestLearnerTest, WeightDiffPayload) {
  auto learner =
      MakeLearner({{"size", "4"}, {"delta", "0.5"}, {"payload", "diff"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  absl::StatusOr<TrainOutput> out = learner->Train(*global, 0, kNotCancelled);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->kind, v1::PAYLOAD_KIND_WEIGHT_DIFF);
  EXPECT_THAT(Floats(out->model), ElementsAre(0.5f, 0.5f, 0.5f, 0.5f));
}

TEST(TestLearnerTest, RefusesNonF32AndEmptyModels) {
  auto learner = MakeLearner({});
  ASSERT_NE(learner, nullptr);
  std::vector<TensorSpec> specs;
  specs.push_back(*MakeTensorSpec("w", v1::DTYPE_F64, {2}));
  absl::StatusOr<Model> f64 = Model::Create(std::move(specs));
  ASSERT_TRUE(f64.ok());
  absl::StatusOr<TrainOutput> out = learner->Train(*f64, 0, kNotCancelled);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("tensor \"w\" is F64"));

  Model empty;
  EXPECT_EQ(learner->Train(empty, 0, kNotCancelled).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(learner->Validate(empty, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TestLearnerTest, ScriptedMetrics) {
  auto learner = MakeLearner({{"metrics", "0:0.50, 1:0.72,2:0.61"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  const double expected[] = {0.50, 0.72, 0.61, 0.0, 0.0};
  for (uint32_t round = 0; round < 5; ++round) {
    absl::StatusOr<Metrics> metrics = learner->Validate(*global, round);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_EQ(metrics->size(), 2u);
    EXPECT_EQ(metrics->at("accuracy"), expected[round]) << round;
    EXPECT_EQ(metrics->at("loss"), 1.0 - expected[round]) << round;
    EXPECT_EQ(learner->MetricFor(round), expected[round]);
  }
}

TEST(TestLearnerTest, DefaultMetricAndNonFinite) {
  auto learner =
      MakeLearner({{"metrics", "3:nan"}, {"default_metric", "0.25"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  EXPECT_EQ(learner->Validate(*global, 0)->at("accuracy"), 0.25);
  EXPECT_EQ(learner->Validate(*global, 0)->at("loss"), 0.75);
  EXPECT_TRUE(std::isnan(learner->Validate(*global, 3)->at("accuracy")));
}

TEST(TestLearnerTest, PerSiteKeysWin) {
  Params params = {{"delta", "1"},
                   {"delta.site-b", "2"},
                   {"metrics", "0:0.1"},
                   {"metrics.site-b", "0:0.9"},
                   {"sample_count.site-a", "7"}};
  auto a = MakeLearner(params, "site-a");
  auto b = MakeLearner(params, "site-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->options().delta, 1.0f);
  EXPECT_EQ(b->options().delta, 2.0f);
  EXPECT_EQ(a->MetricFor(0), 0.1);
  EXPECT_EQ(b->MetricFor(0), 0.9);
  EXPECT_EQ(a->options().sample_count, 7u);
  EXPECT_EQ(b->options().sample_count, 1u);
}

TEST(TestLearnerTest, ScriptedFailure) {
  auto learner = MakeLearner({{"fail_round", "2, 4"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  for (uint32_t round = 0; round < 6; ++round) {
    absl::StatusOr<TrainOutput> out =
        learner->Train(*global, round, kNotCancelled);
    if (round == 2 || round == 4) {
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal) << round;
      EXPECT_THAT(out.status().message(),
                  HasSubstr("scripted training failure in round"));
    } else {
      EXPECT_TRUE(out.ok()) << round << ": " << out.status();
    }
    // Validation still works in a failing round.
    EXPECT_TRUE(learner->Validate(*global, round).ok());
  }
}

TEST(TestLearnerTest, CancelledBeforeStart) {
  auto learner = MakeLearner({});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  std::atomic<bool> cancel{true};
  absl::StatusOr<TrainOutput> out = learner->Train(*global, 3, cancel);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(out.status().message(), HasSubstr("round 3 cancelled"));
}

TEST(TestLearnerTest, CancelDuringTrainingReturnsPromptly) {
  auto learner = MakeLearner({{"train_ms", "60000"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  std::atomic<bool> cancel{false};
  // Timed from before the canceller starts: under load the thread may run
  // its sleep before this thread gets back (a start taken after it made
  // the test fail at 19 ms once).
  const absl::Time start = absl::Now();
  std::thread canceller([&cancel] {
    absl::SleepFor(absl::Milliseconds(30));
    cancel.store(true);
  });
  absl::StatusOr<TrainOutput> out = learner->Train(*global, 0, cancel);
  const absl::Duration took = absl::Now() - start;
  canceller.join();
  EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled);
  EXPECT_GE(took, absl::Milliseconds(25));
  EXPECT_LT(took, absl::Seconds(5));  // Not the 60 s of training.
}

TEST(TestLearnerTest, TrainingTakesTrainMs) {
  auto learner = MakeLearner({{"train_ms", "40"}});
  ASSERT_NE(learner, nullptr);
  absl::StatusOr<Model> global = learner->InitialModel();
  ASSERT_TRUE(global.ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<TrainOutput> out = learner->Train(*global, 0, kNotCancelled);
  EXPECT_TRUE(out.ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(40));
}

TEST(TestLearnerOptionsTest, ParameterErrorsNameTheParameter) {
  struct Case {
    Params params;
    const char* message;
  } cases[] = {
      {{{"delta", "abc"}}, "learner param \"delta\": \"abc\" is not a number"},
      {{{"delta.site-a", "1x"}},
       "learner param \"delta.site-a\": \"1x\" is not a number"},
      {{{"init_scale", ""}}, "learner param \"init_scale\""},
      {{{"init_offset", "o"}}, "learner param \"init_offset\""},
      {{{"size", "0"}}, "learner param \"size\": \"0\" is not in [1, "},
      {{{"size", "-4"}},
       "learner param \"size\": \"-4\" is not a "
       "non-negative integer"},
      {{{"size", "2e3"}}, "learner param \"size\""},
      {{{"sample_count", "0"}},
       "learner param \"sample_count\": \"0\" is "
       "not in [1, "},
      {{{"metrics", "0=0.5"}},
       "learner param \"metrics\": \"0=0.5\" has entry \"0=0.5\", not "
       "round:value"},
      {{{"metrics", "x:0.5"}},
       "learner param \"metrics\": \"x:0.5\" has a bad round number \"x\""},
      {{{"metrics", "1:0.5,2:y"}}, "has a bad value \"y\" for round 2"},
      {{{"metrics", "1:0.5,1:0.6"}}, "lists round 1 twice"},
      {{{"metrics", "0:0.5,"}}, "has entry \"\", not round:value"},
      {{{"default_metric", "high"}}, "learner param \"default_metric\""},
      {{{"fail_round", "two"}},
       "learner param \"fail_round\": \"two\" has a "
       "bad round number \"two\""},
      {{{"fail_round", "-1"}}, "learner param \"fail_round\""},
      {{{"train_ms", "-5"}},
       "learner param \"train_ms\": \"-5\" is not a "
       "non-negative integer"},
      {{{"train_ms", "99999999999"}}, "learner param \"train_ms\""},
      {{{"payload", "half"}},
       "learner param \"payload\": \"half\" is not "
       "\"full\" or \"diff\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TestLearnerOptions> options =
        ParseTestLearnerOptions("site-a", c.params);
    ASSERT_FALSE(options.ok()) << c.message;
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(options.status().message(), HasSubstr(c.message));
  }
}

TEST(TestLearnerOptionsTest, UnknownParams) {
  Params params = {{"delta", "1"},      {"delta.site-b", "2"},
                   {"lr", "0.1"},       {"deltas", "1"},
                   {"metrics.", "0:1"}, {"train_ms.x.y", "1"}};
  EXPECT_THAT(UnknownTestLearnerParams(params),
              ElementsAre("deltas", "lr", "metrics."));
  // Unknown keys do not fail parsing.
  EXPECT_TRUE(ParseTestLearnerOptions("a", params).ok());
}

TEST(TestLearnerOptionsTest, CreateChecksOptions) {
  TestLearnerOptions options;
  options.size = 0;
  EXPECT_EQ(TestLearner::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.size = 1;
  options.sample_count = 0;
  EXPECT_EQ(TestLearner::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swarm
