// SiteMachine: Step, the routing of events to the roles, SiteContext (what
// the roles use of the site) and the operator's events; the queries are in
// site_machine_queries.cc. The roles live beside it: trainer_role.cc,
// scatter_role.cc, aggregator_role.cc and finale_role.cc.
#include "controller/site_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/overloaded.h"
#include "config/job_config.h"
#include "controller/replies.h"
#include "gatherer/server_optimizer.h"
#include "streaming/digest.h"

namespace swarm {
namespace {

// A stream's relay budgets: the sender of a partial sum (at a hop or at the
// aggregator) is given up after a failover timeout of silence, so that a
// frozen hop does not hold its contributors' results until the round's
// timeout; a next hop, after a failover timeout per hop from it on.
RelayBudgets StreamBudgets(const v1::ModelHeader& header,
                           absl::Duration failover) {
  RelayBudgets budgets;
  if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
    budgets.idle = RelayIdleBudget(failover);
  }
  if (header.relay_to_size() > 0) {
    budgets.stall = RelayStallBudget(failover, header.relay_to_size() - 1);
  }
  return budgets;
}

}  // namespace

SiteMachine::SiteMachine(SiteMachineOptions options)
    : options_(std::move(options)), run_(std::make_unique<JobRun>(context())) {
  run_->record.self = options_.site;
}

SiteMachine::~SiteMachine() = default;

Effects SiteMachine::Step(Event event, absl::Time now) {
  now_ = std::max(now_, now);
  // One handler per kind of event: an Event alternative without one fails
  // to compile here (Overloaded's catch-all static_assert).
  std::visit(
      Overloaded{
          [this](event::Configure& e) { OnConfigure(e); },
          [this](event::Start& e) { OnStart(e); },
          [this](event::Abort& e) { OnAbort(e); },
          [this](event::ModelHeader& e) { OnModelHeader(e); },
          [this](event::ModelBody& e) { OnModelBody(e); },
          [this](event::PermissionAsked& e) {
            run_->work.aggregator.OnPermissionAsked(e);
          },
          [this](event::RequestCancelled& e) {
            run_->work.aggregator.OnRequestCancelled(e);
          },
          [this](event::ShareBest& e) { run_->work.finale.OnShareBest(e); },
          [this](event::CallDone& e) { OnCallDone(e); },
          [this](event::TimerFired& e) { OnTimerFired(e); },
          [this](event::TrainingDone& e) { OnTrainingDone(e); },
          [this](event::InitialModel& e) { OnInitialModel(e); },
          [this](event::AggregationDone& e) { OnAggregationDone(e); },
          [this](event::ResultAdded& e) { OnResultAdded(e); },
          [this](event::PersistDone& e) { OnPersistDone(e); },
          [this](event::LearnerWaiting& e) { OnLearnerWaiting(e); },
          [this](event::Recover& e) { OnRecover(e); },
          Unhandled{},
      },
      event);
  // A slot freed or a round opened: a held request may be answered now.
  // (Answering may close a round, which may change more: look again, a few
  // times at most.)
  for (int pass = 0; permission_dirty_ && pass < 4; ++pass) {
    permission_dirty_ = false;
    run_->work.aggregator.AnswerHeldRequests();
  }
  permission_dirty_ = false;
  JournalStateChange();
  if (status_dirty_) {
    ++status_version_;
    out_.push_back(effect::StatusChanged{});
    status_dirty_ = false;
  }
  Effects effects;
  effects.swap(out_);
  return effects;
}

// ---------------------------------------------------------------------------
// Helpers

bool SiteMachine::Active() const {
  return run_->job != nullptr && run_->record.started &&
         !IsTerminal(run_->record.state);
}

bool SiteMachine::IsTrainer(absl::string_view site) const {
  return run_->job != nullptr && run_->job->IsTrainer(site);
}

void SiteMachine::JournalStateChange() {
  const v1::SiteState state = run_->record.state;
  const uint32_t round = StatusRound();
  if (!state_changes_.empty() && state_changes_.back().state == state &&
      state_changes_.back().round == round) {
    return;
  }
  const uint64_t seq =
      state_changes_.empty() ? 1 : state_changes_.back().seq + 1;
  state_changes_.push_back(
      StateChange{seq, state, round, now_, Counters(), run_->metrics});
  if (state_changes_.size() > kStateChangesKept) state_changes_.pop_front();
  status_dirty_ = true;
}

