// SiteMachine: Step, the shared helpers and the operator's events; the
// queries are in site_machine_queries.cc. The roles live beside it:
// site_machine_trainer.cc (scatter, training, submission),
// site_machine_aggregator.cc (the rounds this site gathers) and
// site_machine_finale.cc (BEST and LAST).
#include "controller/site_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "controller/replies.h"
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
    : options_(std::move(options)) {
  record_.self = options_.site;
}

SiteMachine::~SiteMachine() = default;

Effects SiteMachine::Step(Event event, absl::Time now) {
  now_ = std::max(now_, now);
  std::visit(
      [this](auto& e) {
        using E = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<E, event::Configure>) OnConfigure(e);
        if constexpr (std::is_same_v<E, event::Start>) OnStart(e);
        if constexpr (std::is_same_v<E, event::Abort>) OnAbort(e);
        if constexpr (std::is_same_v<E, event::ModelHeader>) OnModelHeader(e);
        if constexpr (std::is_same_v<E, event::ModelBody>) OnModelBody(e);
        if constexpr (std::is_same_v<E, event::PermissionAsked>)
          OnPermissionAsked(e);
        if constexpr (std::is_same_v<E, event::RequestCancelled>)
          OnRequestCancelled(e);
        if constexpr (std::is_same_v<E, event::ShareBest>) OnShareBest(e);
        if constexpr (std::is_same_v<E, event::CallDone>) OnCallDone(e);
        if constexpr (std::is_same_v<E, event::TimerFired>) OnTimerFired(e);
        if constexpr (std::is_same_v<E, event::TrainingDone>) OnTrainingDone(e);
        if constexpr (std::is_same_v<E, event::InitialModel>) OnInitialModel(e);
        if constexpr (std::is_same_v<E, event::AggregationDone>)
          OnAggregationDone(e);
        if constexpr (std::is_same_v<E, event::PersistDone>) OnPersistDone(e);
        if constexpr (std::is_same_v<E, event::LearnerWaiting>)
          OnLearnerWaiting(e);
        if constexpr (std::is_same_v<E, event::Recover>) OnRecover(e);
      },
      event);
  // A slot freed or a round opened: a held request may be answered now.
  // (Answering may close a round, which may change more: look again, a few
  // times at most.)
  for (int pass = 0; permission_dirty_ && pass < 4; ++pass) {
    permission_dirty_ = false;
    AnswerHeldRequests();
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
  return job_ != nullptr && record_.started && !IsTerminal(record_.state);
}

bool SiteMachine::IsTrainer(absl::string_view site) const {
  return job_ != nullptr && job_->IsTrainer(site);
}

void SiteMachine::JournalStateChange() {
  const v1::SiteState state = record_.state;
  const uint32_t round = StatusRound();
  if (!state_changes_.empty() && state_changes_.back().state == state &&
      state_changes_.back().round == round) {
    return;
  }
  const uint64_t seq =
      state_changes_.empty() ? 1 : state_changes_.back().seq + 1;
  state_changes_.push_back(
      StateChange{seq, state, round, now_, Counters(), metrics_});
  if (state_changes_.size() > kStateChangesKept) state_changes_.pop_front();
  status_dirty_ = true;
}

void SiteMachine::SetState(v1::SiteState state) {
  if (IsTerminal(record_.state) && state != v1::SITE_STATE_CONFIGURED) return;
  if (record_.state != state) {
    record_.state = state;
    PermissionMayChange();
  }
}

void SiteMachine::ReportError(absl::string_view what,
                              const absl::Status& status) {
  last_error_ = absl::StrCat(what, ": ", status.message());
  last_error_time_ = now_;
  SWARM_LOG_WARNING("%s", last_error_);
  Changed();
}

void SiteMachine::DropRounds() {
  // What they counted stays in the site's counters; nothing of theirs is in
  // flight any more.
  for (const auto& [number, round] : rounds_) {
    RoundCounters counted = round->counters();
    counted.in_flight = 0;
    closed_rounds_.Add(counted);
  }
  rounds_.clear();
}

