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
#ifndef SWARM_CONTROLLER_SITE_MACHINE_H_
#define SWARM_CONTROLLER_SITE_MACHINE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/admission.h"
#include "controller/aggregation_round.h"
#include "controller/job_view.h"
#include "controller/lineage.h"
#include "controller/peer_message.h"
#include "controller/relay_protocol.h"
#include "controller/state_change.h"
#include "learner/learner.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"

namespace swarm {

using RequestId = uint64_t;  // An incoming call, numbered by the caller.
using CallId = uint64_t;     // An outgoing call, numbered by the machine.
using TimerId = uint64_t;
using PersistId = uint64_t;

// What an incoming model stream should be assembled into.
struct ModelAdmission {
  AssemblerOptions assembler;
  // Set for results: the aggregator's sink (validates while receiving).
  std::unique_ptr<TensorSink> sink;
  // No body to receive: a failed result (header.failed()), or a final model
  // this site already stored. The reply is OK with `reply_message`.
  bool header_only = false;
  std::string reply_message = "failure noted";
  // Set for a partial sum passing through this site (chain reduction): the
  // body goes through a PartialSumSink that adds `own` weighted by
  // `own_weight` to every chunk, and the output is streamed to `next` with
  // header `onward` as it comes. The body event's model is then OK (empty)
  // when `next` accepted the onward stream, else why not.
  struct ChainHop {
    std::shared_ptr<const Model> own;
    double own_weight = 0;
    v1::ModelHeader onward;
    std::string next;
  };
  std::optional<ChainHop> chain_hop;
  // The relay protocol's budgets for this stream (controller/
  // relay_protocol.h), decided here: how long the sender of a partial sum
  // may stay silent, and how long the next hop (relay_to[0], or
  // chain_hop->next) may take no frame before it is given up.
  RelayBudgets relay;
};

// ---------------------------------------------------------------------------
// Events

namespace event {
// The operator's configure. REQUIRES: SiteMachine::CheckConfigure passed,
// the learner took the job's parameters and the job config is stored.
struct Configure {
  RequestId request = 0;
  v1::JobConfig job;  // With defaults applied, validated.
  std::string offload_dir;
};
struct Start {
  RequestId request = 0;
  v1::StartRequest start;
};
struct Abort {
  RequestId request = 0;
  v1::AbortRequest abort;
};
// A model stream's header arrived: the reply is a ModelAdmission or why not.
struct ModelHeader {
  RequestId request = 0;
  v1::ModelHeader header;
};
// The body of a stream whose header was admitted (and not header-only):
// the model, or why assembly failed. Made by MakeModelBody.
struct ModelBody {
  RequestId request = 0;
  v1::ModelHeader header;
  absl::StatusOr<std::shared_ptr<const Model>> model;
  // A BEST model's ModelContentDigest (empty for other kinds or no model):
  // a BEST from a site that is neither its scorer nor the final aggregator
  // is taken only if this matches the best record's digest.
  std::string content_digest;
};
// REQUIRES: called outside the machine's lock: for a BEST model it reads
// the whole model to fill `content_digest`.
ModelBody MakeModelBody(RequestId request, v1::ModelHeader header,
                        absl::StatusOr<std::shared_ptr<const Model>> model);
// A trainer asks to submit; a RETRY answer may be held until `hold_until`
// (granted the moment a slot frees or the round opens).
struct PermissionAsked {
  RequestId request = 0;
  v1::SubmitPermissionRequest ask;
  absl::Time hold_until = absl::InfinitePast();
};
// The caller of a held request went away.
struct RequestCancelled {
  RequestId request = 0;
};
struct ShareBest {
  RequestId request = 0;
  v1::ShareBestRequest share;
};
// An outgoing call ended (after the caller's retries). `maybe_delivered`:
// an earlier attempt failed in a way that may have reached the peer.
struct CallDone {
  CallId call = 0;
  absl::StatusOr<PeerReply> reply;
  bool maybe_delivered = false;
};
struct TimerFired {
  TimerId timer = 0;
};
// The learner finished a StartTraining: the validation metrics of the
// incoming model, and the trained result (already a weight difference when
// the effect asked for one and it could be made).
struct TrainingDone {
  uint32_t round = 0;
  absl::StatusOr<Metrics> metrics;
  absl::StatusOr<TrainOutput> output;
  // StartTraining.job_run, copied (0: not checked, for step tests).
  uint64_t job_run = 0;
};
struct InitialModel {
  absl::StatusOr<std::shared_ptr<const Model>> model;
};
struct AggregationDone {
  uint32_t round = 0;
  absl::StatusOr<std::shared_ptr<const Model>> model;
  // RunAggregation.digest_base: the base model's ModelContentDigest.
  std::string base_digest;
  uint64_t job_run = 0;  // RunAggregation.job_run, copied.
};
// An AddResult's job ran: the result is in the aggregate, or why not.
struct ResultAdded {
  RequestId request = 0;
  uint32_t round = 0;
  v1::ModelHeader header;
  absl::Status added;
  uint64_t job_run = 0;  // AddResult.job_run, copied.
};
// A Persist ended. Reported for every Persist with `notify`, and for every
// one that failed (`what` names the file).
struct PersistDone {
  PersistId persist = 0;
  absl::Status status;
  std::string what;
  // Persist.map_back: the written model, mapped from its file (null when
  // that failed: the model stays in memory).
  std::shared_ptr<const Model> mapped;
};
// The daemon restarted: the job this site was in, reloaded from its
// workspace (the accepted config, the state file, the persisted global
// model if any). REQUIRES: the learner took the job's parameters.
struct Recover {
  v1::JobConfig job;
  v1::JobState state;
  std::shared_ptr<const Model> global;  // Of state.global_round(), or null.
  // The best model's copy when this site holds it (state.best()), or null.
  std::shared_ptr<const Model> best_model;
  std::string offload_dir;
};
// What the learner waits for changed (Learner::WaitingFor; "" for nothing):
// shown in status as `waiting_for`.
struct LearnerWaiting {
  std::string what;
};
}  // namespace event

using Event =
    std::variant<event::Configure, event::Start, event::Abort,
                 event::ModelHeader, event::ModelBody, event::PermissionAsked,
                 event::RequestCancelled, event::ShareBest, event::CallDone,
                 event::TimerFired, event::TrainingDone, event::InitialModel,
                 event::AggregationDone, event::ResultAdded, event::PersistDone,
                 event::LearnerWaiting, event::Recover>;

// ---------------------------------------------------------------------------
// Effects

namespace effect {
// Send `message` to `to`. Retry retryable failures (transport errors,
// deadlines) per the retry policy while `retry` and the machine still
// wants the call (SiteMachine::WantsCall), at least until `retry_until`.
struct Send {
  CallId call = 0;
  v1::SiteInfo to;
  PeerMessage message;
  bool retry = true;
  absl::Time retry_until = absl::InfinitePast();
};
// The answer to incoming call `request`.
struct Reply {
  RequestId request = 0;
  std::variant<v1::Reply, v1::SubmitPermissionReply,
               absl::StatusOr<ModelAdmission>>
      answer;
};
// Validate `global` and train on it for `round`; report kTrainingDone.
struct StartTraining {
  uint32_t round = 0;
  std::shared_ptr<const Model> global;
  // Return a weight difference against `global` when the learner gives
  // full weights.
  bool weight_diff = false;
  // The job run that asked (copy it into kTrainingDone): a training of a
  // job that is gone is dropped when it ends.
  uint64_t job_run = 0;
};
// Stop the training under way (its kTrainingDone may then never come).
struct CancelTraining {};
// The job's first model; report kInitialModel. From the learner's initial
// weights, or, with `kept_round` (a job whose start_round is above 0), the
// global model of that round this site kept (keep_round_models) in an
// earlier run of the job: a start_round without its model is refused.
struct LoadInitialModel {
  std::optional<uint32_t> kept_round;
  // Set: a model of lean_min_bytes or more is written to lean_path, mapped
  // and unlinked, so that it is held as a file mapping, not memory.
  std::string lean_path;
  uint64_t lean_min_bytes = 0;
};
// Aggregate the closed round (costly: outside any lock); report
// kAggregationDone.
struct RunAggregation {
  uint32_t round = 0;
  std::shared_ptr<AggregationRound> closed;
  // The base is the new best: digest it too (before aggregating, so that
  // no result is held while the base is read; outside the step, since it
  // reads a whole model).
  bool digest_base = false;
  uint64_t job_run = 0;  // Copied into kAggregationDone.
};
// Fold a received result into its round's aggregate (a pass over the
// model: outside any lock, on the worker that runs RunAggregation, in the
// order given); report kResultAdded with `job`'s status. The answer to
// `request` waits for it.
struct AddResult {
  RequestId request = 0;
  uint32_t round = 0;
  v1::ModelHeader header;
  AggregationRound::AddJob job;
  uint64_t job_run = 0;
};
// Let `held` go on the aggregation worker, after the work queued before it:
// a dropped round's aggregator removes its offload files as it goes, which
// is I/O the step must not do.
struct Release {
  std::shared_ptr<void> held;
};
struct SetTimer {
  TimerId timer = 0;
  absl::Time when;
};
// Write to the site's store, in the order given. With `notify`, and on
// failure, report kPersistDone.
struct Persist {
  // kBestModel: the global model of `round` this site scored best, kept as
  // held-best.safetensors so that a restart does not lose it.
  // kSetAsideRound: the kept model of `round` (keep_round_models) is of a
  // chain that lost; it is renamed with `tag`, so that no two sites
  // disagree on what round `round`'s model was.
  enum class What {
    kState,
    kGlobal,
    kFinal,
    kClearOffload,
    kBestModel,
    kSetAsideRound
  };
  What what = What::kState;
  PersistId persist = 0;
  bool notify = false;
  std::string job_id;
  v1::JobState state;  // kState.
  uint32_t round = 0;  // kGlobal: the round the model is the input of.
  bool keep_round = false;
  // kGlobal (lean memory): map the written file back and report it in
  // kPersistDone, so that the site holds the model as a file mapping.
  bool map_back = false;
  v1::ModelKind kind = v1::MODEL_KIND_UNSPECIFIED;  // kFinal.
  std::shared_ptr<const Model> model;
  std::map<std::string, std::string> metadata;
  std::string tag;  // kSetAsideRound.
};
// A job was configured: the transport may connect ahead.
struct PrepareTransport {
  v1::JobConfig job;
};
// What Status() shows changed (wake held Status calls).
struct StatusChanged {};
}  // namespace effect

// The work of a RunAggregation, for its carrier (outside any lock): the
// base's digest if asked, then the aggregate.
event::AggregationDone RunAggregationWork(const effect::RunAggregation& run);

using Effect = std::variant<effect::Send, effect::Reply, effect::StartTraining,
                            effect::CancelTraining, effect::LoadInitialModel,
                            effect::RunAggregation, effect::AddResult,
                            effect::Release, effect::SetTimer, effect::Persist,
                            effect::PrepareTransport, effect::StatusChanged>;
using Effects = std::vector<Effect>;

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
  // What an outgoing call is for.
  struct Call {
    enum class Purpose {
      kTaskToTrainer,
      kTaskToAggregator,
      kAskPermission,
      kSubmit,
      kFinal,
      kShareBest,
      kHandoff,  // A trainer hands its round to an aggregator (failover).
      // The newer round's task to a trainer that handed over a round this
      // site is past (its scatter was lost with its aggregator).
      kCatchUp,
      // Chain reduction: the chain's first trainer streams its result to
      // the second (the answer comes once the aggregator took the sum).
      kChainSubmit,
    };
    Purpose purpose = Purpose::kTaskToTrainer;
    std::string target;
    uint32_t round = 0;
    uint64_t broadcast = 0;  // kFinal: which broadcast.
    bool probe = false;      // kAskPermission: a liveness probe.
    // kTaskToTrainer sent as a broadcast: the sites the stream goes along,
    // `target` first.
    std::vector<std::string> chain;
  };
  // What a timer is for.
  struct Timer {
    enum class Purpose {
      kRoundDeadline,
      kHeldPermission,
      kAskAgain,
      // Drop the expected trainers not heard from for two failover
      // timeouts (down, frozen, or silent after a handoff); look again.
      kComeForward,
      // A scatter's first acknowledgement came a failover timeout ago: go
      // on without the trainers still silent.
      kScatterGrace,
      // A LAST broadcast's first acknowledgement came a failover timeout
      // ago: BEST goes to the sites that acknowledged, the rest follow.
      kFinalGrace,
      // A trainer configured start_timeout ago that never got a learn task
      // leaves the job (the start never came).
      kStartDeadline,
      // LAST came final_result_ack_timeout ago and BEST never followed.
      kBestDeadline,
    };
    Purpose purpose = Purpose::kRoundDeadline;
    uint32_t round = 0;
    RequestId request = 0;
    uint64_t training = 0;
    uint64_t broadcast = 0;
  };
  // A scatter waiting for the trainers' acknowledgements.
  struct Scatter {
    v1::ModelHeader header;  // The trainers' learn task.
    std::shared_ptr<const Model> global;
    std::set<std::string> waiting;
    std::vector<std::string> acked;
    // Trainers the task did not reach, and why.
    std::map<std::string, std::string> missed;
    // The grace timer for the trainers still silent is set.
    bool grace_set = false;
    // Broadcast: the aggregator kept the chain's copy (its task goes
    // without a body).
    bool aggregator_holds_copy = false;
  };
  // The operator's Start (or resume), answered once the first round's
  // aggregator acknowledged its learn task (or the start failed): the
  // reply lists the trainers the round's task did not reach.
  struct PendingStart {
    RequestId request = 0;
    uint32_t round = 0;
  };
  // A round this site gathers: its attempt and chain, and when each trainer
  // was last heard from (a probe, a request, a result; InfiniteFuture while
  // it holds a slot). Trainers probe their aggregator every half failover
  // timeout, so one silent for two failover timeouts is down or frozen.
  struct Gathering {
    uint32_t attempt = 0;
    Lineage lineage;
    bool handoff = false;
    absl::Time opened;
    std::map<std::string, absl::Time> heard;
    // Chain reduction: trainers put into a chain whose partial sum has not
    // come yet (they are not asked to join another).
    std::set<std::string> chained;
    // The round is over but results are still being added: it closes once
    // the last add ends (CloseRound).
    bool close_when_added = false;
    // Trainers that reported they stopped training for the job for good
    // (their privacy budget spent: ModelHeader.trainer_stopped).
    std::set<std::string> stopped;
  };
  void Heard(uint32_t round, const std::string& trainer, absl::Time when);
  // This site's training for one round, from the learn task to submission.
  // It is kept after submission until the round's outcome arrives (the next
  // learn task, the final models): the result is resubmitted to a backup if
  // the aggregator dies (design section 6).
  struct Training {
    uint64_t id = 0;
    uint32_t round = 0;
    std::shared_ptr<const Model> global;
    v1::ModelHeader task;  // The learn task (attempt, chain, best record).
    std::string aggregator;
    uint32_t attempt = 0;
    bool trained = false;
    bool submitted = false;  // Kept; the aggregator is probed.
    absl::Time asking_since;
    v1::ModelHeader result_header;
    std::shared_ptr<const Model> result;
    // The aggregator's trouble: failed calls in a row and since when, and
    // since when it has answered that it lacks the round's task.
    int failures = 0;
    absl::Time failing_since = absl::InfiniteFuture();
    absl::Time lacking_since = absl::InfiniteFuture();
    bool handing_off = false;
    // When the aggregator (at `attempt`) last answered that it holds the
    // round: a probe or a permission request answered, the result taken.
    // A handoff of the round to this site at the next attempt is declined
    // while that is recent (DeclineTakeOver).
    absl::Time confirmed = absl::InfinitePast();
    TimerId ask_timer = 0;  // The one kAskAgain timer that counts.
    // Chain reduction (JobConfig.reduce_results_in_chain): this site's part
    // in a chain. kHead: it streams its result to the next trainer;
    // kMember: a partial sum is to pass through it until `chain_until`;
    // kContributing: one is passing through now.
    enum class InChain { kNo, kHead, kMember, kContributing };
    InChain chain = InChain::kNo;
    absl::Time chain_until = absl::InfiniteFuture();
    // Asks for an ordinary slot (a chain did not carry its result).
    bool direct = false;
    bool uploading = false;  // A direct upload is under way.
  };
  struct Held {
    v1::SubmitPermissionRequest ask;
    absl::Time until;
  };
  // A final-model broadcast: LAST, then BEST (or asking its holder).
  // Each target's call retries for final_result_ack_timeout (a site back
  // from a restart then gets it). BEST follows LAST per site: to the sites
  // that acknowledged LAST once all did or a failover timeout after the
  // first, and to each later one as it acknowledges.
  struct Broadcast {
    v1::ModelKind kind = v1::MODEL_KIND_UNSPECIFIED;
    std::set<std::string> pending;
    std::set<std::string> acked;
    bool advanced = false;  // BEST went out to the acknowledged ones.
    absl::Status first_error;
    // After LAST: what to do for BEST.
    bool then_best = false;
    std::shared_ptr<const Model> best_model;
    v1::BestRecord best;
    uint32_t last_round = 0;
  };

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
  void SendTaskToTrainer(const Scatter& scatter, const std::string& target);
  void OnTaskToAggregatorDone(const Call& call, const event::CallDone& e);
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
  // The aggregator has this site's result (an accepted upload or partial
  // sum, or it says so when asked again): keep it until the round's
  // outcome, probing the aggregator meanwhile.
  void ResultIsIn(Training& task);
  void OnSubmitDone(const Call& call, const event::CallDone& e);
  // Whether this site's asks are liveness probes (training, submitted, or
  // its result is with a reduction chain).
  bool Probing(const Training& task) const;
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

