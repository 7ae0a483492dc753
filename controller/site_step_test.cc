// One site alone, step by step (design section 3): the test is every other
// site. It feeds the site's calls in (learn tasks, permission requests,
// results), answers the site's outgoing calls from a script, moves virtual
// time, and asserts on the calls the site made, in order.
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "controller/job_view.h"
#include "controller/model_receiver.h"
#include "controller/model_store.h"
#include "controller/peer_transport.h"
#include "controller/replies.h"
#include "controller/swarm_controller.h"
#include "controller/task_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/test_learner.h"
#include "streaming/chunker.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "step";

// One outgoing call of the site under test.
struct Sent {
  std::string kind;  // "learn_task", "ask", "result", "share_best", "final"
  std::string to;
  v1::ModelHeader header;  // Model streams.
  v1::SubmitPermissionRequest ask;
  std::shared_ptr<const Model> model;

  std::string Brief() const { return absl::StrCat(kind, "->", to); }
};

// Records every call and answers from a script (OK by default).
class ScriptedTransport final : public PeerTransport {
 public:
  absl::StatusOr<v1::Reply> SendLearnTask(const v1::SiteInfo& to,
                                          const v1::ModelHeader& header,
                                          std::shared_ptr<const Model> model,
                                          absl::Duration) override {
    Record("learn_task", to, header, model);
    return NextReply(to.name());
  }
  absl::StatusOr<v1::SubmitPermissionReply> RequestToSubmit(
      const v1::SiteInfo& to, const v1::SubmitPermissionRequest& request,
      absl::Duration) override {
    Sent sent;
    sent.kind = "ask";
    sent.to = to.name();
    sent.ask = request;
    sent_.push_back(sent);
    if (!permissions_.empty()) {
      v1::SubmitPermissionReply reply = permissions_.front();
      permissions_.pop_front();
      return reply;
    }
    v1::SubmitPermissionReply granted;
    granted.set_outcome(v1::OUTCOME_OK);
    return granted;
  }
  absl::StatusOr<v1::Reply> SubmitResult(
      const v1::SiteInfo& to, const v1::ModelHeader& header,
      std::shared_ptr<const Model> model) override {
    Record("result", to, header, model);
    return NextReply(to.name());
  }
  absl::StatusOr<v1::Reply> ShareBest(const v1::SiteInfo& to,
                                      const v1::ShareBestRequest&,
                                      absl::Duration) override {
    Record("share_best", to, v1::ModelHeader(), nullptr);
    return NextReply(to.name());
  }
  absl::StatusOr<v1::Reply> SendFinalResult(const v1::SiteInfo& to,
                                            const v1::ModelHeader& header,
                                            std::shared_ptr<const Model> model,
                                            absl::Duration) override {
    Record(header.kind() == v1::MODEL_KIND_BEST ? "best" : "last", to, header,
           model);
    return NextReply(to.name());
  }

  // The next call to `site` fails with `status` (every later one succeeds).
  void FailNext(const std::string& site, absl::Status status) {
    failures_.push_back({site, std::move(status)});
  }
  void AnswerNextAsk(v1::Outcome outcome, uint64_t retry_after_ms = 0) {
    v1::SubmitPermissionReply reply;
    reply.set_outcome(outcome);
    reply.set_retry_after_ms(retry_after_ms);
    permissions_.push_back(reply);
  }
  // The calls made since the last Take().
  std::vector<Sent> Take() {
    std::vector<Sent> sent = std::move(sent_);
    sent_.clear();
    return sent;
  }

 private:
  void Record(std::string kind, const v1::SiteInfo& to,
              const v1::ModelHeader& header,
              std::shared_ptr<const Model> model) {
    Sent sent;
    sent.kind = std::move(kind);
    sent.to = to.name();
    sent.header = header;
    sent.model = std::move(model);
    sent_.push_back(std::move(sent));
  }
  absl::StatusOr<v1::Reply> NextReply(const std::string& site) {
    for (auto it = failures_.begin(); it != failures_.end(); ++it) {
      if (it->first == site) {
        absl::Status status = it->second;
        failures_.erase(it);
        return status;
      }
    }
    return OkReply("ok");
  }

