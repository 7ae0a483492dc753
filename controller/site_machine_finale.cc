// SiteMachine, the end of the job (design section 3, step 8): LAST, then
// BEST from this site or from the holder it asks to share.
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/replies.h"
#include "controller/site_machine.h"
#include "gatherer/server_optimizer.h"

namespace swarm {

namespace {

std::string FormatMetric(const v1::BestRecord& best) {
  return best.present() ? absl::StrCat(best.metric()) : "none";
}

// The final models' metadata entry of one trainer's privacy spend.
std::string FormatPrivacy(const v1::PrivacySpent& spent) {
  return absl::StrFormat("epsilon=%.6g delta=%g rounds=%u", spent.epsilon(),
                         spent.delta(), spent.rounds());
}

}  // namespace

void SiteMachine::FinishJob(uint32_t last_round,
                            std::shared_ptr<const Model> last,
                            v1::BestRecord best, const std::string& reason) {
  if (!Active()) return;
  SetState(v1::SITE_STATE_DISTRIBUTING);
  run_->final_round = last_round;
  run_->end_reason = reason;
  Broadcast then;
  then.then_best = true;
  then.best = best;
  then.last_round = last_round;
  if (!best.present()) {
    // No round produced a usable metric: the last model is also the best.
    then.best_model = last;
  } else if (run_->best_model != nullptr &&
             run_->best_model_round == best.round()) {
    then.best_model = run_->best_model;  // Scored here, or trained on here.
  }
  SWARM_LOG_INFO(
      "job %s: finishing after round %d (%s); best %s from %s "
      "(round %d)",
      run_->job->id(), last_round, reason, FormatMetric(best),
      best.present() ? best.site() : "-", best.round());
  // LAST first: it carries the final best record from this site, the one
  // every site trusts for it, so that a BEST from another holder is then
  // accepted on the strength of each site's own record (AdmitStream).
  BroadcastFinal(v1::MODEL_KIND_LAST, std::move(last), last_round, best,
                 std::move(then));
}

void SiteMachine::BroadcastFinal(v1::ModelKind kind,
                                 std::shared_ptr<const Model> model,
                                 uint32_t round, v1::BestRecord best,
                                 Broadcast then,
                                 std::vector<std::string> targets) {
  // The final models are the global model only: no server optimizer state.
  model = TrainableView(std::move(model));
  v1::ModelHeader header = BaseHeader(kind, round);
  *header.mutable_best() = best;
  header.set_final_round(run_->final_round);
  header.set_attempt(run_->final_attempt);
  LineageToProto(run_->final_chain, header.mutable_lineage());
  auto& metadata = *header.mutable_metadata();
  if (!run_->end_reason.empty()) metadata["end_reason"] = run_->end_reason;
  metadata["job"] = run_->job->id();
  metadata["round"] = absl::StrCat(round);
  metadata["kind"] = kind == v1::MODEL_KIND_BEST ? "best" : "last";
  metadata["source_site"] = options_.site;
  // Every trainer's privacy spend as known at the end of the job, written
  // here and carried to every site with the model (digests cover only the
  // tensors; the metadata is the sender's for every receiver).
  header.mutable_privacy_spent()->insert(run_->privacy_spent.begin(),
                                         run_->privacy_spent.end());
  for (const auto& [site, spent] : run_->privacy_spent) {
    metadata[absl::StrCat("privacy.", site)] = FormatPrivacy(spent);
  }
  if (kind == v1::MODEL_KIND_BEST && best.present()) {
    metadata["metric_name"] = run_->job->config().metric_name();
    metadata["metric"] = absl::StrCat(best.metric());
    metadata["best_site"] = best.site();
  }
  if (targets.empty()) targets = run_->job->site_names();
  const uint64_t id = run_->next_broadcast++;
  then.kind = kind;
  for (const std::string& target : targets) then.answers.Expect(target);
  run_->work.broadcasts[id] = std::move(then);
  for (const std::string& target : targets) {
    PeerMessage message;
    message.kind = CallKind::kFinalResult;
    message.header = header;
    message.model = model;
    message.timeout = run_->job->final_result_ack_timeout();
    Call call;
    call.purpose = Call::Purpose::kFinal;
    call.round = round;
    call.broadcast = id;
    Send(target, std::move(message), call, /*retry=*/true,
         now_ + run_->job->final_result_ack_timeout());
  }
}

void SiteMachine::OnFinalDone(const Call& call, const event::CallDone& e) {
  absl::Status status =
      e.reply.ok() ? StatusFromReply(e.reply->reply) : e.reply.status();
  auto it = run_->work.broadcasts.find(call.broadcast);
  if (it == run_->work.broadcasts.end()) return;
  const uint64_t id = it->first;
  Broadcast& broadcast = it->second;
  const bool last_then_best =
      broadcast.kind == v1::MODEL_KIND_LAST && broadcast.then_best;
  const FanOut::Noted noted =
      broadcast.answers.NoteAnswer(call.target, status, last_then_best);
  if (last_then_best && noted.counted && status.ok()) {
    if (broadcast.answers.grace_ended()) {
      SendBest(broadcast, {call.target});  // A late one: BEST follows.
    } else if (noted.start_grace) {
      Timer timer;
      timer.purpose = Timer::Purpose::kFinalGrace;
      timer.broadcast = id;
      SetTimer(now_ + run_->job->failover_timeout(), timer);
    }
  }
  if (!broadcast.answers.done()) return;
  Broadcast done = std::move(broadcast);
  run_->work.broadcasts.erase(it);
  if (!done.answers.first_error().ok()) {
    ReportError(done.kind == v1::MODEL_KIND_LAST ? "distributing LAST"
                                                 : "distributing BEST",
                done.answers.first_error());
  }
  if (last_then_best && !done.answers.grace_ended()) {
    SendBest(done, done.answers.AckedByName());
  }
}

void SiteMachine::OnBestDeadline(uint32_t last_round) {
  if (run_->job == nullptr || IsTerminal(run_->record.state) ||
      run_->finals.count(v1::MODEL_KIND_BEST) > 0 ||
      run_->finals.count(v1::MODEL_KIND_LAST) == 0) {
    return;
  }
  Fail(
      "final models",
      absl::DeadlineExceededError(absl::StrCat(
          "LAST of round ", last_round, " arrived but no BEST within twice ",
          "final_result_ack_timeout_ms; no site holding the best model (round ",
          run_->record.best.round(), ", scored by ", run_->record.best.site(),
          ") gave it")));
}

void SiteMachine::OnFinalGrace(uint64_t id) {
  auto it = run_->work.broadcasts.find(id);
  if (it == run_->work.broadcasts.end() ||
      !it->second.answers.EndGrace()) {
    return;
  }
  Broadcast& broadcast = it->second;
  std::vector<std::string> waiting(broadcast.answers.waiting().begin(),
                                   broadcast.answers.waiting().end());
  SWARM_LOG_WARNING(
      "job %s: LAST not yet acknowledged by %s; BEST goes to the others now, "
      "to them when they acknowledge (retried for final_result_ack_timeout_ms)",
      run_->job->id(), absl::StrJoin(waiting, ","));
  SendBest(broadcast, broadcast.answers.AckedByName());
}

void SiteMachine::SendBest(const Broadcast& done,
                           std::vector<std::string> targets) {
  if (targets.empty()) return;
  const v1::BestRecord& best = done.best;
  if (done.best_model != nullptr) {
    BroadcastFinal(v1::MODEL_KIND_BEST, done.best_model,
                   best.present() ? best.round() : done.last_round, best,
                   Broadcast(), std::move(targets));
    return;
  }
  // Asked of the holders in turn: the site that scored it, then every
  // other site (those that trained on it hold a copy; the others refuse).
  BestAsk ask;
  ask.request.set_job_id(run_->job->id());
  ask.request.set_sender(options_.site);
  *ask.request.mutable_best() = best;
  ask.request.set_final_round(run_->final_round);
  ask.request.set_attempt(run_->final_attempt);
  LineageToProto(run_->final_chain, ask.request.mutable_lineage());
  ask.request.mutable_privacy_spent()->insert(run_->privacy_spent.begin(),
                                              run_->privacy_spent.end());
  ask.request.set_end_reason(run_->end_reason);
  for (const std::string& target : targets) ask.request.add_targets(target);
  if (run_->job->Site(best.site()) != nullptr && best.site() != options_.site) {
    ask.holders.push_back(best.site());
  }
  for (const std::string& site : run_->job->site_names()) {
    if (site != options_.site && site != best.site()) {
      ask.holders.push_back(site);
    }
  }
  const uint64_t id = run_->next_best_ask++;
  run_->work.best_asks[id] = std::move(ask);
  AskNextHolder(id);
}

void SiteMachine::AskNextHolder(uint64_t id) {
  auto it = run_->work.best_asks.find(id);
  if (it == run_->work.best_asks.end()) return;
  BestAsk& ask = it->second;
  if (ask.next >= ask.holders.size()) {
    ReportError(
        "distributing BEST",
        absl::NotFoundError(absl::StrCat(
            "no site gave the best model of round ", ask.request.best().round(),
            " (asked ", absl::StrJoin(ask.holders, ","), "; first: ",
            ask.first_error.ok() ? "none" : ask.first_error.message(), ")")));
    run_->work.best_asks.erase(it);
    return;
  }
  const std::string holder = ask.holders[ask.next++];
  PeerMessage message;
  message.kind = CallKind::kShareBest;
  message.share_best = ask.request;
  message.timeout = run_->job->final_result_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kShareBest;
  call.round = ask.request.best().round();
  call.broadcast = id;
  Send(holder, std::move(message), call);
}

void SiteMachine::OnShareBestDone(const Call& call, const event::CallDone& e) {
  auto it = run_->work.best_asks.find(call.broadcast);
  if (it == run_->work.best_asks.end()) return;
  const absl::Status status =
      e.reply.ok() ? StatusFromReply(e.reply->reply) : e.reply.status();
  if (status.ok()) {
    if (call.target != it->second.request.best().site()) {
      SWARM_LOG_WARNING(
          "job %s: BEST of round %d comes from %s (its scorer %s did not "
          "give it)",
          run_->job->id(), call.round, call.target,
          it->second.request.best().site());
    }
    run_->work.best_asks.erase(it);
    return;
  }
  if (it->second.first_error.ok()) {
    it->second.first_error = absl::Status(
        status.code(), absl::StrCat(call.target, ": ", status.message()));
  }
  AskNextHolder(call.broadcast);
}

void SiteMachine::OnShareBest(event::ShareBest& e) {
  const v1::ShareBestRequest& request = e.share;
  absl::Status job =
      CheckJobId(run_->job.get(), options_.site, request.job_id());
  if (!job.ok()) return Reply(e.request, ReplyFromStatus(job));
  // The final round's aggregator asks (at any attempt, and after an early
  // stop: any candidate may be it; the BEST it triggers is still checked by
  // every receiver against its own record).
  if (!run_->job->IsCandidate(request.sender())) {
    return Reply(e.request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("only the final round's aggregator "
                                        "may ask to share the best model, "
                                        "not ",
                                        request.sender())));
  }
  if (run_->best_model == nullptr ||
      run_->best_model_round != request.best().round()) {
    return Reply(e.request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("site ", options_.site,
                                        " does not hold the best model of "
                                        "round ",
                                        request.best().round())));
  }
  // The holder distributes BEST itself; the reply does not wait for it.
  run_->final_round = request.final_round();
  run_->final_attempt = request.attempt();
  run_->final_chain = LineageFromProto(request.lineage());
  // The BEST says what the LAST says: why the job ended, every trainer's
  // privacy spend.
  if (!request.end_reason().empty()) run_->end_reason = request.end_reason();
  NotePrivacy(request.privacy_spent());
  BroadcastFinal(v1::MODEL_KIND_BEST, run_->best_model, request.best().round(),
                 request.best(), Broadcast(),
                 std::vector<std::string>(request.targets().begin(),
                                          request.targets().end()));
  Reply(e.request, MakeReply(v1::OUTCOME_OK, "sharing the best model"));
}