void SiteMachine::SetIdleOrGathering() {
  SetState(run_->work.aggregator.GathersAny() ? v1::SITE_STATE_GATHERING
                                              : v1::SITE_STATE_IDLE);
}

void SiteMachine::SetState(v1::SiteState state) {
  if (IsTerminal(run_->record.state) && state != v1::SITE_STATE_CONFIGURED)
    return;
  if (run_->record.state != state) {
    run_->record.state = state;
    PermissionMayChange();
  }
}

void SiteMachine::ReportError(absl::string_view what,
                              const absl::Status& status) {
  run_->last_error = absl::StrCat(what, ": ", status.message());
  run_->last_error_time = now_;
  SWARM_LOG_WARNING("%s", run_->last_error);
  Changed();
}

void SiteMachine::EndActivity() {
  Work& work = run_->work;
  if (work.trainer.HasRound()) out_.push_back(effect::CancelTraining{});
  // Held requests are answered: the job is over here. The gathered rounds
  // go (their aggregators remove their offload files as they go).
  work.aggregator.EndAll(IsTerminal(run_->record.state)
                             ? ReplyFromStatus(JobEndedHere(run_->record))
                             : MakeReply(v1::OUTCOME_ABORTED, "job reset"));
  if (work.pending_start.has_value()) {
    Reply(work.pending_start->request,
          MakeReply(v1::OUTCOME_REJECTED,
                    absl::StrCat("the job ended here before its first round's "
                                 "learn tasks were out: ",
                                 run_->last_error.empty() ? "reset"
                                                          : run_->last_error)));
  }
  // Everything under way goes at once: its calls, timers and writes, when
  // they end, find nothing (Stale). The roles are replaced whole: one whose
  // method is on the stack (it called Fail) finds its state gone, as the
  // caller of Fail expects.
  run_->work = Work(this);
  PermissionMayChange();
}

bool SiteMachine::Stale(uint64_t id, uint64_t first_of_run) {
  if (id >= first_of_run) return false;
  ++stale_completions_;
  Changed();
  return true;
}

bool SiteMachine::StaleRun(uint64_t job_run) {
  return job_run != 0 && job_run != run_->id && Stale(0, 1);
}

void SiteMachine::Fail(absl::string_view what, const absl::Status& status) {
  ReportError(what, status);
  if (IsTerminal(run_->record.state))
    return;  // Ended already: nothing to undo.
  run_->end_reason = absl::StrCat("failed: ", run_->last_error);
  SetState(v1::SITE_STATE_FAILED);
  EndActivity();
  PersistState();
}

PersistId SiteMachine::PersistClearOffloadAndState(bool notify) {
  effect::Persist clear;
  clear.what = effect::Persist::What::kClearOffload;
  clear.persist = next_persist_++;
  clear.job_id = run_->job->id();
  out_.push_back(std::move(clear));
  return PersistState(notify);
}

void SiteMachine::ArmStartDeadline() {
  if (!IsTrainer(options_.site)) return;
  Timer timer;
  timer.purpose = Timer::Purpose::kStartDeadline;
  SetTimer(now_ + run_->job->start_timeout(), timer);
}

v1::Reply SiteMachine::FailAndAbort(const std::string& what,
                                    const absl::Status& status) {
  Fail(what, status);
  return MakeReply(v1::OUTCOME_ABORTED,
                   absl::StrCat("site ", options_.site, " failed (", what, ": ",
                                status.message(), ")"));
}

