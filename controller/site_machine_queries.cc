// SiteMachine's queries: what may be configured, the status, where a
// fetched model is. None changes the machine.
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "config/job_config.h"
#include "controller/replies.h"
#include "controller/site_machine.h"
#include "google/protobuf/util/message_differencer.h"

namespace swarm {

std::optional<v1::Reply> SiteMachine::CheckConfigure(const v1::JobConfig& job,
                                                     bool* already) const {
  *already = false;
  absl::Status valid = ValidateJobConfig(job);
  if (!valid.ok()) {
    return MakeReply(v1::OUTCOME_BAD_REQUEST,
                     absl::StrCat("invalid job config: ", valid.message()));
  }
  if (FindSite(job, options_.site) == nullptr) {
    return MakeReply(v1::OUTCOME_BAD_REQUEST,
                     absl::StrCat("site ", options_.site,
                                  " is not a site of job ", job.job_id()));
  }
  if (job_ != nullptr && record_.started && !IsTerminal(record_.state)) {
    // A running job keeps its learner: refuse before touching it.
    std::string difference;
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&difference);
    if (differ.Compare(job_->config(), job)) {
      *already = true;
      return MakeReply(v1::OUTCOME_OK, "already configured with this job");
    }
    if (job.job_id() == job_->id()) {
      return MakeReply(
          v1::OUTCOME_REJECTED,
          absl::StrCat("site ", options_.site, " runs job ", job_->id(),
                       " with another config (",
                       absl::StripTrailingAsciiWhitespace(difference),
                       "; the first is what it accepted)"));
    }
    return MakeReply(
        v1::OUTCOME_REJECTED,
        absl::StrCat("site ", options_.site, " is running job ", job_->id()));
  }
  return std::nullopt;
}

v1::StatusReply SiteMachine::Status() const {
  v1::StatusReply reply;
  v1::SiteStatus* status = reply.mutable_status();
  status->set_site(options_.site);
  if (job_ != nullptr) {
    status->set_job_id(job_->id());
    status->mutable_role()->set_trainer(IsTrainer(options_.site));
  }
  status->set_state(record_.state);
  status->mutable_role()->set_aggregator(record_.round_aggregator ==
                                         options_.site);
  status->set_round(StatusRound());
  status->set_aggregator(record_.round_aggregator);
  *status->mutable_best() = record_.best;
  *status->mutable_counters() = Counters();
  status->set_last_error(last_error_);
  if (last_error_time_ != absl::InfinitePast()) {
    status->set_last_error_time_ms(absl::ToUnixMillis(last_error_time_));
  }
  for (const auto& [name, value] : metrics_) {
    (*status->mutable_metrics())[name] = value;
  }
  status->set_waiting_for(learner_waiting_);
  status->set_attempt(record_.attempt);
  status->set_rejoined(reloaded_);
  status->set_global_round(durable_global_round_);
  for (const v1::Failover& failover : failovers_) {
    *status->add_failovers() = failover;
  }
  std::string end_reason = end_reason_;
  if (record_.state == v1::SITE_STATE_ABORTED) end_reason = last_error_;
  if (IsTerminal(record_.state)) status->set_end_reason(end_reason);
  reply.set_version(status_version_);
  return reply;
}

uint32_t SiteMachine::StatusRound() const {
  return record_.last_task_round.value_or(job_ != nullptr ? job_->first_round()
                                                          : 0);
}

std::vector<StateChange> SiteMachine::StateChangesAfter(
    uint64_t after_seq) const {
  std::vector<StateChange> changes;
  for (const StateChange& change : state_changes_) {
    if (change.seq > after_seq) changes.push_back(change);
  }
  return changes;
}

absl::StatusOr<FetchSource> SiteMachine::ModelForFetch(
    const v1::FetchModelRequest& request) const {
  absl::Status job = CheckJobId(job_.get(), options_.site, request.job_id());
  if (!job.ok()) return job;
  FetchSource source;
  switch (request.which()) {
    case v1::MODEL_SELECTOR_BEST:
      source.final_kind = v1::MODEL_KIND_BEST;
      break;
    case v1::MODEL_SELECTOR_LAST:
      source.final_kind = v1::MODEL_KIND_LAST;
      break;
    case v1::MODEL_SELECTOR_CURRENT:
      if (current_global_ == nullptr) {
        return absl::NotFoundError("no global model yet");
      }
      source.model = current_global_;
      return source;
    case v1::MODEL_SELECTOR_ROUND:
      source.round = request.round();
      return source;
    default:
      return absl::InvalidArgumentError("unknown model selector");
  }
  auto it = finals_.find(source.final_kind);
  if (it != finals_.end()) source.model = it->second;
  return source;
}

}  // namespace swarm
