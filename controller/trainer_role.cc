// TrainerRole: taking learn tasks, training, asking, submitting, failing
// over (trainer_role.h); chain reduction's hop is in trainer_role_chain.cc.
#include "controller/trainer_role.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/admission.h"
#include "controller/job_run.h"
#include "controller/replies.h"
#include "controller/retry_policy.h"
#include "gatherer/server_optimizer.h"
#include "streaming/partial_sum_sink.h"

namespace swarm::site {

void TrainerRole::OnCallDone(const Call& call, const event::CallDone& e) {
  switch (call.purpose) {
    case Call::Purpose::kAskPermission:
      return OnPermissionReply(call, e);
    case Call::Purpose::kSubmit:
      return OnSubmitDone(call, e);
    case Call::Purpose::kChainSubmit:
      return OnChainSubmitDone(call, e);
    case Call::Purpose::kHandoff:
      return OnHandoffDone(call, e);
    case Call::Purpose::kCatchUp:
      if (!e.reply.ok()) {
        site_->ReportError(
            absl::StrCat("round ", call.round, ": learn task to ", call.target,
                         " (catching up)"),
            e.reply.status());
      }
      return;
    case Call::Purpose::kTaskToTrainer:
    case Call::Purpose::kTaskToAggregator:
    case Call::Purpose::kFinal:
    case Call::Purpose::kShareBest:
      return;  // Not a trainer's.
  }
}

void TrainerRole::OnTimerFired(TimerId id, const Timer& timer) {
  if (timer.purpose == Timer::Purpose::kAskAgain && training_.has_value() &&
      training_->id == timer.training && training_->ask_timer == id) {
    AskToSubmit();
  }
}

void TrainerRole::EndTrainingAtLast(uint32_t round) {
  if (!training_.has_value() || training_->round > round) return;
  // The job's outcome is here: this site's last result is not needed for
  // a resubmission any more, and its round is over. The training record
  // goes with it (as at the next learn task), and with it the probing of
  // that round's aggregator: an aggregator lost after LAST must not make
  // this site hand a finished round to a backup (with lean memory its
  // models were let go already).
  Emit(effect::CancelTraining{});
  training_.reset();
}

void TrainerRole::ReplaceHeldModel(const Model* old,
                                   const std::shared_ptr<const Model>& mapped) {
  if (training_.has_value() && training_->global.get() == old) {
    training_->global = mapped;
  }
}

void TrainerRole::CatchUp(const v1::ModelHeader& stale) {
  if (!site_->Active() || !run().current_task.has_value() ||
      run().current_global == nullptr ||
      run().current_task->round() <= stale.round() ||
      !run().job->IsTrainer(stale.sender()) || stale.sender() == self()) {
    return;
  }
  // The trainer lost its aggregator while that aggregator's scatter of the
  // next round was under way and did not reach it: this site has that
  // round's task, and hands it on (as a handoff: it comes from a trainer,
  // not from the round's scatterer).
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = *run().current_task;
  message.header.set_sender(self());
  message.header.set_handoff(true);
  message.header.clear_expected_trainers();
  message.model = run().current_global;
  message.timeout = run().job->learn_task_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kCatchUp;
  call.round = run().current_task->round();
  SWARM_LOG_INFO(
      "round %d: %s handed over round %d, which is past here; "
      "sending it round %d's learn task",
      call.round, stale.sender(), stale.round(), call.round);
  Send(stale.sender(), std::move(message), call, /*retry=*/true);
}

v1::Reply TrainerRole::AcceptLearnTask(const v1::ModelHeader& header,
                                       std::shared_ptr<const Model> model) {
  // Judged again: the site may have moved on while the body streamed in.
  absl::StatusOr<Admitted> admitted =
      AdmitStream(run().job.get(), run().record, header);
  if (!admitted.ok()) return ReplyFromStatus(admitted.status());
  if (!admitted->receive_body) {
    if (absl::Status held = OnHeldTask(header, admitted->task); !held.ok()) {
      return ReplyFromStatus(held);
    }
    return MakeReply(v1::OUTCOME_OK, admitted->message);
  }
  if (header.aggregator_task_follows() && header.aggregator() == self() &&
      admitted->task == TaskVerdict::kNew) {
    // This site aggregates the round: the broadcast's copy waits for its
    // own task (which names the expected trainers) and comes without a
    // body.
    held_task_copy_ = HeldTaskCopy{header, std::move(model)};
    return MakeReply(v1::OUTCOME_OK,
                     absl::StrCat("round ", header.round(),
                                  ": kept for the aggregator's task"));
  }
  held_task_copy_.reset();
  site_->NotePrivacy(header.privacy_spent());
  if (admitted->task == TaskVerdict::kSwitch) SwitchToWinningChain(header);
  const bool aggregate = header.aggregator() == self();
  NoteLearnTask(header, model);
  // The outcome of the round this site trained before is known now: its
  // kept result is no longer needed.
  if (training_.has_value()) Emit(effect::CancelTraining{});
  training_.reset();
  if (aggregate) {
    if (header.attempt() > 0) {
      run().counters.set_rounds_taken_over(run().counters.rounds_taken_over() +
                                           1);
    }
    site_->OpenRound(header, model);
  }
  if (site_->IsTrainer(self())) {
    BeginTraining(header, model);
  } else if (aggregate) {
    site_->SetState(v1::SITE_STATE_GATHERING);
  }
  SWARM_LOG_INFO("round %d: learn task from %s (aggregator %s%s%s)",
                 header.round(), header.sender(), header.aggregator(),
                 header.attempt() > 0
                     ? absl::StrCat(" at attempt ", header.attempt())
                     : std::string(),
                 aggregate ? ", that is me" : "");
  return MakeReply(v1::OUTCOME_OK, "learn task accepted");
}

void TrainerRole::SwitchToWinningChain(const v1::ModelHeader& header) {
  DropLosingChain(header);
  if (run().record.state == v1::SITE_STATE_DONE) {
    // Done on the losing chain: its final models go (the winner's will
    // replace the files), and the site takes part again.
    run().record.state = v1::SITE_STATE_IDLE;
    run().finals.clear();
    run().record.final_rounds.clear();
    run().record.final_lineage.reset();
    run().end_reason.clear();
  }
}

void TrainerRole::NoteLearnTask(const v1::ModelHeader& header,
                                const std::shared_ptr<const Model>& model) {
  const bool first = !run().record.last_task_round.has_value();
  run().record.started = true;
  run().record.last_task_round = header.round();
  run().record.round_aggregator = header.aggregator();
  run().record.attempt = header.attempt();
  run().record.lineage = LineageFromProto(header.lineage());
  run().record.best = header.best();
  site_->SetAsideLostRounds(run().record.lineage, header.round());
  const bool rejoined = run().record.recovered;
  run().record.recovered = false;
  site_->KeepBestCopy(header.best());
  run().current_global = model;
  run().current_global_round = header.round();
  run().current_task = header;
  site_->PermissionMayChange();
  // The state file tells a restarted daemon that it is in this job (and on
  // which chain): written at the first task, a rejoin, and a failed-over
  // chain, not on every round (a file sync per trainer per round). A later
  // task than the one written is taken as new after a restart anyway.
  if (first || rejoined || header.attempt() > 0 || header.lineage_size() > 0) {
    site_->PersistState();
  }
  if (rejoined) {
    run().counters.set_rejoins(run().counters.rejoins() + 1);
    SWARM_LOG_INFO("round %d: rejoined the job after a restart",
                   header.round());
  }
}

void TrainerRole::BeginTraining(const v1::ModelHeader& header,
                                std::shared_ptr<const Model> model) {
  Training& task = training_.emplace();
  task.id = run().next_training++;
  task.round = header.round();
  task.global = model;
  task.task = header;
  task.task.clear_expected_trainers();
  task.aggregator = header.aggregator();
  task.attempt = header.attempt();
  site_->SetState(v1::SITE_STATE_TRAINING);
  Emit(effect::StartTraining{header.round(), std::move(model),
                             run().job->config().send_weight_diff(), run().id});
  // Watch the aggregator while training, so that its death moves the
  // round to a backup before this site's result is ready.
  if (header.aggregator() != self()) {
    ScheduleAsk(run().job->failover_timeout() / 2);
  }
}

absl::StatusOr<ModelAdmission> TrainerRole::AcceptHeldTask(
    const v1::ModelHeader& header) {
  if (!held_task_copy_.has_value() ||
      held_task_copy_->header.round() != header.round() ||
      held_task_copy_->header.attempt() != header.attempt() ||
      held_task_copy_->header.sender() != header.sender()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", header.round(), ": no copy of the round's model from ",
        header.sender(), " is kept here; send the task with its body"));
  }
  std::shared_ptr<const Model> model = std::move(held_task_copy_->model);
  held_task_copy_.reset();
  const v1::Reply reply = AcceptLearnTask(header, std::move(model));
  if (reply.outcome() != v1::OUTCOME_OK) return StatusFromReply(reply);
  ModelAdmission admission;
  admission.header_only = true;
  admission.reply_message = reply.message();
  return admission;
}