void SiteMachine::EndActivity() {
  if (training_.has_value()) out_.push_back(effect::CancelTraining{});
  training_.reset();
  DropRounds();
  aggregating_.clear();
  calls_.clear();
  timers_.clear();
  scatters_.clear();
  aggregator_tasks_.clear();
  gathering_.clear();
  armed_.clear();
  broadcasts_.clear();
  best_asks_.clear();
  // Held requests are answered: the job is over here.
  const v1::Reply ended = IsTerminal(record_.state)
                              ? ReplyFromStatus(JobEndedHere(record_))
                              : MakeReply(v1::OUTCOME_ABORTED, "job reset");
  for (auto& [request, held] : held_) {
    v1::SubmitPermissionReply reply;
    reply.set_outcome(ended.outcome());
    reply.set_message(ended.message());
    out_.push_back(effect::Reply{request, reply});
  }
  held_.clear();
  if (pending_start_.has_value()) {
    const RequestId request = pending_start_->request;
    pending_start_.reset();
    Reply(request,
          MakeReply(v1::OUTCOME_REJECTED,
                    absl::StrCat("the job ended here before its first round's "
                                 "learn tasks were out: ",
                                 last_error_.empty() ? "reset" : last_error_)));
  }
  PermissionMayChange();
}

void SiteMachine::Fail(absl::string_view what, const absl::Status& status) {
  ReportError(what, status);
  if (IsTerminal(record_.state)) return;  // Ended already: nothing to undo.
  end_reason_ = absl::StrCat("failed: ", last_error_);
  SetState(v1::SITE_STATE_FAILED);
  EndActivity();
  PersistState();
}

PersistId SiteMachine::PersistClearOffloadAndState(bool notify) {
  effect::Persist clear;
  clear.what = effect::Persist::What::kClearOffload;
  clear.persist = next_persist_++;
  clear.job_id = job_->id();
  out_.push_back(std::move(clear));
  return PersistState(notify);
}

void SiteMachine::ArmStartDeadline() {
  if (!IsTrainer(options_.site)) return;
  Timer timer;
  timer.purpose = Timer::Purpose::kStartDeadline;
  SetTimer(now_ + job_->start_timeout(), timer);
}

v1::Reply SiteMachine::FailAndAbort(const std::string& what,
                                    const absl::Status& status) {
  Fail(what, status);
  return MakeReply(v1::OUTCOME_ABORTED,
                   absl::StrCat("site ", options_.site, " failed (", what, ": ",
                                status.message(), ")"));
}

PersistId SiteMachine::PersistState(bool notify) {
  if (job_ == nullptr) return 0;
  effect::Persist persist;
  persist.what = effect::Persist::What::kState;
  persist.persist = next_persist_++;
  persist.notify = notify;
  persist.job_id = job_->id();
  v1::JobState& state = persist.state;
  state.set_job_id(job_->id());
  state.set_last_completed_round(
      record_.last_task_round.has_value()
          ? static_cast<int64_t>(*record_.last_task_round)
          : -1);
  *state.mutable_best() = record_.best;
  state.set_state(record_.state);
  state.set_attempt(record_.attempt);
  LineageToProto(record_.lineage, state.mutable_lineage());
  state.set_started(record_.started);
  state.set_global_round(persisted_global_round_);
  LineageToProto(persisted_global_lineage_, state.mutable_global_lineage());
  state.set_updated_time_ms(absl::ToUnixMillis(now_));
  const PersistId id = persist.persist;
  out_.push_back(std::move(persist));
  return id;
}

v1::ModelHeader SiteMachine::BaseHeader(v1::ModelKind kind,
                                        uint32_t round) const {
  v1::ModelHeader header;
  header.set_kind(kind);
  header.set_job_id(job_->id());
  header.set_round(round);
  header.set_sender(options_.site);
  header.set_digest_algorithm(job_->config().digest_algorithm());
  // The transport chunks every stream it sends at header.chunk_size.
  header.set_chunk_size(job_->config().chunk_size());
  return header;
}

AssemblerOptions SiteMachine::AssemblerFor(v1::ModelKind kind) const {
  AssemblerOptions assembler;
  assembler.limits = options_.limits;
  assembler.limits.max_model_bytes = std::min(assembler.limits.max_model_bytes,
                                              job_->config().max_model_bytes());
  assembler.expected_kind = kind;
  return assembler;
}

CallId SiteMachine::Send(const std::string& to, PeerMessage message, Call call,
                         bool retry, absl::Time retry_until) {
  const CallId id = next_call_++;
  effect::Send send;
  send.call = id;
  if (const v1::SiteInfo* site = job_->Site(to); site != nullptr) {
    send.to = *site;
  } else {
    send.to.set_name(to);  // The driver answers NOT_FOUND.
  }
  send.message = std::move(message);
  send.retry = retry;
  send.retry_until = retry_until;
  call.target = to;
  calls_[id] = std::move(call);
  out_.push_back(std::move(send));
  return id;
}

