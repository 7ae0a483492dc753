// Bad input (issue 4, "Bad input" and "Done when", item 3), with real
// processes:
// - `swarmctl start` refuses a bad job config with exit code 2 and a message
//   naming the field and the rule, before touching any site: the running
//   sites stay idle, with no job.
// - A site refuses, with a reply or status saying why: a call for another
//   job, a second job while one runs, a learn task for a round it has already
//   finished (a repeat of its current task is acknowledged, not redone), a
//   start without a configuration.
// One test also checks that a trainer streams its result in the job's
// chunk_size (a job parameter only visible on the wire).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/substitute.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "controller/task_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "proto/swarm.grpc.pb.h"
#include "rpc/peer_client.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Asserts that an absl::Status expression is OK, printing it if not.
#define ASSERT_OK_STATUS(expr)                        \
  do {                                                \
    const absl::Status assert_status = (expr);        \
    ASSERT_TRUE(assert_status.ok()) << assert_status; \
  } while (false)

// The site is idle with no job: nobody configured it.
void ExpectUntouched(LocalSwarm& swarm, const std::string& site) {
  absl::StatusOr<v1::StatusReply> reply = swarm.Status(site);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status().state(), v1::SITE_STATE_IDLE) << site;
  EXPECT_EQ(reply->status().job_id(), "") << site;
}

// ---------------------------------------------------------------------------
// swarmctl start with a bad job config

struct BadJob {
  const char* name;
  // JSON with $0 and $1 for the addresses of the two running sites, or an
  // explicit path when `path` is set.
  const char* json;
  const char* path;
  // Every one must appear in swarmctl's stderr.
  std::vector<std::string> messages;
};

class BadJobConfigTest : public ::testing::TestWithParam<BadJob> {};

TEST_P(BadJobConfigTest, SwarmctlStartRefusesBeforeTouchingAnySite) {
  const BadJob& bad = GetParam();
  LocalSwarm swarm(absl::StrCat("bad-job-", bad.name));
  ASSERT_OK_STATUS(swarm.StartSite("site-a", {}));
  ASSERT_OK_STATUS(swarm.StartSite("site-b", {}));
  const std::string path =
      bad.path != nullptr
          ? std::string(bad.path)
          : swarm.WriteFile(
                "job.json",
                absl::Substitute(bad.json, swarm.site("site-a").address,
                                 swarm.site("site-b").address));

  CommandResult start = swarm.Swarmctl({"start", "--job", path});

  EXPECT_EQ(start.code(), 2) << start.ToString();
  EXPECT_THAT(start.out, IsEmpty()) << "swarmctl talked to a site";
  for (const std::string& message : bad.messages) {
    EXPECT_THAT(start.err, HasSubstr(message));
  }
  ExpectUntouched(swarm, "site-a");
  ExpectUntouched(swarm, "site-b");
  absl::Status stopped = swarm.StopAll(absl::Seconds(10));
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// A valid two-site job, to show which part each case breaks:
//   {"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
//                             {"name": "site-b", "address": "$1"}],
//    "num_rounds": 2}
const BadJob kBadJobs[] = {
    {"UnknownTrainer",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 2, "trainers": ["site-a", "site-x"]})",
     nullptr,
     {"trainers[1]: \"site-x\" is not a site of the job"}},
    {"UnknownCandidate",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 2, "aggregator_candidates": ["site-y"]})",
     nullptr,
     {"aggregator_candidates[0]: \"site-y\" is not a site of the job"}},
    {"DuplicateSiteNames",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-a", "address": "$1"}],
         "num_rounds": 2})",
     nullptr,
     {"sites[1].name: \"site-a\" is used twice (also sites[0])"}},
    {"DuplicateAddresses",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$0"}],
         "num_rounds": 2})",
     nullptr,
     {"sites[1].address: ", "is used twice (also sites[0])"}},
    // No trainer and no candidate. In proto3 JSON an empty list is the same
    // as an absent one, and an absent trainers / aggregator_candidates list
    // means "every site" (the documented default), so `"trainers": []` with
    // sites is a valid job. The only way to have no trainer or no candidate
    // is a job with no site at all; all three rules must be reported.
    {"NoSiteSoNoTrainerAndNoCandidate",
     R"({"job_id": "j", "sites": [], "trainers": [],
         "aggregator_candidates": [], "num_rounds": 2})",
     nullptr,
     {"sites: at least one site is required",
      "trainers: at least one trainer is required",
      "aggregator_candidates: at least one candidate is required"}},
    {"ZeroRounds",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 0})",
     nullptr,
     {"num_rounds: rounds must be at least 1"}},
    {"MissingRounds",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}]})",
     nullptr,
     {"num_rounds: rounds must be at least 1"}},
    {"NegativeRounds",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": -3})",
     nullptr,
     {"num_rounds: invalid value -3"}},
    {"MinResponsesAboveTrainers",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 2, "trainers": ["site-b"],
         "min_responses_required": 2})",
     nullptr,
     {"min_responses_required: 2 is more than the number of trainers (1)"}},
    {"NegativeTime",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 2, "round_timeout_ms": -5})",
     nullptr,
     {"round_timeout_ms: invalid value -5",
      "durations are unsigned integer milliseconds"}},
    {"NegativeTimeAsString",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 2, "wait_after_min_responses_ms": "-1"})",
     nullptr,
     {"wait_after_min_responses_ms: invalid value \"-1\""}},
    {"TimeBeyondThirtyDays",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 2, "learn_task_ack_timeout_ms": 2592000001})",
     nullptr,
     {"learn_task_ack_timeout_ms: 2592000001 ms is more than 30 days"}},
    {"MissingFile",
     nullptr,
     "/nonexistent/swarm/job.json",
     {"job config /nonexistent/swarm/job.json: cannot open: No such file or "
      "directory"}},
    {"DirectoryInsteadOfFile",
     nullptr,
     "/",
     {"job config /: cannot read: Is a directory"}},
    {"UnknownField",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0"},
                                  {"name": "site-b", "address": "$1"}],
         "num_rounds": 2, "num_round": 3})",
     nullptr,
     {"unknown field \"num_round\""}},
    {"UnknownSiteField",
     R"({"job_id": "j", "sites": [{"name": "site-a", "address": "$0",
                                   "port": 7}],
         "num_rounds": 2})",
     nullptr,
     {"unknown field \"sites[0].port\""}},
    {"MalformedJson",
     R"({"job_id": "j", "sites": [)",
     nullptr,
     {"malformed JSON"}},
};

