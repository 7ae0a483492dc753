#include "controller/metered_transport.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace swarm {
namespace {

const char* KindLabel(CallKind kind) { return InfoOf(kind).metric_label; }

const char* OutcomeLabel(v1::Outcome outcome) {
  switch (outcome) {
    case v1::OUTCOME_OK:
      return "ok";
    case v1::OUTCOME_RETRY:
      return "retry";
    case v1::OUTCOME_REJECTED:
      return "rejected";
    case v1::OUTCOME_BAD_REQUEST:
      return "bad_request";
    case v1::OUTCOME_ABORTED:
      return "aborted";
    default:
      return "unknown";
  }
}

}  // namespace

void ByteTally::Add(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  total_ += bytes;
  // The time is taken under the lock: growths stay in time order.
  growths_.push_back(Growth{absl::Now(), total_});
  if (growths_.size() > kKept) {
    before_kept_ = growths_.front().total;
    growths_.pop_front();
  }
}

uint64_t ByteTally::Total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

uint64_t ByteTally::TotalAt(absl::Time at) const {
  absl::MutexLock lock(&mu_);
  auto later = std::upper_bound(
      growths_.begin(), growths_.end(), at,
      [](absl::Time t, const Growth& growth) { return t < growth.at; });
  if (later == growths_.begin()) return before_kept_;
  return std::prev(later)->total;
}

absl::StatusOr<std::unique_ptr<MeteredTransport>> MeteredTransport::Create(
    PeerTransport* inner, MetricsRegistry* registry, std::string site) {
  absl::StatusOr<CounterFamily*> calls = registry->AddCounter(
      "swarm_peer_calls_total",
      "Calls this site made to a peer that ended, by kind and outcome (error: "
      "transport or authentication failure).",
      {"site", "peer", "kind", "outcome"});
  if (!calls.ok()) return calls.status();
  absl::StatusOr<HistogramFamily*> seconds = registry->AddHistogram(
      "swarm_peer_call_seconds",
      "Duration of this site's calls to a peer (a model stream: the whole "
      "upload).",
      {"site", "peer", "kind"},
      {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800});
  if (!seconds.ok()) return seconds.status();
  absl::StatusOr<CounterFamily*> models = registry->AddCounter(
      "swarm_peer_models_sent_total",
      "Models this site delivered to a peer (learn tasks, results, final "
      "models).",
      {"site", "peer"});
  if (!models.ok()) return models.status();
  absl::StatusOr<CounterFamily*> bytes = registry->AddCounter(
      "swarm_peer_model_bytes_sent_total",
      "Tensor bytes of the models this site delivered to a peer.",
      {"site", "peer"});
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<GaugeFamily*> up = registry->AddGauge(
      "swarm_peer_up",
      "1 when this site's last call to the peer reached it (whatever it "
      "answered), 0 when it could not (down, unreachable, no answer in "
      "time).",
      {"site", "peer"});
  if (!up.ok()) return up.status();
  return std::unique_ptr<MeteredTransport>(new MeteredTransport(
      inner, std::move(site), *calls, *seconds, *models, *bytes, *up));
}

MeteredTransport::MeteredTransport(PeerTransport* inner, std::string site,
                                   CounterFamily* calls,
                                   HistogramFamily* seconds,
                                   CounterFamily* models, CounterFamily* bytes,
                                   GaugeFamily* up)
    : inner_(inner),
      site_(std::move(site)),
      calls_(calls),
      seconds_(seconds),
      models_(models),
      bytes_(bytes),
      up_(up) {}

void MeteredTransport::PrepareForJob(const v1::JobConfig& job) {
  inner_->PrepareForJob(job);
}