TimerId SiteMachine::SetTimer(absl::Time when, Timer timer) {
  const TimerId id = next_timer_++;
  timers_[id] = timer;
  out_.push_back(effect::SetTimer{id, when});
  return id;
}

void SiteMachine::Reply(RequestId request, v1::Reply reply) {
  out_.push_back(effect::Reply{request, std::move(reply)});
}

v1::SiteCounters SiteMachine::Counters() const {
  v1::SiteCounters counters = counters_;
  RoundCounters rounds = closed_rounds_;
  for (const auto& [number, round] : rounds_) rounds.Add(round->counters());
  rounds.CopyTo(&counters);
  return counters;
}

// ---------------------------------------------------------------------------
// Operator events

void SiteMachine::ResetForJob(v1::JobConfig job, std::string offload_dir) {
  EndActivity();
  finals_.clear();
  best_model_.reset();
  best_model_round_ = 0;
  current_global_.reset();
  current_task_.reset();
  pending_finals_.clear();
  counters_ = v1::SiteCounters();
  closed_rounds_ = RoundCounters();
  metrics_.clear();
  last_error_.clear();
  last_error_time_ = absl::InfinitePast();
  job_ = std::make_shared<const JobView>(std::move(job));
  offload_dir_ = std::move(offload_dir);
  record_ = SiteRecord();
  record_.self = options_.site;
  record_.state = v1::SITE_STATE_CONFIGURED;
  failovers_.clear();
  end_reason_.clear();
  final_round_ = 0;
  final_attempt_ = 0;
  persisted_global_round_ = -1;
  durable_global_round_ = -1;
  durable_writes_.clear();
  persisted_global_lineage_.clear();
  reloaded_ = false;
}

void SiteMachine::OnConfigure(event::Configure& e) {
  ResetForJob(std::move(e.job), std::move(e.offload_dir));
  PermissionMayChange();
  PersistClearOffloadAndState();
  out_.push_back(effect::PrepareTransport{job_->config()});
  // A trainer takes part in every round: no task for this long means the
  // job never started (a non-trainer candidate may wait for its first
  // election as long as the job lasts).
  ArmStartDeadline();
  SWARM_LOG_INFO("configured for job %s (%d sites, %d rounds)", job_->id(),
                 job_->config().sites_size(), job_->config().num_rounds());
  Reply(e.request, MakeReply(v1::OUTCOME_OK, "configured"));
}

void SiteMachine::OnRecover(event::Recover& e) {
  ResetForJob(std::move(e.job), std::move(e.offload_dir));
  const v1::JobState& state = e.state;
  record_.started = state.started() || state.last_completed_round() >= 0;
  if (state.last_completed_round() >= 0) {
    record_.last_task_round =
        static_cast<uint32_t>(state.last_completed_round());
  }
  record_.attempt = state.attempt();
  record_.lineage = LineageFromProto(state.lineage());
  record_.best = state.best();
  record_.recovered = true;
  reloaded_ = true;
  if (e.best_model != nullptr && record_.best.site() == options_.site) {
    best_model_ = e.best_model;
    best_model_round_ = record_.best.round();
  }
  if (e.global != nullptr && state.global_round() >= 0) {
    persisted_global_round_ = state.global_round();
    durable_global_round_ = state.global_round();
    persisted_global_lineage_ = LineageFromProto(state.global_lineage());
    current_global_ = e.global;
    current_global_round_ = static_cast<uint32_t>(state.global_round());
  }
  if (IsTerminal(state.state())) {
    record_.state = state.state();
    end_reason_ = "ended before the restart";
  } else {
    record_.state =
        record_.started ? v1::SITE_STATE_IDLE : v1::SITE_STATE_CONFIGURED;
    if (!record_.started) ArmStartDeadline();
  }
  PermissionMayChange();
  SWARM_LOG_INFO(
      "job %s reloaded from the workspace after a restart (%s; last learn "
      "task: round %s; global model of round %d)",
      job_->id(), v1::SiteState_Name(record_.state),
      record_.last_task_round.has_value()
          ? absl::StrCat(*record_.last_task_round)
          : std::string("none"),
      persisted_global_round_);
}

