// SiteMachine: one site's whole part in a swarm job (design sections 2 and
// 3) as a deterministic state machine, in the manner of etcd raft's Step:
// every input is an Event, passed with the time; Step changes the state and
// returns what the caller must do as Effects (send this, reply to that, start
// training, arm a timer, persist a file). The machine never blocks, sleeps,
// locks or does I/O; it holds no thread and no clock.
//
// Caller's obligations (SiteDriver meets them; a test may too):
// - Serialize every call (one Step at a time) and pass a time that never
//   goes backwards.
// - Carry out each Step's effects in order: persist effects in the order
//   given (a later one may depend on an earlier), the others as soon as it
//   can. Report every Send's end as exactly one kCallDone, every
//   StartTraining's end as one kTrainingDone (unless cancelled), every
//   RunAggregation as one kAggregationDone, every Persist with `notify` (or
//   that failed) as one kPersistDone, every LoadInitialModel as one
//   kInitialModel, and every SetTimer as one kTimerFired at or after its time
//   (a timer the machine no longer needs is ignored when it fires).
// - Answer every incoming call exactly once, with the Reply effect carrying
//   its request id (which may come in a later Step: a held permission
//   request, a final model whose file is being written).
// - A message this site sends to itself (Send with `to` == self) is fed back
//   as the matching incoming event; its reply ends the call as kCallDone.
//
// The vocabulary is in machine_events.h and machine_effects.h, the state of
// a job here in job_run.h (and the trainer's round in trainer_task.h).
#ifndef SWARM_CONTROLLER_SITE_MACHINE_H_
#define SWARM_CONTROLLER_SITE_MACHINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/job_run.h"
#include "controller/machine_effects.h"
#include "controller/machine_events.h"
#include "controller/state_change.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"

namespace swarm {

struct SiteMachineOptions {
  // This site's name.
  std::string site;
  // Limits for incoming model streams (the job may lower max_model_bytes).
  AssemblerLimits limits;
};

// Where FetchModel finds a model: in memory, or in the store.
struct FetchSource {
  std::shared_ptr<const Model> model;  // Set: answer with it.
  v1::ModelKind final_kind = v1::MODEL_KIND_UNSPECIFIED;  // Else load BEST/LAST
  std::optional<uint32_t> round;  // or a kept round's model.
};

class SiteMachine {
 public:
  explicit SiteMachine(SiteMachineOptions options);
  SiteMachine(const SiteMachine&) = delete;
  SiteMachine& operator=(const SiteMachine&) = delete;
  ~SiteMachine();

  Effects Step(Event event, absl::Time now);

  // --- Queries (no state change) ---
  const std::string& self() const { return options_.site; }
  // Whether `job` may replace what runs here: an early refusal (as the
  // reply), or nullopt to go on (store the config, configure the learner,
  // then Step a Configure). `already` is set when this exact job runs here.
  std::optional<v1::Reply> CheckConfigure(const v1::JobConfig& job,
                                          bool* already) const;
  v1::StatusReply Status() const;
  uint64_t status_version() const { return status_version_; }
  // The journaled changes of state or round after the one numbered
  // `after_seq`, oldest first: at most the last kStateChangesKept.
  std::vector<StateChange> StateChangesAfter(uint64_t after_seq) const;
  static constexpr size_t kStateChangesKept = 64;
  absl::StatusOr<FetchSource> ModelForFetch(
      const v1::FetchModelRequest& request) const;
  const JobView* job() const { return run_->job.get(); }
  // Whether outgoing call `call` is still wanted (retry it) or was dropped
  // (the job ended or changed, the round moved on).
  bool WantsCall(CallId call) const { return run_->work.calls.count(call) > 0; }
  const SiteRecord& record() const { return run_->record; }
  // Held permission requests (for tests and status).
  size_t held_requests() const { return run_->work.held.size(); }