  // Rounds closed and being aggregated, with their verdict.
  struct Closing {
    v1::BestRecord best;
    std::optional<double> input_score;
    uint32_t attempt = 0;
    Lineage lineage;
    std::string stop_reason;  // Set: finish after this round (early stop).
  };
  // Scatters the next round of `round`'s aggregate, or finishes the job.
  void GoOnAfter(uint32_t round, const Closing& closing,
                 std::shared_ptr<const Model> next);
  // The round's model as a broadcast brought it to this site, the round's
  // aggregator, kept for its own task (header.body_held).
  struct HeldTaskCopy {
    v1::ModelHeader header;
    std::shared_ptr<const Model> model;
  };
  // Asking holders in turn to share BEST (SendBest).
  struct BestAsk {
    v1::ShareBestRequest request;
    std::vector<std::string> holders;
    size_t next = 0;
    absl::Status first_error;
  };
  // Writes with map_back: a lean aggregate waiting for its write and
  // mapping before it goes on (ScatterRound or FinishJob), so that whatever
  // would hold the model in memory beside its file (the next round's base,
  // the sends, this site's own training) holds the mapping instead.
  struct AfterGlobal {
    uint32_t round = 0;
    Closing closing;
    std::shared_ptr<const Model> model;  // The aggregate in memory.
  };
  // Final models being written, and the requests waiting for them.
  struct PendingFinal {
    RequestId request = 0;
    v1::ModelHeader header;
    std::shared_ptr<const Model> model;
  };