// A resume: scatter the round of the persisted global model again.
void SiteMachine::Resume(RequestId request) {
  if (!record_.recovered || current_global_ == nullptr ||
      persisted_global_round_ < 0) {
    return Reply(request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("site ", options_.site,
                                        " holds no persisted global model of "
                                        "job ",
                                        job_->id(), " to resume from")));
  }
  const uint32_t round = static_cast<uint32_t>(persisted_global_round_);
  if (!job_->HasRound(round)) {
    return Reply(request, MakeReply(v1::OUTCOME_REJECTED,
                                    absl::StrCat("round ", round,
                                                 " is past the job's last")));
  }
  record_.started = true;
  SWARM_LOG_INFO("resuming job %s at round %d", job_->id(), round);
  // Answered once the round's tasks are out (AnswerStart).
  pending_start_ = PendingStart{request, round};
  ScatterRound(round, current_global_, record_.best, persisted_global_lineage_,
               /*resume=*/true);
}

void SiteMachine::OnStart(event::Start& e) {
  absl::Status job = CheckJobId(job_.get(), options_.site, e.start.job_id());
  if (!job.ok()) return Reply(e.request, ReplyFromStatus(job));
  if (e.start.resume()) {
    if (IsTerminal(record_.state)) {
      return Reply(
          e.request,
          MakeReply(v1::OUTCOME_REJECTED,
                    absl::StrCat("job ", job_->id(), " is ",
                                 v1::SiteState_Name(record_.state), " here")));
    }
    return Resume(e.request);
  }
  if (job_->config().starting_site() != options_.site) {
    return Reply(e.request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("start goes to the starting site ",
                                        job_->config().starting_site(),
                                        ", not ", options_.site)));
  }
  if (record_.started) {
    return Reply(e.request, MakeReply(v1::OUTCOME_REJECTED,
                                      absl::StrCat("job ", job_->id(),
                                                   " already started")));
  }
  record_.started = true;
  PermissionMayChange();
  // Answered once the first round's tasks are out (AnswerStart).
  pending_start_ = PendingStart{e.request, job_->first_round()};
  effect::LoadInitialModel load;
  if (job_->first_round() > 0) load.kept_round = job_->first_round();
  if (!offload_dir_.empty()) {
    load.lean_path = LeanPath("initial-model");
    load.lean_min_bytes = job_->config().lean_memory_min_model_bytes();
  }
  out_.push_back(load);
  SWARM_LOG_INFO("starting job %s at round %d", job_->id(),
                 job_->first_round());
}

void SiteMachine::OnInitialModel(event::InitialModel& e) {
  if (!Active()) return;
  if (!e.model.ok() && job_->first_round() > 0 && pending_start_.has_value()) {
    // No model of start_round here: the start is refused and the job stays
    // configured (start again with the model in place, or from round 0).
    const RequestId request = pending_start_->request;
    pending_start_.reset();
    record_.started = false;
    PermissionMayChange();
    ReportError("start", e.model.status());
    return Reply(request, MakeReply(v1::OUTCOME_REJECTED,
                                    std::string(e.model.status().message())));
  }
  if (!e.model.ok()) return Fail("initial model", e.model.status());
  ScatterRound(job_->first_round(), std::move(*e.model), v1::BestRecord(),
               Lineage());
}

void SiteMachine::AnswerStart(uint32_t round, const Scatter* scatter,
                              const absl::Status& failure) {
  if (!pending_start_.has_value() || pending_start_->round != round) return;
  const RequestId request = pending_start_->request;
  pending_start_.reset();
  if (!failure.ok() || scatter == nullptr) {
    return Reply(request,
                 MakeReply(v1::OUTCOME_REJECTED,
                           absl::StrCat("round ", round, " did not start: ",
                                        failure.ok() ? "no learn task sent"
                                                     : failure.message())));
  }
  v1::Reply reply = MakeReply(
      v1::OUTCOME_OK,
      absl::StrCat("round ", round, ": learn task delivered to ",
                   scatter->acked.size(), " trainer(s) and to aggregator ",
                   scatter->header.aggregator()));
  for (const auto& [site, why] : scatter->missed) {
    reply.add_not_reached(absl::StrCat(site, ": ", why));
  }
  Reply(request, std::move(reply));
}