INSTANTIATE_TEST_SUITE_P(Integration, BadJobConfigTest,
                         ::testing::ValuesIn(kBadJobs),
                         [](const ::testing::TestParamInfo<BadJob>& info) {
                           return std::string(info.param.name);
                         });

// ---------------------------------------------------------------------------
// Sites refusing calls

v1::JobConfig TwoSiteJob(const std::string& job_id, const v1::SiteInfo& a,
                         const v1::SiteInfo& b) {
  v1::JobConfig job;
  job.set_job_id(job_id);
  *job.add_sites() = a;
  *job.add_sites() = b;
  job.set_num_rounds(3);
  job.set_wait_after_min_responses_ms(2000);
  job.set_round_timeout_ms(60000);
  job.set_request_to_submit_interval_ms(100);
  job.set_learn_task_ack_timeout_ms(10000);
  job.set_final_result_ack_timeout_ms(10000);
  return job;
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(10) * TimeScale()));
}

v1::Reply Configure(LocalSwarm& swarm, const std::string& site,
                    const v1::JobConfig& job) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ConfigureRequest request;
  request.set_sender("admin");
  *request.mutable_job() = job;
  v1::Reply reply;
  grpc::Status status = swarm.Stub(site).Configure(&context, request, &reply);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return reply;
}

// Waits until `site` reports `state` for its job (long-polling Status).
absl::Status WaitForState(LocalSwarm& swarm, const std::string& site,
                          v1::SiteState state, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout * TimeScale();
  uint64_t version = 0;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::StatusReply> reply =
        swarm.Status(site, "", 1000, version);
    if (!reply.ok()) return reply.status();
    if (reply->status().state() == state) return absl::OkStatus();
    version = reply->version();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "site ", site, " never reached ", v1::SiteState_Name(state)));
}

