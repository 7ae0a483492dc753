// AggregatorRole: the rounds this site gathers (aggregator_role.h); chain
// reduction's launch is in aggregator_role_chain.cc.
#include "controller/aggregator_role.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/storage_error.h"
#include "controller/job_run.h"
#include "controller/replies.h"
#include "streaming/digest.h"

namespace swarm {

event::AggregationDone RunAggregationWork(const effect::RunAggregation& run) {
  event::AggregationDone done;
  done.round = run.round;
  done.job_run = run.job_run;
  if (run.digest_base) {
    done.base_digest = ModelContentDigest(run.closed->base());
    // Not read again unless results are differences: a file-backed base
    // (lean memory) gives its pages back.
    run.closed->base().storage()->ReleaseResidentPages();
  }
  done.model = run.closed->Aggregate();
  return done;
}

namespace site {

void AggregatorRole::OnTimerFired(TimerId, const Timer& timer) {
  switch (timer.purpose) {
    case Timer::Purpose::kRoundDeadline: {
      RoundState* gathered = Gathered(timer.round);
      if (gathered == nullptr) return;
      return OnRoundReport(timer.round, gathered->round->Check(now()));
    }
    case Timer::Purpose::kHeldPermission: {
      auto held = held_.find(timer.request);
      if (held == held_.end()) return;
      // A request waiting for a chain: the chain starts with those that
      // asked (this one is answered with them).
      MaybeLaunchChain(held->second.ask.round(), /*now_or_never=*/true);
      held = held_.find(timer.request);
      if (held == held_.end()) return;
      v1::SubmitPermissionReply reply = DecidePermission(held->second.ask);
      // Held as long as allowed: the trainer asks again at once.
      if (reply.outcome() == v1::OUTCOME_RETRY) reply.set_retry_after_ms(0);
      Emit(effect::Reply{timer.request, std::move(reply)});
      held_.erase(held);
      return;
    }
    case Timer::Purpose::kComeForward:
      return DropSilentTrainers(timer.round);
    case Timer::Purpose::kAskAgain:
    case Timer::Purpose::kScatterGrace:
    case Timer::Purpose::kFinalGrace:
    case Timer::Purpose::kStartDeadline:
    case Timer::Purpose::kBestDeadline:
      return;  // Not an aggregator's.
  }
}

bool AggregatorRole::OnPersistDone(const event::PersistDone& e) {
  auto after = after_global_.find(e.persist);
  if (after == after_global_.end()) return false;
  AfterGlobal next = std::move(after->second);
  after_global_.erase(after);
  // A failed write fails the site (the caller sees to it; its trainers
  // fail over). Not mapped (the driver said why): on with the model in
  // memory, as without lean memory.
  if (e.mapped != nullptr) {
    site_->ReplaceHeldModel(next.model.get(), e.mapped);
    next.model = e.mapped;
  }
  if (e.status.ok() && site_->Active()) {
    GoOnAfter(next.round, next.closing, std::move(next.model));
  }
  return true;
}

void AggregatorRole::EndAll(const v1::Reply& ended) {
  DropRounds();
  for (auto& [request, held] : held_) {
    v1::SubmitPermissionReply reply;
    reply.set_outcome(ended.outcome());
    reply.set_message(ended.message());
    Emit(effect::Reply{request, reply});
  }
  held_.clear();
}

uint64_t AggregatorRole::DropAll() {
  const uint64_t dropped = rounds_.size() + aggregating_.size();
  DropRounds();
  aggregating_.clear();
  return dropped;
}

void AggregatorRole::AddCounters(RoundCounters* counters) const {
  for (const auto& [number, gathered] : rounds_) {
    counters->Add(gathered.round->counters());
  }
}

void AggregatorRole::OpenRound(const v1::ModelHeader& header,
                               std::shared_ptr<const Model> base) {
  const uint32_t round = header.round();
  v1::ModelHeader task = header;
  RoundState gathering;
  gathering.attempt = header.attempt();
  gathering.lineage = LineageFromProto(header.lineage());
  gathering.handoff = header.handoff();
  if (header.handoff()) {
    // Handed over by a trainer, who does not know who acknowledged the
    // round's task: expect every trainer but the aggregators given up on,
    // and drop those that do not come forward within the failover bounds.
    task.clear_expected_trainers();
    const std::vector<std::string> order = run().job->ElectionOrder(round);
    const auto given_up =
        order.begin() + std::min<size_t>(header.attempt(), order.size());
    for (const std::string& trainer : run().job->trainers()) {
      if (std::find(order.begin(), given_up, trainer) == given_up) {
        task.add_expected_trainers(trainer);
      }
    }
  }
  gathering.opened = now();
  gathering.heard[header.sender()] = now();
  absl::StatusOr<std::unique_ptr<AggregationRound>> opened =
      AggregationRound::Open(*run().job, self(), task, std::move(base),
                             run().offload_dir, now());
  if (!opened.ok()) {
    return site_->Fail(absl::StrCat("round ", round, ": aggregator"),
                       opened.status());
  }
  AggregationRound& open = **opened;
  gathering.round = std::move(*opened);
  rounds_[round] = std::move(gathering);
  {
    // Every live trainer probes its aggregator (and, after a failover,
    // comes forward to the backup) within a failover timeout.
    Timer timer;
    timer.purpose = Timer::Purpose::kComeForward;
    timer.round = round;
    SetTimer(now() + 2 * run().job->failover_timeout(), timer);
  }
  site_->PermissionMayChange();
  OnRoundReport(round, open.Check(now()));
}

void AggregatorRole::DropSilentTrainers(uint32_t round) {
  RoundState* info = Gathered(round);
  if (info == nullptr) return;
  const absl::Time silent_since = now() - 2 * run().job->failover_timeout();
  for (const std::string& trainer : run().job->trainers()) {
    if (trainer == self()) continue;
    auto heard = info->heard.find(trainer);
    const absl::Time last =
        heard == info->heard.end() ? info->opened : heard->second;
    if (last > silent_since) continue;
    if (info->round->DropTrainer(trainer, "silent: down or frozen", now())) {
      run().counters.set_trainers_dropped(run().counters.trainers_dropped() +
                                          1);
      site_->ReportError(
          absl::StrCat("round ", round),
          absl::UnavailableError(
              absl::StrCat("not waiting for ", trainer, ": not heard from for ",
                           absl::FormatDuration(now() - last),
                           info->handoff ? " (after the failover)" : "")));
    }
  }
  site_->PermissionMayChange();
  OnRoundReport(round, info->round->Check(now()));
  if (Gathered(round) != nullptr) {
    Timer timer;
    timer.purpose = Timer::Purpose::kComeForward;
    timer.round = round;
    SetTimer(now() + run().job->failover_timeout(), timer);
  }
}

void AggregatorRole::Heard(uint32_t round, const std::string& trainer,
                           absl::Time when) {
  if (RoundState* info = Gathered(round)) info->heard[trainer] = when;
}

RoundState* AggregatorRole::Gathered(uint32_t round) {
  auto it = rounds_.find(round);
  return it == rounds_.end() ? nullptr : &it->second;
}

std::optional<v1::SubmitPermissionReply> AggregatorRole::CheckChain(
    uint32_t round, uint32_t asked_round, const std::string& sender,
    const google::protobuf::RepeatedPtrField<v1::RoundAttempt>& chain) {
  RoundState* info = Gathered(round);
  if (info == nullptr || asked_round != round) return std::nullopt;
  const Lineage lineage = LineageFromProto(chain);
  const int chains = CompareChains(lineage, info->lineage, round);
  if (chains == 0) {
    absl::Time& heard = info->heard[sender];
    if (heard != absl::InfiniteFuture()) heard = now();
    return std::nullopt;
  }
  v1::SubmitPermissionReply reply;
  if (chains < 0) {
    // The trainer's chain wins: its task is the one to gather.
    reply.set_outcome(v1::OUTCOME_RETRY);
    reply.set_needs_learn_task(true);
    reply.set_retry_after_ms(
        run().job->config().request_to_submit_interval_ms());
    reply.set_message(absl::StrCat("round ", round, " is gathered here on ",
                                   "a chain that loses to yours (",
                                   DescribeLineage(lineage), ")"));
  } else {
    reply.set_outcome(v1::OUTCOME_REJECTED);
    reply.set_message(
        absl::StrCat("your learn task of round ", round,
                     " is from a losing chain (", DescribeLineage(lineage),
                     "); this site follows ", DescribeLineage(info->lineage)));
  }
  return reply;
}

void AggregatorRole::OnRoundReport(uint32_t round, const RoundReport& report) {
  RoundState* info = Gathered(round);
  if (info == nullptr) return;
  if (!report.done) {
    const absl::Time deadline = info->round->NextDeadline();
    if (deadline == absl::InfiniteFuture()) return;
    // A timer still to come by then looks again. Not the one firing now
    // (armed at `now()`): it is this very look.
    if (info->armed <= deadline && info->armed > now()) return;
    info->armed = deadline;
    Timer timer;
    timer.purpose = Timer::Purpose::kRoundDeadline;
    timer.round = round;
    SetTimer(deadline, timer);
    return;
  }
  CloseRound(round);
}

void AggregatorRole::CloseRound(uint32_t number) {
  auto it = rounds_.find(number);
  if (it->second.round->pending_adds() > 0) {
    // Over, but results are still being added: on once they are (every
    // accepted result is in the aggregate). An add is a pass over one
    // model, so this waits a bounded time.
    it->second.close_when_added = true;
    return;
  }
  const RoundReport report = it->second.round->Check(now());
  SWARM_LOG_INFO("round %d closed (%s): %d of %d results%s%s", number,
                 DoneReasonName(report.reason), report.responded,
                 report.expected, report.missing.empty() ? "" : "; missing: ",
                 absl::StrJoin(report.missing, ","));
  if (!report.missing.empty()) {
    site_->ReportError(
        absl::StrCat("round ", number),
        absl::DeadlineExceededError(absl::StrCat(
            "no result from ", absl::StrJoin(report.missing, ","))));
  }
  RoundState gathering = std::move(it->second);
  rounds_.erase(it);
  std::shared_ptr<AggregationRound> round = std::move(gathering.round);
  run().closed_rounds.Add(round->counters());
  AggregationRound::Verdict verdict = round->Judge();
  if (verdict.base_is_new_best) {
    run().best_model = round->shared_trainable();
    run().best_model_round = number;
    // Every trainer of the round holds this model too: the digest (set when
    // the aggregation reports it) lets a BEST from any of them be checked
    // when this site is gone at the end.
    effect::Persist keep;
    keep.what = effect::Persist::What::kBestModel;
    keep.persist = site_->NextPersist();
    keep.job_id = run().job->id();
    keep.round = number;
    keep.model = run().best_model;
    keep.metadata = run().best_model->metadata();
    keep.metadata["job"] = run().job->id();
    keep.metadata["round"] = absl::StrCat(number);
    Emit(std::move(keep));
  }
  run().record.best = verdict.best;
  run().counters.set_rounds_completed(run().counters.rounds_completed() + 1);
  site_->SetState(v1::SITE_STATE_AGGREGATING);
  SWARM_LOG_INFO(
      "round %d: aggregating %d results; best metric %s (round %d, %s)%s",
      number, static_cast<int>(verdict.results),
      verdict.best.present() ? absl::StrCat(verdict.best.metric()) : "none",
      verdict.best.round(), verdict.best.site(),
      verdict.base_is_new_best ? " - new best" : "");
  Closing closing;
  closing.best = verdict.best;
  closing.input_score = verdict.input_score;
  closing.attempt = gathering.attempt;
  closing.lineage = std::move(gathering.lineage);
  closing.stop_reason = EarlyStopReason(*run().job, verdict.best, number);
  if (closing.stop_reason.empty()) {
    // Trainers out of privacy budget: the job cannot go on with too few.
    closing.stop_reason = TooFewTrainersReason(
        *run().job, number,
        report.expected + static_cast<int>(report.dropped.size()),
        gathering.stopped);
  }
  aggregating_[number] = std::move(closing);
  site_->PermissionMayChange();
  Emit(effect::RunAggregation{number, std::move(round),
                              verdict.base_is_new_best, run().id});
}

void AggregatorRole::OnAggregationDone(event::AggregationDone& e) {
  auto it = aggregating_.find(e.round);
  if (it == aggregating_.end() || !site_->Active()) return;
  Closing closing = it->second;
  aggregating_.erase(it);
  if (!e.base_digest.empty()) {
    closing.best.set_digest(e.base_digest);
    if (run().record.best.round() == e.round &&
        run().record.best.site() == self() &&
        run().record.best.digest().empty()) {
      run().record.best.set_digest(e.base_digest);
    }
  }
  if (!e.model.ok()) {
    return site_->Fail(absl::StrCat("round ", e.round, ": aggregation"),
                       e.model.status());
  }
  std::shared_ptr<const Model> next = std::move(*e.model);
  effect::Persist global;
  global.what = effect::Persist::What::kGlobal;
  global.persist = site_->NextPersist();
  global.job_id = run().job->id();
  global.round = e.round + 1;
  global.keep_round = run().job->config().keep_round_models();
  if (global.keep_round) {
    run().kept_rounds[e.round + 1] =
        Extend(closing.lineage, e.round, closing.attempt);
  }
  global.model = next;
  const bool lean = site_->LeanFor(next->total_bytes());
  if (lean) {
    global.map_back = true;
    after_global_[global.persist] = AfterGlobal{e.round, closing, next};
  }
  global.metadata = next->metadata();
  global.metadata["job"] = run().job->id();
  global.metadata["round"] = absl::StrCat(e.round + 1);
  global.metadata["aggregator"] = self();
  if (closing.attempt > 0) {
    global.metadata["attempt"] = absl::StrCat(closing.attempt);
  }
  // The trainers' mean validation metric of this round's input model.
  if (closing.input_score.has_value()) {
    global.metadata["input_score"] = absl::StrCat(*closing.input_score);
  }
  Emit(std::move(global));
  // The state file names that global model only after it is written.
  run().persisted_global_round = e.round + 1;
  run().persisted_global_lineage =
      Extend(closing.lineage, e.round, closing.attempt);
  // Status says the model is on disk once the state file naming it is.
  run().durable_writes[site_->PersistClearOffloadAndState(/*notify=*/true)] =
      run().persisted_global_round;
  // Lean: on once the aggregate is written and mapped (OnPersistDone). A
  // model of that size takes a fraction of a second to write to the page
  // cache; held in memory beside its file for the whole next round, it
  // would cost one model's size more at this site.
  if (lean) return;
  GoOnAfter(e.round, closing, std::move(next));
}

void AggregatorRole::GoOnAfter(uint32_t round, const Closing& closing,
                               std::shared_ptr<const Model> next) {
  if (round < run().job->last_round() && closing.stop_reason.empty()) {
    site_->ScatterRound(round + 1, std::move(next), closing.best,
                        Extend(closing.lineage, round, closing.attempt));
  } else {
    run().final_attempt = closing.attempt;
    run().final_chain = Extend(closing.lineage, round, closing.attempt);
    site_->FinishJob(round, std::move(next), closing.best,
                     closing.stop_reason.empty() ? "done: every round ran"
                                                 : closing.stop_reason);
  }
}

AggregationRound* AggregatorRole::GatheringRound(uint32_t round) {
  auto it = rounds_.find(round);
  if (it != rounds_.end()) return it->second.round.get();
  // Else the latest open one (it answers late and early requests by its
  // rules).
  return rounds_.empty() ? nullptr : rounds_.rbegin()->second.round.get();
}

absl::StatusOr<ModelAdmission> AggregatorRole::AdmitResult(
    const v1::ModelHeader& header, absl::Time now) {
  AggregationRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", self(), " gathers no round (result for round ",
                     header.round(), ")"));
  }
  const uint32_t round = target->round();
  if (std::optional<v1::SubmitPermissionReply> refused =
          CheckChain(round, header.round(), header.sender(), header.lineage());
      refused.has_value()) {
    return absl::FailedPreconditionError(refused->message());
  }
  AggregationRound::ResultStart start = target->BeginResult(header, now);
  if (start.refused.ok()) {
    site_->NotePrivacy(header.privacy_spent());
    if (header.failed() && header.trainer_stopped() &&
        header.round() == round) {
      Gathered(round)->stopped.insert(header.sender());
    }
  }
  // The upload starts on a slot already taken: a status change only. A
  // refused or failed result frees its slot: held requests may go on.
  if (start.refused.ok() && !start.header_only) {
    site_->Changed();
    // Uploading: not silent, however long the upload takes.
    Heard(round, header.sender(), absl::InfiniteFuture());
  } else {
    site_->PermissionMayChange();
    Heard(round, header.sender(), now);
  }
  absl::StatusOr<ModelAdmission> answer;
  if (!start.refused.ok()) {
    answer = start.refused;
  } else {
    ModelAdmission admission;
    if (start.header_only) {
      admission.header_only = true;
    } else {
      admission.assembler = site_->AssemblerFor(header.kind());
      admission.assembler.expected_specs = target->base().specs();
      admission.sink = std::move(start.sink);
    }
    answer = std::move(admission);
  }
  OnRoundReport(round, start.report);  // May close the round.
  return answer;
}

