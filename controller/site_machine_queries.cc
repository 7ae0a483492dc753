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
  if (run_->job != nullptr && run_->record.started &&
      !IsTerminal(run_->record.state)) {
    // A running job keeps its learner: refuse before touching it.
    std::string difference;
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&difference);
    if (differ.Compare(run_->job->config(), job)) {
      *already = true;
      return MakeReply(v1::OUTCOME_OK, "already configured with this job");
    }
    if (job.job_id() == run_->job->id()) {
      return MakeReply(
          v1::OUTCOME_REJECTED,
          absl::StrCat("site ", options_.site, " runs job ", run_->job->id(),
                       " with another config (",
                       absl::StripTrailingAsciiWhitespace(difference),
                       "; the first is what it accepted)"));
    }
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("site ", options_.site, " is running job ",
                                  run_->job->id()));
  }
  return std::nullopt;
}

v1::StatusReply SiteMachine::Status() const {
  v1::StatusReply reply;
  v1::SiteStatus* status = reply.mutable_status();
  status->set_site(options_.site);
  if (run_->job != nullptr) {
    status->set_job_id(run_->job->id());
    status->mutable_role()->set_trainer(IsTrainer(options_.site));
  }
  status->set_state(run_->record.state);
  status->mutable_role()->set_aggregator(run_->record.round_aggregator ==
                                         options_.site);
  status->set_round(StatusRound());
  status->set_aggregator(run_->record.round_aggregator);
  *status->mutable_best() = run_->record.best;
  *status->mutable_counters() = Counters();
  status->set_last_error(run_->last_error);
  if (run_->last_error_time != absl::InfinitePast()) {
    status->set_last_error_time_ms(absl::ToUnixMillis(run_->last_error_time));
  }
  for (const auto& [name, value] : run_->metrics) {
    (*status->mutable_metrics())[name] = value;
  }
  status->set_waiting_for(learner_waiting_);
  status->set_attempt(run_->record.attempt);
  status->set_rejoined(run_->reloaded);
  status->set_global_round(run_->durable_global_round);
  for (const v1::Failover& failover : run_->failovers) {
    *status->add_failovers() = failover;
  }
  std::string end_reason = run_->end_reason;
  if (run_->record.state == v1::SITE_STATE_ABORTED)
    end_reason = run_->last_error;
  if (IsTerminal(run_->record.state)) status->set_end_reason(end_reason);
  reply.set_version(status_version_);
  return reply;
}

uint32_t SiteMachine::StatusRound() const {
  return run_->record.last_task_round.value_or(
      run_->job != nullptr ? run_->job->first_round() : 0);
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
  absl::Status job =
      CheckJobId(run_->job.get(), options_.site, request.job_id());
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
      if (run_->current_global == nullptr) {
        return absl::NotFoundError("no global model yet");
      }
      source.model = run_->current_global;
      return source;
    case v1::MODEL_SELECTOR_ROUND:
      source.round = request.round();
      return source;
    default:
      return absl::InvalidArgumentError("unknown model selector");
  }
  // BEST and LAST come from their files, not from memory: the file holds
  // the final's own metadata (kind, metric, best site, end reason, every
  // trainer's privacy spend); the model in memory holds the stream's. A
  // final is in `finals` only once its file is written.
  return source;
}

}  // namespace swarm