TEST(SiteRefusalTest, StartWithoutConfiguration) {
  LocalSwarm swarm("start-without-configuration");
  ASSERT_OK_STATUS(swarm.StartSite("site-a", {}));

  grpc::ClientContext context;
  SetDeadline(&context);
  v1::StartRequest request;
  request.set_sender("admin");
  request.set_job_id("some-job");
  v1::Reply reply;
  grpc::Status status = swarm.Stub("site-a").Start(&context, request, &reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.outcome(), v1::OUTCOME_REJECTED);
  EXPECT_THAT(reply.message(), HasSubstr("site site-a has no job configured"));
  ExpectUntouched(swarm, "site-a");

  absl::Status stopped = swarm.StopAll(absl::Seconds(10));
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// A stand-in aggregator in the test process: it grants every request to
// submit and records the frames of every submitted result.
class FakeAggregator final : public v1::Peer::Service {
 public:
  struct Submission {
    v1::ModelHeader header;
    std::vector<uint64_t> chunk_sizes;
    bool trailer = false;
  };

  grpc::Status RequestToSubmit(grpc::ServerContext*,
                               const v1::SubmitPermissionRequest* request,
                               v1::SubmitPermissionReply* reply) override {
    reply->set_outcome(v1::OUTCOME_OK);
    reply->set_message("granted by the fake aggregator");
    return grpc::Status::OK;
  }

  grpc::Status SubmitResult(grpc::ServerContext*,
                            grpc::ServerReader<v1::ModelFrame>* reader,
                            v1::Reply* reply) override {
    Submission submission;
    v1::ModelFrame frame;
    while (reader->Read(&frame)) {
      if (frame.has_header()) submission.header = frame.header();
      if (frame.has_chunk()) {
        submission.chunk_sizes.push_back(frame.chunk().data().size());
      }
      if (frame.has_trailer()) submission.trailer = true;
    }
    reply->set_outcome(v1::OUTCOME_OK);
    reply->set_message("stored by the fake aggregator");
    absl::MutexLock lock(&mu_);
    submissions_.push_back(std::move(submission));
    return grpc::Status::OK;
  }

  // Waits until `count` results arrived; a copy of them.
  std::vector<Submission> WaitForSubmissions(size_t count,
                                             absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return submissions_.size() >= count;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return submissions_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Submission> submissions_ ABSL_GUARDED_BY(mu_);
};

// One real site ("site-a", a trainer) in a job with the fake aggregator
// ("fake-aggr", the only candidate), configured directly over gRPC.
class FakeAggregatorTest : public ::testing::Test {
 protected:
  static constexpr char kJob[] = "job-a";
  static constexpr uint64_t kChunkSize = 4096;
  static constexpr uint64_t kElements = 4096;  // 16 KiB: four chunks.

  void SetUp() override {
    swarm_ = std::make_unique<LocalSwarm>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    const security::TlsIdentity& fake_identity =
        swarm_->Identity("fake-aggr", security::kSiteRole);
    channels_ = std::make_unique<PeerChannels>(
        security::ClientCredentials(fake_identity));
    runner_ = std::make_unique<ThreadPoolRunner>(2);
    transport_ =
        std::make_unique<GrpcPeerTransport>(channels_.get(), runner_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort(
        "127.0.0.1:0", security::ServerCredentials(fake_identity), &fake_port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(fake_port_, 0);
    fake_info_.set_name("fake-aggr");
    fake_info_.set_address(absl::StrCat("127.0.0.1:", fake_port_));
    ASSERT_OK_STATUS(swarm_->StartSite("site-a", {{"delta", "0.5"}}));
    job_ = TwoSiteJob(kJob, swarm_->Info("site-a"), fake_info_);
    job_.add_trainers("site-a");
    job_.add_aggregator_candidates("fake-aggr");
    job_.set_chunk_size(kChunkSize);
    // The fake aggregator scatters every round: it starts the job and is
    // the only candidate (sites check who may send a learn task).
    job_.set_starting_site("fake-aggr");
    job_.set_num_rounds(10);
    v1::Reply reply = Configure(*swarm_, "site-a", job_);
    ASSERT_EQ(reply.outcome(), v1::OUTCOME_OK) << reply.message();
  }

  void TearDown() override {
    if (swarm_ != nullptr) {
      absl::Status stopped = swarm_->StopAll(absl::Seconds(10));
      EXPECT_TRUE(stopped.ok()) << stopped;
    }
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(1));
    }
  }

  // Sends site-a the learn task of `round` as if from the fake aggregator.
  absl::StatusOr<v1::Reply> SendLearnTask(
      uint32_t round, const std::string& job_id = kJob,
      const std::string& aggregator = "fake-aggr") {
    absl::StatusOr<TensorSpec> spec =
        MakeTensorSpec("weight", v1::DTYPE_F32, {kElements});
    if (!spec.ok()) return spec.status();
    absl::StatusOr<Model> model = Model::Create({*spec});
    if (!model.ok()) return model.status();
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_LEARN_TASK);
    header.set_job_id(job_id);
    header.set_round(round);
    header.set_sender("fake-aggr");
    header.set_aggregator(aggregator);
    header.add_expected_trainers("site-a");
    PeerMessage message;
    message.kind = CallKind::kLearnTask;
    message.header = header;
    message.model = std::make_shared<const Model>(std::move(*model));
    message.timeout = absl::Seconds(30);
    absl::Notification sent;
    absl::StatusOr<PeerReply> reply;
    transport_->Send(swarm_->Info("site-a"), std::move(message),
                     [&](absl::StatusOr<PeerReply> answer) {
                       reply = std::move(answer);
                       sent.Notify();
                     });
    if (!sent.WaitForNotificationWithTimeout(absl::Seconds(60))) {
      return absl::DeadlineExceededError("no reply to the learn task");
    }
    if (!reply.ok()) return reply.status();
    return reply->reply;
  }

  FakeAggregator fake_;
  int fake_port_ = 0;
  v1::SiteInfo fake_info_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<LocalSwarm> swarm_;
  v1::JobConfig job_;
  std::unique_ptr<PeerChannels> channels_;
  std::unique_ptr<ThreadPoolRunner> runner_;
  std::unique_ptr<GrpcPeerTransport> transport_;
};

TEST_F(FakeAggregatorTest, RefusesEveryCallForAnotherJob) {
  const std::string other = "job-b";
  const std::string why = "runs job \"job-a\", not \"job-b\"";
  v1::Peer::Stub& stub = swarm_->Stub("site-a");
  // Peer calls come with the fake aggregator's own certificate.
  std::unique_ptr<v1::Peer::Stub> peer =
      swarm_->StubAs("site-a", "fake-aggr", security::kSiteRole);
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::StartRequest request;
    request.set_sender("admin");
    request.set_job_id(other);
    v1::Reply reply;
    ASSERT_TRUE(stub.Start(&context, request, &reply).ok());
    EXPECT_EQ(reply.outcome(), v1::OUTCOME_REJECTED);
    EXPECT_THAT(reply.message(), HasSubstr(why));
  }
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::AbortRequest request;
    request.set_sender("admin");
    request.set_job_id(other);
    v1::Reply reply;
    ASSERT_TRUE(stub.Abort(&context, request, &reply).ok());
    EXPECT_EQ(reply.outcome(), v1::OUTCOME_REJECTED);
    EXPECT_THAT(reply.message(), HasSubstr(why));
  }
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::SubmitPermissionRequest request;
    request.set_job_id(other);
    request.set_sender("fake-aggr");
    v1::SubmitPermissionReply reply;
    ASSERT_TRUE(peer->RequestToSubmit(&context, request, &reply).ok());
    EXPECT_EQ(reply.outcome(), v1::OUTCOME_REJECTED);
    EXPECT_THAT(reply.message(), HasSubstr(why));
  }
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::ShareBestRequest request;
    request.set_job_id(other);
    request.set_sender("fake-aggr");
    v1::Reply reply;
    ASSERT_TRUE(peer->ShareBest(&context, request, &reply).ok());
    EXPECT_EQ(reply.outcome(), v1::OUTCOME_REJECTED);
    EXPECT_THAT(reply.message(), HasSubstr(why));
  }
  {
    absl::StatusOr<v1::StatusReply> reply = swarm_->Status("site-a", other);
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(reply.status().message(), HasSubstr(why));
  }
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::FetchModelRequest request;
    request.set_sender("admin");
    request.set_job_id(other);
    request.set_which(v1::MODEL_SELECTOR_LAST);
    std::unique_ptr<grpc::ClientReader<v1::ModelFrame>> reader =
        stub.FetchModel(&context, request);
    v1::ModelFrame frame;
    EXPECT_FALSE(reader->Read(&frame));
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr(why));
  }
  {
    absl::StatusOr<v1::Reply> reply = SendLearnTask(0, other);
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(reply.status().message(), HasSubstr(why));
  }
  // Nothing changed: still configured for job-a, not started.
  absl::StatusOr<v1::StatusReply> status = swarm_->Status("site-a", kJob);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->status().state(), v1::SITE_STATE_CONFIGURED);
  EXPECT_EQ(status->status().job_id(), kJob);
  EXPECT_TRUE(fake_.WaitForSubmissions(1, absl::ZeroDuration()).empty());
}

