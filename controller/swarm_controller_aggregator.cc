// SwarmController, aggregator side (design section 3, steps 4 to 7): the
// rounds this site aggregates, each an AggregationRound, and the end of each.
#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "controller/admission.h"
#include "controller/aggregation_round.h"
#include "controller/replies.h"
#include "controller/retry_policy.h"
#include "controller/swarm_controller.h"

namespace swarm {

void SwarmController::OpenRound(const v1::ModelHeader& header,
                                std::shared_ptr<const Model> base) {
  absl::StatusOr<std::unique_ptr<AggregationRound>> opened =
      AggregationRound::Open(*job_, options_.site, header, std::move(base),
                             store_->OffloadDir(job_->id()), runner_->Now());
  if (!opened.ok()) {
    Fail(absl::StrCat("round ", header.round(), ": aggregator"),
         opened.status());
    return;
  }
  auto round = std::make_unique<AggregatorRound>();
  round->round = std::move(*opened);
  AggregatorRound& open = *round;
  rounds_[header.round()] = std::move(round);
  Bump();
  OnRoundReport(open, open.round->Check(runner_->Now()));
}

void SwarmController::OnRoundReport(AggregatorRound& open,
                                    const RoundReport& report) {
  const uint32_t round = open.round->round();
  if (open.finishing) return;
  if (!report.done) {
    const absl::Time deadline = open.round->NextDeadline();
    if (deadline == absl::InfiniteFuture()) return;
    runner_->PostAt(deadline, [this, round] {
      absl::MutexLock lock(&mu_);
      auto it = rounds_.find(round);
      if (it == rounds_.end()) return;
      OnRoundReport(*it->second, it->second->round->Check(runner_->Now()));
    });
    return;
  }
  open.finishing = true;
  Bump();
  SWARM_LOG_INFO("round %d closed (%s): %d of %d results%s%s", round,
                 DoneReasonName(report.reason), report.responded,
                 report.expected, report.missing.empty() ? "" : "; missing: ",
                 absl::StrJoin(report.missing, ","));
  if (!report.missing.empty()) {
    ReportError(absl::StrCat("round ", round),
                absl::DeadlineExceededError(absl::StrCat(
                    "no result from ", absl::StrJoin(report.missing, ","))));
  }
  runner_->Post([this, round] { FinishRound(round); });
}

SwarmController::AggregatorRound* SwarmController::GatheringRound(
    uint32_t round) {
  auto it = rounds_.find(round);
  if (it != rounds_.end() && !it->second->finishing) return it->second.get();
  AggregatorRound* latest = nullptr;
  for (auto& [number, open] : rounds_) {
    if (!open->finishing) latest = open.get();
  }
  return latest;
}

v1::SiteCounters SwarmController::Counters() const {
  v1::SiteCounters counters = counters_;
  RoundCounters rounds = closed_rounds_;
  for (const auto& [number, open] : rounds_)
    rounds.Add(open->round->counters());
  rounds.CopyTo(&counters);
  return counters;
}

absl::StatusOr<ModelAdmission> SwarmController::AdmitResult(
    const v1::ModelHeader& header) {
  // The gatherer of the result's round, or else the latest open one (it
  // answers late and early results by its rules).
  AggregatorRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site ", options_.site, " gathers no round (result for round ",
        header.round(), ")"));
  }
  AggregationRound::ResultStart start =
      target->round->BeginResult(header, runner_->Now());
  // The upload starts on a slot already taken: a status change only (see
  // RequestToSubmit). A refused or failed result frees its slot: a Bump.
  if (start.refused.ok() && !start.header_only) {
    StatusChanged();
  } else {
    Bump();
  }
  OnRoundReport(*target, start.report);
  if (!start.refused.ok()) return start.refused;
  ModelAdmission admission;
  if (start.header_only) {
    admission.header_only = true;
    return admission;
  }
  admission.assembler.limits = options_.limits;
  admission.assembler.limits.max_model_bytes =
      std::min(admission.assembler.limits.max_model_bytes,
               job_->config().max_model_bytes());
  admission.assembler.expected_kind = v1::MODEL_KIND_RESULT;
  admission.assembler.expected_specs = target->round->base().specs();
  admission.sink = std::move(start.sink);
  return admission;
}

v1::Reply SwarmController::OnResult(
    const v1::ModelHeader& header,
    absl::StatusOr<std::shared_ptr<const Model>> model) {
  Bump();
  AggregatorRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    ++closed_rounds_.rejected;
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("round ", header.round(),
                                  " closed before the result was complete"));
  }
  AggregationRound::ResultEnd end =
      target->round->CompleteResult(header, model, runner_->Now());
  if (!end.refused.ok()) {
    ReportError(absl::StrCat("round ", header.round(), ": result from ",
                             header.sender(), " refused"),
                end.refused);
    OnRoundReport(*target, end.report);
    return ReplyFromStatus(end.refused);
  }
  SWARM_LOG_INFO("round %d: result from %s: %s", header.round(),
                 header.sender(), end.reply.message());
  OnRoundReport(*target, end.report);
  return end.reply;
}