absl::Status TrainerRole::OnHeldTask(const v1::ModelHeader& header,
                                     TaskVerdict verdict) {
  if (verdict == TaskVerdict::kTakeOver) {
    if (absl::Status declined = DeclineTakeOver(header); !declined.ok()) {
      SWARM_LOG_WARNING("round %d: %s handed the round over: %s",
                        header.round(), header.sender(), declined.message());
      return declined;
    }
    TakeOver(header);
    return absl::OkStatus();
  }
  if (header.handoff()) site_->Heard(header.round(), header.sender(), now());
  return absl::OkStatus();
}

absl::Status TrainerRole::DeclineTakeOver(const v1::ModelHeader& header) const {
  if (!header.handoff() || header.sender() == self() ||
      !training_.has_value()) {
    return absl::OkStatus();
  }
  const Training& task = *training_;
  if (task.round != header.round() || task.aggregator == self() ||
      task.attempt + 1 != header.attempt() || task.handing_off ||
      task.failures > 0 || task.lacking_since != absl::InfiniteFuture() ||
      now() - task.confirmed > run().job->failover_timeout()) {
    return absl::OkStatus();
  }
  return absl::AlreadyExistsError(
      absl::StrCat("not taking over round ", header.round(), " at attempt ",
                   header.attempt(), ": ", task.aggregator,
                   " holds it at attempt ", task.attempt, " (it answered ",
                   self(), " ", absl::FormatDuration(now() - task.confirmed),
                   " ago) and that attempt wins; submit there"));
}

