#include "rpc/peer_service.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/version.h"
#include "config/job_config.h"
#include "controller/model_receiver.h"
#include "controller/replies.h"
#include "rpc/frame_relay.h"
#include "rpc/grpc_stream.h"
#include "rpc/stream_watchdog.h"
#include "security/certificates.h"
#include "streaming/chunker.h"
#include "streaming/digest.h"

namespace swarm {
namespace {

// How much earlier than the caller's deadline a held RequestToSubmit answers,
// so the reply arrives in time.
constexpr absl::Duration kDeadlineMargin = kHoldMargin;
// How much earlier than its own deadline a forwarding site's call to the
// next hop ends, so that its answer (for itself and the hops after it)
// still reaches the previous hop in time.
constexpr absl::Duration kRelayMargin = absl::Seconds(1);

absl::Time CallDeadline(const grpc::ServerContextBase* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// "ipv4:10.0.0.1:5555" -> "ipv4:10.0.0.1": calls from one host share a
// budget when there is no certificate to tell peers apart.
std::string HostOf(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace

// One call counted against its peer's budget.
class PeerService::CallSlot {
 public:
  CallSlot(PeerService* service, std::string peer)
      : service_(service), peer_(std::move(peer)) {}
  ~CallSlot() { service_->ReleaseSlot(peer_); }
  CallSlot(const CallSlot&) = delete;
  CallSlot& operator=(const CallSlot&) = delete;

 private:
  PeerService* service_;
  std::string peer_;
};

grpc::Status PeerService::Authorize(grpc::ServerContextBase* context,
                                    absl::string_view method, Rule rule,
                                    absl::string_view sender,
                                    std::unique_ptr<CallSlot>* slot) {
  const security::PeerIdentity identity = security::IdentityOf(*context);
  auto refuse = [&](grpc::StatusCode code, std::string reason) {
    SWARM_LOG_WARNING(
        "refused %s from %s (%s): %s", method,
        identity.name.empty() ? std::string(sender) : identity.name,
        context->peer(), reason);
    return grpc::Status(code, reason);
  };
  if (options_.tls) {
    if (!identity.authenticated) {
      return refuse(grpc::StatusCode::UNAUTHENTICATED,
                    "no verified client certificate");
    }
    switch (rule) {
      case Rule::kAdmin:
        if (identity.role != security::kAdminRole) {
          return refuse(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method, " is for admins; ", identity.name,
                                     " has the role \"", identity.role, "\""));
        }
        break;
      case Rule::kAnyPeer:
        break;
      case Rule::kSender:
        if (identity.role != security::kSiteRole) {
          return refuse(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method, " is for sites; ", identity.name,
                                     " has the role \"", identity.role, "\""));
        }
        break;
      case Rule::kFetch: {
        if (identity.role == security::kAdminRole) break;
        const std::optional<v1::JobConfig> job = controller_->job();
        if (identity.role != security::kSiteRole || !job.has_value() ||
            FindSite(*job, identity.name) == nullptr) {
          return refuse(
              grpc::StatusCode::PERMISSION_DENIED,
              absl::StrCat(identity.name,
                           " is neither an admin nor a site of the job"));
        }
        break;
      }
    }
    // Every request names its sender, and under TLS that name is the
    // certificate's, whatever the call (the README's rule): a log line or an
    // abort reason never shows a name the caller could not prove.
    if (sender != identity.name) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED,
                    absl::StrCat("sender \"", sender,
                                 "\" does not match the certificate of \"",
                                 identity.name, "\""));
    }
  }
  // Whose budget the call counts against: the certificate's name. Without
  // TLS the claimed sender is trusted (as everywhere in insecure mode), on
  // its host: several sites often share one host, and counted by host alone
  // they would starve each other.
  const std::string peer =
      identity.authenticated ? identity.name
      : sender.empty()       ? HostOf(context->peer())
                       : absl::StrCat(sender, "@", HostOf(context->peer()));
  {
    absl::MutexLock lock(&mu_);
    int& calls = calls_[peer];
    if (calls >= options_.max_calls_per_peer) {
      return refuse(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(peer, " already has ", calls, " calls in flight (limit ",
                       options_.max_calls_per_peer, ")"));
    }
    ++calls;
  }
  *slot = std::make_unique<CallSlot>(this, peer);
  return grpc::Status::OK;
}

