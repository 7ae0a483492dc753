// SiteDriver: runs one site's SiteMachine (design section 2). It owns the
// lock, the model store, the learner and the task runner: it feeds every
// input into SiteMachine::Step under the lock and carries the effects out
// outside it: sends through the transport (retrying with backoff and seeded
// jitter), answers the incoming calls, runs training, aggregation and the
// learner's initial model on the runner, arms timers, and writes files in
// order on one writer (no fsync under the lock). A message to the site
// itself goes back into Step (one loopback path), never through a server.
//
// The same driver runs in the site daemon (gRPC transport, thread pool) and
// in simulations (fake network, virtual time). Thread-safe.
#ifndef SWARM_CONTROLLER_SITE_DRIVER_H_
#define SWARM_CONTROLLER_SITE_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/model_store.h"
#include "controller/peer_transport.h"
#include "controller/retry_policy.h"
#include "controller/site_machine.h"
#include "controller/task_runner.h"
#include "learner/learner.h"
#include "model/model.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"

namespace swarm {

struct DriverOptions {
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

class SiteDriver {
 public:
  using ReplyDone = std::function<void(v1::Reply)>;
  using PermissionDone = std::function<void(v1::SubmitPermissionReply)>;

  // `transport`, `learner`, `store` and `runner` must outlive the driver.
  // Before destroying it: stop the servers feeding it calls, shut the
  // transport down (no `done` may run later) and stop the runner.
  SiteDriver(DriverOptions options, PeerTransport* transport, Learner* learner,
             ModelStore* store, TaskRunner* runner);
  ~SiteDriver();
  SiteDriver(const SiteDriver&) = delete;
  SiteDriver& operator=(const SiteDriver&) = delete;

  // On start, before the first call: reloads the job this site was in from
  // its store, if one was started and has not ended (design section 6), so
  // the site rejoins at the next learn task or a resume. Returns the job's
  // id, "" when there was none. REQUIRES: no job configured yet.
  absl::StatusOr<std::string> RecoverJob();

  // On shutdown, before the runner stops (which drops the tasks it has not
  // run, among them a queued drainer of writes): waits until every write
  // the machine asked for so far is in the store, or `deadline` passes.
  // Returns how many writes were still queued then (0: all written). A
  // finished job's DONE state is such a write: without the wait, a restart
  // right after the job ended reloaded it as interrupted.
  size_t FinishWrites(absl::Time deadline) ABSL_LOCKS_EXCLUDED(write_mu_);

  // --- Operator calls (answered at once, but Start) ---
  v1::Reply Configure(const v1::ConfigureRequest& request);
  // Start (or resume) answers once the first round's aggregator has its
  // learn task, listing the trainers the task did not reach; the machine
  // bounds that wait (the scatter's retries and failover timeout), and
  // `deadline` (the call's) bounds it here. It parks the calling thread:
  // an operator call, rare and one at a time.
  v1::Reply Start(const v1::StartRequest& request, absl::Time deadline);
  // The same without waiting: `done` gets the answer when it comes (from
  // whichever thread steps the machine then).
  void Start(const v1::StartRequest& request,
             std::function<void(v1::Reply)> done);
  v1::Reply Abort(const v1::AbortRequest& request);
  v1::StatusReply Status() const;
  // Blocks until the status version differs from `known_version` or
  // `deadline` passes; then returns Status(). With `changes`, also the
  // machine's journaled changes of state or round after the one numbered
  // `after_change` (SiteMachine::StateChangesAfter), read under the same
  // lock as the status.
  v1::StatusReply WaitForStatusChange(
      uint64_t known_version, absl::Time deadline, uint64_t after_change = 0,
      std::vector<StateChange>* changes = nullptr) const;
  // Non-blocking form: `wake` runs on the runner once the status version
  // differs from `known_version`, and again at `deadline` (it may run twice:
  // the caller ignores the second call). No lock is held when it runs.
  void WhenStatusChanges(uint64_t known_version, absl::Time deadline,
                         std::function<void()> wake);

  // --- Peer calls ---
  // A model stream's header: how to assemble its body, or why not (the
  // stream is refused with that status).
  absl::StatusOr<ModelAdmission> AdmitModel(const v1::ModelHeader& header);
  // The body of a stream AdmitModel admitted (and not header-only): `done`
  // gets the reply, now or once the site has written what it must.
  void OnModel(const v1::ModelHeader& header, absl::StatusOr<Model> model,
               ReplyDone done);
  // A permission request; a RETRY answer is held until a slot frees, the
  // round opens, or `hold_until`. Returns a handle for CancelRequest.
  RequestId RequestToSubmit(const v1::SubmitPermissionRequest& request,
                            absl::Time hold_until, PermissionDone done);
  // The caller of a held request went away (its `done` may still run).
  void CancelRequest(RequestId request);
  v1::Reply ShareBest(const v1::ShareBestRequest& request);
  // A model this site holds, for FetchModel.
  absl::StatusOr<std::shared_ptr<const Model>> ModelForFetch(
      const v1::FetchModelRequest& request) const;