PersistId SiteMachine::PersistState(bool notify) {
  if (run_->job == nullptr) return 0;
  effect::Persist persist;
  persist.what = effect::Persist::What::kState;
  persist.persist = next_persist_++;
  persist.notify = notify;
  persist.job_id = run_->job->id();
  v1::JobState& state = persist.state;
  state.set_job_id(run_->job->id());
  state.set_last_completed_round(
      run_->record.last_task_round.has_value()
          ? static_cast<int64_t>(*run_->record.last_task_round)
          : -1);
  *state.mutable_best() = run_->record.best;
  state.set_state(run_->record.state);
  state.set_attempt(run_->record.attempt);
  LineageToProto(run_->record.lineage, state.mutable_lineage());
  state.set_started(run_->record.started);
  state.set_global_round(run_->persisted_global_round);
  LineageToProto(run_->persisted_global_lineage,
                 state.mutable_global_lineage());
  state.set_updated_time_ms(absl::ToUnixMillis(now_));
  const PersistId id = persist.persist;
  out_.push_back(std::move(persist));
  return id;
}

v1::ModelHeader SiteMachine::BaseHeader(v1::ModelKind kind,
                                        uint32_t round) const {
  v1::ModelHeader header;
  header.set_kind(kind);
  header.set_job_id(run_->job->id());
  header.set_round(round);
  header.set_sender(options_.site);
  header.set_digest_algorithm(run_->job->config().digest_algorithm());
  // The transport chunks every stream it sends at header.chunk_size.
  header.set_chunk_size(run_->job->config().chunk_size());
  return header;
}

AssemblerOptions SiteMachine::AssemblerFor(v1::ModelKind kind) const {
  AssemblerOptions assembler;
  assembler.limits = options_.limits;
  assembler.limits.max_model_bytes = std::min(
      assembler.limits.max_model_bytes, run_->job->config().max_model_bytes());
  assembler.expected_kind = kind;
  return assembler;
}

CallId SiteMachine::Send(const std::string& to, PeerMessage message, Call call,
                         bool retry, absl::Time retry_until) {
  const CallId id = next_call_++;
  effect::Send send;
  send.call = id;
  if (const v1::SiteInfo* site = run_->job->Site(to); site != nullptr) {
    send.to = *site;
  } else {
    send.to.set_name(to);  // The driver answers NOT_FOUND.
  }
  send.message = std::move(message);
  send.retry = retry;
  send.retry_until = retry_until;
  call.target = to;
  run_->work.calls[id] = std::move(call);
  out_.push_back(std::move(send));
  return id;
}

TimerId SiteMachine::SetTimer(absl::Time when, Timer timer) {
  const TimerId id = next_timer_++;
  run_->work.timers[id] = timer;
  out_.push_back(effect::SetTimer{id, when});
  return id;
}

void SiteMachine::Reply(RequestId request, v1::Reply reply) {
  out_.push_back(effect::Reply{request, std::move(reply)});
}

v1::SiteCounters SiteMachine::Counters() const {
  v1::SiteCounters counters = run_->counters;
  RoundCounters rounds = run_->closed_rounds;
  run_->work.aggregator.AddCounters(&rounds);
  rounds.CopyTo(&counters);
  counters.set_stale_completions(stale_completions_);
  return counters;
}

// ---------------------------------------------------------------------------
// Operator events

void SiteMachine::ResetForJob(v1::JobConfig job, std::string offload_dir) {
  EndActivity();
  // Final models still being written belong to the job that goes: their
  // senders are told, and their writes' ends find nothing.
  for (auto& [persist, pending] : run_->pending_finals) {
    Reply(pending.request,
          MakeReply(v1::OUTCOME_ABORTED, absl::StrCat("job ", run_->job->id(),
                                                      " was replaced here")));
  }
  run_ = std::make_unique<JobRun>(context());
  run_->id = next_run_++;
  run_->job = std::make_shared<const JobView>(std::move(job));
  run_->offload_dir = std::move(offload_dir);
  run_->first_call = next_call_;
  run_->first_timer = next_timer_;
  run_->first_persist = next_persist_;
  run_->record.self = options_.site;
  run_->record.state = v1::SITE_STATE_CONFIGURED;
}

void SiteMachine::OnConfigure(event::Configure& e) {
  ResetForJob(std::move(e.job), std::move(e.offload_dir));
  PermissionMayChange();
  PersistClearOffloadAndState();
  out_.push_back(effect::PrepareTransport{run_->job->config()});
  // A trainer takes part in every round: no task for this long means the
  // job never started (a non-trainer candidate may wait for its first
  // election as long as the job lasts).
  ArmStartDeadline();
  SWARM_LOG_INFO("configured for job %s (%d sites, %d rounds)", run_->job->id(),
                 run_->job->config().sites_size(),
                 run_->job->config().num_rounds());
  Reply(e.request, MakeReply(v1::OUTCOME_OK, "configured"));
}

