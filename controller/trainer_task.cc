#include "controller/trainer_task.h"

namespace swarm::site {

const char* Training::PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kTraining:
      return "training";
    case Phase::kAsking:
      return "asking";
    case Phase::kUploading:
      return "uploading";
    case Phase::kChainHead:
      return "chain head";
    case Phase::kChainMember:
      return "chain member";
    case Phase::kContributing:
      return "contributing";
    case Phase::kSubmitted:
      return "submitted";
  }
  return "?";
}

void Training::BecomeAsking(absl::Time now) {
  phase_ = Phase::kAsking;
  asking_since_ = now;
}

void Training::BecomeUploading() { phase_ = Phase::kUploading; }

void Training::BecomeChainHead() { phase_ = Phase::kChainHead; }

void Training::BecomeChainMember(absl::Time until) {
  phase_ = Phase::kChainMember;
  chain_until_ = until;
}

void Training::BecomeContributing() { phase_ = Phase::kContributing; }

void Training::BecomeSubmitted(absl::Time now) {
  phase_ = Phase::kSubmitted;
  chain_until_ = absl::InfiniteFuture();
  confirmed = now;
}

void Training::UploadEnded() {
  if (phase_ == Phase::kUploading) phase_ = Phase::kAsking;
}

void Training::LeaveChain(absl::Time now) {
  phase_ = Phase::kAsking;
  chain_until_ = absl::InfiniteFuture();
  direct_ = true;
  asking_since_ = now;
}

void Training::ResultLost() {
  if (phase_ == Phase::kSubmitted) phase_ = Phase::kAsking;
}

void Training::AskAfresh() {
  if (phase_ != Phase::kTraining) phase_ = Phase::kAsking;
  chain_until_ = absl::InfiniteFuture();
  direct_ = false;
}

void Training::FollowAggregator(const std::string& to, uint32_t at) {
  aggregator = to;
  attempt = at;
  task.set_aggregator(to);
  task.set_attempt(at);
  result_header.set_aggregator(to);
  result_header.set_attempt(at);
  ResultLost();
  confirmed = absl::InfinitePast();
  failures = 0;
  failing_since = absl::InfiniteFuture();
  lacking_since = absl::InfiniteFuture();
}

}  // namespace swarm::site