void TrainerRole::TakeOver(const v1::ModelHeader& header) {
  const uint32_t round = header.round();
  // A site that failed over to itself noted it already (FailOver).
  if (header.sender() != self()) {
    site_->NoteFailover(round, run().record.round_aggregator, self(),
                        absl::StrCat("handed over by ", header.sender()));
  }
  run().counters.set_rounds_taken_over(run().counters.rounds_taken_over() + 1);
  run().record.round_aggregator = self();
  run().record.attempt = header.attempt();
  site_->PermissionMayChange();
  site_->OpenRound(header, run().current_global);
  if (training_.has_value() && training_->round == round) {
    // This site's own result goes to itself now (again, if it went to the
    // aggregator given up on).
    Training& task = *training_;
    task.FollowAggregator(self(), header.attempt());
    if (task.trained()) {
      site_->SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
      AskToSubmit();
    }
  } else if (site_->Gathers(round)) {
    site_->SetState(v1::SITE_STATE_GATHERING);
  }
}

void TrainerRole::DropLosingChain(const v1::ModelHeader& winner) {
  uint32_t round = 0;
  const Lineage lineage = LineageFromProto(winner.lineage());
  const bool done = run().record.state == v1::SITE_STATE_DONE &&
                    run().record.final_lineage.has_value();
  const Lineage& mine =
      done ? *run().record.final_lineage : run().record.lineage;
  const uint32_t below =
      run().record.last_task_round.has_value() && !done
          ? std::min(winner.round(), *run().record.last_task_round)
          : winner.round();
  CompareChains(lineage, mine, below, &round);
  // What this site gathered, aggregated and scattered on the losing chain
  // goes.
  const uint64_t dropped = site_->DropLosingWork();
  run().counters.set_discarded_aggregates(
      run().counters.discarded_aggregates() + 1);
  site_->ReportError(
      absl::StrCat("round ", winner.round(), ": switching to the chain of ",
                   winner.sender()),
      absl::AbortedError(absl::StrCat(
          "it aggregated round ", round, " at attempt ",
          AttemptOf(lineage, round), ", this site's chain at attempt ",
          AttemptOf(mine, round), "; the lower wins",
          dropped > 0 ? absl::StrCat("; dropped ", dropped,
                                     " round(s) this site gathered")
                      : std::string())));
  site_->PermissionMayChange();
}

