// FinaleRole: the end of the job (design section 3, step 8): LAST, then
// BEST from this site or from the holder it asks to share (finale_role.h).
#include "controller/finale_role.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/job_run.h"
#include "controller/replies.h"
#include "gatherer/server_optimizer.h"

namespace swarm::site {

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

void FinaleRole::OnCallDone(const Call& call, const event::CallDone& e) {
  switch (call.purpose) {
    case Call::Purpose::kFinal:
      return OnFinalDone(call, e);
    case Call::Purpose::kShareBest:
      return OnShareBestDone(call, e);
    case Call::Purpose::kTaskToTrainer:
    case Call::Purpose::kTaskToAggregator:
    case Call::Purpose::kAskPermission:
    case Call::Purpose::kSubmit:
    case Call::Purpose::kHandoff:
    case Call::Purpose::kCatchUp:
    case Call::Purpose::kChainSubmit:
      return;  // Not the finale's.
  }
}

void FinaleRole::OnTimerFired(TimerId, const Timer& timer) {
  switch (timer.purpose) {
    case Timer::Purpose::kFinalGrace:
      return OnFinalGrace(timer.broadcast);
    case Timer::Purpose::kBestDeadline:
      return OnBestDeadline(timer.round);
    case Timer::Purpose::kRoundDeadline:
    case Timer::Purpose::kHeldPermission:
    case Timer::Purpose::kAskAgain:
    case Timer::Purpose::kComeForward:
    case Timer::Purpose::kScatterGrace:
    case Timer::Purpose::kStartDeadline:
      return;  // Not the finale's.
  }
}

void FinaleRole::ReplaceHeldModel(const Model* old,
                                  const std::shared_ptr<const Model>& mapped) {
  for (auto& [id, broadcast] : broadcasts_) {
    if (broadcast.best_model.get() == old) broadcast.best_model = mapped;
  }
}

void FinaleRole::FinishJob(uint32_t last_round,
                           std::shared_ptr<const Model> last,
                           v1::BestRecord best, const std::string& reason) {
  if (!site_->Active()) return;
  site_->SetState(v1::SITE_STATE_DISTRIBUTING);
  run().final_round = last_round;
  run().end_reason = reason;
  Broadcast then;
  then.then_best = true;
  then.best = best;
  then.last_round = last_round;
  if (!best.present()) {
    // No round produced a usable metric: the last model is also the best.
    then.best_model = last;
  } else if (run().best_model != nullptr &&
             run().best_model_round == best.round()) {
    then.best_model = run().best_model;  // Scored here, or trained on here.
  }
  SWARM_LOG_INFO(
      "job %s: finishing after round %d (%s); best %s from %s "
      "(round %d)",
      run().job->id(), last_round, reason, FormatMetric(best),
      best.present() ? best.site() : "-", best.round());
  // LAST first: it carries the final best record from this site, the one
  // every site trusts for it, so that a BEST from another holder is then
  // accepted on the strength of each site's own record (AdmitStream).
  BroadcastFinal(v1::MODEL_KIND_LAST, std::move(last), last_round, best,
                 std::move(then));
}

void FinaleRole::BroadcastFinal(v1::ModelKind kind,
                                std::shared_ptr<const Model> model,
                                uint32_t round, v1::BestRecord best,
                                Broadcast then,
                                std::vector<std::string> targets) {
  // The final models are the global model only: no server optimizer state.
  model = TrainableView(std::move(model));
  v1::ModelHeader header = site_->BaseHeader(kind, round);
  *header.mutable_best() = best;
  header.set_final_round(run().final_round);
  header.set_attempt(run().final_attempt);
  LineageToProto(run().final_chain, header.mutable_lineage());
  auto& metadata = *header.mutable_metadata();
  if (!run().end_reason.empty()) metadata["end_reason"] = run().end_reason;
  metadata["job"] = run().job->id();
  metadata["round"] = absl::StrCat(round);
  metadata["kind"] = kind == v1::MODEL_KIND_BEST ? "best" : "last";
  metadata["source_site"] = self();
  // Every trainer's privacy spend as known at the end of the job, written
  // here and carried to every site with the model (digests cover only the
  // tensors; the metadata is the sender's for every receiver).
  header.mutable_privacy_spent()->insert(run().privacy_spent.begin(),
                                         run().privacy_spent.end());
  for (const auto& [site, spent] : run().privacy_spent) {
    metadata[absl::StrCat("privacy.", site)] = FormatPrivacy(spent);
  }
  if (kind == v1::MODEL_KIND_BEST && best.present()) {
    metadata["metric_name"] = run().job->config().metric_name();
    metadata["metric"] = absl::StrCat(best.metric());
    metadata["best_site"] = best.site();
  }
  if (targets.empty()) targets = run().job->site_names();
  const uint64_t id = run().next_broadcast++;
  then.kind = kind;
  for (const std::string& target : targets) then.answers.Expect(target);
  broadcasts_[id] = std::move(then);
  for (const std::string& target : targets) {
    PeerMessage message;
    message.kind = CallKind::kFinalResult;
    message.header = header;
    message.model = model;
    message.timeout = run().job->final_result_ack_timeout();
    Call call;
    call.purpose = Call::Purpose::kFinal;
    call.round = round;
    call.broadcast = id;
    Send(target, std::move(message), call, /*retry=*/true,
         now() + run().job->final_result_ack_timeout());
  }
}

void FinaleRole::OnFinalDone(const Call& call, const event::CallDone& e) {
  absl::Status status = ReplyStatus(e);
  auto it = broadcasts_.find(call.broadcast);
  if (it == broadcasts_.end()) return;
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
      SetTimer(now() + run().job->failover_timeout(), timer);
    }
  }
  if (!broadcast.answers.done()) return;
  Broadcast done = std::move(broadcast);
  broadcasts_.erase(it);
  if (!done.answers.first_error().ok()) {
    site_->ReportError(done.kind == v1::MODEL_KIND_LAST ? "distributing LAST"
                                                        : "distributing BEST",
                       done.answers.first_error());
  }
  if (last_then_best && !done.answers.grace_ended()) {
    SendBest(done, done.answers.AckedByName());
  }
}