TEST_F(FakeAggregatorTest, RefusesALearnTaskForARoundItAlreadyHad) {
  absl::StatusOr<v1::Reply> first = SendLearnTask(3);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->outcome(), v1::OUTCOME_OK) << first->message();
  // The site trains round 3 and submits it to the fake aggregator.
  std::vector<FakeAggregator::Submission> results =
      fake_.WaitForSubmissions(1, absl::Seconds(20) * TimeScale());
  ASSERT_EQ(results.size(), 1u) << swarm_->Logs();
  EXPECT_EQ(results[0].header.round(), 3u);
  EXPECT_EQ(results[0].header.sender(), "site-a");
  ASSERT_TRUE(
      WaitForState(*swarm_, "site-a", v1::SITE_STATE_IDLE, absl::Seconds(10))
          .ok())
      << swarm_->Logs();

  // The same task again (its acknowledgement may have been lost): it is
  // acknowledged again, and nothing else happens: no second training.
  absl::StatusOr<v1::Reply> repeat = SendLearnTask(3);
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_EQ(repeat->outcome(), v1::OUTCOME_OK) << repeat->message();
  EXPECT_THAT(repeat->message(),
              HasSubstr("learn task of round 3 already accepted"));
  // Round 3 naming another aggregator than the election's (at attempt 0)
  // is refused as such.
  absl::StatusOr<v1::Reply> other = SendLearnTask(3, kJob, "site-a");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(),
              HasSubstr("names site-a as aggregator of round 3 at attempt 0"));
  // Earlier rounds are refused.
  for (const auto& [round, aggregator] :
       std::vector<std::pair<uint32_t, std::string>>{{2, "fake-aggr"},
                                                     {0, "fake-aggr"}}) {
    SCOPED_TRACE(absl::StrCat("round ", round, " from ", aggregator));
    absl::StatusOr<v1::Reply> again = SendLearnTask(round, kJob, aggregator);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
        << (again.ok() ? again->ShortDebugString() : "");
    EXPECT_THAT(again.status().message(),
                HasSubstr("site site-a already has the learn task of round 3"));
  }
  ASSERT_TRUE(
      WaitForState(*swarm_, "site-a", v1::SITE_STATE_IDLE, absl::Seconds(10))
          .ok());
  absl::StatusOr<v1::StatusReply> status = swarm_->Status("site-a", kJob);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->status().counters().rounds_trained(), 1u);
  EXPECT_EQ(status->status().round(), 3u);
  EXPECT_EQ(fake_.WaitForSubmissions(2, absl::ZeroDuration()).size(), 1u);

  // A later round is still welcome; and the only results ever submitted are
  // those of rounds 3 and 4 (the repeat of round 3 was not trained again).
  absl::StatusOr<v1::Reply> next = SendLearnTask(4);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->outcome(), v1::OUTCOME_OK) << next->message();
  results = fake_.WaitForSubmissions(2, absl::Seconds(20) * TimeScale());
  ASSERT_EQ(results.size(), 2u) << swarm_->Logs();
  EXPECT_EQ(results[1].header.round(), 4u);
  ASSERT_TRUE(
      WaitForState(*swarm_, "site-a", v1::SITE_STATE_IDLE, absl::Seconds(10))
          .ok());
  status = swarm_->Status("site-a", kJob);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->status().counters().rounds_trained(), 2u);
  EXPECT_EQ(fake_.WaitForSubmissions(3, absl::ZeroDuration()).size(), 2u);
}

