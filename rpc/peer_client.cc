#include "rpc/peer_client.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/frame_relay.h"
#include "rpc/grpc_stream.h"
#include "rpc/stream_watchdog.h"
#include "streaming/chunker.h"

namespace swarm {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// Names the peer in a failed call's status.
absl::Status PeerError(const v1::SiteInfo& to, absl::string_view call,
                       const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(call, " to ", to.name(), " (", to.address(),
                                   "): ", status.message()));
}

// A model stream's end as the caller's answer: the peer's reply, or the
// failure naming the peer.
std::function<void(absl::StatusOr<v1::Reply>)> StreamAnswer(
    const v1::SiteInfo& to, absl::string_view method,
    PeerTransport::Done done) {
  return [to, method, done = std::move(done)](absl::StatusOr<v1::Reply> reply) {
    if (!reply.ok()) return done(PeerError(to, method, reply.status()));
    PeerReply peer;
    peer.reply = std::move(*reply);
    done(std::move(peer));
  };
}

}  // namespace

absl::Duration StreamDeadline(uint64_t bytes) {
  return absl::Seconds(30) + absl::Seconds(static_cast<double>(bytes) / 20e6);
}

PeerChannels::PeerChannels(
    std::shared_ptr<grpc::ChannelCredentials> credentials)
    : credentials_(std::move(credentials)) {}

std::shared_ptr<grpc::Channel> PeerChannels::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  grpc::ChannelArguments args;
  ApplyModelStreamArgs(&args, AssemblerLimits());
  // A peer that comes back (a restart) is reachable within a second. gRPC's
  // default reconnect backoff grows to 120 s, and while it waits every call
  // fails at once with "Connection refused" although the peer is up again:
  // a trainer then fails over away from an aggregator that is running
  // (the split that faults_test AggregatorKilledBeforeItsTaskArrivesRestarts
  // caught in CI). A dead peer costs one connection attempt a second. (The
  // minimum, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, stays at its 20 s: it is
  // also each attempt's connect deadline, TLS handshake included.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A connection a network cut broke is found dead within about 20 s and
  // closed (a ping every 10 s, 10 s for its answer, with or without calls),
  // so calls made after the cut heals go on a fresh connection. Without
  // keepalive, calls kept going onto the dead one and ran into their
  // deadlines for as long as TCP retransmitted (52 s after a 60 s cut in
  // faults_test LongerCutWithABridgeInALaterRound), failing over away from
  // sites that were reachable again. The peer's server accepts pings this
  // often (ApplyModelStreamArgs).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kPeerKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kPeerKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = grpc::CreateCustomChannel(address, credentials_, args);
  channels_.emplace(address, channel);
  return channel;
}

GrpcPeerTransport::GrpcPeerTransport(PeerChannels* channels, TaskRunner* runner,
                                     absl::Duration unary_timeout)
    : channels_(channels),
      runner_(runner),
      unary_timeout_(unary_timeout),
      watchdog_(std::make_shared<StreamWatchdog>()) {}

GrpcPeerTransport::~GrpcPeerTransport() = default;

void GrpcPeerTransport::PrepareForJob(const v1::JobConfig& job) {
  for (const v1::SiteInfo& site : job.sites()) {
    // Starts connecting (and the TLS handshake) in the background.
    channels_->Get(site.address())->GetState(/*try_to_connect=*/true);
  }
}

void GrpcPeerTransport::Send(const v1::SiteInfo& to, PeerMessage message,
                             Done done) {
  if (message.is_model_stream()) {
    if (message.header.kind() == v1::MODEL_KIND_PARTIAL_SUM &&
        message.model != nullptr) {
      // The head of a reduction chain: each hop changes the sum, so it is
      // not signed; sent like a forward, so that a hop that stops reading
      // is given up after the stall timeout.
      runner_->Post([this, to, message = std::move(message),
                     done = std::move(done)]() mutable {
        SendChainHead(to, std::move(message), std::move(done));
      });
      return;
    }
    if (message.header.relay_to_size() > 0 && message.model != nullptr) {
      runner_->Post([this, to, message = std::move(message),
                     done = std::move(done)]() mutable {
        SignAndSend(to, std::move(message), std::move(done));
      });
      return;
    }
    return SendStream(to, std::move(message), std::move(done));
  }
  const absl::Duration timeout = std::max(message.timeout, unary_timeout_);
  SendUnary(to, std::move(message), std::move(done), timeout);
}

