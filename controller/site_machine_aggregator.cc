// SiteMachine, aggregator side (design section 3, steps 4 to 7): the rounds
// this site gathers, each an AggregationRound; permission requests, held
// while the answer is RETRY; the close of each round and what follows it.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/storage_error.h"
#include "controller/replies.h"
#include "controller/site_machine.h"
#include "streaming/digest.h"

namespace swarm {

void SiteMachine::OpenRound(const v1::ModelHeader& header,
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
    const std::vector<std::string> order = run_->job->ElectionOrder(round);
    const auto given_up =
        order.begin() + std::min<size_t>(header.attempt(), order.size());
    for (const std::string& trainer : run_->job->trainers()) {
      if (std::find(order.begin(), given_up, trainer) == given_up) {
        task.add_expected_trainers(trainer);
      }
    }
  }
  gathering.opened = now_;
  gathering.heard[header.sender()] = now_;
  absl::StatusOr<std::unique_ptr<AggregationRound>> opened =
      AggregationRound::Open(*run_->job, options_.site, task, std::move(base),
                             run_->offload_dir, now_);
  if (!opened.ok()) {
    return Fail(absl::StrCat("round ", round, ": aggregator"), opened.status());
  }
  AggregationRound& open = **opened;
  gathering.round = std::move(*opened);
  run_->work.rounds[round] = std::move(gathering);
  {
    // Every live trainer probes its aggregator (and, after a failover,
    // comes forward to the backup) within a failover timeout.
    Timer timer;
    timer.purpose = Timer::Purpose::kComeForward;
    timer.round = round;
    SetTimer(now_ + 2 * run_->job->failover_timeout(), timer);
  }
  PermissionMayChange();
  OnRoundReport(round, open.Check(now_));
}

void SiteMachine::DropSilentTrainers(uint32_t round) {
  RoundState* info = Gathered(round);
  if (info == nullptr) return;
  const absl::Time silent_since = now_ - 2 * run_->job->failover_timeout();
  for (const std::string& trainer : run_->job->trainers()) {
    if (trainer == options_.site) continue;
    auto heard = info->heard.find(trainer);
    const absl::Time last =
        heard == info->heard.end() ? info->opened : heard->second;
    if (last > silent_since) continue;
    if (info->round->DropTrainer(trainer, "silent: down or frozen", now_)) {
      run_->counters.set_trainers_dropped(run_->counters.trainers_dropped() +
                                          1);
      ReportError(absl::StrCat("round ", round),
                  absl::UnavailableError(absl::StrCat(
                      "not waiting for ", trainer, ": not heard from for ",
                      absl::FormatDuration(now_ - last),
                      info->handoff ? " (after the failover)" : "")));
    }
  }
  PermissionMayChange();
  OnRoundReport(round, info->round->Check(now_));
  if (Gathered(round) != nullptr) {
    Timer timer;
    timer.purpose = Timer::Purpose::kComeForward;
    timer.round = round;
    SetTimer(now_ + run_->job->failover_timeout(), timer);
  }
}

void SiteMachine::Heard(uint32_t round, const std::string& trainer,
                        absl::Time when) {
  if (RoundState* info = Gathered(round)) info->heard[trainer] = when;
}

SiteMachine::RoundState* SiteMachine::Gathered(uint32_t round) {
  auto it = run_->work.rounds.find(round);
  return it == run_->work.rounds.end() ? nullptr : &it->second;
}

std::optional<v1::SubmitPermissionReply> SiteMachine::CheckChain(
    uint32_t round, uint32_t asked_round, const std::string& sender,
    const google::protobuf::RepeatedPtrField<v1::RoundAttempt>& chain) {
  RoundState* info = Gathered(round);
  if (info == nullptr || asked_round != round) return std::nullopt;
  const Lineage lineage = LineageFromProto(chain);
  const int chains = CompareChains(lineage, info->lineage, round);
  if (chains == 0) {
    absl::Time& heard = info->heard[sender];
    if (heard != absl::InfiniteFuture()) heard = now_;
    return std::nullopt;
  }
  v1::SubmitPermissionReply reply;
  if (chains < 0) {
    // The trainer's chain wins: its task is the one to gather.
    reply.set_outcome(v1::OUTCOME_RETRY);
    reply.set_needs_learn_task(true);
    reply.set_retry_after_ms(
        run_->job->config().request_to_submit_interval_ms());
    reply.set_message(absl::StrCat("round ", round, " is gathered here on ",
                                   "a chain that loses to yours (",
                                   DescribeLineage(lineage), ")"));
  } else {
    reply.set_outcome(v1::OUTCOME_REJECTED);
    reply.set_message(absl::StrCat(
        "your learn task of round ", round, " is from a losing chain (",
        DescribeLineage(lineage), "); this site follows ",
        DescribeLineage(info->lineage)));
  }
  return reply;
}

