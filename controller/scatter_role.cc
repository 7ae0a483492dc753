// ScatterRole: a round's learn tasks to its trainers, then to its
// aggregator (scatter_role.h).
#include "controller/scatter_role.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/admission.h"
#include "controller/job_run.h"
#include "controller/replies.h"
#include "streaming/partial_sum_sink.h"

namespace swarm::site {

void ScatterRole::OnCallDone(const Call& call, const event::CallDone& e) {
  switch (call.purpose) {
    case Call::Purpose::kTaskToTrainer:
      return OnTaskToTrainerDone(call, e);
    case Call::Purpose::kTaskToAggregator:
      return OnTaskToAggregatorDone(call, e);
    case Call::Purpose::kAskPermission:
    case Call::Purpose::kSubmit:
    case Call::Purpose::kFinal:
    case Call::Purpose::kShareBest:
    case Call::Purpose::kHandoff:
    case Call::Purpose::kCatchUp:
    case Call::Purpose::kChainSubmit:
      return;  // Not a scatter's.
  }
}

void ScatterRole::OnTimerFired(TimerId, const Timer& timer) {
  if (timer.purpose == Timer::Purpose::kScatterGrace) {
    EndScatterWait(timer.round);
  }
}

void ScatterRole::DropAll() {
  scatters_.clear();
  aggregator_tasks_.clear();
}

void ScatterRole::ReplaceHeldModel(const Model* old,
                                   const std::shared_ptr<const Model>& mapped) {
  for (auto* held : {&scatters_, &aggregator_tasks_}) {
    for (auto& [round, scatter] : *held) {
      if (scatter.global.get() == old) scatter.global = mapped;
    }
  }
}

void ScatterRole::ScatterRound(uint32_t round,
                               std::shared_ptr<const Model> global,
                               v1::BestRecord best, const Lineage& lineage,
                               bool resume) {
  if (!site_->Active()) return;
  const std::vector<std::string> order = run().job->ElectionOrder(round);
  if (order.empty()) {
    return site_->Fail(
        "election", absl::FailedPreconditionError("no aggregator candidate"));
  }
  Scatter scatter;
  scatter.header = site_->BaseHeader(v1::MODEL_KIND_LEARN_TASK, round);
  scatter.header.set_aggregator(order[0]);
  for (size_t i = 1; i < order.size(); ++i) {
    scatter.header.add_backup_aggregators(order[i]);
  }
  *scatter.header.mutable_best() = best;
  LineageToProto(lineage, scatter.header.mutable_lineage());
  scatter.header.set_resume(resume);
  // Every trainer's privacy spend travels from round to round, so that
  // whichever site ends the job knows it for the final models.
  scatter.header.mutable_privacy_spent()->insert(run().privacy_spent.begin(),
                                                 run().privacy_spent.end());
  scatter.global = std::move(global);
  SWARM_LOG_INFO("round %d: scattering to %d trainers, aggregator %s", round,
                 static_cast<int>(run().job->trainers().size()), order[0]);
  // Phase 1: every trainer but the aggregator; their acknowledgements form
  // the round's expected set. Phase 2: the aggregator, with that set.
  for (const std::string& trainer : run().job->trainers()) {
    if (trainer != order[0]) scatter.answers.Expect(trainer);
  }
  if (scatter.answers.done()) return SendTaskToAggregator(scatter);
  const std::vector<std::string> chain = BroadcastChain(scatter);
  Scatter& stored = scatters_[round] = std::move(scatter);
  for (const std::string& target : stored.answers.waiting()) {
    if (chain.empty() || target == self()) {
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
    message.relay_stall = RelayStallBudget(run().job->failover_timeout(),
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

std::vector<std::string> ScatterRole::BroadcastChain(Scatter& scatter) const {
  // With broadcast, one stream goes along the other sites, each forwarding
  // it to the next as it arrives; this site's own task stays a loopback.
  std::vector<std::string> chain;
  if (!run().job->config().broadcast_learn_tasks()) return chain;
  for (const std::string& trainer : scatter.answers.waiting()) {
    if (trainer != self()) chain.push_back(trainer);
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
  if (!chain.empty() && aggregator != self()) {
    chain.push_back(aggregator);
    scatter.header.set_aggregator_task_follows(true);
  }
  if (chain.size() < 2) {
    chain.clear();
    scatter.header.clear_aggregator_task_follows();
  }
  return chain;
}

PeerMessage ScatterRole::TaskToTrainer(const Scatter& scatter) const {
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = scatter.header;
  message.model = scatter.global;
  message.timeout = run().job->learn_task_ack_timeout();
  return message;
}

void ScatterRole::SendTaskToTrainer(const Scatter& scatter,
                                    const std::string& target) {
  Call call;
  call.purpose = Call::Purpose::kTaskToTrainer;
  call.round = scatter.header.round();
  Send(target, TaskToTrainer(scatter), std::move(call));
}

void ScatterRole::OnChainTaskDone(const Call& call, const event::CallDone& e) {
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
  auto it = scatters_.find(call.round);
  const bool aggregator_on_chain =
      it != scatters_.end() && it->second.header.aggregator_task_follows();
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
      !direct.empty() && it != scatters_.end() && site_->Active();
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

void ScatterRole::OnTaskToTrainerDone(const Call& call,
                                      const event::CallDone& e) {
  if (!call.chain.empty()) return OnChainTaskDone(call, e);
  NoteTaskToTrainer(call.round, call.target, ReplyStatus(e));
}

void ScatterRole::NoteTaskToTrainer(uint32_t round, const std::string& target,
                                    const absl::Status& status,
                                    bool may_start_grace) {
  if (!status.ok()) {
    site_->ReportError(absl::StrCat("round ", round, ": learn task to ", target,
                                    " not acknowledged; not waiting for it"),
                       status);
  }
  auto it = scatters_.find(round);
  if (it == scatters_.end()) return;
  Scatter& scatter = it->second;
  // The tasks stream in parallel: a trainer still silent a failover
  // timeout after the first one acknowledged is down, frozen or cut off,
  // and the round does not wait for it. Only another site's
  // acknowledgement counts: this site's own comes at once, and a large
  // model may take the others longer than a failover timeout to receive.
  const FanOut::Noted noted = scatter.answers.NoteAnswer(
      target, status, may_start_grace && target != self());
  if (!noted.counted) return;
  if (noted.start_grace) {
    Timer timer;
    timer.purpose = Timer::Purpose::kScatterGrace;
    timer.round = round;
    SetTimer(now() + run().job->failover_timeout(), timer);
  }
  if (!scatter.answers.done()) return;
  Scatter done = std::move(scatter);
  scatters_.erase(it);
  SendTaskToAggregator(done);
}

void ScatterRole::EndScatterWait(uint32_t round) {
  auto it = scatters_.find(round);
  if (it == scatters_.end() || !site_->Active()) return;
  Scatter done = std::move(it->second);
  scatters_.erase(it);
  for (const std::string& trainer : done.answers.GiveUpWaiting(
           "no acknowledgement within failover_timeout_ms of the first one")) {
    site_->ReportError(
        absl::StrCat("round ", round, ": learn task to ", trainer,
                     " not acknowledged; not waiting for it"),
        absl::DeadlineExceededError(
            "silent for failover_timeout_ms after the first "
            "acknowledgement"));
  }
  SendTaskToAggregator(done);
}

void ScatterRole::SendTaskToAggregator(const Scatter& scatter) {
  if (!site_->Active()) return;
  const uint32_t round = scatter.header.round();
  Scatter& task = aggregator_tasks_[round] = scatter;
  std::vector<std::string> expected = scatter.answers.acked();
  if (site_->IsTrainer(scatter.header.aggregator())) {
    expected.push_back(scatter.header.aggregator());
  }
  std::sort(expected.begin(), expected.end());
  for (const std::string& name : expected) {
    task.header.add_expected_trainers(name);
  }
  SendAggregatorTask(round);
}

void ScatterRole::SendAggregatorTask(uint32_t round) {
  const Scatter& task = aggregator_tasks_.at(round);
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
  message.timeout = run().job->learn_task_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kTaskToAggregator;
  call.round = round;
  // Without this task the round cannot happen: keep trying for the
  // failover timeout (an aggregator back from a short cut then runs the
  // round), then hand the round to the next backup.
  Send(task.header.aggregator(), std::move(message), call, /*retry=*/true,
       now() + run().job->failover_timeout());
}

void ScatterRole::OnTaskToAggregatorDone(const Call& call,
                                         const event::CallDone& e) {
  auto it = aggregator_tasks_.find(call.round);
  if (it == aggregator_tasks_.end()) return;
  const absl::Status status = ReplyStatus(e);
  if (!status.ok() && it->second.aggregator_holds_copy && site_->Active()) {
    // Sent without a body and not taken (the aggregator lost its copy, or
    // the call failed): again, with the body.
    SWARM_LOG_INFO(
        "round %d: aggregator %s did not take its task without a body (%s); "
        "sending it with the model",
        call.round, call.target, status.message());
    it->second.aggregator_holds_copy = false;
    return SendAggregatorTask(call.round);
  }
  if (status.ok() || !site_->Active()) {
    if (status.ok()) site_->AnswerStart(call.round, &it->second);
    aggregator_tasks_.erase(it);
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
    site_->AnswerStart(call.round, &it->second);
    aggregator_tasks_.erase(it);
    return;
  }
  if (run().record.last_task_round.has_value() &&
      *run().record.last_task_round > call.round) {
    // The round went on meanwhile (its trainers handed it over): this
    // task is no longer needed.
    site_->AnswerStart(call.round, &it->second);
    aggregator_tasks_.erase(it);
    return;
  }
  // This site follows a chain that beats the one it scattered for (it lost
  // meanwhile), or the aggregator follows one that beats it (it says so):
  // either way the task's chain lost (design section 6). A backup would
  // refuse it too, and the last backup may be this site, which would then
  // run the losing chain's rounds alone.
  const bool lost = ScatterLost(it->second.header);
  const bool losing = !lost && IsLosingChainRefusal(status);
  if (call.target == self() && !e.reply.ok() && !lost && !losing) {
    return site_->Fail(absl::StrCat("round ", call.round, ": own learn task"),
                       status);
  }
  if (lost || losing || (e.reply.ok() && !ended_there)) {
    // The aggregator answered and refused: its reason stands (another chain
    // won, or the round went on without this task). An aggregator whose job
    // failed or was aborted (OUTCOME_ABORTED) is passed over like one that
    // cannot be reached. When this site scattered the round for a chain
    // that lost (design section 6), its aggregate is dropped and it goes on
    // in the winner's rounds (their learn task switches it over): its own
    // task (loopback) is refused for that reason too, no cause to fail.
    const std::string what =
        lost     ? std::string("dropped the learn task of a chain that lost")
        : losing ? absl::StrCat("aggregator ", call.target,
                                " follows a chain that wins over this "
                                "task's; not passing it to a backup")
                 : absl::StrCat("aggregator ", call.target,
                                " refused its learn task");
    site_->ReportError(absl::StrCat("round ", call.round, ": ", what), status);
    site_->AnswerStart(call.round, nullptr,
                       absl::FailedPreconditionError(
                           absl::StrCat(what, ": ", status.message())));
    aggregator_tasks_.erase(it);
    if (lost || losing) {
      run().counters.set_discarded_aggregates(
          run().counters.discarded_aggregates() + 1);
    }
    if (lost) {
      site_->SetAsideLostRounds(run().record.lineage,
                                *run().record.last_task_round);
    }
    return;
  }
  PassTaskToBackup(call, status);
}

void ScatterRole::PassTaskToBackup(const Call& call,
                                   const absl::Status& status) {
  Scatter& task = aggregator_tasks_.at(call.round);
  const uint32_t next = task.header.attempt() + 1;
  const std::string backup = run().job->AggregatorAt(call.round, next);
  if (backup.empty()) {
    return site_->Fail(
        absl::StrCat("round ", call.round, ": no aggregator reachable ",
                     "(the last backup was ", call.target, ")"),
        status);
  }
  site_->ReportError(absl::StrCat("round ", call.round, ": aggregator ",
                                  call.target, " unreachable"),
                     status);
  site_->NoteFailover(
      call.round, call.target, backup,
      absl::StrCat("learn task not delivered: ", status.message()));
  run().counters.set_failovers(run().counters.failovers() + 1);
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

bool ScatterRole::ScatterLost(const v1::ModelHeader& task) const {
  if (!run().record.last_task_round.has_value()) return false;
  const Lineage lineage = LineageFromProto(task.lineage());
  return CompareChains(lineage, run().record.lineage,
                       std::min(task.round(), *run().record.last_task_round)) >
         0;
}

}  // namespace swarm::site
