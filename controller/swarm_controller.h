// The swarm workflow of one site (design sections 2 and 3): pure logic over
// small interfaces. It never opens a socket and never sleeps: network calls go
// through a PeerTransport, disk through a ModelStore, training through a
// Learner, and every wait is a task posted to a TaskRunner (now, or at a
// deadline). The same object runs in the site daemon (gRPC transport, thread
// pool) and in simulations (fake network, virtual time).
//
// Incoming calls (from the gRPC service or the fake network) are the public
// On*/Handle* methods; they do not block on other sites and are thread-safe.
#ifndef SWARM_CONTROLLER_SWARM_CONTROLLER_H_
#define SWARM_CONTROLLER_SWARM_CONTROLLER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/admission.h"
#include "controller/aggregation_round.h"
#include "controller/job_view.h"
#include "controller/model_store.h"
#include "controller/peer_transport.h"
#include "controller/retry_policy.h"
#include "controller/task_runner.h"
#include "gatherer/aggregator.h"
#include "gatherer/gatherer.h"
#include "learner/learner.h"
#include "model/model.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"

namespace swarm {

// How long, and while what holds, an outgoing call is retried.
struct CallRetryBudget {
  // Retry at least ControllerOptions::retry.attempts attempts, and
  // further until this time.
  absl::Time until = absl::InfinitePast();
  // Checked before each retry; when false, the call ends CANCELLED.
  std::function<bool()> still_wanted;
};

struct ControllerOptions {
  // This site's name (must be a site of the job it is configured with).
  std::string site;
  // How outgoing calls are retried (attempts, backoff).
  RetryPolicy retry;
  // Seed of the backoff jitter; 0 draws one from std::random_device.
  // Simulations set it so that a run replays exactly.
  uint64_t jitter_seed = 0;
  // Limits for incoming model streams (the job may lower max_model_bytes).
  AssemblerLimits limits;
};

// What an incoming model stream should be assembled into.
struct ModelAdmission {
  AssemblerOptions assembler;
  // Set for results: the aggregator's sink (validates while receiving).
  std::unique_ptr<TensorSink> sink;
  // No body to receive: a failed result (header.failed()), or a final model
  // this site already stored. The reply is OK with `reply_message`.
  bool header_only = false;
  std::string reply_message = "failure noted";
};

class SwarmController {
 public:
  // `transport`, `learner`, `store` and `runner` must outlive the controller,
  // and the runner must run no more tasks (and any server feeding it calls
  // must be shut down) before the controller is destroyed.
  SwarmController(ControllerOptions options, PeerTransport* transport,
                  Learner* learner, ModelStore* store, TaskRunner* runner);
  ~SwarmController();
  SwarmController(const SwarmController&) = delete;
  SwarmController& operator=(const SwarmController&) = delete;

  // --- Operator calls ---
  v1::Reply Configure(const v1::ConfigureRequest& request);
  v1::Reply Start(const v1::StartRequest& request);
  v1::Reply Abort(const v1::AbortRequest& request);
  v1::StatusReply Status() const;
  // Blocks until the status version differs from `known_version` or
  // `deadline` passes (for swarmctl status --watch); then returns Status().
  v1::StatusReply WaitForStatusChange(uint64_t known_version,
                                      absl::Time deadline) const;

  // --- Peer calls ---
  // Before a model stream's body is received: checks the header (job, sender
  // role, round, kind) and says how to assemble it. An error refuses the
  // stream (its message says why).
  absl::StatusOr<ModelAdmission> AdmitModel(const v1::ModelHeader& header);
  // After the body: `model` is the assembled model or why assembly failed.
  // Caller obligation: AdmitModel returned OK for this header.
  v1::Reply OnModel(const v1::ModelHeader& header, absl::StatusOr<Model> model);

  v1::SubmitPermissionReply RequestToSubmit(
      const v1::SubmitPermissionRequest& request);
  // Waits until a permission decision may have changed (a slot freed, a
  // round opened) or `deadline`; for long-polling RequestToSubmit.
  void WaitForPermissionChange(uint64_t known_version,
                               absl::Time deadline) const;
  uint64_t permission_version() const;