void SiteMachine::OnRoundReport(uint32_t round, const RoundReport& report) {
  RoundState* info = Gathered(round);
  if (info == nullptr) return;
  if (!report.done) {
    const absl::Time deadline = info->round->NextDeadline();
    if (deadline == absl::InfiniteFuture()) return;
    // A timer still to come by then looks again. Not the one firing now
    // (armed at `now_`): it is this very look.
    if (info->armed <= deadline && info->armed > now_) return;
    info->armed = deadline;
    Timer timer;
    timer.purpose = Timer::Purpose::kRoundDeadline;
    timer.round = round;
    SetTimer(deadline, timer);
    return;
  }
  CloseRound(round);
}

void SiteMachine::CloseRound(uint32_t number) {
  auto it = run_->work.rounds.find(number);
  if (it->second.round->pending_adds() > 0) {
    // Over, but results are still being added: on once they are (every
    // accepted result is in the aggregate). An add is a pass over one
    // model, so this waits a bounded time.
    it->second.close_when_added = true;
    return;
  }
  const RoundReport report = it->second.round->Check(now_);
  SWARM_LOG_INFO("round %d closed (%s): %d of %d results%s%s", number,
                 DoneReasonName(report.reason), report.responded,
                 report.expected, report.missing.empty() ? "" : "; missing: ",
                 absl::StrJoin(report.missing, ","));
  if (!report.missing.empty()) {
    ReportError(absl::StrCat("round ", number),
                absl::DeadlineExceededError(absl::StrCat(
                    "no result from ", absl::StrJoin(report.missing, ","))));
  }
  RoundState gathering = std::move(it->second);
  run_->work.rounds.erase(it);
  std::shared_ptr<AggregationRound> round = std::move(gathering.round);
  run_->closed_rounds.Add(round->counters());
  AggregationRound::Verdict verdict = round->Judge();
  if (verdict.base_is_new_best) {
    run_->best_model = round->shared_trainable();
    run_->best_model_round = number;
    // Every trainer of the round holds this model too: the digest (set when
    // the aggregation reports it) lets a BEST from any of them be checked
    // when this site is gone at the end.
    effect::Persist keep;
    keep.what = effect::Persist::What::kBestModel;
    keep.persist = next_persist_++;
    keep.job_id = run_->job->id();
    keep.round = number;
    keep.model = run_->best_model;
    keep.metadata = run_->best_model->metadata();
    keep.metadata["job"] = run_->job->id();
    keep.metadata["round"] = absl::StrCat(number);
    out_.push_back(std::move(keep));
  }
  run_->record.best = verdict.best;
  run_->counters.set_rounds_completed(run_->counters.rounds_completed() + 1);
  SetState(v1::SITE_STATE_AGGREGATING);
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
  closing.stop_reason = EarlyStopReason(*run_->job, verdict.best, number);
  if (closing.stop_reason.empty()) {
    // Trainers out of privacy budget: the job cannot go on with too few.
    closing.stop_reason = TooFewTrainersReason(
        *run_->job, number,
        report.expected + static_cast<int>(report.dropped.size()),
        gathering.stopped);
  }
  run_->work.aggregating[number] = std::move(closing);
  PermissionMayChange();
  out_.push_back(effect::RunAggregation{number, std::move(round),
                                        verdict.base_is_new_best, run_->id});
}

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