TEST_F(FakeAggregatorTest, TrainerStreamsItsResultInTheJobsChunkSize) {
  absl::StatusOr<v1::Reply> task = SendLearnTask(0);
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_EQ(task->outcome(), v1::OUTCOME_OK) << task->message();
  std::vector<FakeAggregator::Submission> results =
      fake_.WaitForSubmissions(1, absl::Seconds(20) * TimeScale());
  ASSERT_EQ(results.size(), 1u) << swarm_->Logs();
  const FakeAggregator::Submission& result = results[0];
  EXPECT_TRUE(result.trailer);
  EXPECT_EQ(result.header.total_bytes(), kElements * sizeof(float));
  EXPECT_EQ(result.header.chunk_size(), kChunkSize);
  EXPECT_EQ(result.chunk_sizes,
            std::vector<uint64_t>(kElements * sizeof(float) / kChunkSize,
                                  kChunkSize));
}

// `swarmctl health` (the container and Kubernetes probe) over the standard
// gRPC health service: SERVING while the daemon runs, exit 1 once it stopped,
// and the server certificate's name is checked (--server-name overrides it).
TEST(HealthTest, SwarmctlHealthFollowsTheDaemon) {
  LocalSwarm swarm("health");
  ASSERT_OK_STATUS(swarm.StartSite("site-a", {}));
  const std::string address = swarm.site("site-a").address;
  CommandResult healthy = swarm.Swarmctl({"health", "--site", address});
  EXPECT_EQ(healthy.code(), 0) << healthy.ToString();
  EXPECT_THAT(healthy.out, HasSubstr("SERVING"));
  // The site's certificate names 127.0.0.1, not "elsewhere".
  CommandResult wrong_name = swarm.Swarmctl(
      {"health", "--site", address, "--server-name", "elsewhere"});
  EXPECT_EQ(wrong_name.code(), 1) << wrong_name.ToString();
  CommandResult usage = swarm.Swarmctl({"health"});
  EXPECT_EQ(usage.code(), 2) << usage.ToString();

  ASSERT_OK_STATUS(swarm.StopAll(absl::Seconds(10)));
  CommandResult stopped =
      swarm.Swarmctl({"health", "--site", address, "--timeout-ms", "1000"});
  EXPECT_EQ(stopped.code(), 1) << stopped.ToString();
  EXPECT_THAT(stopped.err, HasSubstr(address));
}