void TrainerRole::OnTrainingDone(event::TrainingDone& e) {
  if (!training_.has_value() || training_->round != e.round ||
      training_->trained() || !site_->Active()) {
    return;
  }
  Training& task = *training_;
  v1::ModelHeader& header = task.result_header;
  header = site_->BaseHeader(v1::MODEL_KIND_RESULT, task.round);
  header.set_aggregator(task.aggregator);
  header.set_attempt(task.attempt);
  *header.mutable_lineage() = task.task.lineage();
  if (e.metrics.ok()) {
    for (const auto& [name, value] : *e.metrics) {
      (*header.mutable_metrics())[name] = value;
    }
    run().metrics = *e.metrics;
  }
  absl::StatusOr<TrainOutput>& output = e.output;
  if (e.metrics.ok() && output.ok()) {
    header.set_sample_count(output->sample_count);
    header.set_payload_kind(output->kind);
    if (output->spent.has_value()) {
      // This site's privacy spend with the result's charge: to the
      // aggregator, and on into the final models.
      (*header.mutable_privacy_spent())[self()] = *output->spent;
      site_->NotePrivacy(header.privacy_spent());
    }
    run().counters.set_rounds_trained(run().counters.rounds_trained() + 1);
    task.result = std::make_shared<const Model>(std::move(output->model));
  } else {
    const absl::Status failed =
        e.metrics.ok() ? output.status() : e.metrics.status();
    site_->ReportError(absl::StrCat("round ", task.round, ": training"),
                       failed);
    header.set_failed(true);
    header.set_failure(std::string(failed.message()));
    // Out of privacy budget: it will not train again in this job.
    header.set_trainer_stopped(StoppedForJob(failed));
  }
  task.BecomeAsking(now());
  site_->SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  AskToSubmit();
}

void TrainerRole::AddChain(v1::SubmitPermissionRequest* ask) const {
  ask->set_attempt(training_->attempt);
  *ask->mutable_lineage() = training_->task.lineage();
}

void TrainerRole::AskToSubmit() {
  if (!training_.has_value() || !site_->Active() || training_->handing_off)
    return;
  Training& task = *training_;
  task.ask_timer = 0;
  if (task.phase() == Training::Phase::kChainMember &&
      now() >= task.chain_until()) {
    return LeaveChain(
        "no partial sum came through this site",
        absl::DeadlineExceededError("the reduction chain's wait ran out"));
  }
  const bool probe = task.Probing();
  if (probe && task.aggregator == self()) return;
  PeerMessage message;
  message.kind = CallKind::kRequestToSubmit;
  message.permission.set_job_id(run().job->id());
  message.permission.set_sender(self());
  message.permission.set_round(task.round);
  message.permission.set_probe(probe);
  // A result that cannot travel in a partial sum asks for a slot at once.
  message.permission.set_direct(
      task.direct() || task.result == nullptr || task.result_header.failed() ||
      !CheckPartialSumLayout(task.result->specs()).ok());
  AddChain(&message.permission);
  message.timeout = run().job->request_to_submit_message_timeout();
  Call call;
  call.purpose = Call::Purpose::kAskPermission;
  call.round = task.round;
  call.probe = probe;
  Send(task.aggregator, std::move(message), call, /*retry=*/false);
}

