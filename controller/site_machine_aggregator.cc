// SiteMachine, aggregator side (design section 3, steps 4 to 7): the rounds
// this site gathers, each an AggregationRound; permission requests, held
// while the answer is RETRY; the close of each round and what follows it.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/replies.h"
#include "controller/site_machine.h"

namespace swarm {

void SiteMachine::OpenRound(const v1::ModelHeader& header,
                            std::shared_ptr<const Model> base) {
  absl::StatusOr<std::unique_ptr<AggregationRound>> opened =
      AggregationRound::Open(*job_, options_.site, header, std::move(base),
                             offload_dir_, now_);
  if (!opened.ok()) {
    return Fail(absl::StrCat("round ", header.round(), ": aggregator"),
                opened.status());
  }
  const uint32_t round = header.round();
  AggregationRound& open = **opened;
  rounds_[round] = std::move(*opened);
  PermissionMayChange();
  OnRoundReport(round, open.Check(now_));
}

void SiteMachine::OnRoundReport(uint32_t round, const RoundReport& report) {
  auto it = rounds_.find(round);
  if (it == rounds_.end()) return;
  if (!report.done) {
    const absl::Time deadline = it->second->NextDeadline();
    if (deadline == absl::InfiniteFuture()) return;
    auto armed = armed_.find(round);
    // A timer still to come by then looks again. Not the one firing now
    // (armed at `now_`): it is this very look.
    if (armed != armed_.end() && armed->second <= deadline &&
        armed->second > now_) {
      return;
    }
    armed_[round] = deadline;
    Timer timer;
    timer.purpose = Timer::Purpose::kRoundDeadline;
    timer.round = round;
    SetTimer(deadline, timer);
    return;
  }
  SWARM_LOG_INFO("round %d closed (%s): %d of %d results%s%s", round,
                 DoneReasonName(report.reason), report.responded,
                 report.expected, report.missing.empty() ? "" : "; missing: ",
                 absl::StrJoin(report.missing, ","));
  if (!report.missing.empty()) {
    ReportError(absl::StrCat("round ", round),
                absl::DeadlineExceededError(absl::StrCat(
                    "no result from ", absl::StrJoin(report.missing, ","))));
  }
  CloseRound(round);
}

void SiteMachine::CloseRound(uint32_t number) {
  auto it = rounds_.find(number);
  std::shared_ptr<AggregationRound> round = std::move(it->second);
  rounds_.erase(it);
  armed_.erase(number);
  closed_rounds_.Add(round->counters());
  const AggregationRound::Verdict verdict = round->Judge();
  if (verdict.base_is_new_best) {
    best_model_ = round->shared_base();
    best_model_round_ = number;
  }
  record_.best = verdict.best;
  counters_.set_rounds_completed(counters_.rounds_completed() + 1);
  SetState(v1::SITE_STATE_AGGREGATING);
  SWARM_LOG_INFO(
      "round %d: aggregating %d results; best metric %s (round %d, %s)%s",
      number, static_cast<int>(verdict.results),
      verdict.best.present() ? absl::StrCat(verdict.best.metric()) : "none",
      verdict.best.round(), verdict.best.site(),
      verdict.base_is_new_best ? " - new best" : "");
  aggregating_[number] = Closing{verdict.best, verdict.input_score};
  PermissionMayChange();
  out_.push_back(effect::RunAggregation{number, std::move(round)});
}

void SiteMachine::OnAggregationDone(event::AggregationDone& e) {
  auto it = aggregating_.find(e.round);
  if (it == aggregating_.end() || !Active()) return;
  const Closing closing = it->second;
  aggregating_.erase(it);
  if (!e.model.ok()) {
    return Fail(absl::StrCat("round ", e.round, ": aggregation"),
                e.model.status());
  }
  std::shared_ptr<const Model> next = std::move(*e.model);
  PersistClearOffloadAndState();
  effect::Persist global;
  global.what = effect::Persist::What::kGlobal;
  global.persist = next_persist_++;
  global.job_id = job_->id();
  global.round = e.round + 1;
  global.keep_round = job_->config().keep_round_models();
  global.model = next;
  global.metadata = next->metadata();
  global.metadata["job"] = job_->id();
  global.metadata["round"] = absl::StrCat(e.round + 1);
  global.metadata["aggregator"] = options_.site;
  // The trainers' mean validation metric of this round's input model.
  if (closing.input_score.has_value()) {
    global.metadata["input_score"] = absl::StrCat(*closing.input_score);
  }
  out_.push_back(std::move(global));
  if (e.round < job_->last_round()) {
    ScatterRound(e.round + 1, std::move(next), closing.best);
  } else {
    FinishJob(e.round, std::move(next), closing.best);
  }
}

AggregationRound* SiteMachine::GatheringRound(uint32_t round) {
  auto it = rounds_.find(round);
  if (it != rounds_.end()) return it->second.get();
  // Else the latest open one (it answers late and early requests by its
  // rules).
  return rounds_.empty() ? nullptr : rounds_.rbegin()->second.get();
}

absl::StatusOr<ModelAdmission> SiteMachine::AdmitResult(
    const v1::ModelHeader& header, absl::Time now) {
  AggregationRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site ", options_.site, " gathers no round (result for round ",
        header.round(), ")"));
  }
  const uint32_t round = target->round();
  AggregationRound::ResultStart start = target->BeginResult(header, now);
  // The upload starts on a slot already taken: a status change only. A
  // refused or failed result frees its slot: held requests may go on.
  if (start.refused.ok() && !start.header_only) {
    Changed();
  } else {
    PermissionMayChange();
  }
  absl::StatusOr<ModelAdmission> answer;
  if (!start.refused.ok()) {
    answer = start.refused;
  } else {
    ModelAdmission admission;
    if (start.header_only) {
      admission.header_only = true;
    } else {
      admission.assembler = AssemblerFor(v1::MODEL_KIND_RESULT);
      admission.assembler.expected_specs = target->base().specs();
      admission.sink = std::move(start.sink);
    }
    answer = std::move(admission);
  }
  OnRoundReport(round, start.report);  // May close the round.
  return answer;
}