v1::SubmitPermissionReply SwarmController::RequestToSubmit(
    const v1::SubmitPermissionRequest& request) {
  absl::MutexLock lock(&mu_);
  v1::SubmitPermissionReply reply;
  absl::Status job = CheckJob(request.job_id());
  if (!job.ok()) {
    reply.set_outcome(v1::OUTCOME_REJECTED);
    reply.set_message(std::string(job.message()));
    return reply;
  }
  if (IsTerminal(record_.state)) {
    reply.set_outcome(v1::OUTCOME_ABORTED);
    reply.set_message(
        absl::StrCat("job is ", v1::SiteState_Name(record_.state)));
    return reply;
  }
  const uint64_t retry_ms = job_->config().request_to_submit_interval_ms();
  AggregatorRound* target = GatheringRound(request.round());
  if (target == nullptr) {
    const bool ahead = !record_.last_task_round.has_value() ||
                       request.round() > *record_.last_task_round;
    reply.set_outcome(ahead ? v1::OUTCOME_RETRY : v1::OUTCOME_REJECTED);
    reply.set_message(
        ahead ? absl::StrCat("round ", request.round(), " is not open here yet")
              : absl::StrCat("round ", request.round(), " is closed here"));
    if (ahead) reply.set_retry_after_ms(retry_ms);
    return reply;
  }
  const AggregationRound::Permission permission =
      target->round->RequestToSubmit(request.sender(), request.round(),
                                     runner_->Now());
  const PermissionDecision& decision = permission.decision;
  reply.set_outcome(decision.outcome);
  reply.set_message(decision.message);
  if (decision.outcome == v1::OUTCOME_RETRY) reply.set_retry_after_ms(retry_ms);
  if (decision.code == PermissionCode::kGranted) {
    // A status change only: taking a slot turns no other request's RETRY
    // into an answer, so the held requests are not woken (a Bump wakes
    // every one of them).
    StatusChanged();
  }
  OnRoundReport(*target, permission.report);
  return reply;
}

void SwarmController::WaitForPermissionChange(uint64_t known_version,
                                              absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, known_version]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return permission_version_ != known_version;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
}

uint64_t SwarmController::permission_version() const {
  absl::MutexLock lock(&mu_);
  return permission_version_;
}

void SwarmController::FinishRound(uint32_t number) {
  std::unique_ptr<AggregatorRound> round;
  AggregationRound::Verdict verdict;
  {
    absl::MutexLock lock(&mu_);
    auto it = rounds_.find(number);
    if (it == rounds_.end() || !Active()) return;
    round = std::move(it->second);
    rounds_.erase(it);
    closed_rounds_.Add(round->round->counters());
    verdict = round->round->Judge();
    if (verdict.base_is_new_best) {
      best_model_ = round->round->shared_base();
      best_model_round_ = number;
    }
    record_.best = verdict.best;
    counters_.set_rounds_completed(counters_.rounds_completed() + 1);
    SetState(v1::SITE_STATE_AGGREGATING);
    SWARM_LOG_INFO(
        "round %d: aggregating %d results; best metric %s (round %d, %s)%s",
        number, static_cast<int>(verdict.results), FormatMetric(verdict.best),
        verdict.best.round(), verdict.best.site(),
        verdict.base_is_new_best ? " - new best" : "");
  }
  // Outside the lock: the round is this function's alone now.
  absl::StatusOr<std::shared_ptr<const Model>> aggregated =
      round->round->Aggregate();
  if (!aggregated.ok()) {
    absl::MutexLock lock(&mu_);
    Fail(absl::StrCat("round ", number, ": aggregation"), aggregated.status());
    return;
  }
  std::shared_ptr<const Model> next = std::move(*aggregated);
  const v1::BestRecord best = verdict.best;
  const std::optional<double> input_score = verdict.input_score;
  round.reset();
  std::string job_id;
  bool more = false;
  bool keep_round = false;
  {
    absl::MutexLock lock(&mu_);
    if (!Active()) return;
    job_id = job_->id();
    keep_round = job_->config().keep_round_models();
    more = number < job_->last_round();
    store_->ClearOffload(job_id).IgnoreError();
    PersistState();
  }
  std::map<std::string, std::string> metadata = next->metadata();
  metadata["job"] = job_id;
  metadata["round"] = absl::StrCat(number + 1);
  metadata["aggregator"] = options_.site;
  // The trainers' mean validation metric of this round's input model.
  if (input_score.has_value()) {
    metadata["input_score"] = absl::StrCat(*input_score);
  }
  absl::Status saved =
      store_->SaveGlobal(job_id, number + 1, *next, metadata, keep_round);
  if (!saved.ok()) {
    absl::MutexLock lock(&mu_);
    ReportError("saving the global model", saved);
  }
  if (more) {
    Scatter(number + 1, next, best);
  } else {
    FinishJob(number, next, best);
  }
}

}  // namespace swarm
