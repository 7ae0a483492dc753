// PeerService's model uploads (LearnTask, SubmitResult, FinalResult): one
// read reactor per call, as gRPC's route_guide_callback_server Recorder. The
// header is authorized and admitted before any body frame is read; then
// every upload is a RelayedStream (rpc/relayed_stream.h) that RelayProtocol
// drives: a plain upload (kReceive; a partial sum into the aggregator with
// its idle budget), a broadcast's forward (kRelay) or a chain's hop (kHop),
// with the budgets the site decided at the header. The reactor only reads
// frames, feeds them to the assembler, hands the site the model and
// finishes the call with the site's reply. No thread waits for the sender
// or for the site.
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "controller/model_receiver.h"
#include "controller/replies.h"
#include "rpc/grpc_stream.h"
#include "rpc/peer_service.h"
#include "rpc/peer_service_internal.h"
#include "rpc/relayed_stream.h"
#include "rpc/stream_watchdog.h"
#include "rpc/upload_checks.h"
#include "security/certificates.h"
#include "streaming/chunker.h"
#include "streaming/digest.h"

namespace swarm {
namespace {

// A chain hop's output: the chunks the partial sum puts out, as frames for
// the next hop, and their digest for its trailer. Touched by the reading
// thread only (one read at a time).
class HopOutput {
 public:
  explicit HopOutput(std::unique_ptr<StreamDigest> digest)
      : digest_(std::move(digest)) {}

  absl::Status Emit(uint32_t index, uint64_t offset, absl::string_view data) {
    digest_->AddChunk(index, offset, data);
    ++chunks_;
    auto bytes = std::make_shared<const std::string>(data);
    ChunkRef chunk;
    chunk.tensor_index = index;
    chunk.offset = offset;
    chunk.data = *bytes;
    frames_.push_back(EncodeChunkFrame(chunk, bytes));
    return absl::OkStatus();
  }
  // The frames put out since the last call.
  std::vector<grpc::ByteBuffer> Take() {
    std::vector<grpc::ByteBuffer> frames;
    frames.swap(frames_);
    return frames;
  }
  grpc::ByteBuffer Trailer() {
    v1::ModelTrailer trailer;
    trailer.set_digest(digest_->Finish());
    trailer.set_chunk_count(chunks_);
    return EncodeTrailerFrame(trailer);
  }

 private:
  const std::unique_ptr<StreamDigest> digest_;
  uint64_t chunks_ = 0;
  std::vector<grpc::ByteBuffer> frames_;
};

}  // namespace

class PeerService::UploadCall final
    : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadCall(PeerService* service, grpc::CallbackServerContext* context,
             v1::Reply* reply)
      : service_(service),
        context_(context),
        reply_(reply),
        receiver_(service->site_),
        checks_(service->options_.tls, service->options_.verifier,
                service->site_),
        side_(std::make_shared<Side>(this)) {}

  void Start() { StartRead(&frame_); }

  void OnReadDone(bool ok) override {
    if (!header_read_) return OnHeader(ok);
    if (!ok) return OnEnd();
    OnFrame();
  }

  // While a read is pending, it ends (not OK) and the stream goes on from
  // there; only a call waiting for the site's reply is finished here.
  void OnCancel() override {
    if (side_->TakeIfWaiting()) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    if (watched_) service_->watchdog_->Forget(context_);
    delete this;
  }

 private:
  // What the stream's actions and the site's reply find: the call, until
  // it finishes (once).
  class Side final : public RelayedStream::Side {
   public:
    explicit Side(UploadCall* call) : call_(call) {}
    void Read() override {
      if (UploadCall* call = Get()) call->StartRead(&call->frame_);
    }
    void CancelIncoming() override {
      // Through the watchdog, whose Forget (OnDone) waits for it.
      if (UploadCall* call = Get()) {
        call->service_->watchdog_->Watch(call->context_, absl::Now());
      }
    }
    void TellSite(absl::Status status) override {
      if (UploadCall* call = Get()) call->HandToSite(std::move(status));
    }
    void Answer(v1::Reply reply) override {
      UploadCall* call = Take();
      if (call == nullptr) return;  // Cancelled.
      *call->reply_ = std::move(reply);
      // The reactor may be deleted (OnDone) from here on.
      call->Finish(grpc::Status::OK);
    }
    void OnwardDone(absl::StatusOr<v1::Reply>) override {}
    void End(const grpc::Status& status) {
      if (UploadCall* call = Take()) call->Finish(status);
    }
    void SetWaiting() {
      absl::MutexLock lock(&mu_);
      waiting_ = true;
    }
    bool TakeIfWaiting() {
      absl::MutexLock lock(&mu_);
      if (!waiting_ || call_ == nullptr) return false;
      call_ = nullptr;
      return true;
    }

   private:
    UploadCall* Get() {
      absl::MutexLock lock(&mu_);
      return call_;
    }
    UploadCall* Take() {
      absl::MutexLock lock(&mu_);
      UploadCall* call = call_;
      call_ = nullptr;
      return call;
    }
    absl::Mutex mu_;
    UploadCall* call_ ABSL_GUARDED_BY(mu_);
    bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  };

