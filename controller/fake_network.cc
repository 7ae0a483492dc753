#include "controller/fake_network.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/model_receiver.h"
#include "controller/replies.h"
#include "streaming/assembler.h"
#include "streaming/chunker.h"

namespace swarm {
namespace {

bool Matches(const CallMatcher& match, const CallRecord& record) {
  if (match.kind.has_value() && *match.kind != record.kind) return false;
  if (!match.from.empty() && match.from != record.from) return false;
  if (!match.to.empty() && match.to != record.to) return false;
  if (match.round.has_value() && *match.round != record.round) return false;
  return true;
}

std::string Describe(const CallRecord& record) {
  return absl::StrCat(CallKindName(record.kind), " from ", record.from, " to ",
                      record.to);
}

absl::Status Unavailable(const CallRecord& record, absl::string_view why) {
  return absl::UnavailableError(
      absl::StrCat("fake network: ", Describe(record), ": ", why));
}

}  // namespace

absl::string_view FaultName(Fault fault) {
  switch (fault) {
    case Fault::kDrop:
      return "drop";
    case Fault::kDropReply:
      return "drop_reply";
    case Fault::kLoseAfterAck:
      return "lose_after_ack";
    case Fault::kDuplicate:
      return "duplicate";
  }
  return "?";
}

// The PeerTransport of one site: every call names that site as its sender.
class FakeNetwork::SiteTransport final : public PeerTransport {
 public:
  SiteTransport(FakeNetwork* network, std::string site)
      : network_(network), site_(std::move(site)) {}
  void Send(const v1::SiteInfo& to, PeerMessage message, Done done) override {
    network_->Send(site_, to, std::move(message), std::move(done));
  }

 private:
  FakeNetwork* const network_;
  const std::string site_;
};

FakeNetwork::FakeNetwork(ManualRunner* runner)
    : manual_(runner), hold_retries_(true) {}

FakeNetwork::FakeNetwork()
    : manual_(nullptr),
      pool_(std::make_unique<ThreadPoolRunner>(4)),
      hold_retries_(true) {}

FakeNetwork::~FakeNetwork() = default;

void FakeNetwork::AddSite(const std::string& name, SiteDriver* site) {
  absl::MutexLock lock(&mu_);
  sites_[name] = site;
}

PeerTransport* FakeNetwork::TransportFor(const std::string& name) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<SiteTransport>& transport = transports_[name];
  if (transport == nullptr) {
    transport = std::make_unique<SiteTransport>(this, name);
  }
  return transport.get();
}

void FakeNetwork::Isolate(const std::string& site) {
  absl::MutexLock lock(&mu_);
  isolated_.insert(site);
}

void FakeNetwork::Recover(const std::string& site) {
  absl::MutexLock lock(&mu_);
  isolated_.erase(site);
}

void FakeNetwork::Partition(std::set<std::string> side) {
  absl::MutexLock lock(&mu_);
  partition_ = std::move(side);
}

void FakeNetwork::CutLinks(const std::string& site,
                           const std::set<std::string>& others) {
  absl::MutexLock lock(&mu_);
  for (const std::string& other : others) cut_.insert({site, other});
}

void FakeNetwork::Heal() {
  absl::MutexLock lock(&mu_);
  partition_.clear();
  cut_.clear();
}

bool FakeNetwork::IsIsolated(const std::string& site) const {
  absl::MutexLock lock(&mu_);
  return isolated_.count(site) > 0;
}

void FakeNetwork::AddFault(CallMatcher match, Fault fault, int count) {
  absl::MutexLock lock(&mu_);
  faults_.push_back(FaultRule{std::move(match), fault, count});
}

void FakeNetwork::ClearFaults() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
}

void FakeNetwork::AddDelay(CallMatcher match, absl::Duration latency,
                           absl::Duration transfer) {
  absl::MutexLock lock(&mu_);
  delays_.push_back(DelayRule{std::move(match), latency, transfer});
}

void FakeNetwork::set_hold_permission_retries(bool hold) {
  absl::MutexLock lock(&mu_);
  hold_retries_ = hold;
}

void FakeNetwork::set_chunk_size(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  chunk_size_ = bytes;
}

void FakeNetwork::SetObserver(std::function<void(const CallRecord&)> observer) {
  absl::MutexLock lock(&mu_);
  observer_ = std::move(observer);
}

std::vector<CallRecord> FakeNetwork::Log() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

int FakeNetwork::calls_in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

void FakeNetwork::Shutdown() {
  std::unique_ptr<ThreadPoolRunner> pool;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    auto idle = [this]()
                    ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(30));
    pool = std::move(pool_);
  }
  pool.reset();  // Runs no further delivery; joins the threads.
}

absl::Time FakeNetwork::Now() const {
  return manual_ != nullptr ? manual_->Now() : absl::Now();
}

