// SiteMachine, trainer side (design section 3, steps 1 to 5): the scatter of
// each round's learn tasks, training, asking the aggregator for permission
// and submitting the result.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/admission.h"
#include "controller/replies.h"
#include "controller/retry_policy.h"
#include "controller/site_machine.h"
#include "gatherer/server_optimizer.h"
#include "streaming/partial_sum_sink.h"

namespace swarm {

namespace {

// How a call answered by a Reply ended, as a status.
absl::Status ReplyStatus(const event::CallDone& e) {
  if (!e.reply.ok()) return e.reply.status();
  return StatusFromReply(e.reply->reply);
}

}  // namespace

void SiteMachine::ScatterRound(uint32_t round,
                               std::shared_ptr<const Model> global,
                               v1::BestRecord best, const Lineage& lineage,
                               bool resume) {
  if (!Active()) return;
  const std::vector<std::string> order = run_->job->ElectionOrder(round);
  if (order.empty()) {
    return Fail("election",
                absl::FailedPreconditionError("no aggregator candidate"));
  }
  Scatter scatter;
  scatter.header = BaseHeader(v1::MODEL_KIND_LEARN_TASK, round);
  scatter.header.set_aggregator(order[0]);
  for (size_t i = 1; i < order.size(); ++i) {
    scatter.header.add_backup_aggregators(order[i]);
  }
  *scatter.header.mutable_best() = best;
  LineageToProto(lineage, scatter.header.mutable_lineage());
  scatter.header.set_resume(resume);
  // Every trainer's privacy spend travels from round to round, so that
  // whichever site ends the job knows it for the final models.
  scatter.header.mutable_privacy_spent()->insert(run_->privacy_spent.begin(),
                                                 run_->privacy_spent.end());
  scatter.global = std::move(global);
  SWARM_LOG_INFO("round %d: scattering to %d trainers, aggregator %s", round,
                 static_cast<int>(run_->job->trainers().size()), order[0]);
  // Phase 1: every trainer but the aggregator; their acknowledgements form
  // the round's expected set. Phase 2: the aggregator, with that set.
  for (const std::string& trainer : run_->job->trainers()) {
    if (trainer != order[0]) scatter.answers.Expect(trainer);
  }
  if (scatter.answers.done()) return SendTaskToAggregator(scatter);
  const std::vector<std::string> chain = BroadcastChain(scatter);
  Scatter& stored = run_->work.scatters[round] = std::move(scatter);
  for (const std::string& target : stored.answers.waiting()) {
    if (chain.empty() || target == options_.site) {
      SendTaskToTrainer(stored, target);
    }
  }
  if (!chain.empty()) {
    PeerMessage message = TaskToTrainer(stored);
    for (size_t i = 1; i < chain.size(); ++i) {
      message.header.add_relay_to(chain[i]);
    }
    // Each forwarder waits failover_timeout per hop after it, this site one
    // more.
    message.relay_stall = RelayStallBudget(run_->job->failover_timeout(),
                                           static_cast<int>(chain.size()));
    Call call;
    call.purpose = Call::Purpose::kTaskToTrainer;
    call.round = round;
    call.chain = chain;
    SWARM_LOG_INFO("round %d: broadcasting the learn task along %s", round,
                   absl::StrJoin(chain, " -> "));
    Send(chain[0], std::move(message), std::move(call));
  }
}

std::vector<std::string> SiteMachine::BroadcastChain(Scatter& scatter) const {
  // With broadcast, one stream goes along the other sites, each forwarding
  // it to the next as it arrives; this site's own task stays a loopback.
  std::vector<std::string> chain;
  if (!run_->job->config().broadcast_learn_tasks()) return chain;
  for (const std::string& trainer : scatter.answers.waiting()) {
    if (trainer != options_.site) chain.push_back(trainer);
  }
  // Rotated by round, so that no one site is always the chain's head.
  if (!chain.empty()) {
    std::rotate(chain.begin(),
                chain.begin() + scatter.header.round() % chain.size(),
                chain.end());
  }
  // The aggregator last: it keeps its copy for its own task, which then
  // goes without a body (it names the round's expected set, known only
  // once the trainers answered), so this site's link carries the model
  // about once.
  const std::string& aggregator = scatter.header.aggregator();
  if (!chain.empty() && aggregator != options_.site) {
    chain.push_back(aggregator);
    scatter.header.set_aggregator_task_follows(true);
  }
  if (chain.size() < 2) {
    chain.clear();
    scatter.header.clear_aggregator_task_follows();
  }
  return chain;
}

PeerMessage SiteMachine::TaskToTrainer(const Scatter& scatter) const {
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = scatter.header;
  message.model = scatter.global;
  message.timeout = run_->job->learn_task_ack_timeout();
  return message;
}

void SiteMachine::SendTaskToTrainer(const Scatter& scatter,
                                    const std::string& target) {
  Call call;
  call.purpose = Call::Purpose::kTaskToTrainer;
  call.round = scatter.header.round();
  Send(target, TaskToTrainer(scatter), std::move(call));
}

void SiteMachine::OnChainTaskDone(const Call& call, const event::CallDone& e) {
  // The head answered for itself, and in `relayed` for each site after it
  // that the forwarded stream reached (in chain order).
  std::map<std::string, absl::Status> answered;
  answered[call.chain[0]] = ReplyStatus(e);
  const std::string& aggregator = call.chain.back();
  if (e.reply.ok()) {
    for (const v1::RelayOutcome& relayed : e.reply->reply.relayed()) {
      if (std::find(call.chain.begin() + 1, call.chain.end(), relayed.site()) ==
              call.chain.end() ||
          answered.count(relayed.site()) > 0) {
        continue;  // Not a site of this chain: ignored.
      }
      v1::Reply reply;
      reply.set_outcome(relayed.outcome());
      reply.set_message(relayed.message());
      answered[relayed.site()] =
          relayed.transport_failed()
              ? absl::UnavailableError(absl::StrCat(
                    "forwarded along the chain: ", relayed.message()))
              : StatusFromReply(reply);
    }
  }
  auto it = run_->work.scatters.find(call.round);
  const bool aggregator_on_chain = it != run_->work.scatters.end() &&
                                   it->second.header.aggregator_task_follows();
  if (aggregator_on_chain) {
    // The aggregator is not a trainer of the scatter: whether it kept a
    // copy decides only whether its task goes with a body.
    auto kept = answered.find(aggregator);
    it->second.aggregator_holds_copy =
        kept != answered.end() && kept->second.ok();
    answered.erase(aggregator);
  }
  std::vector<std::string> direct;
  for (size_t i = 1; i < call.chain.size(); ++i) {
    const std::string& site = call.chain[i];
    if (aggregator_on_chain && site == aggregator) continue;
    auto found = answered.find(site);
    // A site the chain did not reach, or that its forwarder could not
    // reach, gets the task straight from here (its forwarder's link may be
    // the broken one).
    if (found == answered.end() || absl::IsUnavailable(found->second) ||
        absl::IsDeadlineExceeded(found->second)) {
      direct.push_back(site);
      answered.erase(site);
    }
  }
  const bool fallback =
      !direct.empty() && it != run_->work.scatters.end() && Active();
  if (fallback) {
    SWARM_LOG_INFO(
        "round %d: the broadcast did not reach %s; sending the learn task "
        "directly",
        call.round, absl::StrJoin(direct, ", "));
    for (const std::string& site : direct) {
      SendTaskToTrainer(it->second, site);
    }
  }
  // With direct sends under way, the grace for the sites still silent
  // starts at the first direct acknowledgement, as in a scatter without
  // broadcast: the chain's answers came before those sends began.
  for (const auto& [site, status] : answered) {
    NoteTaskToTrainer(call.round, site, status, /*may_start_grace=*/!fallback);
  }
}

void SiteMachine::OnTaskToTrainerDone(const Call& call,
                                      const event::CallDone& e) {
  if (!call.chain.empty()) return OnChainTaskDone(call, e);
  NoteTaskToTrainer(call.round, call.target, ReplyStatus(e));
}

void SiteMachine::NoteTaskToTrainer(uint32_t round, const std::string& target,
                                    const absl::Status& status,
                                    bool may_start_grace) {
  if (!status.ok()) {
    ReportError(absl::StrCat("round ", round, ": learn task to ", target,
                             " not acknowledged; not waiting for it"),
                status);
  }
  auto it = run_->work.scatters.find(round);
  if (it == run_->work.scatters.end()) return;
  Scatter& scatter = it->second;
  // The tasks stream in parallel: a trainer still silent a failover
  // timeout after the first one acknowledged is down, frozen or cut off,
  // and the round does not wait for it. Only another site's
  // acknowledgement counts: this site's own comes at once, and a large
  // model may take the others longer than a failover timeout to receive.
  const FanOut::Noted noted = scatter.answers.NoteAnswer(
      target, status, may_start_grace && target != options_.site);
  if (!noted.counted) return;
  if (noted.start_grace) {
    Timer timer;
    timer.purpose = Timer::Purpose::kScatterGrace;
    timer.round = round;
    SetTimer(now_ + run_->job->failover_timeout(), timer);
  }
  if (!scatter.answers.done()) return;
  Scatter done = std::move(scatter);
  run_->work.scatters.erase(it);
  SendTaskToAggregator(done);
}

void SiteMachine::EndScatterWait(uint32_t round) {
  auto it = run_->work.scatters.find(round);
  if (it == run_->work.scatters.end() || !Active()) return;
  Scatter done = std::move(it->second);
  run_->work.scatters.erase(it);
  for (const std::string& trainer : done.answers.GiveUpWaiting(
           "no acknowledgement within failover_timeout_ms of the first one")) {
    ReportError(absl::StrCat("round ", round, ": learn task to ", trainer,
                             " not acknowledged; not waiting for it"),
                absl::DeadlineExceededError(
                    "silent for failover_timeout_ms after the first "
                    "acknowledgement"));
  }
  SendTaskToAggregator(done);
}

void SiteMachine::SendTaskToAggregator(const Scatter& scatter) {
  if (!Active()) return;
  const uint32_t round = scatter.header.round();
  Scatter& task = run_->work.aggregator_tasks[round] = scatter;
  std::vector<std::string> expected = scatter.answers.acked();
  if (IsTrainer(scatter.header.aggregator())) {
    expected.push_back(scatter.header.aggregator());
  }
  std::sort(expected.begin(), expected.end());
  for (const std::string& name : expected) {
    task.header.add_expected_trainers(name);
  }
  SendAggregatorTask(round);
}

void SiteMachine::SendAggregatorTask(uint32_t round) {
  const Scatter& task = run_->work.aggregator_tasks.at(round);
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = task.header;
  message.header.clear_aggregator_task_follows();
  message.model = task.global;
  if (task.aggregator_holds_copy) {
    // It has the model from the broadcast: the header is the task.
    message.header.set_body_held(true);
    message.model = nullptr;
  }
  message.timeout = run_->job->learn_task_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kTaskToAggregator;
  call.round = round;
  // Without this task the round cannot happen: keep trying for the
  // failover timeout (an aggregator back from a short cut then runs the
  // round), then hand the round to the next backup.
  Send(task.header.aggregator(), std::move(message), call, /*retry=*/true,
       now_ + run_->job->failover_timeout());
}

void SiteMachine::CatchUp(const v1::ModelHeader& stale) {
  if (!Active() || !run_->current_task.has_value() ||
      run_->current_global == nullptr ||
      run_->current_task->round() <= stale.round() ||
      !run_->job->IsTrainer(stale.sender()) ||
      stale.sender() == options_.site) {
    return;
  }
  // The trainer lost its aggregator while that aggregator's scatter of the
  // next round was under way and did not reach it: this site has that
  // round's task, and hands it on (as a handoff: it comes from a trainer,
  // not from the round's scatterer).
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = *run_->current_task;
  message.header.set_sender(options_.site);
  message.header.set_handoff(true);
  message.header.clear_expected_trainers();
  message.model = run_->current_global;
  message.timeout = run_->job->learn_task_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kCatchUp;
  call.round = run_->current_task->round();
  SWARM_LOG_INFO(
      "round %d: %s handed over round %d, which is past here; "
      "sending it round %d's learn task",
      call.round, stale.sender(), stale.round(), call.round);
  Send(stale.sender(), std::move(message), call, /*retry=*/true);
}

void SiteMachine::KeepBestCopy(const v1::BestRecord& best) {
  if (!best.present()) return;
  if (run_->best_model != nullptr && run_->best_model_round == best.round())
    return;
  if (run_->current_global != nullptr &&
      run_->current_global_round == best.round()) {
    // The round this site last trained on scored best: its input is the
    // best model, kept until a better one (more than one site can then
    // give BEST at the end).
    run_->best_model = TrainableView(run_->current_global);
    run_->best_model_round = best.round();
    return;
  }
  run_->best_model.reset();  // Superseded: a better model exists elsewhere.
}

void SiteMachine::NoteFailover(uint32_t round, const std::string& from,
                               const std::string& to,
                               const std::string& reason) {
  v1::Failover failover;
  failover.set_round(round);
  failover.set_from(from);
  failover.set_to(to);
  failover.set_reason(reason);
  run_->failovers.push_back(std::move(failover));
  while (run_->failovers.size() > 32) run_->failovers.pop_front();
  SWARM_LOG_WARNING("round %d: failover from %s to %s (%s)", round, from, to,
                    reason);
  Changed();
}

void SiteMachine::OnTaskToAggregatorDone(const Call& call,
                                         const event::CallDone& e) {
  auto it = run_->work.aggregator_tasks.find(call.round);
  if (it == run_->work.aggregator_tasks.end()) return;
  const absl::Status status = ReplyStatus(e);
  if (!status.ok() && it->second.aggregator_holds_copy && Active()) {
    // Sent without a body and not taken (the aggregator lost its copy, or
    // the call failed): again, with the body.
    SWARM_LOG_INFO(
        "round %d: aggregator %s did not take its task without a body (%s); "
        "sending it with the model",
        call.round, call.target, status.message());
    it->second.aggregator_holds_copy = false;
    return SendAggregatorTask(call.round);
  }
  if (status.ok() || !Active()) {
    if (status.ok()) AnswerStart(call.round, &it->second);
    run_->work.aggregator_tasks.erase(it);
    return;
  }
  const bool ended_there =
      e.reply.ok() && e.reply->reply.outcome() == v1::OUTCOME_ABORTED;
  if (status.code() == absl::StatusCode::kFailedPrecondition &&
      e.maybe_delivered && !ended_there) {
    // An earlier attempt did arrive and the aggregator has moved on (it
    // holds this round's task or a later one, or has finished): the round
    // went ahead. Not a reason to fail the job.
    SWARM_LOG_INFO("round %d: aggregator %s already had its learn task (%s)",
                   call.round, call.target, status.message());
    AnswerStart(call.round, &it->second);
    run_->work.aggregator_tasks.erase(it);
    return;
  }
  if (run_->record.last_task_round.has_value() &&
      *run_->record.last_task_round > call.round) {
    // The round went on meanwhile (its trainers handed it over): this
    // task is no longer needed.
    AnswerStart(call.round, &it->second);
    run_->work.aggregator_tasks.erase(it);
    return;
  }
  const bool lost = ScatterLost(it->second.header);
  if (call.target == options_.site && !e.reply.ok() && !lost) {
    return Fail(absl::StrCat("round ", call.round, ": own learn task"), status);
  }
  if (lost || (e.reply.ok() && !ended_there)) {
    // The aggregator answered and refused: its reason stands (another chain
    // won, or the round went on without this task). An aggregator whose job
    // failed or was aborted (OUTCOME_ABORTED) is passed over like one that
    // cannot be reached. When this site scattered the round for a chain
    // that lost meanwhile (it follows the winner now, design section 6), its
    // aggregate is dropped and it goes on in the winner's rounds: its own
    // task (loopback) is refused for that reason too, no cause to fail.
    const std::string what =
        lost ? absl::StrCat("dropped the learn task of a chain that lost")
             : absl::StrCat("aggregator ", call.target,
                            " refused its learn task");
    ReportError(absl::StrCat("round ", call.round, ": ", what), status);
    AnswerStart(call.round, nullptr,
                absl::FailedPreconditionError(
                    absl::StrCat(what, ": ", status.message())));
    run_->work.aggregator_tasks.erase(it);
    if (lost) {
      run_->counters.set_discarded_aggregates(
          run_->counters.discarded_aggregates() + 1);
      SetAsideLostRounds(run_->record.lineage, *run_->record.last_task_round);
    }
    return;
  }
  PassTaskToBackup(call, status);
}

void SiteMachine::PassTaskToBackup(const Call& call,
                                   const absl::Status& status) {
  Scatter& task = run_->work.aggregator_tasks.at(call.round);
  const uint32_t next = task.header.attempt() + 1;
  const std::string backup = run_->job->AggregatorAt(call.round, next);
  if (backup.empty()) {
    return Fail(absl::StrCat("round ", call.round, ": no aggregator reachable ",
                             "(the last backup was ", call.target, ")"),
                status);
  }
  ReportError(absl::StrCat("round ", call.round, ": aggregator ", call.target,
                           " unreachable"),
              status);
  NoteFailover(call.round, call.target, backup,
               absl::StrCat("learn task not delivered: ", status.message()));
  run_->counters.set_failovers(run_->counters.failovers() + 1);
  task.header.set_aggregator(backup);
  task.header.set_attempt(next);
  // The aggregator given up on does not train this round either (a trainer
  // the backup would wait two failover timeouts for).
  auto* expected = task.header.mutable_expected_trainers();
  for (int i = expected->size() - 1; i >= 0; --i) {
    if (expected->Get(i) == call.target) expected->DeleteSubrange(i, 1);
  }
  SendAggregatorTask(call.round);
}

v1::Reply SiteMachine::AcceptLearnTask(const v1::ModelHeader& header,
                                       std::shared_ptr<const Model> model) {
  // Judged again: the site may have moved on while the body streamed in.
  absl::StatusOr<Admitted> admitted =
      AdmitStream(run_->job.get(), run_->record, header);
  if (!admitted.ok()) return ReplyFromStatus(admitted.status());
  if (!admitted->receive_body) {
    if (absl::Status held = OnHeldTask(header, admitted->task); !held.ok()) {
      return ReplyFromStatus(held);
    }
    return MakeReply(v1::OUTCOME_OK, admitted->message);
  }
  if (header.aggregator_task_follows() &&
      header.aggregator() == options_.site &&
      admitted->task == TaskVerdict::kNew) {
    // This site aggregates the round: the broadcast's copy waits for its
    // own task (which names the expected trainers) and comes without a
    // body.
    run_->work.held_task_copy = HeldTaskCopy{header, std::move(model)};
    return MakeReply(v1::OUTCOME_OK,
                     absl::StrCat("round ", header.round(),
                                  ": kept for the aggregator's task"));
  }
  run_->work.held_task_copy.reset();
  NotePrivacy(header.privacy_spent());
  if (admitted->task == TaskVerdict::kSwitch) SwitchToWinningChain(header);
  const bool aggregate = header.aggregator() == options_.site;
  NoteLearnTask(header, model);
  // The outcome of the round this site trained before is known now: its
  // kept result is no longer needed.
  if (run_->work.training.has_value()) out_.push_back(effect::CancelTraining{});
  run_->work.training.reset();
  if (aggregate) {
    if (header.attempt() > 0) {
      run_->counters.set_rounds_taken_over(run_->counters.rounds_taken_over() +
                                           1);
    }
    OpenRound(header, model);
  }
  if (IsTrainer(options_.site)) {
    BeginTraining(header, model);
  } else if (aggregate) {
    SetState(v1::SITE_STATE_GATHERING);
  }
  SWARM_LOG_INFO("round %d: learn task from %s (aggregator %s%s%s)",
                 header.round(), header.sender(), header.aggregator(),
                 header.attempt() > 0
                     ? absl::StrCat(" at attempt ", header.attempt())
                     : std::string(),
                 aggregate ? ", that is me" : "");
  return MakeReply(v1::OUTCOME_OK, "learn task accepted");
}

void SiteMachine::SwitchToWinningChain(const v1::ModelHeader& header) {
  DropLosingChain(header);
  if (run_->record.state == v1::SITE_STATE_DONE) {
    // Done on the losing chain: its final models go (the winner's will
    // replace the files), and the site takes part again.
    run_->record.state = v1::SITE_STATE_IDLE;
    run_->finals.clear();
    run_->record.final_rounds.clear();
    run_->record.final_lineage.reset();
    run_->end_reason.clear();
  }
}

void SiteMachine::NoteLearnTask(const v1::ModelHeader& header,
                                const std::shared_ptr<const Model>& model) {
  const bool first = !run_->record.last_task_round.has_value();
  run_->record.started = true;
  run_->record.last_task_round = header.round();
  run_->record.round_aggregator = header.aggregator();
  run_->record.attempt = header.attempt();
  run_->record.lineage = LineageFromProto(header.lineage());
  run_->record.best = header.best();
  SetAsideLostRounds(run_->record.lineage, header.round());
  const bool rejoined = run_->record.recovered;
  run_->record.recovered = false;
  KeepBestCopy(header.best());
  run_->current_global = model;
  run_->current_global_round = header.round();
  run_->current_task = header;
  PermissionMayChange();
  // The state file tells a restarted daemon that it is in this job (and on
  // which chain): written at the first task, a rejoin, and a failed-over
  // chain, not on every round (a file sync per trainer per round). A later
  // task than the one written is taken as new after a restart anyway.
  if (first || rejoined || header.attempt() > 0 || header.lineage_size() > 0) {
    PersistState();
  }
  if (rejoined) {
    run_->counters.set_rejoins(run_->counters.rejoins() + 1);
    SWARM_LOG_INFO("round %d: rejoined the job after a restart",
                   header.round());
  }
}

void SiteMachine::BeginTraining(const v1::ModelHeader& header,
                                std::shared_ptr<const Model> model) {
  Training& task = run_->work.training.emplace();
  task.id = run_->next_training++;
  task.round = header.round();
  task.global = model;
  task.task = header;
  task.task.clear_expected_trainers();
  task.aggregator = header.aggregator();
  task.attempt = header.attempt();
  SetState(v1::SITE_STATE_TRAINING);
  out_.push_back(effect::StartTraining{header.round(), std::move(model),
                                       run_->job->config().send_weight_diff(),
                                       run_->id});
  // Watch the aggregator while training, so that its death moves the
  // round to a backup before this site's result is ready.
  if (header.aggregator() != options_.site) {
    ScheduleAsk(run_->job->failover_timeout() / 2);
  }
}

absl::StatusOr<ModelAdmission> SiteMachine::AcceptHeldTask(
    const v1::ModelHeader& header) {
  if (!run_->work.held_task_copy.has_value() ||
      run_->work.held_task_copy->header.round() != header.round() ||
      run_->work.held_task_copy->header.attempt() != header.attempt() ||
      run_->work.held_task_copy->header.sender() != header.sender()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", header.round(), ": no copy of the round's model from ",
        header.sender(), " is kept here; send the task with its body"));
  }
  std::shared_ptr<const Model> model =
      std::move(run_->work.held_task_copy->model);
  run_->work.held_task_copy.reset();
  const v1::Reply reply = AcceptLearnTask(header, std::move(model));
  if (reply.outcome() != v1::OUTCOME_OK) return StatusFromReply(reply);
  ModelAdmission admission;
  admission.header_only = true;
  admission.reply_message = reply.message();
  return admission;
}

