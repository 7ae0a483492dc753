// PeerService's model uploads (LearnTask, SubmitResult, FinalResult).
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "controller/model_receiver.h"
#include "controller/replies.h"
#include "rpc/frame_relay.h"
#include "rpc/grpc_stream.h"
#include "rpc/peer_service.h"
#include "rpc/peer_service_internal.h"
#include "rpc/stream_watchdog.h"
#include "security/certificates.h"
#include "streaming/chunker.h"
#include "streaming/digest.h"

namespace swarm {

// A model upload (LearnTask, SubmitResult, FinalResult) as a read reactor,
// as in gRPC's route_guide_callback_server: the header is authorized and
// admitted before any body frame is read, body frames go to the assembler as
// they arrive, and the site's reply finishes the call. No thread waits for
// the sender or for the site.
class PeerService::UploadCall final
    : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadCall(PeerService* service, grpc::CallbackServerContext* context,
             v1::Reply* reply)
      : service_(service),
        context_(context),
        receiver_(service->controller_),
        shared_(std::make_shared<Shared>()) {
    absl::MutexLock lock(&shared_->mu);
    shared_->call = this;
    shared_->reply = reply;
  }

  void Start() { StartRead(&frame_); }

  void OnReadDone(bool ok) override {
    if (!header_read_) return OnHeader(ok);
    if (hop_) return OnHopRead(ok);
    if (!ok) {
      if (relay_ != nullptr) relay_->Close();
      return HandToSite(Verified(receiver_.assembler()->Finish()));
    }
    // Forwarded as received (the copy shares the frame's slices).
    std::optional<grpc::ByteBuffer> onward;
    if (relay_ != nullptr) onward.emplace(frame_);
    if (absl::Status fed = FeedFrame(&frame_, receiver_.assembler());
        !fed.ok()) {
      // The sender broke a rule of the stream: stop reading; the site
      // says why in its reply.
      if (relay_ != nullptr) relay_->Cancel();
      return HandToSite(fed);
    }
    if (onward.has_value() && relay_->Push(*onward) == FrameRelay::kFull) {
      return;  // The relay's on_room reads on.
    }
    if (idle_watch_) return ReadHop();
    StartRead(&frame_);
  }

  // While a read is pending, it ends (not OK) and OnReadDone finishes the
  // call; only a call waiting for the site's reply is finished here.
  void OnCancel() override {
    {
      absl::MutexLock lock(&shared_->mu);
      if (!shared_->waiting_for_site || shared_->call == nullptr) return;
      shared_->call = nullptr;
    }
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    if (watched_) service_->watchdog_->Forget(context_);
    delete this;
  }

 private:
  // What the site's reply finds: the call, until it finishes.
  struct Shared {
    absl::Mutex mu;
    UploadCall* call ABSL_GUARDED_BY(mu) = nullptr;
    v1::Reply* reply ABSL_GUARDED_BY(mu) = nullptr;
    bool waiting_for_site ABSL_GUARDED_BY(mu) = false;
    // A forwarded stream: the site's own reply waits for the next hop's
    // (whose answers for itself and the hops after it join the reply).
    bool relay_pending ABSL_GUARDED_BY(mu) = false;
    std::optional<v1::Reply> own ABSL_GUARDED_BY(mu);
    // The next hop's answers (Reply.relayed only).
    v1::Reply relayed ABSL_GUARDED_BY(mu);
    // A partial sum passing through: how the incoming stream ended and how
    // the next hop answered; the site hears of it once both are known.
    std::optional<absl::Status> hop_incoming ABSL_GUARDED_BY(mu);
    std::optional<absl::Status> hop_onward ABSL_GUARDED_BY(mu);
  };