void SiteMachine::OnRecover(event::Recover& e) {
  ResetForJob(std::move(e.job), std::move(e.offload_dir));
  const v1::JobState& state = e.state;
  run_->record.started = state.started() || state.last_completed_round() >= 0;
  if (state.last_completed_round() >= 0) {
    run_->record.last_task_round =
        static_cast<uint32_t>(state.last_completed_round());
  }
  run_->record.attempt = state.attempt();
  run_->record.lineage = LineageFromProto(state.lineage());
  run_->record.best = state.best();
  run_->record.recovered = true;
  run_->reloaded = true;
  if (e.best_model != nullptr && run_->record.best.site() == options_.site) {
    run_->best_model = e.best_model;
    run_->best_model_round = run_->record.best.round();
  }
  if (e.global != nullptr && state.global_round() >= 0) {
    run_->persisted_global_round = state.global_round();
    run_->durable_global_round = state.global_round();
    run_->persisted_global_lineage = LineageFromProto(state.global_lineage());
    run_->current_global = e.global;
    run_->current_global_round = static_cast<uint32_t>(state.global_round());
  }
  if (IsTerminal(state.state())) {
    run_->record.state = state.state();
    run_->end_reason = "ended before the restart";
  } else {
    run_->record.state =
        run_->record.started ? v1::SITE_STATE_IDLE : v1::SITE_STATE_CONFIGURED;
    if (!run_->record.started) ArmStartDeadline();
  }
  PermissionMayChange();
  SWARM_LOG_INFO(
      "job %s reloaded from the workspace after a restart (%s; last learn "
      "task: round %s; global model of round %d)",
      run_->job->id(), v1::SiteState_Name(run_->record.state),
      run_->record.last_task_round.has_value()
          ? absl::StrCat(*run_->record.last_task_round)
          : std::string("none"),
      run_->persisted_global_round);
}

// A resume: scatter the round of the persisted global model again.
void SiteMachine::Resume(RequestId request) {
  if (!run_->record.recovered || run_->current_global == nullptr ||
      run_->persisted_global_round < 0) {
    return Reply(request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("site ", options_.site,
                                        " holds no persisted global model of "
                                        "job ",
                                        run_->job->id(), " to resume from")));
  }
  const uint32_t round = static_cast<uint32_t>(run_->persisted_global_round);
  if (!run_->job->HasRound(round)) {
    return Reply(request, MakeReply(v1::OUTCOME_REJECTED,
                                    absl::StrCat("round ", round,
                                                 " is past the job's last")));
  }
  run_->record.started = true;
  SWARM_LOG_INFO("resuming job %s at round %d", run_->job->id(), round);
  // Answered once the round's tasks are out (AnswerStart).
  run_->work.pending_start = PendingStart{request, round};
  ScatterRound(round, run_->current_global, run_->record.best,
               run_->persisted_global_lineage,
               /*resume=*/true);
}

void SiteMachine::OnStart(event::Start& e) {
  absl::Status job =
      CheckJobId(run_->job.get(), options_.site, e.start.job_id());
  if (!job.ok()) return Reply(e.request, ReplyFromStatus(job));
  if (e.start.resume()) {
    if (IsTerminal(run_->record.state)) {
      return Reply(
          e.request,
          MakeReply(
              v1::OUTCOME_REJECTED,
              absl::StrCat("job ", run_->job->id(), " is ",
                           v1::SiteState_Name(run_->record.state), " here")));
    }
    return Resume(e.request);
  }
  if (run_->job->config().starting_site() != options_.site) {
    return Reply(e.request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("start goes to the starting site ",
                                        run_->job->config().starting_site(),
                                        ", not ", options_.site)));
  }
  if (run_->record.started) {
    return Reply(e.request, MakeReply(v1::OUTCOME_REJECTED,
                                      absl::StrCat("job ", run_->job->id(),
                                                   " already started")));
  }
  run_->record.started = true;
  PermissionMayChange();
  // Answered once the first round's tasks are out (AnswerStart).
  run_->work.pending_start = PendingStart{e.request, run_->job->first_round()};
  effect::LoadInitialModel load;
  if (run_->job->first_round() > 0) load.kept_round = run_->job->first_round();
  if (!run_->offload_dir.empty()) {
    load.lean_path = LeanPath("initial-model");
    load.lean_min_bytes = run_->job->config().lean_memory_min_model_bytes();
  }
  out_.push_back(load);
  SWARM_LOG_INFO("starting job %s at round %d", run_->job->id(),
                 run_->job->first_round());
}