 private:
  using Call = site::Call;
  using Timer = site::Timer;
  using Scatter = site::Scatter;
  using PendingStart = site::PendingStart;
  using RoundState = site::RoundState;
  using Training = site::Training;
  using Held = site::Held;
  using Broadcast = site::Broadcast;
  using Closing = site::Closing;
  using HeldTaskCopy = site::HeldTaskCopy;
  using BestAsk = site::BestAsk;
  using AfterGlobal = site::AfterGlobal;
  using PendingFinal = site::PendingFinal;
  using Work = site::Work;
  using JobRun = site::JobRun;

  void Heard(uint32_t round, const std::string& trainer, absl::Time when);

  // One step function per kind of input (site_machine.cc and the role
  // files); each appends to out_.
  void OnConfigure(event::Configure& e);
  void OnStart(event::Start& e);
  void OnAbort(event::Abort& e);
  void OnModelHeader(event::ModelHeader& e);
  void OnModelBody(event::ModelBody& e);
  void OnPermissionAsked(event::PermissionAsked& e);
  void OnRequestCancelled(event::RequestCancelled& e);
  void OnShareBest(event::ShareBest& e);
  void OnCallDone(event::CallDone& e);
  void OnTimerFired(event::TimerFired& e);
  void OnTrainingDone(event::TrainingDone& e);
  void OnInitialModel(event::InitialModel& e);
  void OnAggregationDone(event::AggregationDone& e);
  void OnResultAdded(event::ResultAdded& e);
  void OnPersistDone(event::PersistDone& e);
  void OnLearnerWaiting(event::LearnerWaiting& e);
  void OnRecover(event::Recover& e);
  void Resume(RequestId request);
  // Answers the pending start of `round` (if any): OK with the sites
  // `scatter` missed, or why the start failed (`failure` not OK).
  void AnswerStart(uint32_t round, const Scatter* scatter,
                   const absl::Status& failure = absl::OkStatus());
  void ResetForJob(v1::JobConfig job, std::string offload_dir);

  // Helpers (site_machine.cc).
  bool Active() const;
  bool IsTrainer(absl::string_view site) const;
  void SetState(v1::SiteState state);
  // The trainer's part of a round is over here: IDLE, or GATHERING while
  // this site gathers a round.
  void SetIdleOrGathering();
  // The round status shows: the last task's, else the job's first.
  uint32_t StatusRound() const;
  // Journals the state and round if either changed since the last entry.
  void JournalStateChange();
  void ReportError(absl::string_view what, const absl::Status& status);
  void Fail(absl::string_view what, const absl::Status& status);
  void Changed() { status_dirty_ = true; }
  void PermissionMayChange() {
    status_dirty_ = true;
    permission_dirty_ = true;
  }
  void EndActivity();  // Drops training, rounds, calls, held requests.
  void DropRounds();
  // Returns the state write's id (0 without a job); with `notify` its end
  // comes back as kPersistDone.
  PersistId PersistState(bool notify = false);
  // The job's offload files go first (nothing of an ended round is needed),
  // then the state file. REQUIRES: a job.
  PersistId PersistClearOffloadAndState(bool notify = false);
  // A trainer's deadline for its first learn task (start_timeout_ms).
  void ArmStartDeadline();
  // This site cannot go on (its disk failed under `what`): it fails, and
  // the caller it was answering is told ABORTED, so that it takes its
  // model to the round's next backup or finishes without this site.
  v1::Reply FailAndAbort(const std::string& what, const absl::Status& status);
  v1::ModelHeader BaseHeader(v1::ModelKind kind, uint32_t round) const;
  AssemblerOptions AssemblerFor(v1::ModelKind kind) const;
  CallId Send(const std::string& to, PeerMessage message, Call call,
              bool retry = true, absl::Time retry_until = absl::InfinitePast());
  TimerId SetTimer(absl::Time when, Timer timer);
  void Reply(RequestId request, v1::Reply reply);
  v1::SiteCounters Counters() const;

