#include "controller/fake_network.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/model_receiver.h"
#include "controller/replies.h"
#include "model/tensor_sink.h"
#include "streaming/assembler.h"
#include "streaming/chunker.h"

namespace swarm {
namespace {

// How much earlier than the caller's deadline a held RequestToSubmit
// answers (as PeerService does), and the longest single hold.
constexpr absl::Duration kDeadlineMargin = absl::Milliseconds(200);
constexpr absl::Duration kMaxHold = absl::Seconds(30);

bool Matches(const CallMatcher& match, const CallRecord& record) {
  if (match.kind.has_value() && *match.kind != record.kind) return false;
  if (!match.from.empty() && match.from != record.from) return false;
  if (!match.to.empty() && match.to != record.to) return false;
  if (match.round.has_value() && *match.round != record.round) return false;
  return true;
}

std::string OutcomeText(v1::Outcome outcome) {
  return outcome == v1::OUTCOME_OK ? "OK" : v1::Outcome_Name(outcome);
}

std::string Describe(const CallRecord& record) {
  return absl::StrCat(CallKindName(record.kind), " from ", record.from, " to ",
                      record.to);
}

}  // namespace

absl::string_view CallKindName(CallKind kind) {
  switch (kind) {
    case CallKind::kLearnTask:
      return "LearnTask";
    case CallKind::kRequestToSubmit:
      return "RequestToSubmit";
    case CallKind::kSubmitResult:
      return "SubmitResult";
    case CallKind::kShareBest:
      return "ShareBest";
    case CallKind::kFinalResult:
      return "FinalResult";
  }
  return "?";
}

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

  absl::StatusOr<v1::Reply> SendLearnTask(const v1::SiteInfo& to,
                                          const v1::ModelHeader& header,
                                          std::shared_ptr<const Model> model,
                                          absl::Duration) override {
    return network_->StreamCall(CallKind::kLearnTask, site_, to, header,
                                std::move(model));
  }
  absl::StatusOr<v1::SubmitPermissionReply> RequestToSubmit(
      const v1::SiteInfo& to, const v1::SubmitPermissionRequest& request,
      absl::Duration timeout) override {
    return network_->PermissionCall(site_, to, request, timeout);
  }
  absl::StatusOr<v1::Reply> SubmitResult(
      const v1::SiteInfo& to, const v1::ModelHeader& header,
      std::shared_ptr<const Model> model) override {
    return network_->StreamCall(CallKind::kSubmitResult, site_, to, header,
                                std::move(model));
  }
  absl::StatusOr<v1::Reply> ShareBest(const v1::SiteInfo& to,
                                      const v1::ShareBestRequest& request,
                                      absl::Duration) override {
    return network_->ShareBestCall(site_, to, request);
  }
  absl::StatusOr<v1::Reply> SendFinalResult(const v1::SiteInfo& to,
                                            const v1::ModelHeader& header,
                                            std::shared_ptr<const Model> model,
                                            absl::Duration) override {
    return network_->StreamCall(CallKind::kFinalResult, site_, to, header,
                                std::move(model));
  }

 private:
  FakeNetwork* const network_;
  const std::string site_;
};

FakeNetwork::FakeNetwork(ManualRunner* runner)
    : manual_(runner), hold_retries_(false) {}

FakeNetwork::FakeNetwork() : manual_(nullptr), hold_retries_(true) {}

FakeNetwork::~FakeNetwork() = default;

void FakeNetwork::AddSite(const std::string& name,
                          SwarmController* controller) {
  absl::MutexLock lock(&mu_);
  sites_[name] = controller;
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
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  auto idle = [this]()
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

absl::Time FakeNetwork::Now() const {
  return manual_ != nullptr ? manual_->Now() : absl::Now();
}

FakeNetwork::Plan FakeNetwork::Begin(CallRecord& record) {
  std::function<void(const CallRecord&)> observer;
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    record.start = Now();
    observer = observer_;
  }
  if (observer) observer(record);
  Plan plan;
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    plan.fault_name = "shut_down";
    plan.fault = Fault::kDrop;
    return plan;
  }
  if (isolated_.count(record.from) > 0 || isolated_.count(record.to) > 0) {
    plan.fault_name = "isolated";
    plan.fault = Fault::kDrop;
    return plan;
  }
  for (FaultRule& rule : faults_) {
    if (rule.remaining == 0 || !Matches(rule.match, record)) continue;
    if (rule.remaining > 0) --rule.remaining;
    plan.fault = rule.fault;
    plan.fault_name = std::string(FaultName(rule.fault));
    break;
  }
  for (const DelayRule& rule : delays_) {
    if (!Matches(rule.match, record)) continue;
    plan.latency = rule.latency;
    plan.transfer = rule.transfer;
    break;
  }
  return plan;
}