  // Non-blocking forms of the two waits above, for callback servers: `wake`
  // runs on the task runner once the permission (status) version differs
  // from `known_version`, and again at `deadline` (it may run twice: the
  // caller ignores the second call). No lock is held when it runs.
  void WhenPermissionChanges(uint64_t known_version, absl::Time deadline,
                             std::function<void()> wake);
  void WhenStatusChanges(uint64_t known_version, absl::Time deadline,
                         std::function<void()> wake);

  v1::Reply ShareBest(const v1::ShareBestRequest& request);

  // A model this site holds, for FetchModel.
  absl::StatusOr<std::shared_ptr<const Model>> ModelForFetch(
      const v1::FetchModelRequest& request) const;

  // The configured job, if any.
  std::optional<v1::JobConfig> job() const;

 private:
  // One round this site aggregates, and whether it is being finished (taken
  // out of the gathering rounds, its FinishRound posted).
  struct AggregatorRound {
    std::unique_ptr<AggregationRound> round;
    bool finishing = false;
  };
  // This site's training for one round, from the learn task to the
  // submission.
  struct TrainingTask {
    uint32_t round = 0;
    std::shared_ptr<const Model> global;
    std::string aggregator;
    std::atomic<bool> cancel{false};
    absl::Time asking_since;
    v1::ModelHeader result_header;
    std::shared_ptr<const Model> result;
  };

  static std::string FormatMetric(const v1::BestRecord& best);