  // Trainer role (site_machine_trainer.cc).
  void ScatterRound(uint32_t round, std::shared_ptr<const Model> global,
                    v1::BestRecord best, const Lineage& lineage,
                    bool resume = false);
  void SendTaskToAggregator(const Scatter& scatter);
  void OnTaskToTrainerDone(const Call& call, const event::CallDone& e);
  // The aggregator's task without a body (header.body_held): taken with the
  // broadcast's copy kept here, or refused (the sender then sends the body).
  absl::StatusOr<ModelAdmission> AcceptHeldTask(const v1::ModelHeader& header);
  // The answer of a broadcast's head, for itself and the sites after it.
  void OnChainTaskDone(const Call& call, const event::CallDone& e);
  // How `target` answered round `round`'s learn task.
  // With !may_start_grace its acknowledgement does not start the grace for
  // the trainers still silent (a broadcast's answers, when direct sends
  // follow them).
  void NoteTaskToTrainer(uint32_t round, const std::string& target,
                         const absl::Status& status,
                         bool may_start_grace = true);
  PeerMessage TaskToTrainer(const Scatter& scatter) const;
  // With broadcast_learn_tasks: the sites the round's learn task streams
  // along, head first (empty: direct sends); marks `scatter`'s header when
  // the aggregator's task follows the stream without a body.
  std::vector<std::string> BroadcastChain(Scatter& scatter) const;
  void SendTaskToTrainer(const Scatter& scatter, const std::string& target);
  void OnTaskToAggregatorDone(const Call& call, const event::CallDone& e);
  // The round's aggregator did not take its learn task (`status`): the task
  // goes to the next backup, or the job fails here when there is none.
  void PassTaskToBackup(const Call& call, const absl::Status& status);
  void SendAggregatorTask(uint32_t round);
  void EndScatterWait(uint32_t round);
  // At a learn task carrying `best`: keeps this site's copy of the best
  // model (the input of the round it trained on, when that round scored
  // best), or drops a superseded one.
  void KeepBestCopy(const v1::BestRecord& best);
  void NoteFailover(uint32_t round, const std::string& from,
                    const std::string& to, const std::string& reason);
  v1::Reply AcceptLearnTask(const v1::ModelHeader& header,
                            std::shared_ptr<const Model> model);
  // A learn task of the chain that wins over the one this site followed
  // (TaskVerdict kSwitch): what it did on the losing one goes.
  void SwitchToWinningChain(const v1::ModelHeader& header);
  // An accepted learn task in the site's record (persisted when it tells a
  // restarted daemon something new) and as the current global model.
  void NoteLearnTask(const v1::ModelHeader& header,
                     const std::shared_ptr<const Model>& model);
  // This site trains on the round of learn task `header`.
  void BeginTraining(const v1::ModelHeader& header,
                     std::shared_ptr<const Model> model);
  // A learn task admitted without its body (TaskVerdict kRepeat, kTakeOver,
  // kNoted): what it changes here. An error refuses the task (a takeover
  // declined: DeclineTakeOver).
  absl::Status OnHeldTask(const v1::ModelHeader& header, TaskVerdict verdict);
  // Why this site declines to take over round r at attempt a+1 (handoff
  // `header`, TaskVerdict kTakeOver), or OK to take it over: it trains the
  // round for attempt a's aggregator, which answered it within the failover
  // timeout. That aggregator holds the round's task (and maybe this site's
  // result); the lower attempt wins (design section 6), so an aggregate at
  // a+1 would be dropped with the handing trainer's result in it.
  // ALREADY_EXISTS: the trainer goes back to attempt a (FailBack).
  absl::Status DeclineTakeOver(const v1::ModelHeader& header) const;
  // A handoff of a round this site is past: sends the trainer the task of
  // the round this site holds, if it has it.
  void CatchUp(const v1::ModelHeader& stale);
  // A backup aggregator takes over the round it holds as a trainer.
  void TakeOver(const v1::ModelHeader& header);
  // Drops what this site did on a chain that lost (design section 6).
  void DropLosingChain(const v1::ModelHeader& winner);
  // Whether learn task `task` (scattered here) is of a chain that lost to
  // the one this site follows now.
  bool ScatterLost(const v1::ModelHeader& task) const;
  // Sets aside the round models this site kept (keep_round_models) whose
  // chain loses to `winner` over the rounds before `known` (design
  // section 6: no two sites disagree on what a round's model was).
  void SetAsideLostRounds(const Lineage& winner, uint32_t known);
  void AskToSubmit();
  void ScheduleAsk(absl::Duration wait);
  // The aggregator failed a call (or lacks the task): fail over or hand the
  // task over once the job's bounds say so, else ask again later.
  void OnAggregatorTrouble(const absl::Status& status);
  void FailOver(const std::string& reason);
  void HandOff();
  void OnHandoffDone(const Call& call, const event::CallDone& e);
  // The backup declined the handoff (DeclineTakeOver): back to the
  // aggregator of the attempt before, which holds the round.
  void FailBack(const std::string& reason);
  void AddChain(v1::SubmitPermissionRequest* ask) const;
  void OnPermissionReply(const Call& call, const event::CallDone& e);
  // The aggregator's answer to a request for a slot (not a probe): upload,
  // join a chain, ask again later, or give up.
  void OnSlotReply(Training& task, const v1::SubmitPermissionReply& reply);
  // The aggregator has this site's result (an accepted upload or partial
  // sum, or it says so when asked again): keep it until the round's
  // outcome, probing the aggregator meanwhile.
  void ResultIsIn(Training& task);
  void OnSubmitDone(const Call& call, const event::CallDone& e);
  // Chain reduction, trainer side (site_machine_chain.cc).
  void StartChain(const v1::SubmitPermissionReply& reply);
  // This site's entry in a partial sum's contributions.
  v1::Contribution OwnContribution(const Training& task) const;
  void OnChainSubmitDone(const Call& call, const event::CallDone& e);
  absl::StatusOr<ModelAdmission> AdmitPartialHop(const v1::ModelHeader& header);
  v1::Reply OnPartialPassedOn(const v1::ModelHeader& header,
                              const absl::Status& status);
  // The chain did not carry this site's result: ask for a slot of its own.
  void LeaveChain(const std::string& what, const absl::Status& why);
  // Chain reduction, aggregator side: whether `ask` waits for a chain.
  bool ChainAsk(const v1::SubmitPermissionRequest& ask,
                AggregationRound& target);
  // Answers the held requests of `round` that wait for a chain together
  // with one, once every idle trainer asks (or, with `now_or_never`, with
  // those that do).
  void MaybeLaunchChain(uint32_t round, bool now_or_never);

