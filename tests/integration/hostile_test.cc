// Hostile peers (issue 6, "Hostile-peer tests"), with real processes and
// mTLS on. One job runs across three real sites while the test attacks it:
// - "mallory", a stand-in trainer run by this test with a genuine site
//   certificate, is a trainer of the job. It acknowledges every learn task,
//   then sends the round's aggregator malformed results (a wrong tensor size,
//   a shape that differs from the round's model, NaN values, a digest
//   mismatch, frames after the trailer, a stream cut off in the middle), each
//   after obtaining permission; finally it reports itself failed so the round
//   closes on the honest results alone.
// - Other identities try what they may not: a site certificate claiming
//   another site, a certificate from another CA, no client certificate, an
//   expired certificate, a non-trainer asking to submit and submitting, a
//   learn task from a site that is not the round's scatterer, admin-only
//   calls with a site certificate, and a flood of request-to-submit calls.
// Each refusal is checked (code and message); then the honest job must end
// exactly as it would without mallory: every round's global model is the
// exact weighted average of the honest results, best/last are byte-identical
// on every site, the refused submissions are counted as rejected and never
// as accepted, and no offload file is left behind.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "config/election.h"
#include "config/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "persist/workspace.h"
#include "proto/swarm.grpc.pb.h"
#include "rpc/grpc_stream.h"
#include "rpc/tls.h"
#include "security/certificates.h"
#include "security/model_signature.h"
#include "security/sha256_digest.h"
#include "streaming/chunker.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

// Some cases cut streams with SHA-256 digests, as a signing site does.
[[maybe_unused]] const bool kSha256Registered =
    (security::RegisterSha256StreamDigest(), true);

using ::testing::HasSubstr;

#define ASSERT_OK_STATUS(expr)                        \
  do {                                                \
    const absl::Status assert_status = (expr);        \
    ASSERT_TRUE(assert_status.ok()) << assert_status; \
  } while (false)

constexpr char kJob[] = "hostile";
constexpr char kMallory[] = "mallory";
constexpr uint64_t kModelSize = 2048;  // f32 elements: 8 KiB, two chunks.
constexpr uint64_t kChunkSize = 4096;
constexpr double kInitScale = 1.0 / 32;
constexpr uint32_t kRounds = 5;
constexpr uint32_t kMaxCallsPerPeer = 6;
// Metric script (multiples of 1/16): the best round is 2, unique, not last.
const std::vector<double> kMetrics = {0.25, 0.5, 0.75, 0.375, 0.625};

absl::Time Deadline(absl::Duration d) { return absl::Now() + d * TimeScale(); }

void SetDeadline(grpc::ClientContext* context,
                 absl::Duration d = absl::Seconds(10)) {
  context->set_deadline(absl::ToChronoTime(Deadline(d)));
}

std::shared_ptr<grpc::Channel> ChannelTo(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // A fresh connection per channel: each identity does its own handshake.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, credentials, args);
}

// The stand-in trainer's server: acknowledges learn tasks (recording which
// round and aggregator each names), final models and best-record shares.
class MalloryService final : public v1::Peer::Service {
 public:
  struct Task {
    uint32_t round = 0;
    std::string aggregator;
    v1::ModelHeader header;
  };

  grpc::Status LearnTask(grpc::ServerContext*,
                         grpc::ServerReader<v1::ModelFrame>* reader,
                         v1::Reply* reply) override {
    v1::ModelFrame frame;
    Task task;
    bool header = false;
    while (reader->Read(&frame)) {
      if (frame.has_header() && !header) {
        header = true;
        task.header = frame.header();
        task.round = frame.header().round();
        task.aggregator = frame.header().aggregator();
      }
    }
    reply->set_outcome(v1::OUTCOME_OK);
    reply->set_message("mallory will train");
    absl::MutexLock lock(&mu_);
    if (header && seen_.insert(task.round).second) tasks_.push_back(task);
    return grpc::Status::OK;
  }

  grpc::Status FinalResult(grpc::ServerContext*,
                           grpc::ServerReader<v1::ModelFrame>* reader,
                           v1::Reply* reply) override {
    v1::ModelFrame frame;
    while (reader->Read(&frame)) {
    }
    reply->set_outcome(v1::OUTCOME_OK);
    reply->set_message("stored by mallory");
    return grpc::Status::OK;
  }

  // swarmctl configures and starts every site of the job, mallory too.
  grpc::Status Configure(grpc::ServerContext*, const v1::ConfigureRequest*,
                         v1::Reply* reply) override {
    reply->set_outcome(v1::OUTCOME_OK);
    return grpc::Status::OK;
  }
  grpc::Status Start(grpc::ServerContext*, const v1::StartRequest*,
                     v1::Reply* reply) override {
    reply->set_outcome(v1::OUTCOME_OK);
    return grpc::Status::OK;
  }

  grpc::Status ShareBest(grpc::ServerContext*, const v1::ShareBestRequest*,
                         v1::Reply* reply) override {
    reply->set_outcome(v1::OUTCOME_OK);
    return grpc::Status::OK;
  }

  // The next learn task (in arrival order), waiting up to `timeout`.
  std::optional<Task> NextTask(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto any = [this]()
                   ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !tasks_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&any), timeout)) {
      return std::nullopt;
    }
    Task task = tasks_.front();
    tasks_.pop_front();
    return task;
  }

 private:
  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> seen_ ABSL_GUARDED_BY(mu_);
};

struct StreamOutcome {
  grpc::Status status;
  v1::Reply reply;
};

// Writes `frames` as a raw client stream of `method` and finishes it.
StreamOutcome SendFrames(grpc::ChannelInterface* channel,
                         const std::string& method,
                         const std::vector<grpc::ByteBuffer>& frames) {
  grpc::ClientContext context;
  SetDeadline(&context);
  StreamOutcome out;
  const std::string path =
      PeerMethodPath(method);  // RpcMethod keeps a pointer.
  const grpc::internal::RpcMethod rpc(
      path.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          channel, rpc, &context, &out.reply));
  for (const grpc::ByteBuffer& frame : frames) {
    if (!writer->Write(frame)) break;  // The server already answered.
  }
  writer->WritesDone();
  out.status = writer->Finish();
  return out;
}