void TrainerRole::ScheduleAsk(absl::Duration wait) {
  if (wait <= absl::ZeroDuration()) return AskToSubmit();
  Timer timer;
  timer.purpose = Timer::Purpose::kAskAgain;
  timer.training = training_->id;
  training_->ask_timer = SetTimer(now() + wait, timer);
}

void TrainerRole::OnAggregatorTrouble(const absl::Status& status) {
  Training& task = *training_;
  const bool lacking = status.ok();  // Alive, but it lacks the task.
  if (lacking) {
    task.lacking_since = std::min(task.lacking_since, now());
    if (now() - task.lacking_since >= run().job->failover_timeout()) {
      task.lacking_since = absl::InfiniteFuture();
      return HandOff();
    }
  } else {
    ++task.failures;
    task.failing_since = std::min(task.failing_since, now());
    if (task.failures >= static_cast<int>(run().job->failover_attempts()) ||
        now() - task.failing_since >= run().job->failover_timeout()) {
      return FailOver(std::string(status.message()));
    }
  }
  ScheduleAsk(run().job->request_to_submit_interval());
}

void TrainerRole::FailOver(const std::string& reason) {
  Training& task = *training_;
  const uint32_t next = task.attempt + 1;
  const std::string backup = run().job->AggregatorAt(task.round, next);
  if (backup.empty()) {
    return site_->Fail(
        absl::StrCat("round ", task.round, ": no aggregator reachable"),
        absl::UnavailableError(absl::StrCat(
            "the last backup, ", task.aggregator, ", failed: ", reason)));
  }
  site_->ReportError(
      absl::StrCat("round ", task.round, ": giving up on aggregator ",
                   task.aggregator),
      absl::UnavailableError(reason));
  site_->NoteFailover(task.round, task.aggregator, backup, reason);
  run().counters.set_failovers(run().counters.failovers() + 1);
  task.FollowAggregator(backup, next);
  // A chain or an upload to the aggregator given up on is over (its answer
  // is ignored).
  task.AskAfresh();
  if (backup != self()) {
    run().record.round_aggregator = backup;
    run().record.attempt = next;
  }
  if (task.trained()) site_->SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  HandOff();
}

void TrainerRole::HandOff() {
  Training& task = *training_;
  task.handing_off = true;
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = task.task;
  message.header.set_sender(self());
  message.header.set_handoff(true);
  message.model = task.global;
  message.timeout = run().job->learn_task_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kHandoff;
  call.round = task.round;
  SWARM_LOG_INFO("round %d: handing the round to %s (attempt %d)", task.round,
                 task.aggregator, task.attempt);
  Send(task.aggregator, std::move(message), call, /*retry=*/false);
}

void TrainerRole::OnHandoffDone(const Call& call, const event::CallDone& e) {
  if (!training_.has_value() || training_->round != call.round ||
      training_->aggregator != call.target || !site_->Active()) {
    return;
  }
  Training& task = *training_;
  task.handing_off = false;
  const absl::Status status = ReplyStatus(e);
  if (status.ok()) {
    if (task.trained() && !task.submitted()) return AskToSubmit();
    return ScheduleAsk(run().job->failover_timeout() / 2);
  }
  if (status.code() == absl::StatusCode::kAlreadyExists && task.attempt > 0 &&
      run().job->AggregatorAt(task.round, task.attempt - 1) != self()) {
    // Declined: the backup still reaches the aggregator of the attempt
    // before, which holds the round (DeclineTakeOver).
    return FailBack(std::string(status.message()));
  }
  // A backup that follows a chain beating this site's refuses the handoff
  // for that reason: not trouble to fail over from (the next backup, this
  // site perhaps, would take the losing chain's round alone).
  if (!e.reply.ok() && !IsLosingChainRefusal(e.reply.status())) {
    return OnAggregatorTrouble(e.reply.status());
  }
  if (e.reply.ok() && e.reply->reply.outcome() == v1::OUTCOME_ABORTED) {
    return FailOver(e.reply->reply.message());  // The backup's job ended.
  }
  // Refused: the round went on without this site (a later round is under
  // way there, or another chain won). The winner's next learn task brings it
  // back.
  site_->ReportError(
      absl::StrCat("round ", task.round, ": ", call.target,
                   " refused the handoff; this site's result is ", "left out"),
      status);
  training_.reset();
  site_->SetIdleOrGathering();
}