  // Refuses a request naming another job (or none configured).
  absl::Status CheckJob(absl::string_view job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsTrainer(absl::string_view site) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const v1::SiteInfo* Site(absl::string_view name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Active() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetState(v1::SiteState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::SiteCounters Counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every round this site aggregates (abort, failure), keeping their
  // counts.
  void DropRounds() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportError(absl::string_view what, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::string_view what, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change that may turn a held permission request's answer (and the
  // status): wakes both kinds of waiters.
  void Bump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A status change only (wakes held Status calls).
  void StatusChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts every waiter to the runner and forgets them.
  void WakeAll(std::vector<std::function<void()>>& waiters)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts `wake` now if `version` moved past `known_version`; otherwise
  // keeps it in `waiters` and also posts it at `deadline`.
  void WakeOnChange(uint64_t version, uint64_t known_version,
                    std::vector<std::function<void()>>& waiters,
                    absl::Time deadline, std::function<void()> wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stamps a snapshot of the state file and posts its write (see
  // WritePendingState).
  void PersistState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the newest snapshot not yet written. REQUIRES: mu_ not held (it
  // fsyncs).
  void WritePendingState()
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_, pending_state_mu_);
  v1::ModelHeader BaseHeader(v1::ModelKind kind, uint32_t round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Calls `call` with backoff while it fails with a retryable status and
  // `budget` allows, then `done` with the last status. Runs on the runner.
  void CallWithRetry(std::string what, std::function<absl::Status()> call,
                     std::function<void(absl::Status)> done,
                     CallRetryBudget budget = {}, int attempt = 1);

  // Scatter (design step 1): sends round `round`'s learn task with `global`.
  void Scatter(uint32_t round, std::shared_ptr<const Model> global,
               v1::BestRecord best);
  // Sends `header`'s learn task to trainer `target` (this site: accepted
  // locally), with retries; then `answered(acknowledged)`.
  void SendLearnTaskToTrainer(const std::string& target,
                              const v1::ModelHeader& header,
                              std::shared_ptr<const Model> global,
                              std::function<void(bool)> answered);
  void SendLearnTaskToAggregator(uint32_t round, std::string aggregator,
                                 std::vector<std::string> backups,
                                 std::shared_ptr<const Model> global,
                                 v1::BestRecord best,
                                 std::vector<std::string> expected);
  // A learn task arrived (from a peer or queued locally).
  v1::Reply AcceptLearnTask(const v1::ModelHeader& header,
                            std::shared_ptr<const Model> model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunTraining(std::shared_ptr<TrainingTask> task);
  void AskToSubmit(std::shared_ptr<TrainingTask> task);
  // The aggregator answered `task`'s request with something other than a
  // grant (or could not be asked): ask again later, or give up.
  void OnPermissionRefused(
      std::shared_ptr<TrainingTask> task,
      const absl::StatusOr<v1::SubmitPermissionReply>& reply,
      uint64_t version_before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SubmitResult(std::shared_ptr<TrainingTask> task);

  // Aggregator side.
  void OpenRound(const v1::ModelHeader& header,
                 std::shared_ptr<const Model> base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acts on an aggregation round's report: arms its timer while it
  // gathers, posts FinishRound once it is done (once).
  void OnRoundReport(AggregatorRound& open, const RoundReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishRound(uint32_t round);
  // The gatherer that answers for `round`: that round's while it gathers,
  // else the latest open one (its rules handle late and early requests);
  // nullptr when none gathers.
  AggregatorRound* GatheringRound(uint32_t round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ModelAdmission> AdmitResult(const v1::ModelHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Reply OnResult(const v1::ModelHeader& header,
                     absl::StatusOr<std::shared_ptr<const Model>> model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // End of the job (design step 8).
  void FinishJob(uint32_t last_round, std::shared_ptr<const Model> last,
                 v1::BestRecord best);
  // Sends a final model to every site (this one locally); then `done`.
  void Broadcast(v1::ModelKind kind, std::shared_ptr<const Model> model,
                 uint32_t round, v1::BestRecord best,
                 std::function<void(absl::Status)> done);
  v1::Reply AcceptFinal(const v1::ModelHeader& header,
                        std::shared_ptr<const Model> model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ControllerOptions options_;
  PeerTransport* const transport_;
  Learner* const learner_;
  ModelStore* const store_;
  TaskRunner* const runner_;

  mutable absl::Mutex mu_;
  // The configured job (null before the first Configure).
  std::shared_ptr<const JobView> job_ ABSL_GUARDED_BY(mu_);
  // This site's own record of the job: state, the tasks it accepted, the best
  // record, the final models it stored (what Admission judges by).
  SiteRecord record_ ABSL_GUARDED_BY(mu_);
  // The global model this site scored best as an aggregator (it is the
  // holder of record_.best when record_.best.site() is this site).
  std::shared_ptr<const Model> best_model_ ABSL_GUARDED_BY(mu_);
  uint32_t best_model_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, std::unique_ptr<AggregatorRound>> rounds_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<TrainingTask> training_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Model> current_global_ ABSL_GUARDED_BY(mu_);
  std::map<v1::ModelKind, std::shared_ptr<const Model>> finals_
      ABSL_GUARDED_BY(mu_);
  // This site's own counters (rounds trained, rounds completed); the
  // submission counters come from the aggregation rounds: the closed ones
  // summed here, the open ones asked (Counters()).
  v1::SiteCounters counters_ ABSL_GUARDED_BY(mu_);
  RoundCounters closed_rounds_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> metrics_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_error_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t status_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t permission_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Local submission requests waiting for the next change (Bump).
  std::vector<std::function<void()>> permission_waiters_ ABSL_GUARDED_BY(mu_);
  // Held Status calls waiting for the next status change.
  std::vector<std::function<void()>> status_waiters_ ABSL_GUARDED_BY(mu_);

  // The state file's writes, outside mu_ (WritePendingState). Lock order:
  // write_mu_, then mu_, then pending_state_mu_.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(pending_state_mu_, mu_);
  absl::Mutex pending_state_mu_;
  std::optional<v1::JobState> pending_state_ ABSL_GUARDED_BY(pending_state_mu_);

  absl::Mutex jitter_mu_;
  std::minstd_rand jitter_ ABSL_GUARDED_BY(jitter_mu_);
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_SWARM_CONTROLLER_H_