TEST(SiteRefusalTest, SecondJobWhileOneRuns) {
  LocalSwarm swarm("second-job-while-one-runs");
  // Training takes a minute (cancellable), so the first job is still running
  // when the second one comes.
  ASSERT_OK_STATUS(swarm.StartSite("site-a", {{"train_ms", "60000"}}));
  ASSERT_OK_STATUS(swarm.StartSite("site-b", {{"train_ms", "60000"}}));
  const v1::JobConfig first =
      TwoSiteJob("job-1", swarm.Info("site-a"), swarm.Info("site-b"));
  const v1::JobConfig second =
      TwoSiteJob("job-2", swarm.Info("site-a"), swarm.Info("site-b"));
  const std::string first_path = swarm.WriteJob(first, "job-1.json");
  const std::string second_path = swarm.WriteJob(second, "job-2.json");

  CommandResult start = swarm.Swarmctl({"start", "--job", first_path});
  ASSERT_EQ(start.code(), 0) << start.ToString();
  ASSERT_TRUE(
      WaitForState(swarm, "site-a", v1::SITE_STATE_TRAINING, absl::Seconds(10))
          .ok())
      << swarm.Logs();

  // Through swarmctl: exit 1 before any site is configured, naming the
  // sites, the job they run and what to do.
  CommandResult refused = swarm.Swarmctl({"start", "--job", second_path});
  EXPECT_EQ(refused.code(), 1) << refused.ToString();
  EXPECT_THAT(refused.err,
              AllOf(HasSubstr("site site-a ("), HasSubstr("runs job job-1"),
                    HasSubstr("site site-b ("), HasSubstr("abort that job")));
  EXPECT_THAT(refused.out, Not(HasSubstr("configured")));
  // Directly: each site refuses on its own.
  for (const std::string site : {"site-a", "site-b"}) {
    v1::Reply reply = Configure(swarm, site, second);
    EXPECT_EQ(reply.outcome(), v1::OUTCOME_REJECTED) << site;
    EXPECT_THAT(reply.message(), HasSubstr(absl::StrCat(
                                     "site ", site, " is running job job-1")));
    absl::StatusOr<v1::StatusReply> status = swarm.Status(site);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->status().job_id(), "job-1") << site;
  }

  // Once the first job is aborted, the second one is welcome.
  CommandResult abort =
      swarm.Swarmctl({"abort", "--job", first_path, "--reason", "making room"});
  EXPECT_EQ(abort.code(), 0) << abort.ToString();
  for (const std::string site : {"site-a", "site-b"}) {
    absl::StatusOr<v1::StatusReply> status = swarm.Status(site);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->status().state(), v1::SITE_STATE_ABORTED) << site;
    EXPECT_THAT(status->status().last_error(), HasSubstr("making room"));
  }
  CommandResult restart = swarm.Swarmctl({"start", "--job", second_path});
  EXPECT_EQ(restart.code(), 0) << restart.ToString();
  CommandResult abort_second = swarm.Swarmctl({"abort", "--job", second_path});
  EXPECT_EQ(abort_second.code(), 0) << abort_second.ToString();

  absl::Status stopped = swarm.StopAll(absl::Seconds(10));
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace swarm::testing
