// TrainerLink without a transport: a trainer played by the test thread, the
// daemon's Learner calls on another thread.
#include "trainerlink/trainer_link.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"
#include "trainerlink/model_files.h"

namespace swarm::trainerlink {
namespace {

using ::testing::ElementsAre;

using ::testing::HasSubstr;

Model MakeModel(float base, std::vector<uint64_t> shape = {4},
                DType dtype = v1::DTYPE_F32, std::string name = "w") {
  absl::StatusOr<TensorSpec> spec = MakeTensorSpec(name, dtype, shape);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Model> model = Model::Create({*spec});
  EXPECT_TRUE(model.ok()) << model.status();
  if (dtype == v1::DTYPE_F32) {
    absl::Span<char> data = model->mutable_tensor_data(0);
    for (size_t i = 0; i < data.size() / 4; ++i) {
      const float v = base + static_cast<float>(i);
      std::memcpy(data.data() + 4 * i, &v, 4);
    }
  }
  return std::move(*model);
}

float Element(const Model& model, size_t i) {
  float v;
  std::memcpy(&v, model.tensor_data(0).data() + 4 * i, 4);
  return v;
}

class TrainerLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.site = "site-a";
    options_.dir = dir_.path();
    options_.lease = absl::Seconds(2);
    options_.task_timeout = absl::Seconds(20);
    link_ = std::make_unique<TrainerLink>(options_);
    link_->SetJobView([] { return JobView{"job-1", false, "accuracy"}; });
  }