void SiteMachine::OnInitialModel(event::InitialModel& e) {
  if (!Active()) return;
  if (!e.model.ok() && run_->job->first_round() > 0 &&
      run_->work.pending_start.has_value()) {
    // No model of start_round here: the start is refused and the job stays
    // configured (start again with the model in place, or from round 0).
    const RequestId request = run_->work.pending_start->request;
    run_->work.pending_start.reset();
    run_->record.started = false;
    PermissionMayChange();
    ReportError("start", e.model.status());
    return Reply(request, MakeReply(v1::OUTCOME_REJECTED,
                                    std::string(e.model.status().message())));
  }
  if (!e.model.ok()) return Fail("initial model", e.model.status());
  ScatterRound(run_->job->first_round(), std::move(*e.model), v1::BestRecord(),
               Lineage());
}

void SiteMachine::AnswerStart(uint32_t round, const Scatter* scatter,
                              const absl::Status& failure) {
  if (!run_->work.pending_start.has_value() ||
      run_->work.pending_start->round != round)
    return;
  const RequestId request = run_->work.pending_start->request;
  run_->work.pending_start.reset();
  if (!failure.ok() || scatter == nullptr) {
    return Reply(request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("round ", round, " did not start: ",
                                        failure.ok() ? "no learn task sent"
                                                     : failure.message())));
  }
  v1::Reply reply =
      MakeReply(v1::OUTCOME_OK,
                absl::StrCat("round ", round, ": learn task delivered to ",
                             scatter->answers.acked().size(),
                             " trainer(s) and to aggregator ",
                             scatter->header.aggregator()));
  for (const auto& [site, why] : scatter->answers.missed()) {
    reply.add_not_reached(absl::StrCat(site, ": ", why));
  }
  Reply(request, std::move(reply));
}

void SiteMachine::OnAbort(event::Abort& e) {
  absl::Status job =
      CheckJobId(run_->job.get(), options_.site, e.abort.job_id());
  if (!job.ok()) return Reply(e.request, ReplyFromStatus(job));
  if (IsTerminal(run_->record.state)) {
    return Reply(
        e.request,
        MakeReply(v1::OUTCOME_OK,
                  absl::StrCat("job already ",
                               v1::SiteState_Name(run_->record.state))));
  }
  run_->last_error =
      absl::StrCat("aborted by ", e.abort.sender(),
                   e.abort.reason().empty() ? "" : ": ", e.abort.reason());
  run_->last_error_time = now_;
  run_->record.state = v1::SITE_STATE_ABORTED;
  EndActivity();  // Aggregators remove their offload files.
  PersistClearOffloadAndState();
  SWARM_LOG_WARNING("job %s aborted (%s)", run_->job->id(), run_->last_error);
  Reply(e.request, MakeReply(v1::OUTCOME_OK, "aborted"));
}

// ---------------------------------------------------------------------------
// Incoming model streams