void FakeNetwork::End(CallRecord& record, const absl::Status& status,
                      absl::string_view result) {
  absl::MutexLock lock(&mu_);
  record.end = Now();
  record.result = status.ok() ? std::string(result) : status.ToString();
  log_.push_back(record);
  --in_flight_;
}

SwarmController* FakeNetwork::Target(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = sites_.find(name);
  return it == sites_.end() ? nullptr : it->second;
}

bool FakeNetwork::Reachable(const CallRecord& record) const {
  absl::MutexLock lock(&mu_);
  return !shut_down_ && isolated_.count(record.from) == 0 &&
         isolated_.count(record.to) == 0;
}

void FakeNetwork::At(absl::Time when, std::function<void()> step) {
  if (manual_ != nullptr) {
    if (when <= manual_->Now()) {
      step();
    } else {
      manual_->PostAt(when, std::move(step));
    }
    return;
  }
  // Real time: the calling worker is blocked, as on a slow link.
  const absl::Duration left = when - absl::Now();
  if (left > absl::ZeroDuration()) absl::SleepFor(left);
  step();
}

void FakeNetwork::Await(const std::function<bool()>& done) {
  if (manual_ == nullptr) return;  // Steps ran inline.
  while (!done()) {
    if (manual_->RunUntilIdle(1) == 0) return;
  }
}

void FakeNetwork::WaitUntil(absl::Time until,
                            const std::function<bool()>& done) {
  // A marker at `until`; run the queue in time order until it ran (or
  // `done` holds). The queue is never empty before the marker ran.
  auto fired = std::make_shared<bool>(false);
  manual_->PostAt(until, [fired] { *fired = true; });
  while (!*fired && !(done && done())) {
    if (manual_->RunUntilIdle(1) == 0) break;
  }
}

// One model stream at its target.
struct FakeNetwork::Stream {
  CallRecord* record = nullptr;
  v1::ModelHeader header;  // As the caller gave it.
  std::shared_ptr<const Model> model;
  uint64_t chunk_size = 0;
  std::unique_ptr<Chunker> chunker;
  v1::ModelHeader sent;  // With the tensor table.
  // The target's side of the stream.
  std::unique_ptr<ModelReceiver> receiver;
  // Set once the target has answered (or the stream broke).
  std::optional<absl::StatusOr<v1::Reply>> reply;
};

void FakeNetwork::OpenStream(Stream& stream, SwarmController* target) {
  ++stream.record->deliveries;
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(stream.model, stream.header, stream.chunk_size);
  if (!chunker.ok()) {
    stream.reply = chunker.status();
    return;
  }
  stream.chunker = std::move(*chunker);
  stream.sent = stream.chunker->header();
  stream.receiver = std::make_unique<ModelReceiver>(target);
  v1::ModelFrame frame;
  *frame.mutable_header() = stream.sent;
  absl::Status admitted =
      stream.receiver->Begin(stream.sent, frame.ByteSizeLong());
  if (!admitted.ok()) {
    stream.reply = admitted;  // The service refuses the stream.
  } else if (stream.receiver->answered()) {
    stream.reply = stream.receiver->reply();
  }
}

void FakeNetwork::FinishStream(Stream& stream) {
  if (!Reachable(*stream.record)) {
    // The connection broke mid-stream: the target's read fails.
    const absl::Status broken = absl::UnavailableError(
        absl::StrCat("fake network: ", Describe(*stream.record),
                     ": connection lost mid-stream"));
    stream.receiver->Receive([&](Assembler* assembler) {
      assembler->Abort(broken);
      return assembler->Finish();
    });
    stream.reply = broken;
    return;
  }
  stream.reply = stream.receiver->Receive([&](Assembler* assembler) {
    absl::Status fed;
    while (fed.ok()) {
      std::optional<ChunkRef> chunk = stream.chunker->NextChunk();
      if (!chunk.has_value()) {
        fed = assembler->OnTrailer(stream.chunker->Trailer());
        break;
      }
      fed = assembler->OnChunk(chunk->tensor_index, chunk->offset, chunk->data);
    }
    return assembler->Finish();
  });
}