void SiteMachine::OnAbort(event::Abort& e) {
  absl::Status job = CheckJobId(job_.get(), options_.site, e.abort.job_id());
  if (!job.ok()) return Reply(e.request, ReplyFromStatus(job));
  if (IsTerminal(record_.state)) {
    return Reply(e.request,
                 MakeReply(v1::OUTCOME_OK,
                           absl::StrCat("job already ",
                                        v1::SiteState_Name(record_.state))));
  }
  last_error_ =
      absl::StrCat("aborted by ", e.abort.sender(),
                   e.abort.reason().empty() ? "" : ": ", e.abort.reason());
  last_error_time_ = now_;
  record_.state = v1::SITE_STATE_ABORTED;
  EndActivity();  // Aggregators remove their offload files.
  PersistClearOffloadAndState();
  SWARM_LOG_WARNING("job %s aborted (%s)", job_->id(), last_error_);
  Reply(e.request, MakeReply(v1::OUTCOME_OK, "aborted"));
}

// ---------------------------------------------------------------------------
// Incoming model streams

void SiteMachine::OnModelHeader(event::ModelHeader& e) {
  const v1::ModelHeader& header = e.header;
  absl::StatusOr<Admitted> admitted = AdmitStream(job_.get(), record_, header);
  absl::StatusOr<ModelAdmission> answer;
  if (!admitted.ok()) {
    if (header.kind() == v1::MODEL_KIND_LEARN_TASK && header.handoff()) {
      CatchUp(header);
    }
    answer = admitted.status();
  } else if (!admitted->receive_body) {
    if (header.kind() == v1::MODEL_KIND_LEARN_TASK) {
      OnHeldTask(header, admitted->task);
    }
    ModelAdmission admission;
    admission.header_only = true;
    admission.reply_message = std::move(admitted->message);
    answer = std::move(admission);
  } else if (header.kind() == v1::MODEL_KIND_RESULT ||
             (header.kind() == v1::MODEL_KIND_PARTIAL_SUM &&
              header.relay_to().empty())) {
    answer = AdmitResult(header, now_);
  } else if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
    answer = AdmitPartialHop(header);
  } else if (header.kind() == v1::MODEL_KIND_LEARN_TASK && header.body_held()) {
    answer = AcceptHeldTask(header);
  } else {
    ModelAdmission admission;
    admission.assembler = AssemblerFor(header.kind());
    if (header.kind() == v1::MODEL_KIND_LEARN_TASK &&
        current_global_ != nullptr) {
      admission.assembler.expected_specs = current_global_->specs();
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
    answer->relay = StreamBudgets(header, job_->failover_timeout());
  }
  out_.push_back(effect::Reply{e.request, std::move(answer)});
}