void GrpcPeerTransport::SignAndSend(const v1::SiteInfo& to, PeerMessage message,
                                    Done done) {
  if (signer_ == nullptr) {
    return SendChainHead(to, std::move(message), std::move(done));
  }
  // The signature covers the stream digest, which must be SHA-256; the
  // chunks are the same ones SendChainHead cuts (same model, chunk size).
  message.header.set_digest_algorithm(v1::DIGEST_SHA256);
  message.header.set_chunk_size(message.header.chunk_size() != 0
                                    ? message.header.chunk_size()
                                    : kDefaultChunkSize);
  absl::StatusOr<std::unique_ptr<Chunker>> chunker = Chunker::Create(
      message.model, message.header, message.header.chunk_size());
  absl::StatusOr<std::string> signature = absl::UnknownError("not signed");
  if (!chunker.ok()) {
    signature = chunker.status();
  } else {
    while ((*chunker)->NextChunk().has_value()) {
    }
    const std::string digest = (*chunker)->Trailer().digest();
    message.header = (*chunker)->header();
    signature = signer_->Sign(message.header, digest);
  }
  if (!signature.ok()) {
    return done(
        PeerError(to, CallKindName(message.kind),
                  absl::Status(signature.status().code(),
                               absl::StrCat("signing the model: ",
                                            signature.status().message()))));
  }
  message.header.set_digest_signature(*signature);
  message.header.set_signer_certificate_pem(signer_->certificate_pem());
  SendChainHead(to, std::move(message), std::move(done));
}

namespace {

// Feeds a model's frames into a FrameRelay as it takes them: the head of a
// broadcast is sent like a forward, so a head that stops reading is given up
// after the stall timeout instead of at the stream's deadline (the whole
// chain waits behind it).
class ChainHeadFeed {
 public:
  explicit ChainHeadFeed(std::unique_ptr<Chunker> chunker)
      : chunker_(std::move(chunker)),
        keep_alive_(chunker_->model()->storage()) {}

  void set_relay(std::shared_ptr<FrameRelay> relay) {
    absl::MutexLock lock(&mu_);
    relay_ = std::move(relay);
  }

  // Pushes frames until the relay is full (its on_room calls Pump again) or
  // every frame is out. Runs on one thread at a time: a second call comes
  // only from on_room, after a push that found the queue full.
  void Pump() {
    std::shared_ptr<FrameRelay> relay;
    {
      absl::MutexLock lock(&mu_);
      relay = relay_;
    }
    if (relay == nullptr) return;
    while (true) {
      std::optional<ChunkRef> chunk = chunker_->NextChunk();
      if (!chunk.has_value()) {
        relay->Push(EncodeTrailerFrame(chunker_->Trailer()));
        relay->Close();
        return;
      }
      const FrameRelay::PushResult pushed =
          relay->Push(EncodeChunkFrame(*chunk, keep_alive_));
      if (pushed != FrameRelay::kQueued) return;  // Full, or ended.
    }
  }

  void Release() {
    absl::MutexLock lock(&mu_);
    relay_.reset();
  }