absl::Status SiteMachine::OnHeldTask(const v1::ModelHeader& header,
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
  if (header.handoff()) Heard(header.round(), header.sender(), now_);
  return absl::OkStatus();
}

absl::Status SiteMachine::DeclineTakeOver(
    const v1::ModelHeader& header) const {
  if (!header.handoff() || header.sender() == options_.site ||
      !run_->work.training.has_value()) {
    return absl::OkStatus();
  }
  const Training& task = *run_->work.training;
  if (task.round != header.round() || task.aggregator == options_.site ||
      task.attempt + 1 != header.attempt() || task.handing_off ||
      task.failures > 0 || task.lacking_since != absl::InfiniteFuture() ||
      now_ - task.confirmed > run_->job->failover_timeout()) {
    return absl::OkStatus();
  }
  return absl::AlreadyExistsError(absl::StrCat(
      "not taking over round ", header.round(), " at attempt ",
      header.attempt(), ": ", task.aggregator, " holds it at attempt ",
      task.attempt, " (it answered ", options_.site, " ",
      absl::FormatDuration(now_ - task.confirmed),
      " ago) and that attempt wins; submit there"));
}

void SiteMachine::TakeOver(const v1::ModelHeader& header) {
  const uint32_t round = header.round();
  // A site that failed over to itself noted it already (FailOver).
  if (header.sender() != options_.site) {
    NoteFailover(round, run_->record.round_aggregator, options_.site,
                 absl::StrCat("handed over by ", header.sender()));
  }
  run_->counters.set_rounds_taken_over(run_->counters.rounds_taken_over() + 1);
  run_->record.round_aggregator = options_.site;
  run_->record.attempt = header.attempt();
  PermissionMayChange();
  OpenRound(header, run_->current_global);
  if (run_->work.training.has_value() && run_->work.training->round == round) {
    // This site's own result goes to itself now (again, if it went to the
    // aggregator given up on).
    Training& task = *run_->work.training;
    task.FollowAggregator(options_.site, header.attempt());
    if (task.trained()) {
      SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
      AskToSubmit();
    }
  } else if (run_->work.rounds.count(round) > 0) {
    SetState(v1::SITE_STATE_GATHERING);
  }
}