// The frames of `model` as a stream with `header`.
struct Frames {
  grpc::ByteBuffer header;
  std::vector<grpc::ByteBuffer> chunks;
  std::vector<ChunkRef> refs;
  grpc::ByteBuffer trailer;
};

Frames MakeFrames(
    std::shared_ptr<const Model> model, v1::ModelHeader header,
    const std::function<void(v1::ModelHeader*)>& edit_header = nullptr) {
  Frames frames;
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(model, std::move(header), kChunkSize);
  EXPECT_TRUE(chunker.ok()) << chunker.status();
  if (!chunker.ok()) return frames;
  v1::ModelHeader sent = (*chunker)->header();
  if (edit_header) edit_header(&sent);
  frames.header = EncodeHeaderFrame(sent);
  while (std::optional<ChunkRef> chunk = (*chunker)->NextChunk()) {
    frames.refs.push_back(*chunk);
    frames.chunks.push_back(EncodeChunkFrame(*chunk, model));
  }
  frames.trailer = EncodeTrailerFrame((*chunker)->Trailer());
  return frames;
}

std::vector<float> TensorValues(const Model& model) {
  std::vector<float> values;
  if (model.num_tensors() != 1) return values;
  absl::string_view data = model.tensor_data(0);
  values.resize(data.size() / sizeof(float));
  std::memcpy(values.data(), data.data(), values.size() * sizeof(float));
  return values;
}

class HostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    swarm_ = std::make_unique<LocalSwarm>("hostile");
    const security::TlsIdentity& mallory =
        swarm_->Identity(kMallory, security::kSiteRole);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(
        "127.0.0.1:0", security::ServerCredentials(mallory), &mallory_port_);
    builder.RegisterService(&mallory_service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(mallory_port_, 0);
    mallory_credentials_ = security::ClientCredentials(mallory);
  }

  void TearDown() override {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(1));
    }
  }

  // A channel to `site` presenting mallory's certificate.
  std::shared_ptr<grpc::Channel> MalloryChannel(const std::string& site) {
    auto it = mallory_channels_.find(site);
    if (it != mallory_channels_.end()) return it->second;
    auto channel = ChannelTo(swarm_->site(site).address, mallory_credentials_);
    mallory_channels_[site] = channel;
    return channel;
  }

  // Asks `aggregator` for permission as `sender` (over `stub`) until the
  // answer is not RETRY.
  v1::SubmitPermissionReply AskToSubmit(v1::Peer::Stub& stub,
                                        const std::string& sender,
                                        uint32_t round) {
    v1::SubmitPermissionReply reply;
    const absl::Time deadline = Deadline(absl::Seconds(30));
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      SetDeadline(&context, absl::Seconds(5));
      v1::SubmitPermissionRequest request;
      request.set_job_id(kJob);
      request.set_sender(sender);
      request.set_round(round);
      grpc::Status status = stub.RequestToSubmit(&context, request, &reply);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok() || reply.outcome() != v1::OUTCOME_RETRY) return reply;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "no permission for " << sender << " in round " << round;
    return reply;
  }

  // A result header from mallory for `task`.
  v1::ModelHeader ResultHeader(const MalloryService::Task& task) {
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_RESULT);
    header.set_job_id(kJob);
    header.set_round(task.round);
    header.set_sender(kMallory);
    header.set_aggregator(task.aggregator);
    header.set_sample_count(1000);  // Would dominate the average if counted.
    (*header.mutable_metrics())["accuracy"] = 1.0;
    return header;
  }

  // A model with the round's tensor table, every value `value`.
  std::shared_ptr<const Model> RoundShapedModel(
      const MalloryService::Task& task, float value, int64_t nan_at = -1) {
    std::vector<TensorSpec> specs;
    for (const v1::TensorInfo& info : task.header.tensors()) {
      absl::StatusOr<TensorSpec> spec = TensorSpecFromInfo(info);
      EXPECT_TRUE(spec.ok()) << spec.status();
      if (spec.ok()) specs.push_back(*spec);
    }
    absl::StatusOr<Model> model = Model::Create(specs);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    for (size_t t = 0; t < model->num_tensors(); ++t) {
      absl::Span<char> data = model->mutable_tensor_data(t);
      for (size_t i = 0; i + sizeof(float) <= data.size(); i += sizeof(float)) {
        std::memcpy(data.data() + i, &value, sizeof(float));
      }
    }
    if (nan_at >= 0) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(model->mutable_tensor_data(0).data() + nan_at * sizeof(float),
                  &nan, sizeof(float));
    }
    return std::make_shared<const Model>(std::move(*model));
  }

  // Mallory obtains permission from the round's aggregator and sends
  // `frames`; the aggregator must answer BAD_REQUEST mentioning `why`.
  void BadSubmission(const MalloryService::Task& task, const std::string& name,
                     const std::vector<grpc::ByteBuffer>& frames,
                     const std::string& why) {
    SCOPED_TRACE(
        absl::StrCat(name, " in round ", task.round, " to ", task.aggregator));
    std::unique_ptr<v1::Peer::Stub> stub =
        v1::Peer::NewStub(MalloryChannel(task.aggregator));
    v1::SubmitPermissionReply permission =
        AskToSubmit(*stub, kMallory, task.round);
    ASSERT_EQ(permission.outcome(), v1::OUTCOME_OK) << permission.message();
    EXPECT_THAT(permission.message(),
                HasSubstr("permission granted to mallory"));
    ++granted_at_[task.aggregator];
    StreamOutcome out = SendFrames(MalloryChannel(task.aggregator).get(),
                                   "SubmitResult", frames);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.reply.outcome(), v1::OUTCOME_BAD_REQUEST)
        << out.reply.ShortDebugString();
    EXPECT_THAT(out.reply.message(), HasSubstr(why));
    ++rejected_at_[task.aggregator];
  }

  // Mallory gives up on the round (a failed result), so it closes on the
  // honest results alone.
  void GiveUp(const MalloryService::Task& task) {
    SCOPED_TRACE(absl::StrCat("giving up round ", task.round));
    std::unique_ptr<v1::Peer::Stub> stub =
        v1::Peer::NewStub(MalloryChannel(task.aggregator));
    v1::SubmitPermissionReply permission =
        AskToSubmit(*stub, kMallory, task.round);
    ASSERT_EQ(permission.outcome(), v1::OUTCOME_OK) << permission.message();
    ++granted_at_[task.aggregator];
    v1::ModelHeader header = ResultHeader(task);
    header.set_failed(true);
    header.set_failure("mallory gives up");
    StreamOutcome out = SendFrames(MalloryChannel(task.aggregator).get(),
                                   "SubmitResult", {EncodeHeaderFrame(header)});
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.reply.outcome(), v1::OUTCOME_OK)
        << out.reply.ShortDebugString();
  }

  // --- The malformed results of each round.
  void RoundZeroAttacks(const MalloryService::Task& task) {
    std::shared_ptr<const Model> model = RoundShapedModel(task, 1.0f);
    ASSERT_NE(model, nullptr);
    {  // A tensor whose byte_size does not match its shape.
      Frames f = MakeFrames(model, ResultHeader(task), [](v1::ModelHeader* h) {
        h->mutable_tensors(0)->set_byte_size(h->tensors(0).byte_size() + 4);
        h->set_total_bytes(h->total_bytes() + 4);
      });
      std::vector<grpc::ByteBuffer> frames = {f.header};
      frames.insert(frames.end(), f.chunks.begin(), f.chunks.end());
      frames.push_back(f.trailer);
      BadSubmission(
          task, "wrong tensor size", frames,
          absl::StrCat("byte_size ", kModelSize * 4 + 4,
                       " differs from shape x dtype size ", kModelSize * 4));
    }
    {  // The same bytes in a shape the round's model does not have.
      Frames f = MakeFrames(model, ResultHeader(task), [](v1::ModelHeader* h) {
        v1::TensorInfo* info = h->mutable_tensors(0);
        info->clear_shape();
        info->add_shape(kModelSize / 2);
        info->add_shape(2);
      });
      std::vector<grpc::ByteBuffer> frames = {f.header};
      frames.insert(frames.end(), f.chunks.begin(), f.chunks.end());
      frames.push_back(f.trailer);
      BadSubmission(task, "different shape", frames,
                    "differs in dtype or shape from the round's model");
    }
  }

  void RoundOneAttacks(const MalloryService::Task& task) {
    {  // A NaN in an otherwise well-formed result.
      std::shared_ptr<const Model> model = RoundShapedModel(task, 1.0f, 1500);
      ASSERT_NE(model, nullptr);
      Frames f = MakeFrames(model, ResultHeader(task));
      std::vector<grpc::ByteBuffer> frames = {f.header};
      frames.insert(frames.end(), f.chunks.begin(), f.chunks.end());
      frames.push_back(f.trailer);
      BadSubmission(task, "NaN", frames,
                    "has a NaN or Inf value at element 1500");
    }
    {  // One bit flipped in flight: the trailer's digest does not match.
      std::shared_ptr<const Model> model = RoundShapedModel(task, 1.0f);
      ASSERT_NE(model, nullptr);
      Frames f = MakeFrames(model, ResultHeader(task));
      ASSERT_EQ(f.refs.size(), 2u);
      std::string corrupted(f.refs[1].data);
      corrupted[100] ^= 1;
      ChunkRef bad = f.refs[1];
      bad.data = corrupted;
      std::vector<grpc::ByteBuffer> frames = {
          f.header, f.chunks[0], EncodeChunkFrame(bad, nullptr), f.trailer};
      BadSubmission(task, "digest mismatch", frames, "digest mismatch");
    }
  }

  void RoundTwoAttacks(const MalloryService::Task& task) {
    std::shared_ptr<const Model> model = RoundShapedModel(task, 1.0f);
    ASSERT_NE(model, nullptr);
    {  // A complete, valid stream, then one more chunk.
      Frames f = MakeFrames(model, ResultHeader(task));
      std::vector<grpc::ByteBuffer> frames = {f.header};
      frames.insert(frames.end(), f.chunks.begin(), f.chunks.end());
      frames.push_back(f.trailer);
      frames.push_back(f.chunks[0]);
      BadSubmission(task, "frame after the trailer", frames,
                    "frame after the trailer");
    }
    {  // Cut off after the first chunk.
      Frames f = MakeFrames(model, ResultHeader(task));
      BadSubmission(task, "cut off", {f.header, f.chunks[0]},
                    "stream ended without a trailer after 4096");
    }
  }

  // The connection cut mid-stream: mallory cancels its upload after the
  // first chunk. It sees CANCELLED; the aggregator counts a refused result
  // and frees the slot.
  void RoundThreeAttacks(const MalloryService::Task& task) {
    SCOPED_TRACE(absl::StrCat("cancelled upload in round ", task.round));
    absl::StatusOr<v1::StatusReply> before =
        swarm_->Status(task.aggregator, kJob);
    ASSERT_TRUE(before.ok()) << before.status();
    const uint64_t rejected = before->status().counters().results_rejected();
    std::unique_ptr<v1::Peer::Stub> stub =
        v1::Peer::NewStub(MalloryChannel(task.aggregator));
    v1::SubmitPermissionReply permission =
        AskToSubmit(*stub, kMallory, task.round);
    ASSERT_EQ(permission.outcome(), v1::OUTCOME_OK) << permission.message();
    ++granted_at_[task.aggregator];
    std::shared_ptr<const Model> model = RoundShapedModel(task, 1.0f);
    ASSERT_NE(model, nullptr);
    Frames f = MakeFrames(model, ResultHeader(task));
    {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::Reply reply;
      const std::string path = PeerMethodPath("SubmitResult");
      const grpc::internal::RpcMethod rpc(
          path.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING);
      std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
          grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
              MalloryChannel(task.aggregator).get(), rpc, &context, &reply));
      ASSERT_TRUE(writer->Write(f.header));
      ASSERT_TRUE(writer->Write(f.chunks[0]));
      absl::SleepFor(absl::Milliseconds(200));  // Let the server take it in.
      context.TryCancel();
      grpc::Status status = writer->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
          << status.error_message();
    }
    ++rejected_at_[task.aggregator];
    const absl::Time deadline = Deadline(absl::Seconds(10));
    uint64_t now_rejected = rejected;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::StatusReply> after =
          swarm_->Status(task.aggregator, kJob);
      ASSERT_TRUE(after.ok()) << after.status();
      now_rejected = after->status().counters().results_rejected();
      if (now_rejected > rejected) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(now_rejected, rejected + 1)
        << "the cancelled upload was not refused";
    EXPECT_THAT(ReadFileOrEmpty(swarm_->site(task.aggregator).log_path),
                HasSubstr(absl::StrCat("round ", task.round,
                                       ": submission of mallory failed: ")));
  }

  std::unique_ptr<LocalSwarm> swarm_;
  MalloryService mallory_service_;
  int mallory_port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::ChannelCredentials> mallory_credentials_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> mallory_channels_;
  std::map<std::string, uint64_t> rejected_at_;  // site -> refused results
  std::map<std::string, uint64_t> granted_at_;   // site -> mallory's grants
};