  std::string Attach(const std::string& name = "t1") {
    v1::AttachRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_trainer_name(name);
    request.set_pid(1234);
    absl::StatusOr<v1::AttachReply> reply = link_->Attach(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->session_id() : "";
  }

  v1::TrainerTask Next(const std::string& session, uint64_t wait_ms = 5000) {
    v1::NextTaskRequest request;
    request.set_session_id(session);
    request.set_wait_ms(wait_ms);
    absl::StatusOr<v1::NextTaskReply> reply = link_->NextTask(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->task() : v1::TrainerTask();
  }

  absl::Status Submit(const std::string& session, const v1::TrainerTask& task,
                      const Model& result, uint64_t samples = 8) {
    absl::Status written = WriteHandoffFile(result, task.result_path());
    if (!written.ok()) return written;
    v1::SubmitResultRequest request;
    request.set_session_id(session);
    request.set_task_id(task.task_id());
    request.set_sample_count(samples);
    return link_->SubmitResult(request);
  }

  persist::testutil::ScopedTempDir dir_;
  LinkOptions options_;
  std::unique_ptr<TrainerLink> link_;
  std::atomic<bool> no_cancel_{false};
};

TEST_F(TrainerLinkTest, ValidateTrainSubmit) {
  const std::string session = Attach();
  Model global = MakeModel(1.0f);
  auto metrics = std::async(std::launch::async,
                            [&] { return link_->Validate(global, 3); });
  v1::TrainerTask task = Next(session);
  ASSERT_EQ(task.kind(), v1::TRAINER_TASK_TRAIN);
  EXPECT_EQ(task.job_id(), "job-1");
  EXPECT_EQ(task.round(), 3u);
  EXPECT_TRUE(task.want_validation());
  ASSERT_EQ(task.tensors_size(), 1);
  EXPECT_EQ(task.tensors(0).name(), "w");
  EXPECT_EQ(task.metric_names(0), "accuracy");
  // The trainer reads the model from the file.
  absl::StatusOr<Model> sent = Model::LoadSafetensors(task.model_path());
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(Element(*sent, 2), 3.0f);

  v1::ValidationRequest validation;
  validation.set_session_id(session);
  validation.set_task_id(task.task_id());
  (*validation.mutable_metrics())["accuracy"] = 0.75;
  ASSERT_TRUE(link_->ReportValidation(validation).ok());
  absl::StatusOr<Metrics> got = metrics.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->at("accuracy"), 0.75);

  auto trained = std::async(
      std::launch::async, [&] { return link_->Train(global, 3, no_cancel_); });
  ASSERT_TRUE(Submit(session, task, MakeModel(10.0f), 16).ok());
  absl::StatusOr<TrainOutput> output = trained.get();
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(output->sample_count, 16u);
  EXPECT_EQ(Element(output->model, 3), 13.0f);
  EXPECT_FALSE(std::filesystem::exists(task.model_path()));
  EXPECT_FALSE(std::filesystem::exists(task.result_path()));
  // Submitting again: the task is finished.
  EXPECT_EQ(Submit(session, task, MakeModel(10.0f)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A job that requires DP: the task says so, a result without its privacy
// cost is refused with the reason, and a reported cost reaches the learner.
TEST_F(TrainerLinkTest, RequiredPrivacyCostIsCheckedAndPassedOn) {
  link_->SetRequireDp(true);
  const std::string session = Attach();
  Model global = MakeModel(1.0f);
  auto refused = std::async(
      std::launch::async, [&] { return link_->Train(global, 1, no_cancel_); });
  v1::TrainerTask task = Next(session);
  EXPECT_TRUE(task.require_dp());
  absl::Status missing = Submit(session, task, MakeModel(2.0f));
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(missing.message()),
              HasSubstr("requires differential privacy"));
  EXPECT_THAT(std::string(refused.get().status().message()),
              HasSubstr("privacy=..."));

  auto trained = std::async(
      std::launch::async, [&] { return link_->Train(global, 2, no_cancel_); });
  task = Next(session);
  ASSERT_TRUE(WriteHandoffFile(MakeModel(3.0f), task.result_path()).ok());
  v1::SubmitResultRequest request;
  request.set_session_id(session);
  request.set_task_id(task.task_id());
  request.set_sample_count(8);
  request.mutable_privacy()->set_sampling_rate(0.01);
  request.mutable_privacy()->set_noise_multiplier(1.1);
  request.mutable_privacy()->set_steps(100);
  ASSERT_TRUE(link_->SubmitResult(request).ok());
  absl::StatusOr<TrainOutput> output = trained.get();
  ASSERT_TRUE(output.ok()) << output.status();
  ASSERT_TRUE(output->privacy.has_value());
  EXPECT_EQ(output->privacy->steps(), 100u);
  EXPECT_EQ(output->privacy->noise_multiplier(), 1.1);
}

TEST_F(TrainerLinkTest, InitialModelFromTheTrainer) {
  const std::string session = Attach();
  auto initial =
      std::async(std::launch::async, [&] { return link_->InitialModel(); });
  v1::TrainerTask task = Next(session);
  ASSERT_EQ(task.kind(), v1::TRAINER_TASK_INITIAL_MODEL);
  EXPECT_TRUE(task.model_path().empty());
  ASSERT_TRUE(Submit(session, task, MakeModel(0.5f, {2, 3})).ok());
  absl::StatusOr<Model> model = initial.get();
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->spec(0).shape, (std::vector<uint64_t>{2, 3}));
}

TEST_F(TrainerLinkTest, WrongVersionAndOtherJobAreRefused) {
  v1::AttachRequest request;
  request.set_protocol_version(7);
  absl::StatusOr<v1::AttachReply> reply = link_->Attach(request);
  ASSERT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reply.status().message(),
              HasSubstr("the trainer speaks version 7, site site-a's daemon "
                        "speaks version 1"));
  request.set_protocol_version(kProtocolVersion);
  request.set_job_id("job-2");
  reply = link_->Attach(request);
  ASSERT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reply.status().message(),
              HasSubstr("serves site site-a's job \"job-1\", not job "
                        "\"job-2\""));
}