  std::vector<Sent> sent_;
  std::deque<std::pair<std::string, absl::Status>> failures_;
  std::deque<v1::SubmitPermissionReply> permissions_;
};

std::vector<std::string> Briefs(const std::vector<Sent>& sent) {
  std::vector<std::string> briefs;
  for (const Sent& s : sent) briefs.push_back(s.Brief());
  return briefs;
}

// Sites a, b, c, d; trainers a, b, c; d the only aggregator candidate (so
// each test knows who aggregates); 2 rounds.
v1::JobConfig Job() {
  v1::JobConfig job;
  job.set_job_id(kJob);
  int port = 7100;
  for (const char* name : {"a", "b", "c", "d"}) {
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
    site->set_address(absl::StrCat("127.0.0.1:", ++port));
  }
  for (const char* name : {"a", "b", "c"}) job.add_trainers(name);
  job.add_aggregator_candidates("d");
  job.set_keep_round_models(true);
  job.set_starting_site("a");
  job.set_num_rounds(2);
  job.set_seed(5);
  job.set_max_concurrent_submissions(1);
  job.set_round_timeout_ms(60'000);
  job.set_wait_after_min_responses_ms(10'000);
  job.set_request_to_submit_interval_ms(100);
  job.set_request_to_submit_max_wait_ms(30'000);
  job.set_final_result_ack_timeout_ms(10'000);
  return WithDefaults(job);
}

class SiteStepTest : public ::testing::Test {
 protected:
  SiteStepTest() : view_(Job()) { SetMinLogSeverity(LogSeverity::kError); }

  // Makes the site called `self` and configures it with the job.
  void MakeSite(const std::string& self) {
    TestLearnerOptions options;
    options.site = self;
    options.size = 8;
    options.init_scale = 1.0f;
    options.delta = 1.0f;
    options.sample_count = 2;
    options.metrics = {{0, 0.5}, {1, 0.75}};
    absl::StatusOr<std::unique_ptr<TestLearner>> learner =
        TestLearner::Create(options);
    ASSERT_TRUE(learner.ok()) << learner.status();
    learner_ = std::move(*learner);
    ControllerOptions controller_options;
    controller_options.site = self;
    controller_options.jitter_seed = 1;
    controller_options.retry.attempts = 2;
    site_ = std::make_unique<SwarmController>(
        controller_options, &transport_, learner_.get(), &store_, &runner_);
    v1::ConfigureRequest configure;
    *configure.mutable_job() = view_.config();
    ASSERT_EQ(site_->Configure(configure).outcome(), v1::OUTCOME_OK);
  }

  // Makes the aggregator of `round` (a non-trainer) and opens `round` there
  // with two expected trainers, which it returns.
  std::vector<std::string> OpenRoundHere(uint32_t round) {
    const std::string self = view_.AggregatorOf(round);
    MakeSite(self);
    std::vector<std::string> trainers;
    for (const std::string& name : view_.trainers()) {
      if (name != self) trainers.push_back(name);
    }
    EXPECT_GE(trainers.size(), 2u);
    trainers.resize(2);
    EXPECT_TRUE(Stream(LearnTask(round, trainers), GlobalModel()).ok());
    RunDue();
    transport_.Take();
    return trainers;
  }

  // Runs what is due now (not the timers of later times).
  void RunDue() { runner_.AdvanceTo(runner_.Now()); }

  // A round's global model as the test learner starts it.
  std::shared_ptr<const Model> GlobalModel() {
    absl::StatusOr<Model> model = learner_->InitialModel();
    EXPECT_TRUE(model.ok()) << model.status();
    return std::make_shared<const Model>(std::move(*model));
  }

  // A stream into the site, as its gRPC service or the fake network feeds
  // it. Returns the refusal or the site's reply.
  absl::StatusOr<v1::Reply> Stream(const v1::ModelHeader& header,
                                   std::shared_ptr<const Model> model) {
    if (model == nullptr) model = std::make_shared<const Model>();
    absl::StatusOr<std::unique_ptr<Chunker>> chunker =
        Chunker::Create(model, header, kMinChunkSize);
    if (!chunker.ok()) return chunker.status();
    ModelReceiver receiver(site_.get());
    absl::Status admitted = receiver.Begin((*chunker)->header(), 64);
    if (!admitted.ok()) return admitted;
    if (receiver.answered()) return receiver.reply();
    return receiver.Receive([&](Assembler* assembler) {
      absl::Status fed;
      while (fed.ok()) {
        std::optional<ChunkRef> chunk = (*chunker)->NextChunk();
        if (!chunk.has_value()) {
          fed = assembler->OnTrailer((*chunker)->Trailer());
          break;
        }
        fed =
            assembler->OnChunk(chunk->tensor_index, chunk->offset, chunk->data);
      }
      return assembler->Finish();
    });
  }

  v1::ModelHeader LearnTask(uint32_t round,
                            std::vector<std::string> expected = {}) {
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_LEARN_TASK);
    header.set_job_id(kJob);
    header.set_round(round);
    header.set_sender(view_.ScattererOf(round));
    header.set_aggregator(view_.AggregatorOf(round));
    for (const std::string& name : expected) header.add_expected_trainers(name);
    return header;
  }

  v1::ModelHeader Result(const std::string& trainer, uint32_t round) {
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_RESULT);
    header.set_job_id(kJob);
    header.set_round(round);
    header.set_sender(trainer);
    header.set_aggregator(view_.AggregatorOf(round));
    header.set_sample_count(1);
    (*header.mutable_metrics())["accuracy"] = 0.5;
    return header;
  }

  v1::SubmitPermissionReply Ask(const std::string& trainer, uint32_t round) {
    v1::SubmitPermissionRequest request;
    request.set_job_id(kJob);
    request.set_sender(trainer);
    request.set_round(round);
    return site_->RequestToSubmit(request);
  }

  // A site that trains and is not `not_this`.
  std::string TrainerOtherThan(const std::string& not_this) {
    for (const std::string& name : view_.trainers()) {
      if (name != not_this) return name;
    }
    return "";
  }

  const JobView view_;
  ManualRunner runner_{absl::FromUnixSeconds(1'000'000)};
  ScriptedTransport transport_;
  MemoryModelStore store_;
  std::unique_ptr<TestLearner> learner_;
  std::unique_ptr<SwarmController> site_;
};

TEST_F(SiteStepTest, ScatterSendsTrainersFirstThenTheAggregatorWithTheAcks) {
  MakeSite("a");
  const std::string aggregator = view_.AggregatorOf(0);
  // One trainer (not a, not the aggregator) refuses its learn task.
  std::string refusing;
  for (const std::string& name : view_.trainers()) {
    if (name != "a" && name != aggregator) refusing = name;
  }
  ASSERT_FALSE(refusing.empty());
  transport_.FailNext(refusing, absl::PermissionDeniedError("no"));
  v1::StartRequest start;
  start.set_job_id(kJob);
  ASSERT_EQ(site_->Start(start).outcome(), v1::OUTCOME_OK);
  runner_.RunUntilIdle(200);

  std::vector<Sent> sent = transport_.Take();
  // Learn tasks to the other trainers (a accepts its own locally), then one
  // to the aggregator naming the trainers that acknowledged.
  std::vector<std::string> tasks;
  const Sent* to_aggregator = nullptr;
  for (const Sent& s : sent) {
    if (s.kind != "learn_task") continue;
    tasks.push_back(s.to);
    if (s.to == aggregator) to_aggregator = &s;
  }
  ASSERT_EQ(aggregator, "d");
  {
    ASSERT_NE(to_aggregator, nullptr) << ::testing::PrintToString(Briefs(sent));
    EXPECT_EQ(tasks.back(), aggregator) << "the aggregator's task goes last";
    std::vector<std::string> expected(
        to_aggregator->header.expected_trainers().begin(),
        to_aggregator->header.expected_trainers().end());
    EXPECT_THAT(expected, ::testing::Not(::testing::Contains(refusing)));
    EXPECT_THAT(expected, ::testing::Contains("a"));
    EXPECT_EQ(to_aggregator->header.round(), 0u);
    EXPECT_EQ(to_aggregator->header.sender(), "a");
  }
  EXPECT_THAT(
      site_->Status().status().last_error(),
      HasSubstr(absl::StrCat("learn task to ", refusing, " not acknowledged")));
}

TEST_F(SiteStepTest, LearnTaskForAFinishedRoundIsRefusedWithNoEffects) {
  const std::string self = TrainerOtherThan(view_.AggregatorOf(1));
  MakeSite(self);
  ASSERT_TRUE(Stream(LearnTask(1), GlobalModel()).ok());
  RunDue();
  transport_.Take();
  const v1::StatusReply before = site_->Status();
  absl::StatusOr<v1::Reply> old = Stream(LearnTask(0), GlobalModel());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(),
              HasSubstr("already has the learn task of round 1"));
  RunDue();
  EXPECT_TRUE(transport_.Take().empty());
  EXPECT_EQ(site_->Status().status().round(), before.status().round());
}

TEST_F(SiteStepTest, TrainerAsksUntilGrantedThenSubmits) {
  const std::string aggregator = view_.AggregatorOf(0);
  const std::string self = TrainerOtherThan(aggregator);
  MakeSite(self);
  transport_.AnswerNextAsk(v1::OUTCOME_RETRY, /*retry_after_ms=*/250);
  ASSERT_TRUE(Stream(LearnTask(0), GlobalModel()).ok());
  runner_.RunUntilIdle(1);  // Training runs.
  runner_.AdvanceTo(runner_.Now());
  std::vector<Sent> first = transport_.Take();
  ASSERT_THAT(Briefs(first), ElementsAre("ask->" + aggregator));
  EXPECT_EQ(first[0].ask.round(), 0u);
  EXPECT_EQ(site_->Status().status().state(),
            v1::SITE_STATE_WAITING_FOR_PERMISSION);
  // Nothing more until the retry_after the aggregator gave.
  runner_.AdvanceTo(runner_.Now() + absl::Milliseconds(249));
  EXPECT_TRUE(transport_.Take().empty());
  runner_.AdvanceTo(runner_.Now() + absl::Milliseconds(1));
  std::vector<Sent> second = transport_.Take();
  ASSERT_THAT(Briefs(second),
              ElementsAre("ask->" + aggregator, "result->" + aggregator));
  const v1::ModelHeader& result = second[1].header;
  EXPECT_EQ(result.kind(), v1::MODEL_KIND_RESULT);
  EXPECT_EQ(result.round(), 0u);
  EXPECT_EQ(result.sample_count(), 2u);
  EXPECT_DOUBLE_EQ(result.metrics().at("accuracy"), 0.5);
  EXPECT_EQ(site_->Status().status().counters().rounds_trained(), 1u);
}

TEST_F(SiteStepTest, HeldPermissionIsGrantedTheMomentASlotFrees) {
  // The site aggregates round 0 and does not train it; two trainers.
  const std::vector<std::string> trainers = OpenRoundHere(0);
  if (HasFatalFailure()) return;

  ASSERT_EQ(Ask(trainers[0], 0).outcome(), v1::OUTCOME_OK)
      << Ask(trainers[0], 0).ShortDebugString();
  const uint64_t version = site_->permission_version();
  EXPECT_EQ(Ask(trainers[1], 0).outcome(), v1::OUTCOME_RETRY);
  bool woken = false;
  site_->WhenPermissionChanges(version, runner_.Now() + absl::Seconds(30),
                               [&] { woken = true; });
  RunDue();
  EXPECT_FALSE(woken) << "nothing changed yet";
  // trainers[0]'s result completes: its slot frees, the held request wakes
  // and is granted.
  ASSERT_TRUE(Stream(Result(trainers[0], 0), GlobalModel()).ok());
  runner_.AdvanceTo(runner_.Now());
  EXPECT_TRUE(woken);
  EXPECT_EQ(Ask(trainers[1], 0).outcome(), v1::OUTCOME_OK);
}

TEST_F(SiteStepTest, LastExpectedResultAggregatesPersistsAndScattersNext) {
  const std::string self = view_.AggregatorOf(0);
  const std::vector<std::string> trainers = OpenRoundHere(0);
  if (HasFatalFailure()) return;
  for (const std::string& trainer : trainers) {
    ASSERT_EQ(Ask(trainer, 0).outcome(), v1::OUTCOME_OK);
    absl::StatusOr<v1::Reply> reply = Stream(Result(trainer, 0), GlobalModel());
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->outcome(), v1::OUTCOME_OK) << reply->message();
  }
  RunDue();
  // The round's aggregate is persisted as round 1's global model ...
  EXPECT_TRUE(store_.LoadRound(kJob, 1).ok());
  const v1::SiteStatus status = site_->Status().status();
  EXPECT_EQ(status.counters().rounds_completed(), 1u);
  EXPECT_EQ(status.counters().results_accepted(), 2u);
  EXPECT_EQ(status.counters().max_submissions_in_flight(), 1u);
  EXPECT_EQ(status.counters().submissions_in_flight(), 0u);
  // ... and round 1's learn tasks go out, the elected aggregator's last.
  std::vector<Sent> sent = transport_.Take();
  std::vector<std::string> round_one;
  for (const Sent& s : sent) {
    if (s.kind == "learn_task" && s.header.round() == 1) {
      round_one.push_back(s.to);
    }
  }
  // d aggregates round 1 as well (it takes its own task locally): every
  // trainer gets one.
  EXPECT_THAT(round_one, ::testing::UnorderedElementsAre("a", "b", "c"))
      << ::testing::PrintToString(Briefs(sent));
}