absl::StatusOr<v1::Reply> FakeNetwork::StreamCall(
    CallKind kind, const std::string& from, const v1::SiteInfo& to,
    const v1::ModelHeader& header, std::shared_ptr<const Model> model) {
  CallRecord record;
  record.kind = kind;
  record.from = from;
  record.to = to.name();
  record.round = header.round();
  record.aggregator = header.aggregator();
  record.model_kind = header.kind();
  record.failed_result = header.failed();
  const Plan plan = Begin(record);
  record.fault = plan.fault_name;
  auto fail = [&](absl::Status status) {
    End(record, status, "");
    return status;
  };
  if (plan.fault == Fault::kDrop) {
    return fail(absl::UnavailableError(absl::StrCat(
        "fake network: ", Describe(record), ": ", plan.fault_name)));
  }
  SwarmController* target = Target(record.to);
  if (target == nullptr) {
    return fail(absl::UnavailableError(
        absl::StrCat("fake network: no site ", record.to)));
  }
  uint64_t chunk_size = header.chunk_size();
  if (chunk_size == 0) {
    absl::MutexLock lock(&mu_);
    chunk_size = chunk_size_ != 0 ? chunk_size_ : kMinChunkSize;
  }
  // A failed result has no body: an empty model, as GrpcPeerTransport sends.
  if (model == nullptr) model = std::make_shared<const Model>();
  auto prepare = [&](Stream& stream) {
    stream.record = &record;
    stream.header = header;
    stream.model = model;
    stream.chunk_size = chunk_size;
  };
  Stream stream;
  prepare(stream);
  // The duplicate follows the original back to back.
  auto duplicate = [&] {
    if (plan.fault != Fault::kDuplicate) return;
    Stream again;
    prepare(again);
    OpenStream(again, target);
    if (!again.reply.has_value()) FinishStream(again);
  };
  At(record.start + plan.latency, [&] {
    if (!Reachable(record)) {
      stream.reply = absl::UnavailableError(absl::StrCat(
          "fake network: ", Describe(record), ": unreachable on arrival"));
      return;
    }
    if (plan.fault == Fault::kLoseAfterAck) {
      stream.reply = OkReply("acknowledged (lost by the fake network)");
      return;
    }
    OpenStream(stream, target);
    if (stream.reply.has_value()) {
      duplicate();
      return;
    }
    At(Now() + plan.transfer, [&] {
      FinishStream(stream);
      duplicate();
    });
  });
  Await([&] { return stream.reply.has_value(); });
  if (!stream.reply.has_value()) {
    return fail(absl::InternalError("fake network: delivery never ran"));
  }
  if (plan.fault == Fault::kDropReply) {
    return fail(absl::DeadlineExceededError(absl::StrCat(
        "fake network: ", Describe(record), ": the reply was lost")));
  }
  const absl::StatusOr<v1::Reply>& reply = *stream.reply;
  if (!reply.ok()) return fail(reply.status());
  End(record, absl::OkStatus(), OutcomeText(reply->outcome()));
  return *reply;
}