std::optional<v1::Reply> AggregatorRole::OnResult(
    RequestId request, const v1::ModelHeader& header,
    const absl::StatusOr<std::shared_ptr<const Model>>& model) {
  site_->PermissionMayChange();
  AggregationRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    ++run().closed_rounds.rejected;
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("round ", header.round(),
                                  " closed before the result was complete"));
  }
  const uint32_t round = target->round();
  Heard(round, header.sender(), now());
  auto received = target->ReceiveResult(header, model, now());
  if (auto* end = std::get_if<AggregationRound::ResultEnd>(&received)) {
    return EndResult(round, header, *end);
  }
  // Added outside the step (design section 9): the round stays open (its
  // slot held) until the add ends.
  Emit(effect::AddResult{
      request, round, header,
      std::move(std::get<AggregationRound::AddJob>(received)), run().id});
  return std::nullopt;
}

void AggregatorRole::OnResultAdded(event::ResultAdded& e) {
  site_->PermissionMayChange();
  auto it = rounds_.find(e.round);
  if (it == rounds_.end()) {
    // Dropped meanwhile (its chain lost, the job ended here).
    ++run().closed_rounds.rejected;
    return site_->Reply(
        e.request, MakeReply(v1::OUTCOME_REJECTED,
                             absl::StrCat("round ", e.round, " was dropped ",
                                          "before the result was added")));
  }
  AggregationRound& target = *it->second.round;
  const AggregationRound::ResultEnd end =
      target.FinishResult(e.header, e.added, now());
  site_->Reply(e.request, EndResult(e.round, e.header, end));
  // EndResult may have dropped the round (this site failed).
  RoundState* info = Gathered(e.round);
  if (info != nullptr && info->close_when_added &&
      info->round->pending_adds() == 0) {
    CloseRound(e.round);
  }
}

