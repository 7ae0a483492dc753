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
// a job here in job_run.h. The site's parts are roles that own their state
// (trainer_role.h, scatter_role.h, aggregator_role.h, finale_role.h) and
// reach the site only through SiteContext (site_context.h), which
// SiteMachine implements: it routes each event, call completion and timer
// to the role that owns it, and composes their effects.
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
#include "controller/site_context.h"
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

class SiteMachine : private site::SiteContext {
 public:
  explicit SiteMachine(SiteMachineOptions options);
  SiteMachine(const SiteMachine&) = delete;
  SiteMachine& operator=(const SiteMachine&) = delete;
  ~SiteMachine() override;

  Effects Step(Event event, absl::Time now);

  // --- Queries (no state change) ---
  const std::string& self() const override { return options_.site; }
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
  size_t held_requests() const { return run_->work.aggregator.held_requests(); }

 private:
  using JobRun = site::JobRun;
  using Work = site::Work;
  using Call = site::Call;
  using Timer = site::Timer;
  using PendingStart = site::PendingStart;
  using PendingFinal = site::PendingFinal;
  using Scatter = site::Scatter;
  // This machine as its roles see it.
  site::SiteContext* context() { return this; }

  // --- SiteContext: what the roles use of the site (site_machine.cc) ---
  absl::Time now() const override { return now_; }
  JobRun& run() const override { return *run_; }
  bool Active() const override;
  bool IsTrainer(absl::string_view site) const override;
  void Emit(Effect effect) override { out_.push_back(std::move(effect)); }
  CallId Send(const std::string& to, PeerMessage message, Call call, bool retry,
              absl::Time retry_until) override;
  TimerId SetTimer(absl::Time when, Timer timer) override;
  void Reply(RequestId request, v1::Reply reply) override;
  PersistId NextPersist() override { return next_persist_++; }
  PersistId PersistState(bool notify = false) override;
  PersistId PersistClearOffloadAndState(bool notify = false) override;
  void ReportError(absl::string_view what, const absl::Status& status) override;
  void Fail(absl::string_view what, const absl::Status& status) override;
  v1::Reply FailAndAbort(const std::string& what,
                         const absl::Status& status) override;
  void SetState(v1::SiteState state) override;
  void SetIdleOrGathering() override;
  void Changed() override { status_dirty_ = true; }
  void PermissionMayChange() override {
    status_dirty_ = true;
    permission_dirty_ = true;
  }
  v1::ModelHeader BaseHeader(v1::ModelKind kind, uint32_t round) const override;
  AssemblerOptions AssemblerFor(v1::ModelKind kind) const override;
  bool LeanFor(uint64_t bytes) const override;
  std::string LeanPath(absl::string_view what) override;
  void ReplaceHeldModel(const Model* old,
                        std::shared_ptr<const Model> mapped) override;
  void NotePrivacy(const google::protobuf::Map<std::string, v1::PrivacySpent>&
                       spent) override;
  void NoteFailover(uint32_t round, const std::string& from,
                    const std::string& to, const std::string& reason) override;
  void SetAsideLostRounds(const Lineage& winner, uint32_t known) override;
  void KeepBestCopy(const v1::BestRecord& best) override;
  // Answers the pending start of `round` (if any): OK with the sites
  // `scatter` missed, or why the start failed (`failure` not OK).
  void AnswerStart(uint32_t round, const site::Scatter* scatter,
                   const absl::Status& failure = absl::OkStatus()) override;
  // Requests of one role to another, routed to the role that owns it.
  void ScatterRound(uint32_t round, std::shared_ptr<const Model> global,
                    v1::BestRecord best, const Lineage& lineage,
                    bool resume = false) override;
  void FinishJob(uint32_t last_round, std::shared_ptr<const Model> last,
                 v1::BestRecord best, const std::string& reason) override;
  void OpenRound(const v1::ModelHeader& header,
                 std::shared_ptr<const Model> base) override;
  void Heard(uint32_t round, const std::string& trainer,
             absl::Time when) override;
  bool Gathers(uint32_t round) const override;
  uint64_t DropLosingWork() override;
  bool OwnResultFirst(uint32_t round) const override;
  void EndTrainingAtLast(uint32_t round) override;

  // --- Step: one function per kind of input, routed to its role ---
  void OnConfigure(event::Configure& e);
  void OnStart(event::Start& e);
  void OnAbort(event::Abort& e);
  void OnModelHeader(event::ModelHeader& e);
  void OnModelBody(event::ModelBody& e);
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
  void ResetForJob(v1::JobConfig job, std::string offload_dir);
  // The round status shows: the last task's, else the job's first.
  uint32_t StatusRound() const;
  // Journals the state and round if either changed since the last entry.
  void JournalStateChange();
  void EndActivity();  // Everything under way ends (Work is replaced).
  // A trainer's deadline for its first learn task (start_timeout_ms).
  void ArmStartDeadline();
  v1::SiteCounters Counters() const;
  // Whether a completion numbered `id` (a call, timer or persist) is of a
  // job before this one; counts it if so.
  bool Stale(uint64_t id, uint64_t first_of_run);
  // Whether a completion of job run `job_run` (0: not said) is of a job
  // before this one; counts it if so.
  bool StaleRun(uint64_t job_run);

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