absl::StatusOr<v1::SubmitPermissionReply> FakeNetwork::PermissionCall(
    const std::string& from, const v1::SiteInfo& to,
    const v1::SubmitPermissionRequest& request, absl::Duration timeout) {
  CallRecord record;
  record.kind = CallKind::kRequestToSubmit;
  record.from = from;
  record.to = to.name();
  record.round = request.round();
  const Plan plan = Begin(record);
  record.fault = plan.fault_name;
  auto fail = [&](absl::Status status) {
    End(record, status, "");
    return status;
  };
  if (plan.fault == Fault::kDrop || plan.fault == Fault::kLoseAfterAck) {
    return fail(absl::UnavailableError(absl::StrCat(
        "fake network: ", Describe(record), ": ", plan.fault_name)));
  }
  SwarmController* target = Target(record.to);
  if (target == nullptr) {
    return fail(absl::UnavailableError(
        absl::StrCat("fake network: no site ", record.to)));
  }
  std::optional<absl::StatusOr<v1::SubmitPermissionReply>> reply;
  At(record.start + plan.latency, [&] {
    if (!Reachable(record)) {
      reply = absl::UnavailableError(absl::StrCat(
          "fake network: ", Describe(record), ": unreachable on arrival"));
      return;
    }
    ++record.deliveries;
    v1::SubmitPermissionReply answer =
        DeliverPermission(target, request, record.start + timeout);
    if (plan.fault == Fault::kDuplicate) {
      ++record.deliveries;
      target->RequestToSubmit(request);
    }
    reply = std::move(answer);
  });
  Await([&] { return reply.has_value(); });
  if (!reply.has_value()) {
    return fail(absl::InternalError("fake network: delivery never ran"));
  }
  if (plan.fault == Fault::kDropReply) {
    return fail(absl::DeadlineExceededError(absl::StrCat(
        "fake network: ", Describe(record), ": the reply was lost")));
  }
  if (!reply->ok()) return fail(reply->status());
  if (!Reachable(record)) {
    return fail(absl::UnavailableError(
        absl::StrCat("fake network: ", Describe(record), ": connection lost")));
  }
  End(record, absl::OkStatus(), OutcomeText((*reply)->outcome()));
  return **reply;
}

v1::SubmitPermissionReply FakeNetwork::DeliverPermission(
    SwarmController* target, const v1::SubmitPermissionRequest& request,
    absl::Time call_deadline) {
  bool hold;
  {
    absl::MutexLock lock(&mu_);
    hold = hold_retries_;
  }
  const absl::Time deadline = call_deadline - kDeadlineMargin;
  bool waited = false;
  v1::SubmitPermissionReply reply;
  while (true) {
    const uint64_t version = target->permission_version();
    reply = target->RequestToSubmit(request);
    if (!hold || reply.outcome() != v1::OUTCOME_RETRY || Now() >= deadline) {
      break;
    }
    const absl::Time until = std::min(deadline, Now() + kMaxHold);
    if (manual_ != nullptr) {
      WaitUntil(until, [target, version] {
        return target->permission_version() != version;
      });
    } else {
      target->WaitForPermissionChange(version, until);
    }
    waited = true;
  }
  // Held as long as allowed: the caller may ask again at once.
  if (waited && reply.outcome() == v1::OUTCOME_RETRY) {
    reply.set_retry_after_ms(0);
  }
  return reply;
}

absl::StatusOr<v1::Reply> FakeNetwork::ShareBestCall(
    const std::string& from, const v1::SiteInfo& to,
    const v1::ShareBestRequest& request) {
  CallRecord record;
  record.kind = CallKind::kShareBest;
  record.from = from;
  record.to = to.name();
  record.round = request.best().round();
  const Plan plan = Begin(record);
  record.fault = plan.fault_name;
  auto fail = [&](absl::Status status) {
    End(record, status, "");
    return status;
  };
  if (plan.fault == Fault::kDrop) {
    return fail(absl::UnavailableError(absl::StrCat(
        "fake network: ", Describe(record), ": ", plan.fault_name)));
  }
  SwarmController* target = Target(record.to);
  if (target == nullptr) {
    return fail(absl::UnavailableError(
        absl::StrCat("fake network: no site ", record.to)));
  }
  std::optional<absl::StatusOr<v1::Reply>> reply;
  At(record.start + plan.latency, [&] {
    if (!Reachable(record)) {
      reply = absl::UnavailableError(absl::StrCat(
          "fake network: ", Describe(record), ": unreachable on arrival"));
      return;
    }
    if (plan.fault == Fault::kLoseAfterAck) {
      reply = OkReply("acknowledged (lost by the fake network)");
      return;
    }
    ++record.deliveries;
    v1::Reply answer = target->ShareBest(request);
    if (plan.fault == Fault::kDuplicate) {
      ++record.deliveries;
      target->ShareBest(request);
    }
    reply = std::move(answer);
  });
  Await([&] { return reply.has_value(); });
  if (!reply.has_value()) {
    return fail(absl::InternalError("fake network: delivery never ran"));
  }
  if (plan.fault == Fault::kDropReply) {
    return fail(absl::DeadlineExceededError(absl::StrCat(
        "fake network: ", Describe(record), ": the reply was lost")));
  }
  if (!reply->ok()) return fail(reply->status());
  End(record, absl::OkStatus(), OutcomeText((*reply)->outcome()));
  return **reply;
}

}  // namespace swarm