void SiteMachine::SetAsideLostRounds(const Lineage& winner, uint32_t known) {
  for (auto it = run_->kept_rounds.begin(); it != run_->kept_rounds.end();) {
    const auto& [round, lineage] = *it;
    uint32_t differs = 0;
    if (CompareChains(lineage, winner, std::min(round, known), &differs) <= 0) {
      ++it;
      continue;
    }
    effect::Persist aside;
    aside.what = effect::Persist::What::kSetAsideRound;
    aside.persist = next_persist_++;
    aside.job_id = run_->job->id();
    aside.round = round;
    aside.tag = absl::StrCat("lost-at-round-", differs, "-attempt-",
                             AttemptOf(lineage, differs));
    SWARM_LOG_WARNING(
        "round %d: the model kept for it is of a chain that lost (round %d "
        "at attempt %d); set aside as %s",
        round, differs, AttemptOf(lineage, differs), aside.tag);
    out_.push_back(std::move(aside));
    it = run_->kept_rounds.erase(it);
  }
}

bool SiteMachine::ScatterLost(const v1::ModelHeader& task) const {
  if (!run_->record.last_task_round.has_value()) return false;
  const Lineage lineage = LineageFromProto(task.lineage());
  return CompareChains(lineage, run_->record.lineage,
                       std::min(task.round(), *run_->record.last_task_round)) >
         0;
}