void SiteMachine::OnModelHeader(event::ModelHeader& e) {
  const v1::ModelHeader& header = e.header;
  absl::StatusOr<Admitted> admitted =
      AdmitStream(run_->job.get(), run_->record, header);
  absl::StatusOr<ModelAdmission> answer;
  if (!admitted.ok()) {
    if (header.kind() == v1::MODEL_KIND_LEARN_TASK && header.handoff()) {
      run_->work.trainer.CatchUp(header);
    }
    answer = admitted.status();
  } else if (!admitted->receive_body) {
    absl::Status held = absl::OkStatus();
    if (header.kind() == v1::MODEL_KIND_LEARN_TASK) {
      held = run_->work.trainer.OnHeldTask(header, admitted->task);
    }
    if (held.ok()) {
      ModelAdmission admission;
      admission.header_only = true;
      admission.reply_message = std::move(admitted->message);
      answer = std::move(admission);
    } else {
      answer = held;
    }
  } else if (header.kind() == v1::MODEL_KIND_RESULT ||
             (header.kind() == v1::MODEL_KIND_PARTIAL_SUM &&
              header.relay_to().empty())) {
    answer = run_->work.aggregator.AdmitResult(header, now_);
  } else if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
    answer = run_->work.trainer.AdmitPartialHop(header);
  } else if (header.kind() == v1::MODEL_KIND_LEARN_TASK && header.body_held()) {
    answer = run_->work.trainer.AcceptHeldTask(header);
  } else {
    ModelAdmission admission;
    admission.assembler = AssemblerFor(header.kind());
    if (header.kind() == v1::MODEL_KIND_LEARN_TASK &&
        run_->current_global != nullptr) {
      // The optimizer's state may grow after round 0 (whose model has
      // none): the model's tensors must match, the state may follow.
      admission.assembler.expected_specs =
          TrainableViewOf(*run_->current_global).specs();
      if (run_->job->config().server_optimizer() != v1::SERVER_OPTIMIZER_NONE) {
        admission.assembler.extra_tensor_prefix = kServerOptimizerPrefix;
      }
    }
    uint64_t bytes = 0;
    for (const v1::TensorInfo& tensor : header.tensors()) {
      bytes += tensor.byte_size();
    }
    if (LeanFor(bytes)) {
      // A learn task or a final model, held as a mapping of a file that is
      // gone once mapped: its pages are given back after training, writing
      // and sending (SiteDriver), and come back from the file when read.
      admission.sink = std::make_unique<DiskSink>(
          LeanPath(absl::StrCat(header.kind() == v1::MODEL_KIND_LEARN_TASK
                                    ? "learn-task"
                                    : "final",
                                "-r", header.round())),
          DiskSink::Keep::kUnlinkWhenMapped);
    }
    answer = std::move(admission);
  }
  if (answer.ok() && !answer->header_only) {
    answer->relay = StreamBudgets(header, run_->job->failover_timeout());
  }
  out_.push_back(effect::Reply{e.request, std::move(answer)});
}

namespace event {
ModelBody MakeModelBody(RequestId request, v1::ModelHeader header,
                        absl::StatusOr<std::shared_ptr<const Model>> model) {
  ModelBody body{request, std::move(header), std::move(model), {}};
  if (body.header.kind() == v1::MODEL_KIND_BEST && body.model.ok() &&
      *body.model != nullptr) {
    body.content_digest = ModelContentDigest(**body.model);
  }
  return body;
}
}  // namespace event

void SiteMachine::OnModelBody(event::ModelBody& e) {
  const v1::ModelHeader& header = e.header;
  absl::Status job =
      CheckJobId(run_->job.get(), options_.site, header.job_id());
  if (!job.ok()) return Reply(e.request, ReplyFromStatus(job));
  switch (header.kind()) {
    case v1::MODEL_KIND_LEARN_TASK:
      if (!e.model.ok())
        return Reply(e.request, ReplyFromStatus(e.model.status()));
      return Reply(e.request,
                   run_->work.trainer.AcceptLearnTask(header, *e.model));
    case v1::MODEL_KIND_RESULT:
    case v1::MODEL_KIND_PARTIAL_SUM:
      if (header.kind() == v1::MODEL_KIND_RESULT || header.relay_to().empty()) {
        std::optional<v1::Reply> now =
            run_->work.aggregator.OnResult(e.request, header, e.model);
        if (now.has_value()) Reply(e.request, std::move(*now));
        return;
      }
      return Reply(e.request, run_->work.trainer.OnPartialPassedOn(
                                  header, e.model.status()));
    case v1::MODEL_KIND_BEST:
    case v1::MODEL_KIND_LAST: {
      if (!e.model.ok())
        return Reply(e.request, ReplyFromStatus(e.model.status()));
      if (header.kind() == v1::MODEL_KIND_BEST &&
          header.sender() != run_->record.best.site() &&
          header.sender() !=
              run_->job->AggregatorAt(header.final_round(), header.attempt()) &&
          e.content_digest != run_->record.best.digest()) {
        // Neither the scorer nor the final aggregator: only the model
        // whose digest the record carries is taken from it.
        return Reply(e.request,
                     MakeReply(v1::OUTCOME_BAD_REQUEST,
                               absl::StrCat("BEST of round ", header.round(),
                                            " from ", header.sender(),
                                            " does not match the best "
                                            "record's digest")));
      }
      // Written first; stored in the record (and answered) once on disk.
      effect::Persist persist;
      persist.what = effect::Persist::What::kFinal;
      persist.persist = next_persist_++;
      persist.notify = true;
      persist.job_id = header.job_id();
      persist.kind = header.kind();
      persist.model = *e.model;
      persist.metadata = ModelMetadataFromHeader(header);
      run_->pending_finals[persist.persist] =
          PendingFinal{e.request, header, *e.model};
      out_.push_back(std::move(persist));
      return;
    }
    default:
      return Reply(e.request,
                   MakeReply(v1::OUTCOME_BAD_REQUEST, "unexpected model kind"));
  }
}