void TrainerRole::FailBack(const std::string& reason) {
  Training& task = *training_;
  const uint32_t back = task.attempt - 1;
  const std::string previous = run().job->AggregatorAt(task.round, back);
  site_->ReportError(absl::StrCat("round ", task.round, ": ", task.aggregator,
                                  " declined the round; back to ", previous),
                     absl::AlreadyExistsError(reason));
  task.FollowAggregator(previous, back);
  run().record.round_aggregator = previous;
  run().record.attempt = back;
  // Asked again after half a failover timeout: time for a link that was
  // refused to come back, and for the backup to probe that aggregator
  // again (it takes the next handoff if the aggregator is gone).
  ScheduleAsk(run().job->failover_timeout() / 2);
}

void TrainerRole::OnPermissionReply(const Call& call,
                                    const event::CallDone& e) {
  if (!training_.has_value() || training_->round != call.round ||
      training_->aggregator != call.target || !site_->Active()) {
    return;
  }
  Training& task = *training_;
  // A reply to a probe while this site now asks for a slot (or the other
  // way round) belongs to a chain of calls that has ended.
  if (call.probe != task.Probing()) return;
  if (!e.reply.ok()) {
    site_->ReportError(
        absl::StrCat("round ", task.round, ": ",
                     call.probe ? "probing " : "asking ", task.aggregator,
                     call.probe ? "" : " to submit"),
        e.reply.status());
    return OnAggregatorTrouble(e.reply.status());
  }
  const v1::SubmitPermissionReply& reply = e.reply->permission;
  task.failures = 0;
  task.failing_since = absl::InfiniteFuture();
  if (reply.outcome() == v1::OUTCOME_ABORTED) {
    // The aggregator's job failed or was aborted there: it will never
    // close the round. The next backup takes it, with this site's result.
    return FailOver(reply.message());
  }
  if (reply.outcome() == v1::OUTCOME_RETRY && reply.needs_learn_task()) {
    // Alive, but without this round's task (it never arrived, or it came
    // back from a restart): hand it over once that lasts.
    task.ResultLost();
    return OnAggregatorTrouble(absl::OkStatus());
  }
  task.lacking_since = absl::InfiniteFuture();
  task.confirmed = now();
  if (call.probe) {
    // The aggregator is alive (it gathers the round, or closed it and the
    // outcome is on its way). Look again later.
    return ScheduleAsk(run().job->failover_timeout() / 2);
  }
  OnSlotReply(task, reply);
}