void SiteMachine::DropLosingChain(const v1::ModelHeader& winner) {
  uint32_t round = 0;
  const Lineage lineage = LineageFromProto(winner.lineage());
  const bool done = run_->record.state == v1::SITE_STATE_DONE &&
                    run_->record.final_lineage.has_value();
  const Lineage& mine =
      done ? *run_->record.final_lineage : run_->record.lineage;
  const uint32_t below =
      run_->record.last_task_round.has_value() && !done
          ? std::min(winner.round(), *run_->record.last_task_round)
          : winner.round();
  CompareChains(lineage, mine, below, &round);
  const uint64_t dropped =
      run_->work.rounds.size() + run_->work.aggregating.size();
  run_->counters.set_discarded_aggregates(
      run_->counters.discarded_aggregates() + 1);
  ReportError(absl::StrCat("round ", winner.round(),
                           ": switching to the chain of ", winner.sender()),
              absl::AbortedError(absl::StrCat(
                  "it aggregated round ", round, " at attempt ",
                  AttemptOf(lineage, round), ", this site's chain at attempt ",
                  AttemptOf(mine, round), "; the lower wins",
                  dropped > 0 ? absl::StrCat("; dropped ", dropped,
                                             " round(s) this site gathered")
                              : std::string())));
  DropRounds();
  run_->work.aggregating.clear();
  run_->work.aggregator_tasks.clear();
  run_->work.scatters.clear();
  PermissionMayChange();
}