void FakeNetwork::At(absl::Time when, std::function<void()> step) {
  if (manual_ != nullptr) {
    manual_->PostAt(when, std::move(step));
    return;
  }
  absl::MutexLock lock(&mu_);
  if (pool_ != nullptr) pool_->PostAt(when, std::move(step));
}

bool FakeNetwork::Reachable(const CallRecord& record) const {
  absl::MutexLock lock(&mu_);
  return !shut_down_ && isolated_.count(record.from) == 0 &&
         isolated_.count(record.to) == 0 &&
         !Partitioned(record.from, record.to);
}

SiteDriver* FakeNetwork::Target(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = sites_.find(name);
  return it == sites_.end() ? nullptr : it->second;
}

// ---------------------------------------------------------------------------
// A call: send, arrive, deliver (once or twice), answer.

void FakeNetwork::Send(const std::string& from, const v1::SiteInfo& to,
                       PeerMessage message, PeerTransport::Done done) {
  if (Relayed(message)) {
    return SendRelayed(from, to, std::move(message), std::move(done));
  }
  auto call = std::make_shared<Call>();
  CallRecord& record = call->record;
  record.kind = message.kind;
  record.from = from;
  record.to = to.name();
  record.round = message.round();
  if (message.is_model_stream()) {
    record.aggregator = message.header.aggregator();
    record.model_kind = message.header.kind();
    record.failed_result = message.header.failed();
    record.body_bytes =
        message.model != nullptr ? message.model->total_bytes() : 0;
  }
  call->message = std::move(message);
  call->done = std::move(done);
  call->target = Target(record.to);
  Plan(*call);
  if (call->fault == Fault::kDrop ||
      (call->fault == Fault::kLoseAfterAck &&
       record.kind == CallKind::kRequestToSubmit)) {
    return Answer(call, Unavailable(record, record.fault));
  }
  if (call->target == nullptr) {
    return Answer(call, Unavailable(record, "no such site"));
  }
  At(record.start + call->latency,
     [this, call] { Run(call->record.to, [this, call] { Arrive(call); }); });
}

void FakeNetwork::Plan(Call& call) {
  CallRecord& record = call.record;
  std::function<void(const CallRecord&)> observer;
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    record.start = Now();
    observer = observer_;
  }
  if (observer) observer(record);
  absl::MutexLock lock(&mu_);
  if (shut_down_ || isolated_.count(record.from) > 0 ||
      isolated_.count(record.to) > 0 || Partitioned(record.from, record.to)) {
    record.fault = shut_down_                            ? "shut_down"
                   : Partitioned(record.from, record.to) ? "partitioned"
                                                         : "isolated";
    call.fault = Fault::kDrop;
    return;
  }
  for (FaultRule& rule : faults_) {
    if (rule.remaining == 0 || !Matches(rule.match, record)) continue;
    if (rule.remaining > 0) --rule.remaining;
    call.fault = rule.fault;
    record.fault = std::string(FaultName(rule.fault));
    break;
  }
  for (const DelayRule& rule : delays_) {
    if (!Matches(rule.match, record)) continue;
    call.latency = rule.latency;
    call.transfer = rule.transfer;
    break;
  }
}

void FakeNetwork::Arrive(std::shared_ptr<Call> call) {
  if (!Reachable(call->record)) {
    return Answer(call, Unavailable(call->record, "unreachable on arrival"));
  }
  if (call->fault == Fault::kLoseAfterAck) {
    PeerReply acked;
    acked.reply = OkReply("acknowledged (lost by the fake network)");
    return Answer(call, std::move(acked));
  }
  Deliver(call, [this, call](absl::StatusOr<PeerReply> reply) {
    // The duplicate follows the original back to back; its reply is lost.
    if (call->fault == Fault::kDuplicate) {
      Deliver(call, [](absl::StatusOr<PeerReply>) {});
    }
    Answer(call, std::move(reply));
  });
}

void FakeNetwork::Deliver(
    std::shared_ptr<Call> call,
    std::function<void(absl::StatusOr<PeerReply>)> answered) {
  {
    absl::MutexLock lock(&mu_);
    ++call->record.deliveries;
  }
  const PeerMessage& message = call->message;
  switch (message.kind) {
    case CallKind::kRequestToSubmit: {
      bool hold;
      {
        absl::MutexLock lock(&mu_);
        hold = hold_retries_;
      }
      const absl::Time until =
          hold ? call->record.start + message.timeout - kHoldMargin
               : absl::InfinitePast();
      call->target->RequestToSubmit(
          message.permission, until,
          [answered = std::move(answered)](v1::SubmitPermissionReply reply) {
            PeerReply peer;
            peer.permission = std::move(reply);
            answered(std::move(peer));
          });
      return;
    }
    case CallKind::kShareBest: {
      PeerReply peer;
      peer.reply = call->target->ShareBest(message.share_best);
      answered(std::move(peer));
      return;
    }
    case CallKind::kLearnTask:
    case CallKind::kSubmitResult:
    case CallKind::kFinalResult:
      DeliverStream(std::move(call), std::move(answered));
      return;
  }
}