  // What is under way in a job at this site: every call, timer, round,
  // training and broadcast in flight. Created with the job, replaced whole
  // when the job ends here (EndActivity): a completion of something it no
  // longer holds finds nothing and is dropped.
  struct Work {
    std::optional<Training> training;
    // The rounds this site gathers.
    std::map<uint32_t, std::unique_ptr<AggregationRound>> rounds;
    // When each gathering round's deadline timer is armed for.
    std::map<uint32_t, absl::Time> armed;
    std::map<uint32_t, Gathering> gathering;
    std::map<uint32_t, Closing> aggregating;
    std::map<CallId, Call> calls;
    std::map<TimerId, Timer> timers;
    std::map<uint32_t, Scatter> scatters;
    // Learn tasks to aggregators not yet acknowledged (kept for a failover
    // to the round's next backup).
    std::map<uint32_t, Scatter> aggregator_tasks;
    std::optional<PendingStart> pending_start;
    std::map<uint64_t, BestAsk> best_asks;
    std::map<RequestId, Held> held;
    std::map<uint64_t, Broadcast> broadcasts;
    std::map<PersistId, AfterGlobal> after_global;
    std::optional<HeldTaskCopy> held_task_copy;
  };

  // Everything of one job at this site (design section 9): created at
  // configure (or recovery), destroyed whole when the next job replaces it.
  // No field is reset one by one. What status shows of an ended job stays
  // until then; what was under way (`work`) goes when the job ends here.
  struct JobRun {
    uint64_t id = 0;                     // Numbered by the machine, from 1.
    std::shared_ptr<const JobView> job;  // Null: no job yet.
    std::string offload_dir;
    // The first ids this run numbered: a completion with a lower id is of
    // an earlier job (dropped and counted in stale_completions).
    CallId first_call = 0;
    TimerId first_timer = 0;
    PersistId first_persist = 0;
    uint64_t next_lean_file = 1;
    uint64_t next_training = 1;
    uint64_t next_broadcast = 1;
    uint64_t next_best_ask = 1;
    SiteRecord record;
    // The best model when this site holds it: scored best here as an
    // aggregator (record.best.site() is this site), or the input of the
    // round it trained on that scored best (KeepBestCopy).
    std::shared_ptr<const Model> best_model;
    uint32_t best_model_round = 0;
    std::shared_ptr<const Model> current_global;
    uint32_t current_global_round = 0;  // The round it is the input of.
    // The learn task of that round as this site accepted it (for CatchUp).
    std::optional<v1::ModelHeader> current_task;
    std::map<v1::ModelKind, std::shared_ptr<const Model>> finals;
    v1::SiteCounters counters;
    RoundCounters closed_rounds;
    std::map<std::string, double> metrics;
    std::string last_error;
    absl::Time last_error_time = absl::InfinitePast();
    std::deque<v1::Failover> failovers;
    std::string end_reason;
    // The final round and attempt of the finals this site sends or
    // received, and their chain (including the final round).
    uint32_t final_round = 0;
    uint32_t final_attempt = 0;
    Lineage final_chain;
    // The global model in the store (global.safetensors): its round and
    // chain.
    int64_t persisted_global_round = -1;
    Lineage persisted_global_lineage;
    // The same once on disk (the state file naming it written): what status
    // shows as global_round. The state writes that will make it so.
    int64_t durable_global_round = -1;
    std::map<PersistId, int64_t> durable_writes;
    bool reloaded = false;  // This daemon reloaded its job on start.
    // The round models this site kept (keep_round_models), by the round
    // they are the input of, with their chain.
    std::map<uint32_t, Lineage> kept_rounds;
    std::map<PersistId, PendingFinal> pending_finals;
    // Differential privacy: every trainer's spend as this site last heard
    // of it (results it gathered, learn tasks and finals it received), the
    // latest report per site; carried on in the learn tasks it scatters and
    // into the final models (ModelHeader.privacy_spent).
    std::map<std::string, v1::PrivacySpent> privacy_spent;
    Work work;
  };
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