void PeerService::ReleaseSlot(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(peer);
  if (it != calls_.end() && --it->second <= 0) calls_.erase(it);
}

PeerService::~PeerService() = default;

PeerService::PeerService(SiteDriver* controller, PeerServiceOptions options)
    : controller_(controller),
      options_(std::move(options)),
      watchdog_(std::make_unique<StreamWatchdog>()) {
  AddUnaryMethod<v1::ConfigureRequest, v1::Reply>(
      "Configure",
      [this](grpc::ServerContext* context, const v1::ConfigureRequest* request,
             v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed = Authorize(context, "Configure", Rule::kAdmin,
                                         request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        // A sender of another wire protocol major version is refused before
        // the job is looked at (common/version.h).
        absl::Status compatible = CheckProtocolCompatible(
            PeerProtocolVersion(request->protocol(), request->has_protocol()),
            absl::StrCat("sender ", request->sender()));
        if (!compatible.ok()) {
          reply->set_outcome(v1::OUTCOME_BAD_REQUEST);
          reply->set_message(std::string(compatible.message()));
          return grpc::Status::OK;
        }
        if (options_.check_configure) {
          absl::Status allowed_here = options_.check_configure(*request);
          if (!allowed_here.ok()) {
            reply->set_outcome(v1::OUTCOME_REJECTED);
            reply->set_message(std::string(allowed_here.message()));
            return grpc::Status::OK;
          }
        }
        *reply = controller_->Configure(*request);
        return grpc::Status::OK;
      });
  AddUnaryMethod<v1::StartRequest, v1::Reply>(
      "Start", [this](grpc::ServerContext* context,
                      const v1::StartRequest* request, v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed =
            Authorize(context, "Start", Rule::kAdmin, request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        // Waits for the first round's learn tasks to be out, at most until
        // shortly before the call's deadline (an hour without one), so that
        // the "start goes on" answer reaches the caller in time.
        absl::Time deadline = absl::Now() + absl::Hours(1);
        if (context->deadline() !=
            std::chrono::system_clock::time_point::max()) {
          deadline = std::min(deadline, absl::FromChrono(context->deadline()) -
                                            kDeadlineMargin);
        }
        *reply = controller_->Start(*request, deadline);
        return grpc::Status::OK;
      });
  auto receive = [this](grpc::CallbackServerContext* context,
                        v1::Reply* reply) {
    return ReceiveModel(context, reply);
  };
  AddCallbackUploadMethod("LearnTask", receive);
  AddCallbackUnaryMethod<v1::SubmitPermissionRequest,
                         v1::SubmitPermissionReply>(
      "RequestToSubmit", [this](grpc::CallbackServerContext* context,
                                const v1::SubmitPermissionRequest* request,
                                v1::SubmitPermissionReply* reply) {
        return RequestToSubmit(context, request, reply);
      });
  AddCallbackUploadMethod("SubmitResult", receive);
  AddUnaryMethod<v1::ShareBestRequest, v1::Reply>(
      "ShareBest",
      [this](grpc::ServerContext* context, const v1::ShareBestRequest* request,
             v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed = Authorize(context, "ShareBest", Rule::kSender,
                                         request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        *reply = controller_->ShareBest(*request);
        return grpc::Status::OK;
      });
  AddCallbackUploadMethod("FinalResult", receive);
  AddCallbackUnaryMethod<v1::StatusRequest, v1::StatusReply>(
      "Status",
      [this](grpc::CallbackServerContext* context,
             const v1::StatusRequest* request, v1::StatusReply* reply) {
        return Status(context, request, reply);
      });
  AddModelDownloadMethod(
      "FetchModel",
      [this](grpc::ServerContext* context, const v1::FetchModelRequest* request,
             grpc::ServerWriter<grpc::ByteBuffer>* writer) {
        return FetchModel(context, request, writer);
      });
  AddUnaryMethod<v1::HistoryRequest, v1::HistoryReply>(
      "History",
      [this](grpc::ServerContext* context, const v1::HistoryRequest* request,
             v1::HistoryReply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed = Authorize(context, "History", Rule::kAnyPeer,
                                         request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        if (!options_.history) {
          return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              "this site keeps no history");
        }
        *reply = options_.history(*request);
        return grpc::Status::OK;
      });
  AddUnaryMethod<v1::AbortRequest, v1::Reply>(
      "Abort", [this](grpc::ServerContext* context,
                      const v1::AbortRequest* request, v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed =
            Authorize(context, "Abort", Rule::kAdmin, request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        *reply = controller_->Abort(*request);
        return grpc::Status::OK;
      });
}

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

// A unary call answered now or held until something changes, as a reactor:
// a held call parks no thread. `attempt(last)` computes the reply and says
// whether it is the answer (with `last`, the deadline has come: it must be);
// otherwise `wait(wake)` asks the controller to run `wake` at the next
// change or at the deadline. The call finishes with `status()` once
// answered, or CANCELLED when the client goes away.
class PeerService::HeldCall final : public grpc::ServerUnaryReactor {
 public:
  using Attempt = std::function<bool(bool last)>;
  using Wait = std::function<void(absl::Time until, std::function<void()>)>;

  HeldCall(std::unique_ptr<CallSlot> slot, absl::Time deadline, Attempt attempt,
           Wait wait, std::function<grpc::Status()> status)
      : shared_(std::make_shared<Shared>()),
        slot_(std::move(slot)),
        deadline_(deadline),
        attempt_(std::move(attempt)),
        wait_(std::move(wait)),
        status_(std::move(status)) {
    absl::MutexLock lock(&shared_->mu);
    shared_->call = this;
  }

  void Start() { Wake(shared_); }

  void OnCancel() override {
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->call == nullptr) return;
      shared_->call = nullptr;
      slot_.reset();
    }
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override { delete this; }

 private:
  // What a pending wake-up holds: the call, until it finishes.
  struct Shared {
    absl::Mutex mu;
    HeldCall* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  static void Wake(const std::shared_ptr<Shared>& shared) {
    HeldCall* finishing = nullptr;
    grpc::Status status;
    {
      absl::MutexLock lock(&shared->mu);
      HeldCall* call = shared->call;
      if (call == nullptr) return;  // Answered or cancelled already.
      const absl::Time now = absl::Now();
      const bool last = now >= call->deadline_;
      if (!call->attempt_(last) && !last) {
        // Woken at the latest every 30 s, to look again.
        call->wait_(std::min(call->deadline_, now + absl::Seconds(30)),
                    [shared] { Wake(shared); });
        return;
      }
      shared->call = nullptr;
      call->slot_.reset();
      status = call->status_();
      finishing = call;
    }
    // Outside the lock: the reactor may be deleted (OnDone) from here on.
    finishing->Finish(status);
  }

  const std::shared_ptr<Shared> shared_;
  std::unique_ptr<CallSlot> slot_;
  const absl::Time deadline_;
  const Attempt attempt_;
  const Wait wait_;
  const std::function<grpc::Status()> status_;
};

// A permission request as a reactor: the site answers it at once, or holds
// a RETRY until a slot frees or the round opens (up to the caller's
// deadline); the reactor is finished by that answer. No thread waits.
class PeerService::PermissionCall final : public grpc::ServerUnaryReactor {
 public:
  PermissionCall(SiteDriver* site, std::unique_ptr<CallSlot> slot,
                 v1::SubmitPermissionReply* reply)
      : site_(site), shared_(std::make_shared<Shared>()) {
    absl::MutexLock lock(&shared_->mu);
    shared_->call = this;
    shared_->slot = std::move(slot);
    shared_->reply = reply;
  }

  void Start(const v1::SubmitPermissionRequest& request, absl::Time hold) {
    // The answer may finish (and delete) this reactor before
    // RequestToSubmit returns: only the shared part is touched after it.
    std::shared_ptr<Shared> shared = shared_;
    const RequestId id = site_->RequestToSubmit(
        request, hold, [shared](v1::SubmitPermissionReply answer) {
          Answer(shared, std::move(answer));
        });
    absl::MutexLock lock(&shared->mu);
    shared->request = id;
  }

  void OnCancel() override {
    RequestId request = 0;
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->call == nullptr) return;  // Answered already.
      shared_->call = nullptr;
      shared_->slot.reset();
      request = shared_->request;
    }
    if (request != 0) site_->CancelRequest(request);
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override { delete this; }

 private:
  // What the site's answer finds: the call, until it finishes.
  struct Shared {
    absl::Mutex mu;
    PermissionCall* call ABSL_GUARDED_BY(mu) = nullptr;
    std::unique_ptr<CallSlot> slot ABSL_GUARDED_BY(mu);
    v1::SubmitPermissionReply* reply ABSL_GUARDED_BY(mu) = nullptr;
    RequestId request ABSL_GUARDED_BY(mu) = 0;
  };

  static void Answer(const std::shared_ptr<Shared>& shared,
                     v1::SubmitPermissionReply answer) {
    PermissionCall* finishing = nullptr;
    {
      absl::MutexLock lock(&shared->mu);
      if (shared->call == nullptr) return;  // Cancelled.
      *shared->reply = std::move(answer);
      finishing = shared->call;
      shared->call = nullptr;
      shared->slot.reset();
    }
    // Outside the lock: the reactor may be deleted (OnDone) from here on.
    finishing->Finish(grpc::Status::OK);
  }

  SiteDriver* const site_;
  const std::shared_ptr<Shared> shared_;
};

grpc::ServerUnaryReactor* PeerService::RequestToSubmit(
    grpc::CallbackServerContext* context,
    const v1::SubmitPermissionRequest* request,
    v1::SubmitPermissionReply* reply) {
  std::unique_ptr<CallSlot> slot;
  grpc::Status allowed = Authorize(context, "RequestToSubmit", Rule::kSender,
                                   request->sender(), &slot);
  if (!allowed.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(allowed);
    return reactor;
  }
  auto* call = new PermissionCall(controller_, std::move(slot), reply);
  call->Start(*request, CallDeadline(context) - kDeadlineMargin);
  return call;
}

grpc::ServerUnaryReactor* PeerService::Status(
    grpc::CallbackServerContext* context, const v1::StatusRequest* request,
    v1::StatusReply* reply) {
  std::unique_ptr<CallSlot> slot;
  grpc::Status allowed =
      Authorize(context, "Status", Rule::kAnyPeer, request->sender(), &slot);
  if (!allowed.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(allowed);
    return reactor;
  }
  const absl::Time deadline =
      request->wait_for_change_ms() == 0
          ? absl::InfinitePast()
          : std::min(CallDeadline(context) - kDeadlineMargin,
                     absl::Now() + absl::Milliseconds(static_cast<int64_t>(
                                       request->wait_for_change_ms())));
  auto* call = new HeldCall(
      std::move(slot), deadline,
      [this, request, reply](bool last) {
        *reply = controller_->Status();
        *reply->mutable_protocol() = OwnProtocolVersion();
        reply->set_build(BuildText());
        return last || reply->version() != request->known_version();
      },
      [this, request](absl::Time until, std::function<void()> wake) {
        controller_->WhenStatusChanges(request->known_version(), until,
                                       std::move(wake));
      },
      [request, reply] {
        if (!request->job_id().empty() &&
            reply->status().job_id() != request->job_id()) {
          return grpc::Status(
              grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("site runs job \"", reply->status().job_id(),
                           "\", not \"", request->job_id(), "\""));
        }
        return grpc::Status::OK;
      });
  call->Start();
  return call;
}

grpc::Status PeerService::FetchModel(
    grpc::ServerContext* context, const v1::FetchModelRequest* request,
    grpc::ServerWriter<grpc::ByteBuffer>* writer) {
  std::unique_ptr<CallSlot> slot;
  grpc::Status allowed =
      Authorize(context, "FetchModel", Rule::kFetch, request->sender(), &slot);
  if (!allowed.ok()) return allowed;
  absl::StatusOr<std::shared_ptr<const Model>> model =
      controller_->ModelForFetch(*request);
  if (!model.ok()) return ToGrpcStatus(model.status());
  v1::ModelHeader header;
  header.set_kind(request->which() == v1::MODEL_SELECTOR_BEST
                      ? v1::MODEL_KIND_BEST
                  : request->which() == v1::MODEL_SELECTOR_LAST
                      ? v1::MODEL_KIND_LAST
                      : v1::MODEL_KIND_ROUND_GLOBAL);
  header.set_job_id(request->job_id());
  for (const auto& [key, value] : (*model)->metadata()) {
    (*header.mutable_metadata())[key] = value;
  }
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(*model, header);
  if (!chunker.ok()) return ToGrpcStatus(chunker.status());
  if (!SendModelStream(writer, chunker->get())) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away");
  }
  return grpc::Status::OK;
}

}  // namespace swarm