void SiteMachine::OnLearnerWaiting(event::LearnerWaiting& e) {
  if (e.what == learner_waiting_) return;
  learner_waiting_ = std::move(e.what);
  Changed();
}

void SiteMachine::OnPersistDone(event::PersistDone& e) {
  if (Stale(e.persist, run_->first_persist)) {
    // Written for a job that is gone: the file is that job's, nothing here
    // waits for it. (A failed write is that job's trouble, not this one's.)
    return;
  }
  // A lean aggregate's write: the aggregator goes on with its round (a
  // failed write fails the site below).
  run_->work.aggregator.OnPersistDone(e);
  if (auto durable = run_->durable_writes.find(e.persist);
      durable != run_->durable_writes.end()) {
    if (e.status.ok()) {
      run_->durable_global_round =
          std::max(run_->durable_global_round, durable->second);
      Changed();
    }
    run_->durable_writes.erase(durable);
  }
  auto it = run_->pending_finals.find(e.persist);
  if (it == run_->pending_finals.end()) {
    if (e.status.ok()) return;
    if (!Active())
      return ReportError(absl::StrCat("saving ", e.what), e.status);
    // The site cannot keep its job on disk (a full or failing workspace):
    // it leaves the job, and its peers go on without it (an aggregator's
    // trainers fail over to the round's next backup).
    return Fail(absl::StrCat("saving ", e.what), e.status);
  }
  PendingFinal pending = std::move(it->second);
  run_->pending_finals.erase(it);
  const v1::ModelHeader& header = pending.header;
  if (!e.status.ok()) {
    // This site's disk cannot take the final model: it leaves the job
    // (the sender, answered ABORTED, does not retry); the others finish.
    return Reply(
        pending.request,
        FailAndAbort(absl::StrCat("saving ", v1::ModelKind_Name(header.kind())),
                     e.status));
  }
  absl::Status job =
      CheckJobId(run_->job.get(), options_.site, header.job_id());
  if (!job.ok()) return Reply(pending.request, ReplyFromStatus(job));
  Reply(pending.request, run_->work.finale.AcceptFinal(header, pending.model));
}

// ---------------------------------------------------------------------------
// Outgoing calls ending, timers

void SiteMachine::OnCallDone(event::CallDone& e) {
  if (Stale(e.call, run_->first_call)) return;
  auto it = run_->work.calls.find(e.call);
  if (it == run_->work.calls.end()) return;  // No longer wanted.
  const Call call = std::move(it->second);
  run_->work.calls.erase(it);
  // Back to the role that sent it.
  switch (call.role) {
    case site::RoleId::kTrainer:
      return run_->work.trainer.OnCallDone(call, e);
    case site::RoleId::kScatter:
      return run_->work.scatter.OnCallDone(call, e);
    case site::RoleId::kFinale:
      return run_->work.finale.OnCallDone(call, e);
    case site::RoleId::kAggregator:  // It sends none.
    case site::RoleId::kSite:
      return;
  }
}