void TrainerRole::OnSlotReply(Training& task,
                              const v1::SubmitPermissionReply& reply) {
  if (reply.outcome() == v1::OUTCOME_OK && reply.reduce_to_size() > 0) {
    return StartChain(reply);
  }
  if (reply.outcome() == v1::OUTCOME_OK && reply.reduce_member()) {
    // The result is collected by the partial sum passing through here;
    // the aggregator is probed meanwhile.
    const absl::Duration wait = absl::Milliseconds(reply.reduce_wait_ms());
    task.BecomeChainMember(now() + wait);
    site_->SetState(v1::SITE_STATE_SUBMITTING);
    return ScheduleAsk(std::min(wait, run().job->failover_timeout() / 2));
  }
  if (reply.outcome() == v1::OUTCOME_OK) {
    site_->SetState(v1::SITE_STATE_SUBMITTING);
    task.BecomeUploading();
    PeerMessage message;
    message.kind = CallKind::kSubmitResult;
    message.header = task.result_header;
    message.model = task.result;
    Call submit;
    submit.purpose = Call::Purpose::kSubmit;
    submit.round = task.round;
    Send(task.aggregator, std::move(message), submit, /*retry=*/false);
    return;
  }
  if (reply.outcome() == v1::OUTCOME_REJECTED && reply.result_in()) {
    // The answer to its upload or to its partial sum was lost: the result
    // is in all the same. Kept until the outcome, as after any submission.
    SWARM_LOG_INFO("round %d: %s has this site's result already (%s)",
                   task.round, task.aggregator, reply.message());
    return ResultIsIn(task);
  }
  if (reply.outcome() != v1::OUTCOME_RETRY) {
    site_->ReportError(absl::StrCat("round ", task.round, ": aggregator ",
                                    task.aggregator, " refused the submission"),
                       absl::FailedPreconditionError(reply.message()));
    training_.reset();
    site_->SetIdleOrGathering();
    return;
  }
  const absl::Time give_up =
      task.asking_since() + run().job->request_to_submit_max_wait();
  const absl::Duration wait = absl::Milliseconds(reply.retry_after_ms());
  if (now() + wait > give_up) {
    site_->ReportError(
        absl::StrCat("round ", task.round, ": gave up asking ", task.aggregator,
                     " to submit"),
        absl::DeadlineExceededError("request_to_submit_max_wait passed"));
    training_.reset();
    site_->SetState(v1::SITE_STATE_IDLE);
    return;
  }
  ScheduleAsk(wait);
}

void TrainerRole::ResultIsIn(Training& task) {
  // Kept until the round's outcome arrives; the aggregator is probed
  // meanwhile, so that its death moves the round to a backup.
  task.BecomeSubmitted(now());
  site_->SetIdleOrGathering();
  if (task.aggregator != self()) {
    ScheduleAsk(run().job->failover_timeout() / 2);
    return;
  }
  // In this site's own round: there is no other aggregator to resubmit it
  // to (if this site's round fails, this site has left the job). The held
  // trainers may go on (OwnResultFirst).
  if (task.result != nullptr && site_->LeanFor(task.result->total_bytes())) {
    task.result.reset();
  }
  site_->PermissionMayChange();
}

void TrainerRole::OnSubmitDone(const Call& call, const event::CallDone& e) {
  if (!training_.has_value() || training_->round != call.round ||
      training_->aggregator != call.target) {
    return;
  }
  Training& task = *training_;
  task.UploadEnded();
  const absl::Status status = ReplyStatus(e);
  if (status.ok()) {
    SWARM_LOG_INFO("round %d: result submitted to %s", call.round, call.target);
    return ResultIsIn(task);
  }
  site_->ReportError(
      absl::StrCat("round ", call.round, ": submitting to ", call.target),
      status);
  if (!site_->Active()) return;
  if (!e.reply.ok() && RetryPolicy::Retryable(e.reply.status())) {
    site_->SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
    return OnAggregatorTrouble(e.reply.status());
  }
  if (e.reply.ok() && e.reply->reply.outcome() == v1::OUTCOME_ABORTED) {
    // The aggregator failed (a disk error while it received this result,
    // say): the result goes to the next backup.
    return FailOver(e.reply->reply.message());
  }
  if (e.reply.ok() && e.reply->reply.outcome() == v1::OUTCOME_RETRY) {
    // The permission was released with the failed upload: ask again.
    site_->SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
    return ScheduleAsk(run().job->request_to_submit_interval());
  }
  training_.reset();
  site_->SetIdleOrGathering();
}

bool TrainerRole::OwnResultFirst(uint32_t round) const {
  if (!training_.has_value() || training_->round != round ||
      training_->aggregator != self() || training_->submitted() ||
      training_->global == nullptr) {
    return false;
  }
  return site_->LeanFor(training_->global->total_bytes());
}

}  // namespace swarm::site