  // The configured job, if any.
  std::optional<v1::JobConfig> job() const;
  const std::string& site() const { return options_.site; }

 private:
  using Answer = std::function<void(effect::Reply&)>;

  // Steps `event` with `answer` registered for its request id (if any);
  // carries the effects out. REQUIRES: mu_ not held.
  void Feed(Event event, RequestId request = 0, Answer answer = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  RequestId NewRequest() ABSL_LOCKS_EXCLUDED(mu_);
  // A synchronous operator call: the machine answers it in the same step.
  v1::Reply Ask(Event event, RequestId request);
  // An operator call the machine answers in this step or a later one:
  // `done` gets the answer from whichever thread steps the machine then.
  void AskLater(Event event, RequestId request,
                std::function<void(v1::Reply)> done) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, waiting for the answer until `deadline` (then RETRY, the
  // call going on).
  v1::Reply AskAndWait(Event event, RequestId request, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The kept global model of `round` (a start_round above 0), or why not.
  absl::StatusOr<std::shared_ptr<const Model>> LoadKeptRound(uint32_t round)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Carry(Effects& effects) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the answer to `request` if it was not given.
  void Forget(RequestId request) ABSL_LOCKS_EXCLUDED(mu_);
  void CarrySend(effect::Send& send);
  void CarryReply(effect::Reply& reply) ABSL_LOCKS_EXCLUDED(mu_);
  void CarryLoad(effect::LoadInitialModel& load);
  void CarryStatusChanged() ABSL_LOCKS_EXCLUDED(mu_);
  void Attempt(std::shared_ptr<effect::Send> send, int attempt,
               bool maybe_delivered);
  void Loopback(std::shared_ptr<effect::Send> send);
  void CallDone(CallId call, absl::StatusOr<PeerReply> reply,
                bool maybe_delivered = false);
  void StartTraining(effect::StartTraining& start);
  // Runs the queued writes in order, one at a time. REQUIRES: mu_ not held.
  void DrainWrites() ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  bool WritesIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    return writes_.empty() && !draining_;
  }
  // Queues the step's aggregation work (adds, aggregations, releases) in
  // step order. REQUIRES: mu_ held (so that the order is the steps').
  // Returns whether a drainer must be posted.
  bool QueueAggregationWork(Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      ABSL_LOCKS_EXCLUDED(aggregation_mu_);
  // Runs the queued aggregation work in order, one task at a time.
  void DrainAggregationWork() ABSL_LOCKS_EXCLUDED(mu_, aggregation_mu_);
  void Write(effect::Persist& persist);
  double JitterUnit();

  const DriverOptions options_;
  PeerTransport* const transport_;
  Learner* const learner_;
  ModelStore* const store_;
  TaskRunner* const runner_;

  // Serializes operator Configure calls (they touch the learner and the
  // store before stepping).
  absl::Mutex configure_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(write_mu_, aggregation_mu_);
  SiteMachine machine_ ABSL_GUARDED_BY(mu_);
  RequestId next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<RequestId, Answer> answers_ ABSL_GUARDED_BY(mu_);
  // The training under way, as its cancel flag.
  std::shared_ptr<std::atomic<bool>> training_cancel_ ABSL_GUARDED_BY(mu_);
  // Held Status calls waiting for the next status change.
  std::vector<std::function<void()>> status_waiters_ ABSL_GUARDED_BY(mu_);

  // Writes, in the order the machine asked for them (queued under mu_ right
  // after the step, run outside it by one drainer at a time).
  mutable absl::Mutex write_mu_;
  std::deque<effect::Persist> writes_ ABSL_GUARDED_BY(write_mu_);
  bool draining_ ABSL_GUARDED_BY(write_mu_) = false;

  // The aggregation worker (design section 9): every pass over a model that
  // the machine hands out (adding a result, aggregating a round, dropping a
  // round's offload files), queued in step order under mu_ and run outside
  // it, one at a time, so that the driver's lock is never held across
  // model-sized work and a round's adds never overlap (Aggregator::Add is
  // not thread-safe).
  absl::Mutex aggregation_mu_;
  std::deque<std::function<void()>> aggregation_work_
      ABSL_GUARDED_BY(aggregation_mu_);
  bool aggregating_ ABSL_GUARDED_BY(aggregation_mu_) = false;

  // The longest the driver's lock was held by one Feed (the step and the
  // queueing of its work), and what was stepped: logged when a job ends
  // here, so that work grown inside the lock shows (design section 9).
  absl::Duration longest_hold_ ABSL_GUARDED_BY(mu_);
  const char* longest_hold_event_ ABSL_GUARDED_BY(mu_) = "";

  absl::Mutex jitter_mu_;
  std::minstd_rand jitter_ ABSL_GUARDED_BY(jitter_mu_);
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_SITE_DRIVER_H_