void SiteMachine::OnTimerFired(event::TimerFired& e) {
  if (Stale(e.timer, run_->first_timer)) return;
  auto it = run_->work.timers.find(e.timer);
  if (it == run_->work.timers.end()) return;
  const Timer timer = it->second;
  run_->work.timers.erase(it);
  // Back to the role that set it.
  switch (timer.role) {
    case site::RoleId::kTrainer:
      return run_->work.trainer.OnTimerFired(e.timer, timer);
    case site::RoleId::kScatter:
      return run_->work.scatter.OnTimerFired(e.timer, timer);
    case site::RoleId::kAggregator:
      return run_->work.aggregator.OnTimerFired(e.timer, timer);
    case site::RoleId::kFinale:
      return run_->work.finale.OnTimerFired(e.timer, timer);
    case site::RoleId::kSite:
      break;
  }
  // The site's own: the start deadline (ArmStartDeadline).
  if (timer.purpose != Timer::Purpose::kStartDeadline || run_->job == nullptr ||
      run_->record.last_task_round.has_value() ||
      run_->work.pending_start.has_value() || IsTerminal(run_->record.state)) {
    return;
  }
  Fail("start",
       absl::DeadlineExceededError(absl::StrCat(
           "no learn task within start_timeout_ms (",
           absl::FormatDuration(run_->job->start_timeout()),
           ") of being configured: the job was not started (starting site ",
           run_->job->config().starting_site(),
           "), or its tasks never reached this site")));
}

void SiteMachine::OnTrainingDone(event::TrainingDone& e) {
  if (StaleRun(e.job_run)) return;
  run_->work.trainer.OnTrainingDone(e);
}

void SiteMachine::OnAggregationDone(event::AggregationDone& e) {
  if (StaleRun(e.job_run)) return;
  run_->work.aggregator.OnAggregationDone(e);
}

void SiteMachine::OnResultAdded(event::ResultAdded& e) {
  if (StaleRun(e.job_run)) return;
  run_->work.aggregator.OnResultAdded(e);
}

// ---------------------------------------------------------------------------
// Requests of one role to another

void SiteMachine::ScatterRound(uint32_t round,
                               std::shared_ptr<const Model> global,
                               v1::BestRecord best, const Lineage& lineage,
                               bool resume) {
  run_->work.scatter.ScatterRound(round, std::move(global), std::move(best),
                                  lineage, resume);
}

void SiteMachine::FinishJob(uint32_t last_round,
                            std::shared_ptr<const Model> last,
                            v1::BestRecord best, const std::string& reason) {
  run_->work.finale.FinishJob(last_round, std::move(last), std::move(best),
                              reason);
}

void SiteMachine::OpenRound(const v1::ModelHeader& header,
                            std::shared_ptr<const Model> base) {
  run_->work.aggregator.OpenRound(header, std::move(base));
}

void SiteMachine::Heard(uint32_t round, const std::string& trainer,
                        absl::Time when) {
  run_->work.aggregator.Heard(round, trainer, when);
}

bool SiteMachine::Gathers(uint32_t round) const {
  return run_->work.aggregator.Gathers(round);
}

uint64_t SiteMachine::DropLosingWork() {
  const uint64_t dropped = run_->work.aggregator.DropAll();
  run_->work.scatter.DropAll();
  return dropped;
}

bool SiteMachine::OwnResultFirst(uint32_t round) const {
  return run_->work.trainer.OwnResultFirst(round);
}

void SiteMachine::EndTrainingAtLast(uint32_t round) {
  run_->work.trainer.EndTrainingAtLast(round);
}

// ---------------------------------------------------------------------------
// The job's shared record

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
  if (old == nullptr) return;
  auto swap = [&](std::shared_ptr<const Model>& held) {
    if (held.get() == old) held = mapped;
  };
  swap(run_->current_global);
  swap(run_->best_model);
  for (auto& [kind, model] : run_->finals) swap(model);
  // A gathering round's base stays (its aggregator's state is immutable).
  run_->work.trainer.ReplaceHeldModel(old, mapped);
  run_->work.scatter.ReplaceHeldModel(old, mapped);
  run_->work.finale.ReplaceHeldModel(old, mapped);
}

}  // namespace swarm