void FinaleRole::OnBestDeadline(uint32_t last_round) {
  if (run().job == nullptr || IsTerminal(run().record.state) ||
      run().finals.count(v1::MODEL_KIND_BEST) > 0 ||
      run().finals.count(v1::MODEL_KIND_LAST) == 0) {
    return;
  }
  site_->Fail(
      "final models",
      absl::DeadlineExceededError(absl::StrCat(
          "LAST of round ", last_round, " arrived but no BEST within twice ",
          "final_result_ack_timeout_ms; no site holding the best model (round ",
          run().record.best.round(), ", scored by ", run().record.best.site(),
          ") gave it")));
}

void FinaleRole::OnFinalGrace(uint64_t id) {
  auto it = broadcasts_.find(id);
  if (it == broadcasts_.end() || !it->second.answers.EndGrace()) {
    return;
  }
  Broadcast& broadcast = it->second;
  std::vector<std::string> waiting(broadcast.answers.waiting().begin(),
                                   broadcast.answers.waiting().end());
  SWARM_LOG_WARNING(
      "job %s: LAST not yet acknowledged by %s; BEST goes to the others now, "
      "to them when they acknowledge (retried for final_result_ack_timeout_ms)",
      run().job->id(), absl::StrJoin(waiting, ","));
  SendBest(broadcast, broadcast.answers.AckedByName());
}

void FinaleRole::SendBest(const Broadcast& done,
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
  ask.request.set_job_id(run().job->id());
  ask.request.set_sender(self());
  *ask.request.mutable_best() = best;
  ask.request.set_final_round(run().final_round);
  ask.request.set_attempt(run().final_attempt);
  LineageToProto(run().final_chain, ask.request.mutable_lineage());
  ask.request.mutable_privacy_spent()->insert(run().privacy_spent.begin(),
                                              run().privacy_spent.end());
  ask.request.set_end_reason(run().end_reason);
  for (const std::string& target : targets) ask.request.add_targets(target);
  if (run().job->Site(best.site()) != nullptr && best.site() != self()) {
    ask.holders.push_back(best.site());
  }
  for (const std::string& site : run().job->site_names()) {
    if (site != self() && site != best.site()) {
      ask.holders.push_back(site);
    }
  }
  const uint64_t id = run().next_best_ask++;
  best_asks_[id] = std::move(ask);
  AskNextHolder(id);
}

void FinaleRole::AskNextHolder(uint64_t id) {
  auto it = best_asks_.find(id);
  if (it == best_asks_.end()) return;
  BestAsk& ask = it->second;
  if (ask.next >= ask.holders.size()) {
    site_->ReportError(
        "distributing BEST",
        absl::NotFoundError(absl::StrCat(
            "no site gave the best model of round ", ask.request.best().round(),
            " (asked ", absl::StrJoin(ask.holders, ","), "; first: ",
            ask.first_error.ok() ? "none" : ask.first_error.message(), ")")));
    best_asks_.erase(it);
    return;
  }
  const std::string holder = ask.holders[ask.next++];
  PeerMessage message;
  message.kind = CallKind::kShareBest;
  message.share_best = ask.request;
  message.timeout = run().job->final_result_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kShareBest;
  call.round = ask.request.best().round();
  call.broadcast = id;
  Send(holder, std::move(message), call);
}