void SiteMachine::OnAggregationDone(event::AggregationDone& e) {
  if (e.job_run != run_->id && Stale(0, 1)) return;
  auto it = run_->work.aggregating.find(e.round);
  if (it == run_->work.aggregating.end() || !Active()) return;
  Closing closing = it->second;
  run_->work.aggregating.erase(it);
  if (!e.base_digest.empty()) {
    closing.best.set_digest(e.base_digest);
    if (run_->record.best.round() == e.round &&
        run_->record.best.site() == options_.site &&
        run_->record.best.digest().empty()) {
      run_->record.best.set_digest(e.base_digest);
    }
  }
  if (!e.model.ok()) {
    return Fail(absl::StrCat("round ", e.round, ": aggregation"),
                e.model.status());
  }
  std::shared_ptr<const Model> next = std::move(*e.model);
  effect::Persist global;
  global.what = effect::Persist::What::kGlobal;
  global.persist = next_persist_++;
  global.job_id = run_->job->id();
  global.round = e.round + 1;
  global.keep_round = run_->job->config().keep_round_models();
  if (global.keep_round) {
    run_->kept_rounds[e.round + 1] =
        Extend(closing.lineage, e.round, closing.attempt);
  }
  global.model = next;
  const bool lean = LeanFor(next->total_bytes());
  if (lean) {
    global.map_back = true;
    run_->work.after_global[global.persist] =
        AfterGlobal{e.round, closing, next};
  }
  global.metadata = next->metadata();
  global.metadata["job"] = run_->job->id();
  global.metadata["round"] = absl::StrCat(e.round + 1);
  global.metadata["aggregator"] = options_.site;
  if (closing.attempt > 0) {
    global.metadata["attempt"] = absl::StrCat(closing.attempt);
  }
  // The trainers' mean validation metric of this round's input model.
  if (closing.input_score.has_value()) {
    global.metadata["input_score"] = absl::StrCat(*closing.input_score);
  }
  out_.push_back(std::move(global));
  // The state file names that global model only after it is written.
  run_->persisted_global_round = e.round + 1;
  run_->persisted_global_lineage =
      Extend(closing.lineage, e.round, closing.attempt);
  // Status says the model is on disk once the state file naming it is.
  run_->durable_writes[PersistClearOffloadAndState(/*notify=*/true)] =
      run_->persisted_global_round;
  // Lean: on once the aggregate is written and mapped (OnPersistDone). A
  // model of that size takes a fraction of a second to write to the page
  // cache; held in memory beside its file for the whole next round, it
  // would cost one model's size more at this site.
  if (lean) return;
  GoOnAfter(e.round, closing, std::move(next));
}

void SiteMachine::GoOnAfter(uint32_t round, const Closing& closing,
                            std::shared_ptr<const Model> next) {
  if (round < run_->job->last_round() && closing.stop_reason.empty()) {
    ScatterRound(round + 1, std::move(next), closing.best,
                 Extend(closing.lineage, round, closing.attempt));
  } else {
    run_->final_attempt = closing.attempt;
    run_->final_chain = Extend(closing.lineage, round, closing.attempt);
    FinishJob(round, std::move(next), closing.best,
              closing.stop_reason.empty() ? "done: every round ran"
                                          : closing.stop_reason);
  }
}

AggregationRound* SiteMachine::GatheringRound(uint32_t round) {
  auto it = run_->work.rounds.find(round);
  if (it != run_->work.rounds.end()) return it->second.round.get();
  // Else the latest open one (it answers late and early requests by its
  // rules).
  return run_->work.rounds.empty()
             ? nullptr
             : run_->work.rounds.rbegin()->second.round.get();
}

bool SiteMachine::LeanFor(uint64_t bytes) const {
  return run_->job != nullptr && !run_->offload_dir.empty() &&
         bytes >= run_->job->config().lean_memory_min_model_bytes();
}

std::string SiteMachine::LeanPath(absl::string_view what) {
  // The job's folder (the offload folder's parent): the offload folder is
  // emptied after every aggregation, which must not touch a file being
  // received.
  const size_t slash = run_->offload_dir.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : run_->offload_dir.substr(0, slash);
  return absl::StrCat(folder, "/", what, "-", run_->next_lean_file++,
                      ".safetensors");
}

void SiteMachine::ReplaceHeldModel(const Model* old,
                                   std::shared_ptr<const Model> mapped) {
  auto swap = [&](std::shared_ptr<const Model>& held) {
    if (held != nullptr && held.get() == old) held = mapped;
  };
  swap(run_->current_global);
  swap(run_->best_model);
  if (run_->work.training.has_value()) swap(run_->work.training->global);
  for (auto& [round, scatter] : run_->work.scatters) swap(scatter.global);
  for (auto& [round, task] : run_->work.aggregator_tasks) swap(task.global);
  for (auto& [id, broadcast] : run_->work.broadcasts)
    swap(broadcast.best_model);
  for (auto& [kind, model] : run_->finals) swap(model);
}