void SiteMachine::OnModelBody(event::ModelBody& e) {
  const v1::ModelHeader& header = e.header;
  absl::Status job = CheckJobId(job_.get(), options_.site, header.job_id());
  if (!job.ok()) return Reply(e.request, ReplyFromStatus(job));
  switch (header.kind()) {
    case v1::MODEL_KIND_LEARN_TASK:
      if (!e.model.ok())
        return Reply(e.request, ReplyFromStatus(e.model.status()));
      return Reply(e.request, AcceptLearnTask(header, *e.model));
    case v1::MODEL_KIND_RESULT:
      return Reply(e.request, OnResult(header, e.model));
    case v1::MODEL_KIND_PARTIAL_SUM:
      if (header.relay_to().empty()) {
        return Reply(e.request, OnResult(header, e.model));
      }
      return Reply(e.request, OnPartialPassedOn(header, e.model.status()));
    case v1::MODEL_KIND_BEST:
    case v1::MODEL_KIND_LAST: {
      if (!e.model.ok())
        return Reply(e.request, ReplyFromStatus(e.model.status()));
      if (header.kind() == v1::MODEL_KIND_BEST &&
          header.sender() != record_.best.site() &&
          header.sender() !=
              job_->AggregatorAt(header.final_round(), header.attempt()) &&
          ModelContentDigest(**e.model) != record_.best.digest()) {
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
      pending_finals_[persist.persist] =
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
  if (auto after = after_global_.find(e.persist);
      after != after_global_.end()) {
    AfterGlobal next = std::move(after->second);
    after_global_.erase(after);
    // A failed write fails the site below (its trainers fail over). Not
    // mapped (the driver said why): on with the model in memory, as
    // without lean memory.
    if (e.mapped != nullptr) {
      ReplaceHeldModel(next.model.get(), e.mapped);
      next.model = e.mapped;
    }
    if (e.status.ok() && Active()) {
      GoOnAfter(next.round, next.closing, std::move(next.model));
    }
  }
  if (auto durable = durable_writes_.find(e.persist);
      durable != durable_writes_.end()) {
    if (e.status.ok()) {
      durable_global_round_ = std::max(durable_global_round_, durable->second);
      Changed();
    }
    durable_writes_.erase(durable);
  }
  auto it = pending_finals_.find(e.persist);
  if (it == pending_finals_.end()) {
    if (e.status.ok()) return;
    if (!Active())
      return ReportError(absl::StrCat("saving ", e.what), e.status);
    // The site cannot keep its job on disk (a full or failing workspace):
    // it leaves the job, and its peers go on without it (an aggregator's
    // trainers fail over to the round's next backup).
    return Fail(absl::StrCat("saving ", e.what), e.status);
  }
  PendingFinal pending = std::move(it->second);
  pending_finals_.erase(it);
  const v1::ModelHeader& header = pending.header;
  if (!e.status.ok()) {
    // This site's disk cannot take the final model: it leaves the job
    // (the sender, answered ABORTED, does not retry); the others finish.
    return Reply(
        pending.request,
        FailAndAbort(absl::StrCat("saving ", v1::ModelKind_Name(header.kind())),
                     e.status));
  }
  absl::Status job = CheckJobId(job_.get(), options_.site, header.job_id());
  if (!job.ok()) return Reply(pending.request, ReplyFromStatus(job));
  Reply(pending.request, AcceptFinal(header, pending.model));
}

// ---------------------------------------------------------------------------
// Outgoing calls ending, timers

void SiteMachine::OnCallDone(event::CallDone& e) {
  auto it = calls_.find(e.call);
  if (it == calls_.end()) return;  // No longer wanted.
  const Call call = std::move(it->second);
  calls_.erase(it);
  switch (call.purpose) {
    case Call::Purpose::kTaskToTrainer:
      return OnTaskToTrainerDone(call, e);
    case Call::Purpose::kTaskToAggregator:
      return OnTaskToAggregatorDone(call, e);
    case Call::Purpose::kAskPermission:
      return OnPermissionReply(call, e);
    case Call::Purpose::kSubmit:
      return OnSubmitDone(call, e);
    case Call::Purpose::kChainSubmit:
      return OnChainSubmitDone(call, e);
    case Call::Purpose::kHandoff:
      return OnHandoffDone(call, e);
    case Call::Purpose::kFinal:
      return OnFinalDone(call, e);
    case Call::Purpose::kShareBest:
      return OnShareBestDone(call, e);
    case Call::Purpose::kCatchUp:
      if (!e.reply.ok()) {
        ReportError(absl::StrCat("round ", call.round, ": learn task to ",
                                 call.target, " (catching up)"),
                    e.reply.status());
      }
      return;
  }
}

void SiteMachine::OnTimerFired(event::TimerFired& e) {
  auto it = timers_.find(e.timer);
  if (it == timers_.end()) return;
  const Timer timer = it->second;
  timers_.erase(it);
  switch (timer.purpose) {
    case Timer::Purpose::kRoundDeadline: {
      auto round = rounds_.find(timer.round);
      if (round == rounds_.end()) return;
      return OnRoundReport(timer.round, round->second->Check(now_));
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
      out_.push_back(effect::Reply{timer.request, std::move(reply)});
      held_.erase(held);
      return;
    }
    case Timer::Purpose::kAskAgain:
      if (training_.has_value() && training_->id == timer.training &&
          training_->ask_timer == e.timer) {
        AskToSubmit();
      }
      return;
    case Timer::Purpose::kComeForward:
      return DropSilentTrainers(timer.round);
    case Timer::Purpose::kScatterGrace:
      return EndScatterWait(timer.round);
    case Timer::Purpose::kStartDeadline:
      if (job_ == nullptr || record_.last_task_round.has_value() ||
          pending_start_.has_value() || IsTerminal(record_.state)) {
        return;
      }
      return Fail(
          "start",
          absl::DeadlineExceededError(absl::StrCat(
              "no learn task within start_timeout_ms (",
              absl::FormatDuration(job_->start_timeout()),
              ") of being configured: the job was not started (starting site ",
              job_->config().starting_site(),
              "), or its tasks never reached this site")));
    case Timer::Purpose::kFinalGrace:
      return OnFinalGrace(timer.broadcast);
    case Timer::Purpose::kBestDeadline:
      return OnBestDeadline(timer.round);
  }
}

}  // namespace swarm