v1::Reply SiteMachine::OnResult(
    const v1::ModelHeader& header,
    const absl::StatusOr<std::shared_ptr<const Model>>& model) {
  PermissionMayChange();
  AggregationRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    ++closed_rounds_.rejected;
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("round ", header.round(),
                                  " closed before the result was complete"));
  }
  const uint32_t round = target->round();
  AggregationRound::ResultEnd end = target->CompleteResult(header, model, now_);
  if (!end.refused.ok()) {
    ReportError(absl::StrCat("round ", header.round(), ": result from ",
                             header.sender(), " refused"),
                end.refused);
    OnRoundReport(round, end.report);
    return ReplyFromStatus(end.refused);
  }
  SWARM_LOG_INFO("round %d: result from %s: %s", header.round(),
                 header.sender(), end.reply.message());
  OnRoundReport(round, end.report);
  return end.reply;
}

v1::SubmitPermissionReply SiteMachine::DecidePermission(
    const v1::SubmitPermissionRequest& ask) {
  v1::SubmitPermissionReply reply;
  absl::Status job = CheckJobId(job_.get(), options_.site, ask.job_id());
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
  AggregationRound* target = GatheringRound(ask.round());
  if (target == nullptr) {
    const bool ahead = !record_.last_task_round.has_value() ||
                       ask.round() > *record_.last_task_round;
    reply.set_outcome(ahead ? v1::OUTCOME_RETRY : v1::OUTCOME_REJECTED);
    reply.set_message(
        ahead ? absl::StrCat("round ", ask.round(), " is not open here yet")
              : absl::StrCat("round ", ask.round(), " is closed here"));
    if (ahead) reply.set_retry_after_ms(retry_ms);
    return reply;
  }
  const uint32_t round = target->round();
  const AggregationRound::Permission permission =
      target->RequestToSubmit(ask.sender(), ask.round(), now_);
  const PermissionDecision& decision = permission.decision;
  reply.set_outcome(decision.outcome);
  reply.set_message(decision.message);
  if (decision.outcome == v1::OUTCOME_RETRY) reply.set_retry_after_ms(retry_ms);
  // Taking a slot turns no other request's RETRY into an answer: a status
  // change only.
  if (decision.code == PermissionCode::kGranted) Changed();
  OnRoundReport(round, permission.report);
  return reply;
}

void SiteMachine::OnPermissionAsked(event::PermissionAsked& e) {
  v1::SubmitPermissionReply reply = DecidePermission(e.ask);
  if (reply.outcome() == v1::OUTCOME_RETRY && e.hold_until > now_) {
    // Held until a slot frees or the round opens (AnswerHeldRequests), or
    // its deadline: no trainer sleeps while a slot is free.
    held_[e.request] = Held{e.ask, e.hold_until};
    Timer timer;
    timer.purpose = Timer::Purpose::kHeldPermission;
    timer.request = e.request;
    SetTimer(e.hold_until, timer);
    return;
  }
  out_.push_back(effect::Reply{e.request, std::move(reply)});
}

void SiteMachine::OnRequestCancelled(event::RequestCancelled& e) {
  held_.erase(e.request);
}

void SiteMachine::AnswerHeldRequests() {
  // Asked in arrival order: the first held trainer gets the first slot.
  for (auto it = held_.begin(); it != held_.end();) {
    v1::SubmitPermissionReply reply = DecidePermission(it->second.ask);
    if (reply.outcome() == v1::OUTCOME_RETRY) {
      ++it;
      continue;
    }
    out_.push_back(effect::Reply{it->first, std::move(reply)});
    it = held_.erase(it);
  }
}

}  // namespace swarm