TEST_F(SiteStepTest, RoundTimeoutClosesWithoutTheMissingTrainer) {
  const std::string self = view_.AggregatorOf(0);
  const std::vector<std::string> trainers = OpenRoundHere(0);
  if (HasFatalFailure()) return;
  ASSERT_EQ(Ask(trainers[0], 0).outcome(), v1::OUTCOME_OK)
      << Ask(trainers[0], 0).ShortDebugString();
  ASSERT_TRUE(Stream(Result(trainers[0], 0), GlobalModel()).ok());
  // The grace wait after the minimum (all) never starts; the timeout closes.
  runner_.AdvanceTo(runner_.Now() + absl::Seconds(59));
  EXPECT_EQ(site_->Status().status().counters().rounds_completed(), 0u);
  runner_.AdvanceTo(runner_.Now() + absl::Seconds(1));
  RunDue();
  const v1::SiteStatus status = site_->Status().status();
  EXPECT_EQ(status.counters().rounds_completed(), 1u);
  EXPECT_THAT(status.last_error(),
              HasSubstr(absl::StrCat("no result from ", trainers[1])));
  EXPECT_TRUE(store_.LoadRound(kJob, 1).ok());
}

TEST_F(SiteStepTest, LastAggregatorSendsLastBeforeBest) {
  // The site aggregates the last round, and its input scores best: it holds
  // the best model, and distributes LAST to every site before BEST.
  const std::string self = view_.AggregatorOf(1);
  const std::vector<std::string> trainers = OpenRoundHere(1);
  if (HasFatalFailure()) return;
  for (const std::string& trainer : trainers) {
    ASSERT_EQ(Ask(trainer, 1).outcome(), v1::OUTCOME_OK);
    ASSERT_TRUE(Stream(Result(trainer, 1), GlobalModel()).ok());
  }
  RunDue();
  std::vector<std::string> finals;
  for (const Sent& s : transport_.Take()) {
    if (s.kind == "last" || s.kind == "best") finals.push_back(s.kind);
  }
  // Three other sites: three LASTs, then three BESTs.
  EXPECT_THAT(finals,
              ElementsAre("last", "last", "last", "best", "best", "best"));
  const v1::SiteStatus status = site_->Status().status();
  EXPECT_EQ(status.state(), v1::SITE_STATE_DONE);
  EXPECT_EQ(status.best().site(), self);
  EXPECT_TRUE(store_.LoadFinal(kJob, v1::MODEL_KIND_BEST).ok());
  EXPECT_TRUE(store_.LoadFinal(kJob, v1::MODEL_KIND_LAST).ok());
}

}  // namespace
}  // namespace swarm