void SiteMachine::OnTrainingDone(event::TrainingDone& e) {
  if (e.job_run != 0 && e.job_run != run_->id && Stale(0, 1)) return;
  if (!run_->work.training.has_value() ||
      run_->work.training->round != e.round || run_->work.training->trained() ||
      !Active()) {
    return;
  }
  Training& task = *run_->work.training;
  v1::ModelHeader& header = task.result_header;
  header = BaseHeader(v1::MODEL_KIND_RESULT, task.round);
  header.set_aggregator(task.aggregator);
  header.set_attempt(task.attempt);
  *header.mutable_lineage() = task.task.lineage();
  if (e.metrics.ok()) {
    for (const auto& [name, value] : *e.metrics) {
      (*header.mutable_metrics())[name] = value;
    }
    run_->metrics = *e.metrics;
  }
  absl::StatusOr<TrainOutput>& output = e.output;
  if (e.metrics.ok() && output.ok()) {
    header.set_sample_count(output->sample_count);
    header.set_payload_kind(output->kind);
    if (output->spent.has_value()) {
      // This site's privacy spend with the result's charge: to the
      // aggregator, and on into the final models.
      (*header.mutable_privacy_spent())[options_.site] = *output->spent;
      NotePrivacy(header.privacy_spent());
    }
    run_->counters.set_rounds_trained(run_->counters.rounds_trained() + 1);
    task.result = std::make_shared<const Model>(std::move(output->model));
  } else {
    const absl::Status failed =
        e.metrics.ok() ? output.status() : e.metrics.status();
    ReportError(absl::StrCat("round ", task.round, ": training"), failed);
    header.set_failed(true);
    header.set_failure(std::string(failed.message()));
    // Out of privacy budget: it will not train again in this job.
    header.set_trainer_stopped(StoppedForJob(failed));
  }
  task.BecomeAsking(now_);
  SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  AskToSubmit();
}