TEST_F(TrainerLinkTest, SecondTrainerIsRefusedUntilTheFirstLeaves) {
  const std::string first = Attach("first");
  v1::AttachRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_trainer_name("second");
  absl::StatusOr<v1::AttachReply> reply = link_->Attach(request);
  ASSERT_EQ(reply.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(reply.status().message(),
              HasSubstr("already has a trainer attached: first (pid 1234"));
  v1::DetachRequest detach;
  detach.set_session_id(first);
  ASSERT_TRUE(link_->Detach(detach).ok());
  EXPECT_TRUE(link_->Attach(request).ok());
}

TEST_F(TrainerLinkTest, ExpiredLeaseFailsTheTaskAndItIsNotHandedOutAgain) {
  const std::string session = Attach();
  Model global = MakeModel(1.0f);
  auto trained = std::async(
      std::launch::async, [&] { return link_->Train(global, 1, no_cancel_); });
  v1::TrainerTask task = Next(session);
  ASSERT_EQ(task.kind(), v1::TRAINER_TASK_TRAIN);
  // The trainer goes silent: the lease (2 s) runs out.
  const absl::Time start = absl::Now();
  absl::StatusOr<TrainOutput> output = trained.get();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(output.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(output.status().message(),
              HasSubstr("stopped answering: no call for 2s (its lease) "
                        "during task 1 (round 1)"));
  // The old session is gone; a new trainer does not get the failed task.
  v1::NextTaskRequest next;
  next.set_session_id(session);
  EXPECT_EQ(link_->NextTask(next).status().code(), absl::StatusCode::kNotFound);
  const std::string again = Attach("t2");
  EXPECT_EQ(Next(again, 200).kind(), v1::TRAINER_TASK_NONE);
  EXPECT_EQ(Submit(again, task, MakeModel(1.0f)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(TrainerLinkTest, ProcessExitFailsTheTaskAtOnce) {
  const std::string session = Attach();
  Model global = MakeModel(1.0f);
  auto trained = std::async(
      std::launch::async, [&] { return link_->Train(global, 1, no_cancel_); });
  Next(session);
  link_->TrainerExited(1234, "was killed by signal 9 (Killed)");
  absl::StatusOr<TrainOutput> output = trained.get();
  EXPECT_THAT(output.status().message(),
              HasSubstr("process was killed by signal 9"));
}

TEST_F(TrainerLinkTest, BadResultsAreRefusedNamingTheTensor) {
  struct Case {
    std::string label;
    Model result;
    uint64_t samples;
    std::string want;
  };
  Model nan = MakeModel(1.0f);
  const float bad = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.mutable_tensor_data(0).data() + 8, &bad, 4);
  std::vector<Case> cases;
  cases.push_back({"name", MakeModel(1.0f, {4}, v1::DTYPE_F32, "v"), 1,
                   "tensor \"v\": not in the task's model"});
  cases.push_back({"shape", MakeModel(1.0f, {5}), 1,
                   "tensor \"w\": shape [5], the task's model has [4]"});
  cases.push_back({"dtype", MakeModel(1.0f, {4}, v1::DTYPE_F64), 1,
                   "tensor \"w\": dtype F64, the task's model has F32"});
  cases.push_back(
      {"nan", std::move(nan), 1, "tensor \"w\": element 2 is NaN or infinite"});
  cases.push_back({"samples", MakeModel(1.0f), 0, "sample_count is 0"});
  const std::string session = Attach();
  uint32_t round = 0;
  for (Case& c : cases) {
    SCOPED_TRACE(c.label);
    Model global = MakeModel(1.0f);
    auto trained = std::async(std::launch::async, [&] {
      return link_->Train(global, round, no_cancel_);
    });
    v1::TrainerTask task = Next(session);
    absl::Status submitted = Submit(session, task, c.result, c.samples);
    EXPECT_EQ(submitted.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(submitted.message(), HasSubstr(c.want));
    absl::StatusOr<TrainOutput> output = trained.get();
    EXPECT_EQ(output.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(output.status().message(), HasSubstr(c.want));
    ++round;
  }
}

TEST_F(TrainerLinkTest, TrainerFailureAndCancelAndDeadline) {
  const std::string session = Attach();
  Model global = MakeModel(1.0f);
  {  // The trainer reports that it could not train.
    auto trained = std::async(std::launch::async, [&] {
      return link_->Train(global, 0, no_cancel_);
    });
    v1::TrainerTask task = Next(session);
    v1::SubmitResultRequest request;
    request.set_session_id(session);
    request.set_task_id(task.task_id());
    request.set_failure("out of memory");
    ASSERT_TRUE(link_->SubmitResult(request).ok());
    EXPECT_THAT(trained.get().status().message(),
                HasSubstr("trainer reported a failure: out of memory"));
  }
  {  // The round moves on: the trainer hears of it.
    std::atomic<bool> cancel{false};
    auto trained = std::async(std::launch::async,
                              [&] { return link_->Train(global, 1, cancel); });
    v1::TrainerTask task = Next(session);
    cancel = true;
    EXPECT_EQ(trained.get().status().code(), absl::StatusCode::kCancelled);
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_session_id(session);
    absl::StatusOr<v1::HeartbeatReply> reply = link_->Heartbeat(heartbeat);
    ASSERT_TRUE(reply.ok());
    ASSERT_EQ(reply->cancelled_task_ids_size(), 1);
    EXPECT_EQ(reply->cancelled_task_ids(0), task.task_id());
    absl::Status late = Submit(session, task, MakeModel(1.0f));
    EXPECT_EQ(late.code(), absl::StatusCode::kCancelled);
    EXPECT_THAT(late.message(), HasSubstr("the round moved on"));
  }
  {  // Nothing before the deadline.
    link_.reset();
    options_.task_timeout = absl::Milliseconds(300);
    link_ = std::make_unique<TrainerLink>(options_);
    absl::StatusOr<TrainOutput> output = link_->Train(global, 2, no_cancel_);
    EXPECT_EQ(output.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(output.status().message(),
                HasSubstr("no result from the trainer within 300ms "
                          "(trainer.task_timeout_ms); no trainer is "
                          "attached"));
  }
}

TEST_F(TrainerLinkTest, JobEndEndsTheTrainersLoop) {
  std::atomic<bool> ended{false};
  link_->SetJobView([&] { return JobView{"job-1", ended.load(), ""}; });
  const std::string session = Attach();
  Model global = MakeModel(1.0f);
  auto trained = std::async(
      std::launch::async, [&] { return link_->Train(global, 0, no_cancel_); });
  v1::TrainerTask task = Next(session);
  ASSERT_TRUE(Submit(session, task, MakeModel(2.0f)).ok());
  ASSERT_TRUE(trained.get().ok());
  EXPECT_EQ(Next(session, 10).kind(), v1::TRAINER_TASK_NONE);
  ended = true;
  EXPECT_EQ(Next(session, 10).kind(), v1::TRAINER_TASK_JOB_END);
}

TEST_F(TrainerLinkTest, ShutdownEndsAWait) {
  Model global = MakeModel(1.0f);
  auto trained = std::async(
      std::launch::async, [&] { return link_->Train(global, 0, no_cancel_); });
  absl::SleepFor(absl::Milliseconds(50));
  link_->Shutdown();
  EXPECT_EQ(trained.get().status().code(), absl::StatusCode::kUnavailable);
}

// Status shows "waiting for trainer" while a task has no trainer to take it:
// the listener hears the change both ways.
TEST_F(TrainerLinkTest, WaitingForTrainerUntilOneAttaches) {
  absl::Mutex mu;
  std::vector<std::string> heard;  // WaitingFor() at each call.
  link_->SetWaitingListener([&] {
    std::string now = link_->WaitingFor();
    absl::MutexLock lock(&mu);
    heard.push_back(std::move(now));
  });
  auto heard_at_least = [&](size_t n) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
      return heard.size() >= n;
    };
    mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return heard;
  };
  EXPECT_EQ(link_->WaitingFor(), "");  // No task: nothing to wait for.
  Model global = MakeModel(1.0f);
  auto metrics = std::async(std::launch::async,
                            [&] { return link_->Validate(global, 0); });
  EXPECT_THAT(heard_at_least(1), ElementsAre("waiting for trainer"));
  EXPECT_EQ(link_->WaitingFor(), "waiting for trainer");

  const std::string session = Attach();
  EXPECT_THAT(heard_at_least(2), ElementsAre("waiting for trainer", ""));
  const v1::TrainerTask task = Next(session);
  v1::ValidationRequest validation;
  validation.set_session_id(session);
  validation.set_task_id(task.task_id());
  (*validation.mutable_metrics())["accuracy"] = 0.5;
  ASSERT_TRUE(link_->ReportValidation(validation).ok());
  EXPECT_TRUE(metrics.get().ok());
  EXPECT_EQ(link_->WaitingFor(), "");
  link_->SetWaitingListener(nullptr);
}

}  // namespace
}  // namespace swarm::trainerlink