void FinaleRole::OnShareBestDone(const Call& call, const event::CallDone& e) {
  auto it = best_asks_.find(call.broadcast);
  if (it == best_asks_.end()) return;
  const absl::Status status = ReplyStatus(e);
  if (status.ok()) {
    if (call.target != it->second.request.best().site()) {
      SWARM_LOG_WARNING(
          "job %s: BEST of round %d comes from %s (its scorer %s did not "
          "give it)",
          run().job->id(), call.round, call.target,
          it->second.request.best().site());
    }
    best_asks_.erase(it);
    return;
  }
  if (it->second.first_error.ok()) {
    it->second.first_error = absl::Status(
        status.code(), absl::StrCat(call.target, ": ", status.message()));
  }
  AskNextHolder(call.broadcast);
}

void FinaleRole::OnShareBest(event::ShareBest& e) {
  const v1::ShareBestRequest& request = e.share;
  absl::Status job = CheckJobId(run().job.get(), self(), request.job_id());
  if (!job.ok()) return site_->Reply(e.request, ReplyFromStatus(job));
  // The final round's aggregator asks (at any attempt, and after an early
  // stop: any candidate may be it; the BEST it triggers is still checked by
  // every receiver against its own record).
  if (!run().job->IsCandidate(request.sender())) {
    return site_->Reply(
        e.request, MakeReply(v1::OUTCOME_REJECTED,
                             absl::StrCat("only the final round's aggregator "
                                          "may ask to share the best model, "
                                          "not ",
                                          request.sender())));
  }
  if (run().best_model == nullptr ||
      run().best_model_round != request.best().round()) {
    return site_->Reply(
        e.request, MakeReply(v1::OUTCOME_REJECTED,
                             absl::StrCat("site ", self(),
                                          " does not hold the best model of "
                                          "round ",
                                          request.best().round())));
  }
  // The holder distributes BEST itself; the reply does not wait for it.
  run().final_round = request.final_round();
  run().final_attempt = request.attempt();
  run().final_chain = LineageFromProto(request.lineage());
  // The BEST says what the LAST says: why the job ended, every trainer's
  // privacy spend.
  if (!request.end_reason().empty()) run().end_reason = request.end_reason();
  site_->NotePrivacy(request.privacy_spent());
  BroadcastFinal(v1::MODEL_KIND_BEST, run().best_model, request.best().round(),
                 request.best(), Broadcast(),
                 std::vector<std::string>(request.targets().begin(),
                                          request.targets().end()));
  site_->Reply(e.request, MakeReply(v1::OUTCOME_OK, "sharing the best model"));
}

v1::Reply FinaleRole::AcceptFinal(const v1::ModelHeader& header,
                                  std::shared_ptr<const Model> model) {
  run().finals[header.kind()] = model;
  if (header.kind() == v1::MODEL_KIND_LAST) {
    site_->EndTrainingAtLast(header.round());
  }
  run().record.final_rounds[header.kind()] = header.round();
  // The record is taken only from the last round's aggregator (who closed
  // the last round and so knows the final best); a BEST from the holder
  // carries the record this site already has (AdmitStream checked it).
  if (header.sender() ==
          run().job->AggregatorAt(header.final_round(), header.attempt()) ||
      header.sender() == self()) {
    run().record.best = header.best();
    if (header.kind() == v1::MODEL_KIND_LAST) {
      run().record.final_lineage = LineageFromProto(header.lineage());
      site_->SetAsideLostRounds(*run().record.final_lineage,
                                header.final_round() + 1);
    }
    auto reason = header.metadata().find("end_reason");
    if (reason != header.metadata().end()) run().end_reason = reason->second;
    site_->NotePrivacy(header.privacy_spent());
  }
  site_->PermissionMayChange();
  SWARM_LOG_INFO("job %s: %s model of round %d received from %s",
                 header.job_id(),
                 header.kind() == v1::MODEL_KIND_BEST ? "BEST" : "LAST",
                 header.round(), header.sender());
  if (run().finals.count(v1::MODEL_KIND_BEST) > 0 &&
      run().finals.count(v1::MODEL_KIND_LAST) > 0 &&
      !IsTerminal(run().record.state)) {
    site_->SetState(v1::SITE_STATE_DONE);
    site_->PersistState();
    SWARM_LOG_INFO("job %s: done (best metric %s)", header.job_id(),
                   FormatMetric(run().record.best));
  } else if (header.kind() == v1::MODEL_KIND_LAST &&
             run().finals.count(v1::MODEL_KIND_BEST) == 0) {
    // BEST follows LAST; if no holder gives it within the finals' bound,
    // the site ends failed, saying so, rather than waiting for ever.
    Timer timer;
    timer.purpose = Timer::Purpose::kBestDeadline;
    timer.round = header.round();
    SetTimer(now() + 2 * run().job->final_result_ack_timeout(), timer);
  }
  return MakeReply(v1::OUTCOME_OK, "stored");
}

}  // namespace swarm::site