bool SiteMachine::OwnResultFirst(uint32_t round) const {
  if (!run_->work.training.has_value() || run_->work.training->round != round ||
      run_->work.training->aggregator != options_.site ||
      run_->work.training->submitted() ||
      run_->work.training->global == nullptr) {
    return false;
  }
  return LeanFor(run_->work.training->global->total_bytes());
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
  if (std::optional<v1::SubmitPermissionReply> refused =
          CheckChain(round, header.round(), header.sender(), header.lineage());
      refused.has_value()) {
    return absl::FailedPreconditionError(refused->message());
  }
  AggregationRound::ResultStart start = target->BeginResult(header, now);
  if (start.refused.ok()) {
    NotePrivacy(header.privacy_spent());
    if (header.failed() && header.trainer_stopped() &&
        header.round() == round) {
      Gathered(round)->stopped.insert(header.sender());
    }
  }
  // The upload starts on a slot already taken: a status change only. A
  // refused or failed result frees its slot: held requests may go on.
  if (start.refused.ok() && !start.header_only) {
    Changed();
    // Uploading: not silent, however long the upload takes.
    Heard(round, header.sender(), absl::InfiniteFuture());
  } else {
    PermissionMayChange();
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
      admission.assembler = AssemblerFor(header.kind());
      admission.assembler.expected_specs = target->base().specs();
      admission.sink = std::move(start.sink);
    }
    answer = std::move(admission);
  }
  OnRoundReport(round, start.report);  // May close the round.
  return answer;
}

std::optional<v1::Reply> SiteMachine::OnResult(
    RequestId request, const v1::ModelHeader& header,
    const absl::StatusOr<std::shared_ptr<const Model>>& model) {
  PermissionMayChange();
  AggregationRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    ++run_->closed_rounds.rejected;
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("round ", header.round(),
                                  " closed before the result was complete"));
  }
  const uint32_t round = target->round();
  Heard(round, header.sender(), now_);
  auto received = target->ReceiveResult(header, model, now_);
  if (auto* end = std::get_if<AggregationRound::ResultEnd>(&received)) {
    return EndResult(round, header, *end);
  }
  // Added outside the step (design section 9): the round stays open (its
  // slot held) until the add ends.
  out_.push_back(effect::AddResult{
      request, round, header,
      std::move(std::get<AggregationRound::AddJob>(received)), run_->id});
  return std::nullopt;
}

void SiteMachine::OnResultAdded(event::ResultAdded& e) {
  if (e.job_run != run_->id && Stale(0, 1)) return;
  PermissionMayChange();
  auto it = run_->work.rounds.find(e.round);
  if (it == run_->work.rounds.end()) {
    // Dropped meanwhile (its chain lost, the job ended here).
    ++run_->closed_rounds.rejected;
    return Reply(e.request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("round ", e.round, " was dropped ",
                                        "before the result was added")));
  }
  AggregationRound& target = *it->second.round;
  const AggregationRound::ResultEnd end =
      target.FinishResult(e.header, e.added, now_);
  Reply(e.request, EndResult(e.round, e.header, end));
  // EndResult may have dropped the round (this site failed).
  RoundState* info = Gathered(e.round);
  if (info != nullptr && info->close_when_added &&
      info->round->pending_adds() == 0) {
    CloseRound(e.round);
  }
}

v1::Reply SiteMachine::EndResult(uint32_t round, const v1::ModelHeader& header,
                                 const AggregationRound::ResultEnd& end) {
  if (IsStorageError(end.refused)) {
    // This site's disk failed under the result (full, failing): the result
    // is not at fault, and the site cannot gather. It leaves the job; the
    // trainer, answered ABORTED, takes its result to the next backup.
    return FailAndAbort(
        absl::StrCat("round ", header.round(), ": storing the result from ",
                     header.sender()),
        end.refused);
  }
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
  absl::Status job = CheckJobId(run_->job.get(), options_.site, ask.job_id());
  if (!job.ok()) {
    reply.set_outcome(v1::OUTCOME_REJECTED);
    reply.set_message(std::string(job.message()));
    return reply;
  }
  if (IsTerminal(run_->record.state)) {
    const v1::Reply ended = ReplyFromStatus(JobEndedHere(run_->record));
    reply.set_outcome(ended.outcome());
    reply.set_message(ended.message());
    return reply;
  }
  const uint64_t retry_ms = run_->job->config().request_to_submit_interval_ms();
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
  if (ask.sender() != options_.site && OwnResultFirst(round)) {
    reply.set_outcome(v1::OUTCOME_RETRY);
    reply.set_message(absl::StrCat(
        "round ", round, ": the aggregator adds its own result first"));
    reply.set_retry_after_ms(retry_ms);
    Heard(round, ask.sender(), now_);
    return reply;
  }
  Gathered(round)->chained.erase(ask.sender());  // It asks on its own.
  if (ChainAsk(ask, *target)) {
    // Held with the others until the chain starts (MaybeLaunchChain).
    reply.set_outcome(v1::OUTCOME_RETRY);
    reply.set_message(absl::StrCat("round ", round, ": ", ask.sender(),
                                   " waits for a reduction chain"));
    reply.set_retry_after_ms(retry_ms);
    Heard(round, ask.sender(), now_);
    return reply;
  }
  const AggregationRound::Permission permission =
      target->RequestToSubmit(ask.sender(), ask.round(), now_);
  const PermissionDecision& decision = permission.decision;
  reply.set_outcome(decision.outcome);
  reply.set_message(decision.message);
  reply.set_result_in(decision.code == PermissionCode::kAlreadySubmitted);
  if (decision.outcome == v1::OUTCOME_RETRY) reply.set_retry_after_ms(retry_ms);
  // Taking a slot turns no other request's RETRY into an answer: a status
  // change only.
  if (decision.code == PermissionCode::kGranted) Changed();
  if (decision.outcome == v1::OUTCOME_OK) Heard(round, ask.sender(), now_);
  OnRoundReport(round, permission.report);
  return reply;
}