void SiteMachine::NotePrivacy(
    const google::protobuf::Map<std::string, v1::PrivacySpent>& spent) {
  if (run_->job == nullptr) return;
  for (const auto& [site, report] : spent) {
    if (run_->job->Site(site) == nullptr) continue;  // Not of this job.
    auto [it, added] = run_->privacy_spent.try_emplace(site, report);
    if (added) continue;
    const v1::PrivacySpent& known = it->second;
    if (report.rounds() > known.rounds() ||
        (report.rounds() == known.rounds() &&
         report.epsilon() > known.epsilon())) {
      it->second = report;
    }
  }
}

void SiteMachine::AddChain(v1::SubmitPermissionRequest* ask) const {
  ask->set_attempt(run_->work.training->attempt);
  *ask->mutable_lineage() = run_->work.training->task.lineage();
}

void SiteMachine::AskToSubmit() {
  if (!run_->work.training.has_value() || !Active() ||
      run_->work.training->handing_off)
    return;
  Training& task = *run_->work.training;
  task.ask_timer = 0;
  if (task.phase() == Training::Phase::kChainMember &&
      now_ >= task.chain_until()) {
    return LeaveChain(
        "no partial sum came through this site",
        absl::DeadlineExceededError("the reduction chain's wait ran out"));
  }
  const bool probe = task.Probing();
  if (probe && task.aggregator == options_.site) return;
  PeerMessage message;
  message.kind = CallKind::kRequestToSubmit;
  message.permission.set_job_id(run_->job->id());
  message.permission.set_sender(options_.site);
  message.permission.set_round(task.round);
  message.permission.set_probe(probe);
  // A result that cannot travel in a partial sum asks for a slot at once.
  message.permission.set_direct(
      task.direct() || task.result == nullptr || task.result_header.failed() ||
      !CheckPartialSumLayout(task.result->specs()).ok());
  AddChain(&message.permission);
  message.timeout = run_->job->request_to_submit_message_timeout();
  Call call;
  call.purpose = Call::Purpose::kAskPermission;
  call.round = task.round;
  call.probe = probe;
  Send(task.aggregator, std::move(message), call, /*retry=*/false);
}