void FakeNetwork::DeliverStream(
    std::shared_ptr<Call> call,
    std::function<void(absl::StatusOr<PeerReply>)> answered) {
  const PeerMessage& message = call->message;
  uint64_t chunk_size = message.header.chunk_size();
  if (chunk_size == 0) {
    absl::MutexLock lock(&mu_);
    chunk_size = chunk_size_ != 0 ? chunk_size_ : kMinChunkSize;
  }
  // A failed result has no body: an empty model, as GrpcPeerTransport sends.
  std::shared_ptr<const Model> model = message.model != nullptr
                                           ? message.model
                                           : std::make_shared<const Model>();
  absl::StatusOr<std::unique_ptr<Chunker>> created =
      Chunker::Create(model, message.header, chunk_size);
  if (!created.ok()) return answered(created.status());
  std::shared_ptr<Chunker> chunker = std::move(*created);
  auto receiver = std::make_shared<ModelReceiver>(call->target);
  v1::ModelFrame frame;
  *frame.mutable_header() = chunker->header();
  absl::Status admitted =
      receiver->Begin(chunker->header(), frame.ByteSizeLong());
  if (!admitted.ok()) return answered(admitted);  // The stream is refused.
  if (receiver->answered()) {
    PeerReply peer;
    peer.reply = receiver->reply();
    return answered(std::move(peer));
  }
  auto finished = [answered](v1::Reply reply) {
    PeerReply peer;
    peer.reply = std::move(reply);
    answered(std::move(peer));
  };
  // The body, after its transfer time. (Partial sums, which pass through
  // sites, are relayed streams: fake_relay.cc.)
  At(Now() + call->transfer,
     [this, call, chunker, receiver, answered, finished] {
       Assembler* assembler = receiver->assembler();
       if (!Reachable(call->record)) {
         // The connection broke mid-stream: the target's read fails.
         const absl::Status broken =
             Unavailable(call->record, "connection lost mid-stream");
         if (assembler != nullptr) assembler->Abort(broken);
         receiver->Finish(broken, [](v1::Reply) {});
         return answered(broken);
       }
       absl::StatusOr<Model> body = absl::InvalidArgumentError("bad header");
       if (assembler != nullptr) {
         absl::Status fed;
         while (fed.ok()) {
           std::optional<ChunkRef> chunk = chunker->NextChunk();
           if (!chunk.has_value()) {
             fed = assembler->OnTrailer(chunker->Trailer());
             break;
           }
           fed = assembler->OnChunk(chunk->tensor_index, chunk->offset,
                                    chunk->data);
         }
         body = assembler->Finish();
       }
       receiver->Finish(std::move(body), finished);
     });
}

void FakeNetwork::Answer(std::shared_ptr<Call> call,
                         absl::StatusOr<PeerReply> reply) {
  CallRecord& record = call->record;
  {
    absl::MutexLock lock(&mu_);
    if (call->answered) return;  // A relayed stream given up already.
    call->answered = true;
  }
  if (call->pipe != nullptr) {
    BreakPipe(call->pipe, absl::CancelledError("the call ended"));
  }
  if (reply.ok() && call->fault == Fault::kDropReply) {
    reply = absl::DeadlineExceededError(absl::StrCat(
        "fake network: ", Describe(record), ": the reply was lost"));
  }
  if (reply.ok() && record.kind == CallKind::kRequestToSubmit &&
      !Reachable(record)) {
    reply = Unavailable(record, "connection lost");  // While it was held.
  }
  {
    absl::MutexLock lock(&mu_);
    record.end = Now();
    if (!reply.ok()) {
      record.result = reply.status().ToString();
    } else {
      const v1::Outcome outcome = reply->outcome(record.kind);
      record.result =
          outcome == v1::OUTCOME_OK ? "OK" : v1::Outcome_Name(outcome);
    }
    log_.push_back(record);
    --in_flight_;
  }
  // Replies travel back at once, but never inside the caller's Send.
  // Taken out of the call: a relayed stream's `done` holds the node that
  // holds the call.
  PeerTransport::Done done = std::move(call->done);
  call->done = nullptr;
  At(Now(), [this, from = record.from, done = std::move(done),
             reply = std::move(reply)]() mutable {
    Run(from, [done = std::move(done), reply = std::move(reply)]() mutable {
      done(std::move(reply));
    });
  });
}

}  // namespace swarm