v1::SubmitPermissionReply SiteMachine::NotGatheredHere(
    const v1::SubmitPermissionRequest& ask) const {
  // Ahead of this site, or a round it holds as a trainer only (it is a
  // backup now): either way it lacks the task. Or this site went on along a
  // chain that loses to the asker's (design section 6): it lacks the
  // winning chain's task of that round, which the asker hands over (a
  // "closed here" would leave the winning chain with no aggregator for the
  // round).
  const bool lacking =
      !run_->record.last_task_round.has_value() ||
      ask.round() > *run_->record.last_task_round ||
      (ask.round() == *run_->record.last_task_round &&
       run_->record.round_aggregator != options_.site &&
       run_->work.aggregating.count(ask.round()) == 0) ||
      CompareChains(LineageFromProto(ask.lineage()), run_->record.lineage,
                    std::min(ask.round(), *run_->record.last_task_round)) < 0;
  v1::SubmitPermissionReply reply;
  reply.set_outcome(lacking ? v1::OUTCOME_RETRY : v1::OUTCOME_REJECTED);
  reply.set_needs_learn_task(lacking);
  reply.set_message(
      lacking ? absl::StrCat("round ", ask.round(), " is not open here")
              : absl::StrCat("round ", ask.round(), " is closed here"));
  if (lacking) {
    reply.set_retry_after_ms(
        run_->job->config().request_to_submit_interval_ms());
  }
  return reply;
}

void SiteMachine::OnPermissionAsked(event::PermissionAsked& e) {
  // A request that cannot be held cannot wait for a reduction chain.
  if (e.hold_until <= now_) e.ask.set_direct(true);
  v1::SubmitPermissionReply reply = DecidePermission(e.ask);
  if (reply.outcome() == v1::OUTCOME_RETRY && e.hold_until > now_ &&
      !e.ask.probe()) {
    // Held until a slot frees or the round opens (AnswerHeldRequests), or
    // its deadline: no trainer sleeps while a slot is free.
    run_->work.held[e.request] = Held{e.ask, e.hold_until};
    Timer timer;
    timer.purpose = Timer::Purpose::kHeldPermission;
    timer.request = e.request;
    SetTimer(e.hold_until, timer);
    MaybeLaunchChain(e.ask.round(), /*now_or_never=*/false);
    return;
  }
  out_.push_back(effect::Reply{e.request, std::move(reply)});
}

void SiteMachine::OnRequestCancelled(event::RequestCancelled& e) {
  run_->work.held.erase(e.request);
}

void SiteMachine::AnswerHeldRequests() {
  // Asked in arrival order: the first held trainer gets the first slot.
  for (auto it = run_->work.held.begin(); it != run_->work.held.end();) {
    v1::SubmitPermissionReply reply = DecidePermission(it->second.ask);
    if (reply.outcome() == v1::OUTCOME_RETRY) {
      ++it;
      continue;
    }
    out_.push_back(effect::Reply{it->first, std::move(reply)});
    it = run_->work.held.erase(it);
  }
  // A trainer dropped or a result in: the chain may not wait any longer.
  std::vector<uint32_t> rounds;
  for (const auto& [round, gathered] : run_->work.rounds)
    rounds.push_back(round);
  for (uint32_t round : rounds) MaybeLaunchChain(round, false);
}

}  // namespace swarm