 private:
  const std::unique_ptr<Chunker> chunker_;
  const std::shared_ptr<const void> keep_alive_;
  absl::Mutex mu_;
  std::shared_ptr<FrameRelay> relay_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void GrpcPeerTransport::SendChainHead(const v1::SiteInfo& to,
                                      PeerMessage message, Done done) {
  const uint64_t chunk_size = message.header.chunk_size() != 0
                                  ? message.header.chunk_size()
                                  : kDefaultChunkSize;
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(message.model, message.header, chunk_size);
  if (!chunker.ok()) return done(chunker.status());
  const v1::ModelHeader header = (*chunker)->header();
  auto feed = std::make_shared<ChainHeadFeed>(std::move(*chunker));
  const absl::Duration timeout = std::max(message.timeout, unary_timeout_);
  auto context = std::make_unique<grpc::ClientContext>();
  SetDeadline(context.get(),
              std::max(timeout, StreamDeadline(message.model->total_bytes())));
  FrameRelay::Options options;
  options.max_queued_frames = 8;
  options.stall_timeout = message.relay_stall > absl::ZeroDuration()
                              ? message.relay_stall
                              : timeout;
  options.what = absl::StrCat("round ", header.round(),
                              header.kind() == v1::MODEL_KIND_PARTIAL_SUM
                                  ? " partial sum to "
                                  : " learn task broadcast to ",
                              to.name());
  const absl::string_view method = CallKindName(message.kind);
  std::shared_ptr<FrameRelay> relay = FrameRelay::Start(
      channels_->Get(to.address()).get(), method, std::move(context),
      EncodeHeaderFrame(header), std::move(options), watchdog_,
      [feed] { feed->Pump(); },
      [feed, answer = StreamAnswer(to, method, std::move(done))](
          absl::StatusOr<v1::Reply> reply) {
        feed->Release();  // Breaks the cycle feed -> relay -> callbacks.
        answer(std::move(reply));
      });
  feed->set_relay(std::move(relay));
  feed->Pump();
}

void GrpcPeerTransport::SendStream(const v1::SiteInfo& to, PeerMessage message,
                                   Done done) {
  const absl::Duration timeout = std::max(message.timeout, unary_timeout_);
  const absl::string_view method = CallKindName(message.kind);
  // A header-only stream (a failed result) carries an empty model.
  std::shared_ptr<const Model> model = message.model != nullptr
                                           ? message.model
                                           : std::make_shared<const Model>();
  const uint64_t chunk_size = message.header.chunk_size() != 0
                                  ? message.header.chunk_size()
                                  : kDefaultChunkSize;
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(model, message.header, chunk_size);
  if (!chunker.ok()) {
    // Not inside Send: the caller may hold what `done` needs.
    runner_->Post(
        [done = std::move(done), status = chunker.status()] { done(status); });
    return;
  }
  auto context = std::make_unique<grpc::ClientContext>();
  SetDeadline(context.get(),
              std::max(timeout, StreamDeadline(model->total_bytes())));
  StartModelUpload(channels_->Get(to.address()).get(), method,
                   std::move(context), std::move(*chunker),
                   StreamAnswer(to, method, std::move(done)));
}

void GrpcPeerTransport::SendUnary(const v1::SiteInfo& to, PeerMessage message,
                                  Done done, absl::Duration timeout) {
  // A small call on the callback API: the state lives until it ends.
  struct Unary {
    grpc::ClientContext context;
    v1::SubmitPermissionRequest permission;
    v1::ShareBestRequest share_best;
    PeerReply reply;
  };
  auto call = std::make_shared<Unary>();
  SetDeadline(&call->context, timeout);
  std::unique_ptr<v1::Peer::Stub> stub =
      v1::Peer::NewStub(channels_->Get(to.address()));
  auto finished = [call, to, method = CallKindName(message.kind),
                   done = std::move(done)](grpc::Status status) {
    if (!status.ok()) {
      return done(PeerError(to, method, ToAbslStatus(status)));
    }
    done(std::move(call->reply));
  };
  switch (message.kind) {
    case CallKind::kRequestToSubmit:
      call->permission = std::move(message.permission);
      stub->async()->RequestToSubmit(&call->context, &call->permission,
                                     &call->reply.permission,
                                     std::move(finished));
      return;
    case CallKind::kShareBest:
      call->share_best = std::move(message.share_best);
      stub->async()->ShareBest(&call->context, &call->share_best,
                               &call->reply.reply, std::move(finished));
      return;
    case CallKind::kLearnTask:
    case CallKind::kSubmitResult:
    case CallKind::kFinalResult:
      // Streams go through SendStream or SendRelayed; reaching here is a
      // caller's bug, answered as such rather than sent as another kind.
      finished(grpc::Status(grpc::StatusCode::INTERNAL,
                            absl::StrCat(CallKindName(message.kind),
                                         " is a model stream, not a unary "
                                         "call")));
      return;
  }
}

}  // namespace swarm