  void OnHeader(bool ok) {
    header_read_ = true;
    if (!ok) {
      return side_->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "model stream ended before its header"));
    }
    v1::ModelFrame frame;
    grpc::ProtoBufferReader parse(&frame_);
    if (!frame.ParseFromZeroCopyStream(&parse) || !frame.has_header()) {
      return side_->End(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "the first frame of a model stream must be its header"));
    }
    const v1::ModelHeader& header = frame.header();
    if (grpc::Status allowed = Admit(header); !allowed.ok()) {
      return side_->End(allowed);
    }
    if (receiver_.answered()) return side_->Answer(receiver_.reply());
    StartStream(header);
  }

  // Authorizes the header, then the site admits it.
  grpc::Status Admit(const v1::ModelHeader& header) {
    const std::string what =
        absl::StrCat(v1::ModelKind_Name(header.kind()), " stream");
    // Who must have sent it: the header's sender, or for a signed learn task
    // that comes through a broadcast, the previous hop (a site of the job).
    std::string caller = header.sender();
    if (grpc::Status forwarded =
            checks_.CheckForwarded(header, what, *context_, &caller);
        !forwarded.ok()) {
      return forwarded;
    }
    grpc::Status allowed =
        service_->Authorize(context_, what, Rule::kSender, caller, &slot_);
    if (!allowed.ok()) return allowed;
    if (grpc::Status relay = checks_.CheckRelayList(header); !relay.ok()) {
      SWARM_LOG_WARNING("refused %s from %s (%s): %s", what, caller,
                        context_->peer(), relay.error_message());
      return relay;
    }
    service_->watchdog_->Watch(
        context_, absl::Now() + service_->options_.max_stream_time);
    watched_ = true;
    received_.peer = header.sender();
    received_.kind = header.kind();
    received_.bytes = header.total_bytes();
    absl::Status admitted = receiver_.Begin(header, frame_.Length());
    if (!admitted.ok()) {
      SWARM_LOG_WARNING("refused %s from %s (%s): %s", what, header.sender(),
                        context_->peer(), admitted.message());
      return ToGrpcStatus(admitted);
    }
    return grpc::Status::OK;
  }

  // The body's stream: received here, forwarded, or passed on as a hop.
  void StartStream(const v1::ModelHeader& header) {
    absl::Status ready = absl::OkStatus();
    if (receiver_.assembler() == nullptr) {
      ready = absl::InvalidArgumentError("bad header");
    }
    const ModelAdmission::ChainHop* hop = receiver_.chain_hop();
    std::string next;
    v1::ModelHeader onward;
    if (ready.ok() && hop != nullptr) {
      mode_ = RelayProtocol::Mode::kHop;
      next = hop->next;
      onward = hop->onward;
      ready = StartHop(*hop);
    } else if (ready.ok() && header.relay_to_size() > 0 &&
               header.kind() == v1::MODEL_KIND_LEARN_TASK &&
               Forwarding(header)) {
      mode_ = RelayProtocol::Mode::kRelay;
      next = header.relay_to(0);
      onward = header;
      onward.mutable_relay_to()->DeleteSubrange(0, 1);
    }
    std::shared_ptr<RelayedStream> stream = RelayedStream::Create(
        ready.ok() ? mode_ : RelayProtocol::Mode::kReceive,
        receiver_.relay_budgets(), next,
        absl::StrCat("round ", header.round(), " ",
                     v1::ModelKind_Name(header.kind()), " from ",
                     header.sender(), next.empty() ? "" : " to ", next),
        service_->watchdog_, side_);
    stream_ = stream;
    if (!ready.ok()) return stream->ReadEnd(ready);  // Tells the site.
    std::vector<grpc::ByteBuffer> header_frames;
    if (mode_ != RelayProtocol::Mode::kReceive) {
      stream->OpenOnward(
          service_->options_.forward_channels->Get(next_address_).get(),
          mode_ == RelayProtocol::Mode::kHop ? "SubmitResult" : "LearnTask",
          ForwardContext(header));
      header_frames.push_back(EncodeHeaderFrame(onward));
    }
    if (stream->Start(std::move(header_frames))) StartRead(&frame_);
  }

  // Whether this site can forward a learn task to relay_to[0] (if not, the
  // sender sends to the rest of its list itself).
  bool Forwarding(const v1::ModelHeader& header) {
    const std::optional<v1::JobConfig> job = service_->site_->job();
    const v1::SiteInfo* site =
        job.has_value() ? FindSite(*job, header.relay_to(0)) : nullptr;
    if (service_->options_.forward_channels != nullptr && site != nullptr) {
      next_address_ = site->address();
      return true;
    }
    SWARM_LOG_WARNING("round %d: not forwarding the learn task to %s: %s",
                      header.round(), header.relay_to(0),
                      site == nullptr ? "not a site of the job"
                                      : "this site does not forward");
    return false;
  }

  // Chain reduction: the site adds its result to the partial sum as it
  // passes (the receiver's PartialSumSink); the output goes on to the next
  // hop, one frame per chunk (HopOutput).
  absl::Status StartHop(const ModelAdmission::ChainHop& hop) {
    const std::optional<v1::JobConfig> job = service_->site_->job();
    const v1::SiteInfo* site =
        job.has_value() ? FindSite(*job, hop.next) : nullptr;
    if (service_->options_.forward_channels == nullptr || site == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot pass the partial sum on to ", hop.next, ": ",
                       site == nullptr ? "not a site of the job"
                                       : "this site does not forward"));
    }
    absl::StatusOr<std::unique_ptr<StreamDigest>> digest =
        StreamDigest::Create(hop.onward.digest_algorithm());
    if (!digest.ok()) return digest.status();
    next_address_ = site->address();
    hop_ = std::make_unique<HopOutput>(std::move(*digest));
    receiver_.set_emit([hop = hop_.get()](uint32_t index, uint64_t offset,
                                          absl::string_view data) {
      return hop->Emit(index, offset, data);
    });
    return absl::OkStatus();
  }

  // The next hop's call: due shortly before this call's own deadline (its
  // answer must make it back in time).
  std::unique_ptr<grpc::ClientContext> ForwardContext(
      const v1::ModelHeader& header) {
    auto context = std::make_unique<grpc::ClientContext>();
    absl::Time deadline = CallDeadline(context_);
    deadline = deadline == absl::InfiniteFuture()
                   ? absl::Now() + StreamDeadline(header.total_bytes())
                   : deadline - kRelayMargin;
    context->set_deadline(absl::ToChronoTime(deadline));
    return context;
  }

  // A body frame: into the assembler, and onward (a forward: as received,
  // the copy sharing its slices; a hop: what the sum put out).
  void OnFrame() {
    std::shared_ptr<RelayedStream> stream = stream_;
    std::vector<grpc::ByteBuffer> onward;
    if (mode_ == RelayProtocol::Mode::kRelay) onward.push_back(frame_);
    absl::Status fed = FeedFrame(&frame_, receiver_.assembler());
    if (mode_ == RelayProtocol::Mode::kHop) onward = hop_->Take();
    // The sender broke a rule of the stream: no more reads; the site says
    // why in its reply.
    if (!fed.ok()) return stream->ReadEnd(fed);
    if (stream->FrameRead(std::move(onward))) StartRead(&frame_);
  }

  // Every read is done: the model, or why the stream broke (a hop's
  // output gets its trailer).
  void OnEnd() {
    std::shared_ptr<RelayedStream> stream = stream_;
    absl::StatusOr<Model> body = receiver_.assembler()->Finish();
    std::vector<grpc::ByteBuffer> trailer;
    if (mode_ != RelayProtocol::Mode::kHop) {
      body = checks_.Verified(std::move(body),
                              receiver_.assembler()->stream_digest());
    } else if (body.ok()) {
      trailer.push_back(hop_->Trailer());
    }
    const absl::Status status = body.status();
    body_ = std::move(body);
    stream->ReadEnd(status, std::move(trailer));
  }

  // The site gets the model (a hop: how the sum went on), and its reply
  // goes to the stream, which answers the call (with the next hop's
  // answers, for a forward).
  void HandToSite(absl::Status status) {
    absl::StatusOr<Model> model = Model();
    if (!status.ok()) {
      model = status;
    } else if (mode_ != RelayProtocol::Mode::kHop) {
      model = std::move(body_);
    }
    if (service_->options_.on_model_received) {
      received_.status = model.status();
      service_->options_.on_model_received(received_);
    }
    std::shared_ptr<Side> side = side_;
    std::shared_ptr<RelayedStream> stream = stream_;
    // The reactor may be deleted once the site replied.
    receiver_.Finish(std::move(model), [stream](v1::Reply reply) {
      stream->SiteReplied(std::move(reply));
    });
    side->SetWaiting();
  }

  PeerService* const service_;
  grpc::CallbackServerContext* const context_;
  v1::Reply* const reply_;
  ModelReceiver receiver_;
  UploadChecks checks_;
  const std::shared_ptr<Side> side_;
  std::shared_ptr<RelayedStream> stream_;
  std::unique_ptr<CallSlot> slot_;
  grpc::ByteBuffer frame_;
  bool header_read_ = false;
  bool watched_ = false;
  RelayProtocol::Mode mode_ = RelayProtocol::Mode::kReceive;
  std::string next_address_;  // A forward's or a hop's next site.
  ReceivedModel received_;    // What the header announced.
  absl::StatusOr<Model> body_ = absl::UnknownError("no body yet");
  // A hop's output.
  std::unique_ptr<HopOutput> hop_;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* PeerService::ReceiveModel(
    grpc::CallbackServerContext* context, v1::Reply* reply) {
  auto* call = new UploadCall(this, context, reply);
  call->Start();
  return call;
}

}  // namespace swarm