  // Aggregator role (site_machine_aggregator.cc).
  void OpenRound(const v1::ModelHeader& header,
                 std::shared_ptr<const Model> base);
  // Whether `sender`'s call for `asked_round`, on chain `lineage`, is on the
  // chain of `round` gathered here (then `sender` was heard from); the
  // REJECTED / RETRY reply otherwise.
  std::optional<v1::SubmitPermissionReply> CheckChain(
      uint32_t round, uint32_t asked_round, const std::string& sender,
      const google::protobuf::RepeatedPtrField<v1::RoundAttempt>& lineage);
  void DropSilentTrainers(uint32_t round);
  void OnRoundReport(uint32_t round, const RoundReport& report);
  AggregationRound* GatheringRound(uint32_t round);
  // The round `round` this site gathers, or null.
  RoundState* Gathered(uint32_t round);
  // Whether a model of `bytes` is held the lean way (JobConfig
  // lean_memory_min_model_bytes; never without a job folder).
  bool LeanFor(uint64_t bytes) const;
  // A fresh path in the job's folder for a model held as a file mapping.
  std::string LeanPath(absl::string_view what);
  // Remote results to `round` wait while this site, its aggregator and a
  // trainer, has not added its own (lean memory: its training's models and
  // another result are not held at once).
  bool OwnResultFirst(uint32_t round) const;
  // Every model this machine holds that is `old` becomes `mapped` (the same
  // values, held as a file mapping). A gathering round's base stays (its
  // aggregator's state is immutable).
  void ReplaceHeldModel(const Model* old, std::shared_ptr<const Model> mapped);
  absl::StatusOr<ModelAdmission> AdmitResult(const v1::ModelHeader& header,
                                             absl::Time now);
  // A result's body arrived: its answer now, or nullopt when it is being
  // added (the answer follows its kResultAdded).
  std::optional<v1::Reply> OnResult(
      RequestId request, const v1::ModelHeader& header,
      const absl::StatusOr<std::shared_ptr<const Model>>& model);
  // How the result of `header` ended in round `round`: the reply.
  v1::Reply EndResult(uint32_t round, const v1::ModelHeader& header,
                      const AggregationRound::ResultEnd& end);
  // The answer to `ask` now (a RETRY may be held and asked again).
  v1::SubmitPermissionReply DecidePermission(
      const v1::SubmitPermissionRequest& ask);
  // The answer to `ask` for a round this site does not gather.
  v1::SubmitPermissionReply NotGatheredHere(
      const v1::SubmitPermissionRequest& ask) const;
  void AnswerHeldRequests();
  void CloseRound(uint32_t round);