void SiteMachine::ScheduleAsk(absl::Duration wait) {
  if (wait <= absl::ZeroDuration()) return AskToSubmit();
  Timer timer;
  timer.purpose = Timer::Purpose::kAskAgain;
  timer.training = run_->work.training->id;
  run_->work.training->ask_timer = SetTimer(now_ + wait, timer);
}

void SiteMachine::OnAggregatorTrouble(const absl::Status& status) {
  Training& task = *run_->work.training;
  const bool lacking = status.ok();  // Alive, but it lacks the task.
  if (lacking) {
    task.lacking_since = std::min(task.lacking_since, now_);
    if (now_ - task.lacking_since >= run_->job->failover_timeout()) {
      task.lacking_since = absl::InfiniteFuture();
      return HandOff();
    }
  } else {
    ++task.failures;
    task.failing_since = std::min(task.failing_since, now_);
    if (task.failures >= static_cast<int>(run_->job->failover_attempts()) ||
        now_ - task.failing_since >= run_->job->failover_timeout()) {
      return FailOver(std::string(status.message()));
    }
  }
  ScheduleAsk(run_->job->request_to_submit_interval());
}

void SiteMachine::FailOver(const std::string& reason) {
  Training& task = *run_->work.training;
  const uint32_t next = task.attempt + 1;
  const std::string backup = run_->job->AggregatorAt(task.round, next);
  if (backup.empty()) {
    return Fail(
        absl::StrCat("round ", task.round, ": no aggregator reachable"),
        absl::UnavailableError(absl::StrCat(
            "the last backup, ", task.aggregator, ", failed: ", reason)));
  }
  ReportError(absl::StrCat("round ", task.round, ": giving up on aggregator ",
                           task.aggregator),
              absl::UnavailableError(reason));
  NoteFailover(task.round, task.aggregator, backup, reason);
  run_->counters.set_failovers(run_->counters.failovers() + 1);
  task.FollowAggregator(backup, next);
  // A chain or an upload to the aggregator given up on is over (its answer
  // is ignored).
  task.AskAfresh();
  if (backup != options_.site) {
    run_->record.round_aggregator = backup;
    run_->record.attempt = next;
  }
  if (task.trained()) SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  HandOff();
}

void SiteMachine::HandOff() {
  Training& task = *run_->work.training;
  task.handing_off = true;
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = task.task;
  message.header.set_sender(options_.site);
  message.header.set_handoff(true);
  message.model = task.global;
  message.timeout = run_->job->learn_task_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kHandoff;
  call.round = task.round;
  SWARM_LOG_INFO("round %d: handing the round to %s (attempt %d)", task.round,
                 task.aggregator, task.attempt);
  Send(task.aggregator, std::move(message), call, /*retry=*/false);
}

void SiteMachine::OnHandoffDone(const Call& call, const event::CallDone& e) {
  if (!run_->work.training.has_value() ||
      run_->work.training->round != call.round ||
      run_->work.training->aggregator != call.target || !Active()) {
    return;
  }
  Training& task = *run_->work.training;
  task.handing_off = false;
  const absl::Status status = ReplyStatus(e);
  if (status.ok()) {
    if (task.trained() && !task.submitted()) return AskToSubmit();
    return ScheduleAsk(run_->job->failover_timeout() / 2);
  }
  if (status.code() == absl::StatusCode::kAlreadyExists && task.attempt > 0 &&
      run_->job->AggregatorAt(task.round, task.attempt - 1) != options_.site) {
    // Declined: the backup still reaches the aggregator of the attempt
    // before, which holds the round (DeclineTakeOver).
    return FailBack(std::string(status.message()));
  }
  if (!e.reply.ok()) return OnAggregatorTrouble(e.reply.status());
  if (e.reply->reply.outcome() == v1::OUTCOME_ABORTED) {
    return FailOver(e.reply->reply.message());  // The backup's job ended.
  }
  // Refused: the round went on without this site (a later round is under
  // way there, or another chain won). Its next learn task brings it back.
  ReportError(
      absl::StrCat("round ", task.round, ": ", call.target,
                   " refused the handoff; this site's result is ", "left out"),
      status);
  run_->work.training.reset();
  SetIdleOrGathering();
}