v1::Reply AggregatorRole::EndResult(uint32_t round,
                                    const v1::ModelHeader& header,
                                    const AggregationRound::ResultEnd& end) {
  if (IsStorageError(end.refused)) {
    // This site's disk failed under the result (full, failing): the result
    // is not at fault, and the site cannot gather. It leaves the job; the
    // trainer, answered ABORTED, takes its result to the next backup.
    return site_->FailAndAbort(
        absl::StrCat("round ", header.round(), ": storing the result from ",
                     header.sender()),
        end.refused);
  }
  if (!end.refused.ok()) {
    site_->ReportError(absl::StrCat("round ", header.round(), ": result from ",
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

v1::SubmitPermissionReply AggregatorRole::DecidePermission(
    const v1::SubmitPermissionRequest& ask) {
  v1::SubmitPermissionReply reply;
  absl::Status job = CheckJobId(run().job.get(), self(), ask.job_id());
  if (!job.ok()) {
    reply.set_outcome(v1::OUTCOME_REJECTED);
    reply.set_message(std::string(job.message()));
    return reply;
  }
  if (IsTerminal(run().record.state)) {
    const v1::Reply ended = ReplyFromStatus(JobEndedHere(run().record));
    reply.set_outcome(ended.outcome());
    reply.set_message(ended.message());
    return reply;
  }
  const uint64_t retry_ms = run().job->config().request_to_submit_interval_ms();
  AggregationRound* target = GatheringRound(ask.round());
  if (target == nullptr || (target->round() < ask.round())) {
    return NotGatheredHere(ask);
  }
  const uint32_t round = target->round();
  if (std::optional<v1::SubmitPermissionReply> refused =
          CheckChain(round, ask.round(), ask.sender(), ask.lineage());
      refused.has_value()) {
    return *refused;
  }
  if (ask.probe()) {
    // Alive and gathering: no slot is taken, nothing is held.
    reply.set_outcome(round == ask.round() ? v1::OUTCOME_OK
                                           : v1::OUTCOME_REJECTED);
    reply.set_message(
        round == ask.round()
            ? absl::StrCat("round ", round, " is gathered here")
            : absl::StrCat("round ", ask.round(), " is closed here"));
    return reply;
  }
  if (ask.sender() != self() && site_->OwnResultFirst(round)) {
    reply.set_outcome(v1::OUTCOME_RETRY);
    reply.set_message(absl::StrCat(
        "round ", round, ": the aggregator adds its own result first"));
    reply.set_retry_after_ms(retry_ms);
    Heard(round, ask.sender(), now());
    return reply;
  }
  Gathered(round)->chained.erase(ask.sender());  // It asks on its own.
  if (ChainAsk(ask, *target)) {
    // Held with the others until the chain starts (MaybeLaunchChain).
    reply.set_outcome(v1::OUTCOME_RETRY);
    reply.set_message(absl::StrCat("round ", round, ": ", ask.sender(),
                                   " waits for a reduction chain"));
    reply.set_retry_after_ms(retry_ms);
    Heard(round, ask.sender(), now());
    return reply;
  }
  const AggregationRound::Permission permission =
      target->RequestToSubmit(ask.sender(), ask.round(), now());
  const PermissionDecision& decision = permission.decision;
  reply.set_outcome(decision.outcome);
  reply.set_message(decision.message);
  reply.set_result_in(decision.code == PermissionCode::kAlreadySubmitted);
  if (decision.outcome == v1::OUTCOME_RETRY) reply.set_retry_after_ms(retry_ms);
  // Taking a slot turns no other request's RETRY into an answer: a status
  // change only.
  if (decision.code == PermissionCode::kGranted) site_->Changed();
  if (decision.outcome == v1::OUTCOME_OK) Heard(round, ask.sender(), now());
  OnRoundReport(round, permission.report);
  return reply;
}

v1::SubmitPermissionReply AggregatorRole::NotGatheredHere(
    const v1::SubmitPermissionRequest& ask) const {
  // Ahead of this site, or a round it holds as a trainer only (it is a
  // backup now): either way it lacks the task. Or this site went on along a
  // chain that loses to the asker's (design section 6): it lacks the
  // winning chain's task of that round, which the asker hands over (a
  // "closed here" would leave the winning chain with no aggregator for the
  // round).
  const bool lacking =
      !run().record.last_task_round.has_value() ||
      ask.round() > *run().record.last_task_round ||
      (ask.round() == *run().record.last_task_round &&
       run().record.round_aggregator != self() &&
       aggregating_.count(ask.round()) == 0) ||
      CompareChains(LineageFromProto(ask.lineage()), run().record.lineage,
                    std::min(ask.round(), *run().record.last_task_round)) < 0;
  v1::SubmitPermissionReply reply;
  reply.set_outcome(lacking ? v1::OUTCOME_RETRY : v1::OUTCOME_REJECTED);
  reply.set_needs_learn_task(lacking);
  reply.set_message(
      lacking ? absl::StrCat("round ", ask.round(), " is not open here")
              : absl::StrCat("round ", ask.round(), " is closed here"));
  if (lacking) {
    reply.set_retry_after_ms(
        run().job->config().request_to_submit_interval_ms());
  }
  return reply;
}

void AggregatorRole::OnPermissionAsked(event::PermissionAsked& e) {
  // A request that cannot be held cannot wait for a reduction chain.
  if (e.hold_until <= now()) e.ask.set_direct(true);
  v1::SubmitPermissionReply reply = DecidePermission(e.ask);
  if (reply.outcome() == v1::OUTCOME_RETRY && e.hold_until > now() &&
      !e.ask.probe()) {
    // Held until a slot frees or the round opens (AnswerHeldRequests), or
    // its deadline: no trainer sleeps while a slot is free.
    held_[e.request] = Held{e.ask, e.hold_until};
    Timer timer;
    timer.purpose = Timer::Purpose::kHeldPermission;
    timer.request = e.request;
    SetTimer(e.hold_until, timer);
    MaybeLaunchChain(e.ask.round(), /*now_or_never=*/false);
    return;
  }
  Emit(effect::Reply{e.request, std::move(reply)});
}

void AggregatorRole::OnRequestCancelled(event::RequestCancelled& e) {
  held_.erase(e.request);
}

void AggregatorRole::AnswerHeldRequests() {
  // Asked in arrival order: the first held trainer gets the first slot.
  for (auto it = held_.begin(); it != held_.end();) {
    v1::SubmitPermissionReply reply = DecidePermission(it->second.ask);
    if (reply.outcome() == v1::OUTCOME_RETRY) {
      ++it;
      continue;
    }
    Emit(effect::Reply{it->first, std::move(reply)});
    it = held_.erase(it);
  }
  // A trainer dropped or a result in: the chain may not wait any longer.
  std::vector<uint32_t> rounds;
  for (const auto& [round, gathered] : rounds_) rounds.push_back(round);
  for (uint32_t round : rounds) MaybeLaunchChain(round, false);
}

void AggregatorRole::DropRounds() {
  // What they counted stays in the site's counters; nothing of theirs is in
  // flight any more.
  for (auto& [number, gathered] : rounds_) {
    RoundCounters counted = gathered.round->counters();
    counted.in_flight = 0;
    run().closed_rounds.Add(counted);
    // Its aggregator removes its offload files as it goes: not here.
    Emit(effect::Release{
        std::shared_ptr<AggregationRound>(std::move(gathered.round))});
  }
  rounds_.clear();
}

}  // namespace site
}  // namespace swarm