void MeteredTransport::Send(const v1::SiteInfo& to, PeerMessage message,
                            Done done) {
  const CallKind kind = message.kind;
  const bool stream = message.is_model_stream() && message.model != nullptr;
  const uint64_t model_bytes = stream ? message.model->total_bytes() : 0;
  const absl::Time started = absl::Now();
  inner_->Send(
      to, std::move(message),
      [this, peer = to.name(), kind, stream, model_bytes, started,
       done = std::move(done)](absl::StatusOr<PeerReply> reply) {
        const char* kind_label = KindLabel(kind);
        const char* outcome =
            reply.ok() ? OutcomeLabel(reply->outcome(kind)) : "error";
        (*calls_->WithLabels({site_, peer, kind_label, outcome}))
            ->Inc()
            .IgnoreError();
        (*seconds_->WithLabels({site_, peer, kind_label}))
            ->Observe(absl::ToDoubleSeconds(absl::Now() - started));
        const bool unreachable =
            !reply.ok() &&
            (reply.status().code() == absl::StatusCode::kUnavailable ||
             reply.status().code() == absl::StatusCode::kDeadlineExceeded);
        (*up_->WithLabels({site_, peer}))->Set(unreachable ? 0 : 1);
        if (stream && reply.ok() && reply->outcome(kind) == v1::OUTCOME_OK) {
          (*models_->WithLabels({site_, peer}))->Inc().IgnoreError();
          (*bytes_->WithLabels({site_, peer}))
              ->Inc(static_cast<double>(model_bytes))
              .IgnoreError();
          bytes_sent_.Add(model_bytes);
        }
        done(std::move(reply));
      });
}

absl::StatusOr<std::unique_ptr<ReceivedModelMeter>> ReceivedModelMeter::Create(
    MetricsRegistry* registry, std::string site) {
  absl::StatusOr<CounterFamily*> models = registry->AddCounter(
      "swarm_peer_models_received_total",
      "Model streams this site received whole from a peer (learn tasks, "
      "results, final models), before judging them.",
      {"site", "peer"});
  if (!models.ok()) return models.status();
  absl::StatusOr<CounterFamily*> bytes = registry->AddCounter(
      "swarm_peer_model_bytes_received_total",
      "Tensor bytes of the models this site received whole from a peer.",
      {"site", "peer"});
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<CounterFamily*> broken = registry->AddCounter(
      "swarm_peer_streams_broken_total",
      "Model streams from a peer that broke before their end (a bad frame, "
      "a digest mismatch, the sender went away).",
      {"site", "peer"});
  if (!broken.ok()) return broken.status();
  absl::StatusOr<CounterFamily*> digest = registry->AddCounter(
      "swarm_digest_failures_total",
      "Model streams from a peer whose digest did not match their trailer.",
      {"site", "peer"});
  if (!digest.ok()) return digest.status();
  return std::unique_ptr<ReceivedModelMeter>(new ReceivedModelMeter(
      std::move(site), *models, *bytes, *broken, *digest));
}

ReceivedModelMeter::ReceivedModelMeter(std::string site, CounterFamily* models,
                                       CounterFamily* bytes,
                                       CounterFamily* broken,
                                       CounterFamily* digest_failures)
    : site_(std::move(site)),
      models_(models),
      bytes_(bytes),
      broken_(broken),
      digest_failures_(digest_failures) {}

void ReceivedModelMeter::Observe(const std::string& peer, uint64_t bytes,
                                 const absl::Status& status) {
  if (status.ok()) {
    (*models_->WithLabels({site_, peer}))->Inc().IgnoreError();
    (*bytes_->WithLabels({site_, peer}))
        ->Inc(static_cast<double>(bytes))
        .IgnoreError();
    bytes_received_.Add(bytes);
    return;
  }
  (*broken_->WithLabels({site_, peer}))->Inc().IgnoreError();
  if (status.code() == absl::StatusCode::kDataLoss &&
      absl::StrContains(status.message(), "digest mismatch")) {
    (*digest_failures_->WithLabels({site_, peer}))->Inc().IgnoreError();
  }
}

}  // namespace swarm