  void OnHeader(bool ok) {
    header_read_ = true;
    if (!ok) {
      return EndNow(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "model stream ended before its header"));
    }
    v1::ModelFrame frame;
    grpc::ProtoBufferReader parse(&frame_);
    if (!frame.ParseFromZeroCopyStream(&parse) || !frame.has_header()) {
      return EndNow(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "the first frame of a model stream must be its header"));
    }
    const v1::ModelHeader& header = frame.header();
    const std::string what =
        absl::StrCat(v1::ModelKind_Name(header.kind()), " stream");
    // Who must have sent it: the header's sender, or for a signed learn task
    // that comes through a broadcast, the previous hop (a site of the job).
    std::string caller = header.sender();
    if (grpc::Status forwarded = CheckForwarded(header, what, &caller);
        !forwarded.ok()) {
      return EndNow(forwarded);
    }
    grpc::Status allowed =
        service_->Authorize(context_, what, Rule::kSender, caller, &slot_);
    if (!allowed.ok()) return EndNow(allowed);
    if (grpc::Status relay = CheckRelayList(header); !relay.ok()) {
      SWARM_LOG_WARNING("refused %s from %s (%s): %s", what, caller,
                        context_->peer(), relay.error_message());
      return EndNow(relay);
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
      return EndNow(ToGrpcStatus(admitted));
    }
    if (receiver_.answered()) return Answer(shared_, receiver_.reply());
    if (receiver_.assembler() == nullptr) {
      return HandToSite(absl::InvalidArgumentError("bad header"));
    }
    if (receiver_.chain_hop() != nullptr) {
      if (absl::Status started = StartChainHop(header); !started.ok()) {
        return HandToSite(started);
      }
      return ReadHop();
    }
    if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
      // The chain's last hop to the aggregator: a frozen hop must not hold
      // its contributors' results until the round's timeout either.
      if (const std::optional<v1::JobConfig> job = service_->controller_->job();
          job.has_value()) {
        WatchIdle(*job);
        return ReadHop();
      }
    }
    if (header.relay_to_size() > 0) StartRelay(header);
    StartRead(&frame_);
  }

  // A partial sum's reads are watched for an idle sender (ReadHop).
  void WatchIdle(const v1::JobConfig& job) {
    idle_watch_ = true;
    hop_stream_deadline_ = absl::Now() + service_->options_.max_stream_time;
    hop_idle_ = std::max(absl::Seconds(1),
                         absl::Milliseconds(job.failover_timeout_ms()));
  }

  // The next hop's call for a stream passed on: due shortly before this
  // call's own deadline (its answer must make it back in time).
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

  // How long a write to the next hop may wait: failover_timeout per hop
  // from it on. A site frozen further down stalls this hop too
  // (backpressure), and the forwarder nearest to it must give it up first,
  // so that the rest flows again.
  static absl::Duration ForwardStall(const v1::JobConfig& job,
                                     const v1::ModelHeader& onward) {
    return std::max(absl::Seconds(1),
                    absl::Milliseconds(job.failover_timeout_ms())) *
           static_cast<int64_t>(onward.relay_to_size() + 1);
  }

  // Chain reduction: the site adds its result to the partial sum as it
  // passes (the receiver's PartialSumSink) and the output goes on to the
  // next hop at once, one frame per chunk, under the relay's backpressure.
  absl::Status StartChainHop(const v1::ModelHeader& header) {
    const ModelAdmission::ChainHop& hop = *receiver_.chain_hop();
    const std::optional<v1::JobConfig> job = service_->controller_->job();
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
    hop_digest_ = std::move(*digest);
    hop_ = true;
    WatchIdle(*job);
    receiver_.set_emit(
        [this](uint32_t index, uint64_t offset, absl::string_view data) {
          hop_digest_->AddChunk(index, offset, data);
          ++hop_chunks_;
          auto bytes = std::make_shared<const std::string>(data);
          ChunkRef chunk;
          chunk.tensor_index = index;
          chunk.offset = offset;
          chunk.data = *bytes;
          hop_pending_.push_back(EncodeChunkFrame(chunk, bytes));
          return absl::OkStatus();
        });
    FrameRelay::Options options;
    options.stall_timeout = ForwardStall(*job, hop.onward);
    options.what =
        absl::StrCat("round ", header.round(), " partial sum to ", hop.next);
    std::shared_ptr<Shared> shared = shared_;
    relay_ = FrameRelay::Start(
        service_->options_.forward_channels->Get(site->address()).get(),
        "SubmitResult", ForwardContext(header), EncodeHeaderFrame(hop.onward),
        std::move(options), service_->watchdog_.get(),
        [this] {
          // Room again: read on if OnHopRead paused (else it has not got
          // that far yet, and reads on itself), unless the room is the
          // trailer's (the incoming stream is over).
          {
            absl::MutexLock lock(&hop_mu_);
            if (!hop_paused_) {
              hop_room_ = true;
              return;
            }
            hop_paused_ = false;
          }
          if (!hop_read_done_.load()) ReadHop();
        },
        [shared](absl::StatusOr<v1::Reply> reply) {
          HopDone(shared, std::nullopt, StatusFromHopReply(reply));
        });
    return absl::OkStatus();
  }

  // The next frame of a partial sum passing through. A sender that sends
  // nothing for a failover timeout (frozen, or stalled behind a frozen hop)
  // is given up: the call is cancelled, and every trainer of the chain
  // submits directly, instead of all of them waiting for the round's
  // timeout. Only a pending read counts as idle: while the next hop's queue
  // is full (backpressure), this site does not read on purpose.
  // Re-armed at most every quarter of the idle timeout (a watch costs a
  // lock, an allocation and a wake of the watchdog's thread: not once per
  // frame), so a sender is given up after 3/4 to 1 idle timeout.
  void ReadHop() {
    const absl::Time now = absl::Now();
    if (!idle_armed_ || now - idle_armed_at_ >= hop_idle_ / 4) {
      service_->watchdog_->Watch(
          context_, std::min(hop_stream_deadline_, now + hop_idle_));
      idle_armed_ = true;
      idle_armed_at_ = now;
    }
    StartRead(&frame_);
  }

  // The next hop's queue is full: reading pauses until the relay's on_room,
  // which runs on another thread, maybe before this is called. Returns
  // whether to read on now (the room came already).
  bool PauseHopReads() {
    absl::MutexLock lock(&hop_mu_);
    if (hop_room_) {
      hop_room_ = false;
      return true;
    }
    hop_paused_ = true;
    // Pausing on purpose: not idle.
    service_->watchdog_->Watch(context_, hop_stream_deadline_);
    idle_armed_ = false;
    return false;
  }

  void OnHopRead(bool ok) {
    if (!ok) {
      hop_read_done_ = true;
      absl::StatusOr<Model> sum = receiver_.assembler()->Finish();
      if (sum.ok()) {
        v1::ModelTrailer trailer;
        trailer.set_digest(hop_digest_->Finish());
        trailer.set_chunk_count(hop_chunks_);
        relay_->Push(EncodeTrailerFrame(trailer));
        relay_->Close();
      } else {
        relay_->Cancel();
      }
      return HopDone(shared_, sum.status(), std::nullopt);
    }
    if (absl::Status fed = FeedFrame(&frame_, receiver_.assembler());
        !fed.ok()) {
      relay_->Cancel();
      hop_pending_.clear();
      return HopDone(shared_, fed, std::nullopt);
    }
    // Taken out before the push: once it reports the queue full, on_room
    // may read on from another thread, whose frames go into hop_pending_.
    std::vector<grpc::ByteBuffer> frames;
    frames.swap(hop_pending_);
    if (relay_->Push(std::move(frames)) == FrameRelay::kFull &&
        !PauseHopReads()) {
      return;  // The relay's on_room reads on.
    }
    ReadHop();
  }

  // One half of a hop's end: the site hears of both at once (the incoming
  // stream's failure first, else the next hop's answer).
  static void HopDone(const std::shared_ptr<Shared>& shared,
                      std::optional<absl::Status> incoming,
                      std::optional<absl::Status> onward) {
    UploadCall* call = nullptr;
    absl::Status outcome;
    {
      absl::MutexLock lock(&shared->mu);
      if (incoming.has_value()) shared->hop_incoming = std::move(incoming);
      if (onward.has_value()) shared->hop_onward = std::move(onward);
      if (!shared->hop_incoming.has_value() ||
          !shared->hop_onward.has_value() || shared->call == nullptr) {
        return;
      }
      call = shared->call;
      outcome = !shared->hop_incoming->ok() ? *shared->hop_incoming
                                            : *shared->hop_onward;
    }
    // The call is not finished before the site answers: it is alive.
    call->HandToSite(outcome.ok() ? absl::StatusOr<Model>(Model()) : outcome);
  }

  // A learn task whose sender is not the caller's certificate is accepted
  // only as a broadcast's forward: signed by its sender, whose certificate
  // is the job CA's and names it, and passed on by a site of the job.
  // Sets `caller` to the name the certificate must then carry.
  grpc::Status CheckForwarded(const v1::ModelHeader& header,
                              const std::string& what, std::string* caller) {
    const std::shared_ptr<const security::ModelSignatureVerifier>& verifier =
        service_->options_.verifier;
    if (!header.digest_signature().empty() && verifier != nullptr) {
      signed_header_ = header;  // Checked once the body is in.
    }
    if (!service_->options_.tls) return grpc::Status::OK;
    const security::PeerIdentity identity = security::IdentityOf(*context_);
    if (!identity.authenticated || identity.name == header.sender() ||
        header.kind() != v1::MODEL_KIND_LEARN_TASK ||
        header.digest_signature().empty()) {
      return grpc::Status::OK;  // Authorize judges it.
    }
    auto refuse = [&](grpc::StatusCode code, std::string reason) {
      SWARM_LOG_WARNING("refused %s forwarded by %s for %s (%s): %s", what,
                        identity.name, header.sender(), context_->peer(),
                        reason);
      return grpc::Status(code, reason);
    };
    if (verifier == nullptr) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                    "this site cannot check forwarded models (no CA loaded)");
    }
    const std::optional<v1::JobConfig> job = service_->controller_->job();
    if (!job.has_value() || FindSite(*job, identity.name) == nullptr) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED,
                    absl::StrCat("a forwarded learn task must come from a "
                                 "site of the job; ",
                                 identity.name, " is not one"));
    }
    if (absl::Status signer = verifier->VerifySigner(
            header.signer_certificate_pem(), header.sender());
        !signer.ok()) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED,
                    absl::StrCat("learn task forwarded by ", identity.name,
                                 ": ", signer.message()));
    }
    forwarded_by_ = identity.name;
    *caller = identity.name;
    return grpc::Status::OK;
  }

  // A forward list names each other site of the job at most once, and only
  // a learn task has one: a longer or looping list would make the sites
  // pass one stream around without end.
  grpc::Status CheckRelayList(const v1::ModelHeader& header) {
    if (header.relay_to_size() == 0) return grpc::Status::OK;
    auto bad = [](std::string why) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("relay_to: ", why));
    };
    if (header.kind() != v1::MODEL_KIND_LEARN_TASK &&
        header.kind() != v1::MODEL_KIND_PARTIAL_SUM) {
      return bad("only a learn task or a partial sum is forwarded");
    }
    const std::optional<v1::JobConfig> job = service_->controller_->job();
    if (!job.has_value()) return bad("this site has no job");
    std::set<std::string> seen;
    for (const std::string& site : header.relay_to()) {
      if (FindSite(*job, site) == nullptr) {
        return bad(absl::StrCat("\"", site, "\" is not a site of job ",
                                job->job_id()));
      }
      if (site == service_->controller_->site() || site == header.sender()) {
        return bad(
            absl::StrCat("names ", site, ", which already has the stream"));
      }
      if (!seen.insert(site).second) {
        return bad(absl::StrCat("names ", site, " twice"));
      }
    }
    return grpc::Status::OK;
  }

  // The assembled model, or why its signature does not hold.
  absl::StatusOr<Model> Verified(absl::StatusOr<Model> model) {
    if (!model.ok() || !signed_header_.has_value()) return model;
    absl::Status verified = service_->options_.verifier->VerifyHeader(
        *signed_header_, receiver_.assembler()->stream_digest());
    if (verified.ok()) return model;
    const std::string by =
        forwarded_by_.empty()
            ? std::string("sent by ")
            : absl::StrCat("forwarded by ", forwarded_by_, " for ");
    SWARM_LOG_WARNING("refused a learn task %s%s: %s", by,
                      signed_header_->sender(), verified.message());
    return absl::Status(
        verified.code(),
        absl::StrCat("learn task ", by, signed_header_->sender(), ": ",
                     verified.message()));
  }

  // Forwards the stream to relay_to[0], with the rest of the list.
  void StartRelay(const v1::ModelHeader& header) {
    const std::string next = header.relay_to(0);
    const std::optional<v1::JobConfig> job = service_->controller_->job();
    const v1::SiteInfo* site = job.has_value() ? FindSite(*job, next) : nullptr;
    if (service_->options_.forward_channels == nullptr || site == nullptr) {
      // Not forwarded: the sender sends to the rest itself.
      SWARM_LOG_WARNING("round %d: not forwarding the learn task to %s: %s",
                        header.round(), next,
                        site == nullptr ? "not a site of the job"
                                        : "this site does not forward");
      return;
    }
    v1::ModelHeader onward = header;
    onward.mutable_relay_to()->DeleteSubrange(0, 1);
    FrameRelay::Options options;
    options.stall_timeout = ForwardStall(*job, onward);
    options.what = absl::StrCat("round ", header.round(),
                                " learn task forwarded to ", next);
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->relay_pending = true;
    }
    std::shared_ptr<Shared> shared = shared_;
    relay_ = FrameRelay::Start(
        service_->options_.forward_channels->Get(site->address()).get(),
        "LearnTask", ForwardContext(header), EncodeHeaderFrame(onward),
        std::move(options), service_->watchdog_.get(),
        [this] { StartRead(&frame_); },
        [shared, next](absl::StatusOr<v1::Reply> reply) {
          RelayDone(shared, next, std::move(reply));
        });
  }

  // Every read is done: the model (or why the stream broke) goes to the
  // site, whose reply finishes the call, now or later.
  void HandToSite(absl::StatusOr<Model> model) {
    if (service_->options_.on_model_received) {
      received_.status = model.status();
      service_->options_.on_model_received(received_);
    }
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->waiting_for_site = true;
    }
    std::shared_ptr<Shared> shared = shared_;
    receiver_.Finish(std::move(model), [shared](v1::Reply reply) {
      Answer(shared, std::move(reply));
    });
  }

  void EndNow(const grpc::Status& status) {
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->call == nullptr) return;
      shared_->call = nullptr;
    }
    Finish(status);
  }

  static void Answer(const std::shared_ptr<Shared>& shared, v1::Reply reply) {
    UploadCall* finishing = nullptr;
    {
      absl::MutexLock lock(&shared->mu);
      if (shared->call == nullptr) return;  // Cancelled.
      if (shared->relay_pending) {
        shared->own = std::move(reply);  // Sent with the next hop's answer.
        return;
      }
      *shared->reply = std::move(reply);
      shared->reply->mutable_relayed()->Swap(shared->relayed.mutable_relayed());
      finishing = shared->call;
      shared->call = nullptr;
    }
    // Outside the lock: the reactor may be deleted (OnDone) from here on.
    finishing->Finish(grpc::Status::OK);
  }

  // The next hop answered (for itself and the hops after it), or the
  // forward to it failed.
  static void RelayDone(const std::shared_ptr<Shared>& shared,
                        const std::string& next,
                        absl::StatusOr<v1::Reply> reply) {
    std::optional<v1::Reply> own;
    {
      absl::MutexLock lock(&shared->mu);
      AddRelayed(next, reply, &shared->relayed);
      shared->relay_pending = false;
      own = std::move(shared->own);
    }
    if (own.has_value()) Answer(shared, std::move(*own));
  }

  PeerService* const service_;
  grpc::CallbackServerContext* const context_;
  ModelReceiver receiver_;
  const std::shared_ptr<Shared> shared_;
  std::unique_ptr<CallSlot> slot_;
  grpc::ByteBuffer frame_;
  bool header_read_ = false;
  bool watched_ = false;
  ReceivedModel received_;  // What the header announced.
  // A signed stream: its header, checked against the digest at the end.
  std::optional<v1::ModelHeader> signed_header_;
  // A broadcast's forward: the previous hop.
  std::string forwarded_by_;
  // Forwarding to the next hop, if the header asks for it.
  std::shared_ptr<FrameRelay> relay_;
  // A partial sum passing through (StartChainHop): the output's digest and
  // frames not yet pushed.
  bool hop_ = false;
  std::atomic<bool> hop_read_done_{false};
  bool idle_watch_ = false;
  // Backpressure on a hop: after a push that found the next hop's queue
  // full, exactly one of OnHopRead (hop_room_ set: the room came first) and
  // the relay's on_room (hop_paused_ set: OnHopRead paused first) starts
  // the next read. Two reads at once fed one chunk twice and raced on
  // hop_pending_.
  absl::Mutex hop_mu_;
  bool hop_paused_ ABSL_GUARDED_BY(hop_mu_) = false;
  bool hop_room_ ABSL_GUARDED_BY(hop_mu_) = false;
  // ReadHop's last arming of the idle watch (reactor and on_room threads
  // take turns: a read is never started from both at once).
  bool idle_armed_ = false;
  absl::Time idle_armed_at_;
  absl::Time hop_stream_deadline_ = absl::InfiniteFuture();
  absl::Duration hop_idle_ = absl::Seconds(5);
  std::unique_ptr<StreamDigest> hop_digest_;
  uint64_t hop_chunks_ = 0;
  std::vector<grpc::ByteBuffer> hop_pending_;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* PeerService::ReceiveModel(
    grpc::CallbackServerContext* context, v1::Reply* reply) {
  auto* call = new UploadCall(this, context, reply);
  call->Start();
  return call;
}

}  // namespace swarm