void SiteMachine::FailBack(const std::string& reason) {
  Training& task = *run_->work.training;
  const uint32_t back = task.attempt - 1;
  const std::string previous = run_->job->AggregatorAt(task.round, back);
  ReportError(absl::StrCat("round ", task.round, ": ", task.aggregator,
                           " declined the round; back to ", previous),
              absl::AlreadyExistsError(reason));
  task.FollowAggregator(previous, back);
  run_->record.round_aggregator = previous;
  run_->record.attempt = back;
  // Asked again after half a failover timeout: time for a link that was
  // refused to come back, and for the backup to probe that aggregator
  // again (it takes the next handoff if the aggregator is gone).
  ScheduleAsk(run_->job->failover_timeout() / 2);
}

void SiteMachine::OnPermissionReply(const Call& call,
                                    const event::CallDone& e) {
  if (!run_->work.training.has_value() ||
      run_->work.training->round != call.round ||
      run_->work.training->aggregator != call.target || !Active()) {
    return;
  }
  Training& task = *run_->work.training;
  // A reply to a probe while this site now asks for a slot (or the other
  // way round) belongs to a chain of calls that has ended.
  if (call.probe != task.Probing()) return;
  if (!e.reply.ok()) {
    ReportError(absl::StrCat("round ", task.round, ": ",
                             call.probe ? "probing " : "asking ",
                             task.aggregator, call.probe ? "" : " to submit"),
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
  task.confirmed = now_;
  if (call.probe) {
    // The aggregator is alive (it gathers the round, or closed it and the
    // outcome is on its way). Look again later.
    return ScheduleAsk(run_->job->failover_timeout() / 2);
  }
  OnSlotReply(task, reply);
}

void SiteMachine::OnSlotReply(Training& task,
                              const v1::SubmitPermissionReply& reply) {
  if (reply.outcome() == v1::OUTCOME_OK && reply.reduce_to_size() > 0) {
    return StartChain(reply);
  }
  if (reply.outcome() == v1::OUTCOME_OK && reply.reduce_member()) {
    // The result is collected by the partial sum passing through here;
    // the aggregator is probed meanwhile.
    const absl::Duration wait = absl::Milliseconds(reply.reduce_wait_ms());
    task.BecomeChainMember(now_ + wait);
    SetState(v1::SITE_STATE_SUBMITTING);
    return ScheduleAsk(std::min(wait, run_->job->failover_timeout() / 2));
  }
  if (reply.outcome() == v1::OUTCOME_OK) {
    SetState(v1::SITE_STATE_SUBMITTING);
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
    ReportError(absl::StrCat("round ", task.round, ": aggregator ",
                             task.aggregator, " refused the submission"),
                absl::FailedPreconditionError(reply.message()));
    run_->work.training.reset();
    SetIdleOrGathering();
    return;
  }
  const absl::Time give_up =
      task.asking_since() + run_->job->request_to_submit_max_wait();
  const absl::Duration wait = absl::Milliseconds(reply.retry_after_ms());
  if (now_ + wait > give_up) {
    ReportError(
        absl::StrCat("round ", task.round, ": gave up asking ", task.aggregator,
                     " to submit"),
        absl::DeadlineExceededError("request_to_submit_max_wait passed"));
    run_->work.training.reset();
    SetState(v1::SITE_STATE_IDLE);
    return;
  }
  ScheduleAsk(wait);
}

void SiteMachine::ResultIsIn(Training& task) {
  // Kept until the round's outcome arrives; the aggregator is probed
  // meanwhile, so that its death moves the round to a backup.
  task.BecomeSubmitted(now_);
  SetIdleOrGathering();
  if (task.aggregator != options_.site) {
    ScheduleAsk(run_->job->failover_timeout() / 2);
    return;
  }
  // In this site's own round: there is no other aggregator to resubmit it
  // to (if this site's round fails, this site has left the job). The held
  // trainers may go on (OwnResultFirst).
  if (task.result != nullptr && LeanFor(task.result->total_bytes())) {
    task.result.reset();
  }
  PermissionMayChange();
}

void SiteMachine::OnSubmitDone(const Call& call, const event::CallDone& e) {
  if (!run_->work.training.has_value() ||
      run_->work.training->round != call.round ||
      run_->work.training->aggregator != call.target) {
    return;
  }
  Training& task = *run_->work.training;
  task.UploadEnded();
  const absl::Status status = ReplyStatus(e);
  if (status.ok()) {
    SWARM_LOG_INFO("round %d: result submitted to %s", call.round, call.target);
    return ResultIsIn(task);
  }
  ReportError(
      absl::StrCat("round ", call.round, ": submitting to ", call.target),
      status);
  if (!Active()) return;
  if (!e.reply.ok() && RetryPolicy::Retryable(e.reply.status())) {
    SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
    return OnAggregatorTrouble(e.reply.status());
  }
  if (e.reply.ok() && e.reply->reply.outcome() == v1::OUTCOME_ABORTED) {
    // The aggregator failed (a disk error while it received this result,
    // say): the result goes to the next backup.
    return FailOver(e.reply->reply.message());
  }
  if (e.reply.ok() && e.reply->reply.outcome() == v1::OUTCOME_RETRY) {
    // The permission was released with the failed upload: ask again.
    SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
    return ScheduleAsk(run_->job->request_to_submit_interval());
  }
  run_->work.training.reset();
  SetIdleOrGathering();
}

}  // namespace swarm