TEST_F(HostileTest, HonestJobCompletesExactlyDespiteHostilePeers) {
  LocalSwarm& swarm = *swarm_;
  SCOPED_TRACE(absl::StrCat("files in ", swarm.dir()));
  // Two honest trainers (site-1, site-2) and a candidate-only site-3; all
  // three are the aggregator candidates. Mallory is a trainer only.
  struct Honest {
    std::string name;
    bool trainer;
    double delta;
    double metric_offset;
  };
  const std::vector<Honest> honest = {{"site-1", true, 0.125, 0.0},
                                      {"site-2", true, 0.375, 0.0625},
                                      {"site-3", false, 0.0, 0.0}};
  for (const Honest& site : honest) {
    std::vector<std::string> entries;
    for (uint32_t r = 0; r < kMetrics.size(); ++r) {
      entries.push_back(absl::StrCat(r, ":", kMetrics[r] + site.metric_offset));
    }
    ASSERT_OK_STATUS(swarm.StartSite(site.name,
                                     {{"size", absl::StrCat(kModelSize)},
                                      {"init_scale", absl::StrCat(kInitScale)},
                                      {"delta", absl::StrCat(site.delta)},
                                      {"sample_count", "1"},
                                      {"metrics", absl::StrJoin(entries, ",")}},
                                     kMaxCallsPerPeer));
  }
  v1::JobConfig job;
  job.set_job_id(kJob);
  for (const Honest& site : honest) *job.add_sites() = swarm.Info(site.name);
  v1::SiteInfo mallory_info;
  mallory_info.set_name(kMallory);
  mallory_info.set_address(absl::StrCat("127.0.0.1:", mallory_port_));
  *job.add_sites() = mallory_info;
  job.add_trainers("site-1");
  job.add_trainers("site-2");
  job.add_trainers(kMallory);
  for (const Honest& site : honest) job.add_aggregator_candidates(site.name);
  job.set_starting_site("site-1");
  job.set_num_rounds(kRounds);
  job.set_seed(7);
  // Rounds wait for mallory (it closes them by giving up). Its hand-made
  // client never probes its aggregator, so the silence rule (two failover
  // timeouts) must not drop it first.
  job.set_wait_after_min_responses_ms(120000);
  job.set_round_timeout_ms(120000);
  job.set_failover_timeout_ms(120000);
  job.set_max_concurrent_submissions(1);
  job.set_request_to_submit_interval_ms(100);
  job.set_request_to_submit_max_wait_ms(60000);
  job.set_request_to_submit_message_timeout_ms(5000);
  job.set_final_result_ack_timeout_ms(30000);
  job.set_learn_task_ack_timeout_ms(10000);
  job.set_chunk_size(kChunkSize);
  job.set_keep_round_models(true);
  job.set_disk_offload(true);  // So a refused result could leave files.
  const std::string job_path = swarm.WriteJob(job);
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(job_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  const absl::Time started = absl::Now();
  CommandResult start = swarm.Swarmctl({"start", "--job", job_path});
  ASSERT_EQ(start.code(), 0) << start.ToString();

  // --- Round 0 is open and waits for mallory: the control-plane attacks.
  std::optional<MalloryService::Task> task =
      mallory_service_.NextTask(absl::Seconds(30) * TimeScale());
  ASSERT_TRUE(task.has_value()) << "mallory got no learn task\n"
                                << swarm.Logs();
  ASSERT_EQ(task->round, 0u);
  const std::string aggregator0 = task->aggregator;
  ASSERT_EQ(aggregator0, ElectionOrder(*loaded, 0)[0]);
  const std::string& address0 = swarm.site(aggregator0).address;

  {  // A valid certificate of site-2 claiming to be site-1.
    SCOPED_TRACE("site-2 claims site-1");
    std::unique_ptr<v1::Peer::Stub> stub =
        swarm.StubAs(aggregator0, "site-2", security::kSiteRole);
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::SubmitPermissionRequest request;
    request.set_job_id(kJob);
    request.set_sender("site-1");
    request.set_round(0);
    v1::SubmitPermissionReply reply;
    grpc::Status status = stub->RequestToSubmit(&context, request, &reply);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(),
                HasSubstr("sender \"site-1\" does not match the certificate "
                          "of \"site-2\""));
    // And a result stream in site-1's name.
    std::shared_ptr<const Model> model = RoundShapedModel(*task, 0.5f);
    ASSERT_NE(model, nullptr);
    v1::ModelHeader header = ResultHeader(*task);
    header.set_sender("site-1");
    Frames f = MakeFrames(model, header);
    auto channel =
        ChannelTo(address0, security::ClientCredentials(
                                swarm.Identity("site-2", security::kSiteRole)));
    StreamOutcome out =
        SendFrames(channel.get(), "SubmitResult",
                   {f.header, f.chunks[0], f.chunks[1], f.trailer});
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(out.status.error_message(),
                HasSubstr("sender \"site-1\" does not match the certificate "
                          "of \"site-2\""));
  }

  // Handshake failures: an admin certificate from another CA, no client
  // certificate, an expired admin certificate of the right CA. Each tries
  // to abort the job.
  const std::string swarm_ca =
      swarm.Identity("admin", security::kAdminRole).ca_pem;
  auto try_abort = [&](std::shared_ptr<grpc::ChannelCredentials> credentials,
                       const std::string& what) {
    SCOPED_TRACE(what);
    auto channel = ChannelTo(address0, credentials);
    std::unique_ptr<v1::Peer::Stub> stub = v1::Peer::NewStub(channel);
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::AbortRequest request;
    request.set_job_id(kJob);
    request.set_sender("admin");
    request.set_reason(what);
    v1::Reply reply;
    grpc::Status status = stub->Abort(&context, request, &reply);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << status.error_message() << " " << reply.ShortDebugString();
    EXPECT_THAT(status.error_message(),
                HasSubstr("failed to connect to all addresses"));
  };
  {
    absl::StatusOr<security::KeyAndCert> other_ca =
        security::CreateCa("another CA");
    ASSERT_TRUE(other_ca.ok()) << other_ca.status();
    security::CertRequest request;
    request.common_name = "admin";
    request.role = security::kAdminRole;
    request.ip_addresses = {"127.0.0.1"};
    absl::StatusOr<security::KeyAndCert> cert =
        security::IssueCertificate(*other_ca, request);
    ASSERT_TRUE(cert.ok()) << cert.status();
    security::TlsIdentity identity;
    identity.key_pem = cert->key_pem;
    identity.cert_pem = cert->cert_pem;
    identity.ca_pem = swarm_ca;  // It trusts the swarm's servers.
    identity.name = "admin";
    identity.role = security::kAdminRole;
    try_abort(security::ClientCredentials(identity),
              "certificate of another CA");
  }
  {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = swarm_ca;
    try_abort(grpc::SslCredentials(options), "no client certificate");
  }
  {
    security::CertRequest request;
    request.common_name = "admin";
    request.role = security::kAdminRole;
    request.ip_addresses = {"127.0.0.1"};
    request.not_before = absl::Now() - absl::Hours(48);
    request.not_after = absl::Now() - absl::Hours(24);
    absl::StatusOr<security::KeyAndCert> cert =
        security::IssueCertificate(swarm.ca(), request);
    ASSERT_TRUE(cert.ok()) << cert.status();
    security::TlsIdentity identity;
    identity.key_pem = cert->key_pem;
    identity.cert_pem = cert->cert_pem;
    identity.ca_pem = swarm_ca;
    identity.name = "admin";
    identity.role = security::kAdminRole;
    try_abort(security::ClientCredentials(identity), "expired certificate");
  }

  {  // The aggregator saw the handshakes fail (gRPC logs them).
    const std::string log = ReadFileOrEmpty(swarm.site(aggregator0).log_path);
    EXPECT_THAT(log, HasSubstr("peer did not return a certificate"));
    size_t verify_failures = 0;
    for (size_t at = log.find("certificate verify failed");
         at != std::string::npos;
         at = log.find("certificate verify failed", at + 1)) {
      ++verify_failures;
    }
    EXPECT_GE(verify_failures, 2u) << "another CA and expired";
    absl::StatusOr<v1::StatusReply> status = swarm.Status(aggregator0, kJob);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_NE(status->status().state(), v1::SITE_STATE_ABORTED);
  }

  {  // site-3, a genuine site that is not a trainer, asks and submits.
    SCOPED_TRACE("non-trainer site-3");
    std::unique_ptr<v1::Peer::Stub> stub =
        swarm.StubAs(aggregator0, "site-3", security::kSiteRole);
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::SubmitPermissionRequest request;
    request.set_job_id(kJob);
    request.set_sender("site-3");
    request.set_round(0);
    v1::SubmitPermissionReply reply;
    grpc::Status status = stub->RequestToSubmit(&context, request, &reply);
    if (status.ok()) {
      EXPECT_EQ(reply.outcome(), v1::OUTCOME_REJECTED)
          << reply.ShortDebugString();
      EXPECT_THAT(reply.message(),
                  HasSubstr("site-3 is not an expected trainer of round 0"));
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    }
    std::shared_ptr<const Model> model = RoundShapedModel(*task, 0.5f);
    ASSERT_NE(model, nullptr);
    v1::ModelHeader header = ResultHeader(*task);
    header.set_sender("site-3");
    Frames f = MakeFrames(model, header);
    auto channel =
        ChannelTo(address0, security::ClientCredentials(
                                swarm.Identity("site-3", security::kSiteRole)));
    StreamOutcome out =
        SendFrames(channel.get(), "SubmitResult",
                   {f.header, f.chunks[0], f.chunks[1], f.trailer});
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(out.status.error_message(),
                HasSubstr("sender site-3 is not a trainer of job hostile"));
  }

  {  // Mallory sends a learn task for round 1 (due from round 0's
     // aggregator) to every honest site.
    const std::string aggregator1 = ElectionOrder(*loaded, 1)[0];
    v1::ModelHeader header = task->header;
    header.clear_tensors();
    header.set_round(1);
    header.set_sender(kMallory);
    header.set_aggregator(aggregator1);
    std::shared_ptr<const Model> model = RoundShapedModel(*task, 0.5f);
    ASSERT_NE(model, nullptr);
    Frames f = MakeFrames(model, header);
    for (const Honest& site : honest) {
      SCOPED_TRACE(absl::StrCat("learn task from mallory to ", site.name));
      StreamOutcome out =
          SendFrames(MalloryChannel(site.name).get(), "LearnTask",
                     {f.header, f.chunks[0], f.chunks[1], f.trailer});
      EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << out.status.error_message();
      EXPECT_THAT(out.status.error_message(),
                  HasSubstr(absl::StrCat(
                      "learn task of round 1 must come from ", aggregator0,
                      " (the aggregator of round 0), not "
                      "from mallory")));
    }
  }

  {  // Mallory passes on round 1's learn task as if it were forwarding
     // aggregator0's broadcast (issue 13): the header names aggregator0 as
     // its sender, which mallory's certificate cannot prove, so only a valid
     // signature of aggregator0's over what arrives lets it in.
    const std::string aggregator1 = ElectionOrder(*loaded, 1)[0];
    v1::ModelHeader header = task->header;
    header.clear_tensors();
    header.set_round(1);
    header.set_sender(aggregator0);
    header.set_aggregator(aggregator1);
    header.set_digest_algorithm(v1::DIGEST_SHA256);
    std::shared_ptr<const Model> model = RoundShapedModel(*task, 0.5f);
    ASSERT_NE(model, nullptr);
    // What aggregator0's transport would sign: the genuine model's digest.
    const security::TlsIdentity& scatterer =
        swarm.Identity(aggregator0, security::kSiteRole);
    absl::StatusOr<security::ModelSigner> signer =
        security::ModelSigner::Create(scatterer.key_pem, scatterer.cert_pem);
    ASSERT_TRUE(signer.ok()) << signer.status();
    absl::StatusOr<std::unique_ptr<Chunker>> genuine =
        Chunker::Create(model, header, kChunkSize);
    ASSERT_TRUE(genuine.ok()) << genuine.status();
    while ((*genuine)->NextChunk().has_value()) {
    }
    const std::string digest = (*genuine)->Trailer().digest();
    absl::StatusOr<std::string> signature =
        signer->Sign((*genuine)->header(), digest);
    ASSERT_TRUE(signature.ok()) << signature.status();
    // Mallory alters one value and sends the rest unchanged, with a trailer
    // that matches the altered chunks.
    std::shared_ptr<const Model> altered = RoundShapedModel(*task, 0.5f);
    ASSERT_NE(altered, nullptr);
    const_cast<char*>(altered->tensor_data(0).data())[5] ^= 0x40;
    Frames tampered = MakeFrames(altered, header, [&](v1::ModelHeader* h) {
      h->set_digest_signature(*signature);
      h->set_signer_certificate_pem(signer->certificate_pem());
    });
    // Mallory signs with its own key what it claims aggregator0 sent.
    absl::StatusOr<security::ModelSigner> own_key =
        security::ModelSigner::Create(
            swarm.Identity(kMallory, security::kSiteRole).key_pem,
            swarm.Identity(kMallory, security::kSiteRole).cert_pem);
    ASSERT_TRUE(own_key.ok()) << own_key.status();
    Frames self_signed = MakeFrames(model, header, [&](v1::ModelHeader* h) {
      h->set_digest_signature("not checked: the certificate is refused first");
      h->set_signer_certificate_pem(own_key->certificate_pem());
    });
    Frames unsigned_forward = MakeFrames(model, header);
    // A forward list that passes the stream back and forth.
    Frames looping = MakeFrames(model, header, [&](v1::ModelHeader* h) {
      h->set_digest_signature(*signature);
      h->set_signer_certificate_pem(signer->certificate_pem());
      for (int i = 0; i < 2; ++i) {
        for (const Honest& other : honest) h->add_relay_to(other.name);
      }
    });
    for (const Honest& site : honest) {
      if (site.name == aggregator0) continue;
      SCOPED_TRACE(
          absl::StrCat("learn task forwarded by mallory to ", site.name));
      StreamOutcome out;
      if (site.trainer || site.name == aggregator1) {
        // (A site with no part in round 1 refuses the header itself.)
        out = SendFrames(MalloryChannel(site.name).get(), "LearnTask",
                         {tampered.header, tampered.chunks[0],
                          tampered.chunks[1], tampered.trailer});
        const std::string said =
            out.status.ok() ? out.reply.message() : out.status.error_message();
        EXPECT_TRUE(!out.status.ok() || out.reply.outcome() != v1::OUTCOME_OK)
            << "a tampered forward was accepted: " << said;
        EXPECT_THAT(said,
                    HasSubstr(absl::StrCat("learn task forwarded by ", kMallory,
                                           " for ", aggregator0)));
        EXPECT_THAT(said, HasSubstr("does not verify"));
      }

      out = SendFrames(MalloryChannel(site.name).get(), "LearnTask",
                       {looping.header, looping.chunks[0], looping.chunks[1],
                        looping.trailer});
      EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << out.status.error_message();
      EXPECT_THAT(out.status.error_message(), HasSubstr("relay_to: names "));

      out = SendFrames(MalloryChannel(site.name).get(), "LearnTask",
                       {self_signed.header, self_signed.chunks[0],
                        self_signed.chunks[1], self_signed.trailer});
      EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << out.status.error_message();
      EXPECT_THAT(out.status.error_message(),
                  HasSubstr(absl::StrCat("certificate names ", kMallory)));

      out = SendFrames(MalloryChannel(site.name).get(), "LearnTask",
                       {unsigned_forward.header, unsigned_forward.chunks[0],
                        unsigned_forward.chunks[1], unsigned_forward.trailer});
      EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << out.status.error_message();
      EXPECT_THAT(out.status.error_message(),
                  HasSubstr(absl::StrCat("does not match the certificate of \"",
                                         kMallory, "\"")));
    }
  }

  {  // Partial sums (chain reduction, issue 13). Mallory passes one on in
     // an honest trainer's name: mTLS proves the hop, so it is refused
     // before anything else. In its own name it is refused because this
     // job does not reduce in a chain.
    const std::string honest_trainer = honest.back().name;
    v1::ModelHeader header = ResultHeader(*task);
    header.set_kind(v1::MODEL_KIND_PARTIAL_SUM);
    v1::Contribution* contribution = header.add_contributions();
    contribution->set_site(kMallory);
    contribution->set_sample_count(1000);
    std::shared_ptr<const Model> model = RoundShapedModel(*task, 0.5f);
    ASSERT_NE(model, nullptr);
    v1::ModelHeader impostor = header;
    impostor.set_sender(honest_trainer);
    Frames claimed = MakeFrames(model, impostor);
    StreamOutcome out =
        SendFrames(MalloryChannel(task->aggregator).get(), "SubmitResult",
                   {claimed.header, claimed.chunks[0], claimed.chunks[1],
                    claimed.trailer});
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << out.status.error_message();
    EXPECT_THAT(out.status.error_message(),
                HasSubstr(absl::StrCat("does not match the certificate of \"",
                                       kMallory, "\"")));
    Frames own = MakeFrames(model, header);
    out = SendFrames(MalloryChannel(task->aggregator).get(), "SubmitResult",
                     {own.header, own.chunks[0], own.chunks[1], own.trailer});
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << out.status.error_message();
    EXPECT_THAT(out.status.error_message(),
                HasSubstr("does not reduce results in a chain"));
  }

  {  // Admin-only calls with a site certificate.
    std::unique_ptr<v1::Peer::Stub> stub =
        swarm.StubAs(aggregator0, "site-2", security::kSiteRole);
    const std::string why = "is for admins; site-2 has the role \"swarm-site\"";
    {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::ConfigureRequest request;
      request.set_sender("site-2");
      *request.mutable_job() = job;
      request.mutable_job()->set_job_id("hijack");
      v1::Reply reply;
      grpc::Status status = stub->Configure(&context, request, &reply);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr(absl::StrCat("Configure ", why)));
    }
    {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::StartRequest request;
      request.set_sender("site-2");
      request.set_job_id(kJob);
      v1::Reply reply;
      grpc::Status status = stub->Start(&context, request, &reply);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr(absl::StrCat("Start ", why)));
    }
    {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::AbortRequest request;
      request.set_sender("site-2");
      request.set_job_id(kJob);
      request.set_reason("hijack");
      v1::Reply reply;
      grpc::Status status = stub->Abort(&context, request, &reply);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr(absl::StrCat("Abort ", why)));
    }
  }

  {  // A flood of request-to-submit calls from mallory: requests for the
     // next round are held (RETRY) until their deadline, so the first
     // kMaxCallsPerPeer of them take every slot mallory has.
    SCOPED_TRACE("flood");
    constexpr int kFlood = 2 * kMaxCallsPerPeer;
    std::vector<grpc::Status> statuses(kFlood);
    std::vector<v1::SubmitPermissionReply> replies(kFlood);
    std::vector<std::thread> threads;
    const absl::Time hold_until = Deadline(absl::Seconds(3));
    std::shared_ptr<grpc::Channel> channel = MalloryChannel(aggregator0);
    for (int i = 0; i < kFlood; ++i) {
      threads.emplace_back([&, i] {
        std::unique_ptr<v1::Peer::Stub> stub = v1::Peer::NewStub(channel);
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(hold_until));
        v1::SubmitPermissionRequest request;
        request.set_job_id(kJob);
        request.set_sender(kMallory);
        request.set_round(1);
        statuses[i] = stub->RequestToSubmit(&context, request, &replies[i]);
      });
    }
    // Meanwhile the site serves others: an honest site's request (a status
    // from site-2's identity) and the admin's.
    absl::SleepFor(absl::Milliseconds(500));
    {
      std::unique_ptr<v1::Peer::Stub> stub =
          swarm.StubAs(aggregator0, "site-2", security::kSiteRole);
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::StatusRequest request;
      request.set_sender("site-2");
      v1::StatusReply reply;
      grpc::Status status = stub->Status(&context, request, &reply);
      EXPECT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(reply.status().job_id(), kJob);
    }
    EXPECT_TRUE(swarm.Status(aggregator0, kJob).ok());
    for (std::thread& thread : threads) thread.join();
    int held = 0;
    int exhausted = 0;
    for (int i = 0; i < kFlood; ++i) {
      if (statuses[i].ok()) {
        EXPECT_EQ(replies[i].outcome(), v1::OUTCOME_RETRY)
            << replies[i].ShortDebugString();
        ++held;
      } else {
        EXPECT_EQ(statuses[i].error_code(),
                  grpc::StatusCode::RESOURCE_EXHAUSTED)
            << statuses[i].error_message();
        EXPECT_THAT(statuses[i].error_message(),
                    HasSubstr(absl::StrCat(
                        "mallory already has ", kMaxCallsPerPeer,
                        " calls in flight (limit ", kMaxCallsPerPeer, ")")));
        ++exhausted;
      }
    }
    EXPECT_EQ(held, static_cast<int>(kMaxCallsPerPeer));
    EXPECT_EQ(exhausted, kFlood - static_cast<int>(kMaxCallsPerPeer));
  }

  // --- The malformed results, round by round; then mallory gives up.
  std::map<uint32_t, std::string> aggregator_of;
  for (uint32_t round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    if (round > 0) {
      task = mallory_service_.NextTask(absl::Seconds(30) * TimeScale());
      ASSERT_TRUE(task.has_value()) << "no learn task\n" << swarm.Logs();
    }
    ASSERT_EQ(task->round, round);
    ASSERT_EQ(task->aggregator, ElectionOrder(*loaded, round)[0]);
    aggregator_of[round] = task->aggregator;
    if (round == 0) RoundZeroAttacks(*task);
    if (round == 1) RoundOneAttacks(*task);
    if (round == 2) RoundTwoAttacks(*task);
    if (round == 3) RoundThreeAttacks(*task);
    GiveUp(*task);
  }

  absl::Status done = swarm.WaitAllDone(kJob, Deadline(absl::Seconds(60)));
  ASSERT_TRUE(done.ok()) << done << "\n" << swarm.Logs();
  std::fprintf(stderr, "[ hostile ] job done in %s\n",
               absl::FormatDuration(absl::Now() - started).c_str());

  // --- After the job: mallory, a genuine site that neither aggregated the
  // last round nor holds the best model, forges a BEST of another round,
  // naming itself the holder with a perfect metric. Every site refuses it by
  // its own record, and best.safetensors stays as it was.
  {
    SCOPED_TRACE("forged BEST");
    std::map<std::string, std::string> best_before;
    for (const Honest& site : honest) {
      persist::Workspace workspace(swarm.site(site.name).workspace);
      absl::StatusOr<std::string> bytes =
          ReadBytes(workspace.BestModelPath(kJob));
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      best_before[site.name] = *bytes;
    }
    std::shared_ptr<const Model> model = RoundShapedModel(*task, 42.0f);
    ASSERT_NE(model, nullptr);
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_BEST);
    header.set_job_id(kJob);
    header.set_round(kRounds - 1);
    header.set_sender(kMallory);
    v1::BestRecord* forged = header.mutable_best();
    forged->set_present(true);
    forged->set_site(kMallory);
    forged->set_round(kRounds - 1);
    forged->set_metric(1.0);
    Frames f = MakeFrames(model, header);
    for (const Honest& site : honest) {
      SCOPED_TRACE(site.name);
      StreamOutcome out =
          SendFrames(MalloryChannel(site.name).get(), "FinalResult",
                     {f.header, f.chunks[0], f.chunks[1], f.trailer});
      EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << out.status.error_message() << " " << out.reply.ShortDebugString();
      // Any site may give BEST when the scorer is gone, but only the model
      // of the round its own record names (and then only with the record's
      // digest).
      EXPECT_THAT(out.status.error_message(),
                  HasSubstr(absl::StrCat("BEST of round ", kRounds - 1,
                                         " from mallory refused: this site's "
                                         "record names the model of round")));
      persist::Workspace workspace(swarm.site(site.name).workspace);
      absl::StatusOr<std::string> bytes =
          ReadBytes(workspace.BestModelPath(kJob));
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_TRUE(*bytes == best_before[site.name])
          << "best.safetensors of " << site.name << " was overwritten";
    }
  }

  // --- The sender rule: every request's sender must be the certificate's
  // name, a Status call as much as a submission.
  {
    SCOPED_TRACE("sender rule");
    auto status_as = [&](const std::string& identity, const std::string& role,
                         const std::string& sender) {
      std::unique_ptr<v1::Peer::Stub> stub =
          swarm.StubAs("site-1", identity, role);
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::StatusRequest request;
      request.set_sender(sender);
      v1::StatusReply reply;
      return stub->Status(&context, request, &reply);
    };
    grpc::Status claimed = status_as("site-2", security::kSiteRole, "site-3");
    EXPECT_EQ(claimed.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(claimed.error_message(),
                HasSubstr("sender \"site-3\" does not match the certificate "
                          "of \"site-2\""));
    grpc::Status admin = status_as("admin", security::kAdminRole, "swarmctl");
    EXPECT_EQ(admin.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(admin.error_message(),
                HasSubstr("sender \"swarmctl\" does not match the "
                          "certificate of \"admin\""));
    EXPECT_TRUE(status_as("site-2", security::kSiteRole, "site-2").ok());
    EXPECT_TRUE(status_as("admin", security::kAdminRole, "admin").ok());
  }

  // --- Expected models: only the honest trainers count (equal weights).
  const double step = (0.125 + 0.375) / 2;
  std::vector<std::vector<float>> global(kRounds + 1,
                                         std::vector<float>(kModelSize));
  for (uint64_t i = 0; i < kModelSize; ++i) {
    double value = static_cast<double>(i) * kInitScale;
    global[0][i] = static_cast<float>(value);
    for (uint32_t r = 1; r <= kRounds; ++r) {
      value += step;
      global[r][i] = static_cast<float>(value);
    }
  }
  std::vector<double> score(kRounds);
  for (uint32_t r = 0; r < kRounds; ++r) {
    score[r] = (kMetrics[r] + (kMetrics[r] + 0.0625)) / 2;
  }
  const uint32_t best_round = 2;

  std::map<std::string, std::set<uint32_t>> aggregated;
  for (const auto& [round, site] : aggregator_of)
    aggregated[site].insert(round);
  for (uint32_t round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    persist::Workspace workspace(swarm.site(aggregator_of[round]).workspace);
    absl::StatusOr<Model> model =
        Model::LoadSafetensors(workspace.RoundModelPath(kJob, round + 1));
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(TensorValues(*model) == global[round + 1])
        << "round " << round << " is not the honest weighted average";
  }
  for (const Honest& site : honest) {
    SCOPED_TRACE(site.name);
    absl::StatusOr<v1::StatusReply> reply = swarm.Status(site.name, kJob);
    ASSERT_TRUE(reply.ok()) << reply.status();
    const v1::SiteStatus& status = reply->status();
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE);
    const uint64_t rounds = aggregated[site.name].size();
    EXPECT_EQ(status.counters().rounds_completed(), rounds);
    // Two honest results per round; mallory's never.
    EXPECT_EQ(status.counters().results_accepted(), 2 * rounds);
    EXPECT_EQ(status.counters().results_rejected(), rejected_at_[site.name]);
    EXPECT_EQ(status.counters().submissions_granted(),
              2 * rounds + granted_at_[site.name]);
    EXPECT_EQ(status.counters().submissions_in_flight(), 0u);
    EXPECT_EQ(status.counters().rounds_trained(), site.trainer ? kRounds : 0u);
    EXPECT_TRUE(status.best().present());
    EXPECT_EQ(status.best().round(), best_round);
    EXPECT_EQ(status.best().metric(), score[best_round]);
    persist::Workspace workspace(swarm.site(site.name).workspace);
    EXPECT_TRUE(ListFiles(workspace.OffloadDir(kJob)).empty())
        << "offload files left in " << workspace.OffloadDir(kJob);
  }
  uint64_t rejected_total = 0;
  for (const auto& [site, count] : rejected_at_) rejected_total += count;
  EXPECT_EQ(rejected_total, 7u);
  for (const char* which : {"best", "last"}) {
    SCOPED_TRACE(which);
    const bool best = std::string(which) == "best";
    std::string reference;
    for (const Honest& site : honest) {
      persist::Workspace workspace(swarm.site(site.name).workspace);
      absl::StatusOr<std::string> bytes = ReadBytes(
          best ? workspace.BestModelPath(kJob) : workspace.LastModelPath(kJob));
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      if (reference.empty()) {
        reference = *bytes;
      } else {
        EXPECT_TRUE(*bytes == reference) << which << " of " << site.name;
      }
    }
    persist::Workspace workspace(swarm.site("site-1").workspace);
    absl::StatusOr<Model> model = Model::LoadSafetensors(
        best ? workspace.BestModelPath(kJob) : workspace.LastModelPath(kJob));
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(TensorValues(*model) ==
                (best ? global[best_round] : global[kRounds]));
  }

  absl::Status stopped = swarm.StopAll(absl::Seconds(10));
  EXPECT_TRUE(stopped.ok()) << stopped;
  if (HasFailure()) std::fprintf(stderr, "%s", swarm.Logs(80).c_str());
}

}  // namespace
}  // namespace swarm::testing