v1::Reply SiteMachine::AcceptFinal(const v1::ModelHeader& header,
                                   std::shared_ptr<const Model> model) {
  run_->finals[header.kind()] = model;
  if (header.kind() == v1::MODEL_KIND_LAST && run_->work.training.has_value() &&
      run_->work.training->round <= header.round()) {
    // The job's outcome is here: this site's last result is not needed for
    // a resubmission any more, and its round is over. The training record
    // goes with it (as at the next learn task), and with it the probing of
    // that round's aggregator: an aggregator lost after LAST must not make
    // this site hand a finished round to a backup (with lean memory its
    // models were let go already).
    out_.push_back(effect::CancelTraining{});
    run_->work.training.reset();
  }
  run_->record.final_rounds[header.kind()] = header.round();
  // The record is taken only from the last round's aggregator (who closed
  // the last round and so knows the final best); a BEST from the holder
  // carries the record this site already has (AdmitStream checked it).
  if (header.sender() ==
          run_->job->AggregatorAt(header.final_round(), header.attempt()) ||
      header.sender() == options_.site) {
    run_->record.best = header.best();
    if (header.kind() == v1::MODEL_KIND_LAST) {
      run_->record.final_lineage = LineageFromProto(header.lineage());
      SetAsideLostRounds(*run_->record.final_lineage, header.final_round() + 1);
    }
    auto reason = header.metadata().find("end_reason");
    if (reason != header.metadata().end()) run_->end_reason = reason->second;
    NotePrivacy(header.privacy_spent());
  }
  PermissionMayChange();
  SWARM_LOG_INFO("job %s: %s model of round %d received from %s",
                 header.job_id(),
                 header.kind() == v1::MODEL_KIND_BEST ? "BEST" : "LAST",
                 header.round(), header.sender());
  if (run_->finals.count(v1::MODEL_KIND_BEST) > 0 &&
      run_->finals.count(v1::MODEL_KIND_LAST) > 0 &&
      !IsTerminal(run_->record.state)) {
    SetState(v1::SITE_STATE_DONE);
    PersistState();
    SWARM_LOG_INFO("job %s: done (best metric %s)", header.job_id(),
                   FormatMetric(run_->record.best));
  } else if (header.kind() == v1::MODEL_KIND_LAST &&
             run_->finals.count(v1::MODEL_KIND_BEST) == 0) {
    // BEST follows LAST; if no holder gives it within the finals' bound,
    // the site ends failed, saying so, rather than waiting for ever.
    Timer timer;
    timer.purpose = Timer::Purpose::kBestDeadline;
    timer.round = header.round();
    SetTimer(now_ + 2 * run_->job->final_result_ack_timeout(), timer);
  }
  return MakeReply(v1::OUTCOME_OK, "stored");
}

}  // namespace swarm