  // Finale (site_machine_finale.cc).
  void FinishJob(uint32_t last_round, std::shared_ptr<const Model> last,
                 v1::BestRecord best, const std::string& reason);
  // To `targets` (every site when empty).
  void BroadcastFinal(v1::ModelKind kind, std::shared_ptr<const Model> model,
                      uint32_t round, v1::BestRecord best, Broadcast then,
                      std::vector<std::string> targets = {});
  void OnFinalDone(const Call& call, const event::CallDone& e);
  // BEST to `targets`, after their LAST (from here, or via the holder).
  void SendBest(const Broadcast& done, std::vector<std::string> targets);
  void OnFinalGrace(uint64_t broadcast);
  void OnBestDeadline(uint32_t last_round);
  void AskNextHolder(uint64_t ask);
  void OnShareBestDone(const Call& call, const event::CallDone& e);
  v1::Reply AcceptFinal(const v1::ModelHeader& header,
                        std::shared_ptr<const Model> model);

  void GoOnAfter(uint32_t round, const Closing& closing,
                 std::shared_ptr<const Model> next);
  // Folds trainers' reports into run_->privacy_spent: per site, the report
  // with more rounds charged wins (then the higher epsilon).
  void NotePrivacy(
      const google::protobuf::Map<std::string, v1::PrivacySpent>& spent);
  // Whether a completion numbered `id` (a call, timer or persist) is of a
  // job before this one; counts it if so.
  bool Stale(uint64_t id, uint64_t first_of_run);

  const SiteMachineOptions options_;
  absl::Time now_ = absl::InfinitePast();
  Effects out_;
  bool status_dirty_ = false;
  bool permission_dirty_ = false;
  std::string learner_waiting_;  // Learner::WaitingFor, as last reported.
  uint64_t status_version_ = 0;
  std::deque<StateChange> state_changes_;  // The last kStateChangesKept.
  // Numbered across jobs, so that an old job's completion matches nothing.
  CallId next_call_ = 1;
  TimerId next_timer_ = 1;
  PersistId next_persist_ = 1;
  uint64_t next_run_ = 1;
  // Completions of a job that was gone when they came.
  uint64_t stale_completions_ = 0;
  std::unique_ptr<JobRun> run_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_SITE_MACHINE_H_
