// TrainerLink: the daemon's side of the trainer link (proto/trainer_link.proto)
// without the transport: one attached trainer session with a lease, and one
// task at a time handed from the Learner calls to that trainer.
//
// Trainer-side methods (Attach, NextTask, ...) are called by the gRPC service
// (link_service.h) on its threads; daemon-side methods (InitialModel,
// Validate, Train) by the controller's worker. Thread-safe.
//
// Rules:
// - One trainer at a time: Attach while a session's lease is live is
//   AlreadyExists naming the attached trainer. Any call from the session
//   renews its lease; a session whose lease runs out (or whose process exits,
//   TrainerExited) is dropped and the task it held fails with the reason.
// - A task is handed to one session only, once: a dropped session's task is
//   failed, never handed out again, so no task runs twice.
// - A new task supersedes an unfinished one (its waiter gets Cancelled and the
//   trainer sees the id in HeartbeatReply.cancelled_task_ids).
#ifndef SWARM_TRAINERLINK_TRAINER_LINK_H_
#define SWARM_TRAINERLINK_TRAINER_LINK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "learner/learner.h"
#include "model/model.h"
#include "proto/trainer_link.pb.h"

namespace swarm::trainerlink {

inline constexpr uint32_t kProtocolVersion = v1::TRAINER_LINK_VERSION_CURRENT;

struct LinkOptions {
  std::string site;
  // Folder for the hand-off files (task models, results); must exist.
  std::string dir;
  absl::Duration lease = absl::Seconds(10);
  absl::Duration task_timeout = absl::Hours(1);
  // Shown in logs while no trainer is attached, e.g. the socket path.
  std::string waiting_hint;
};

// The daemon's job as the link sees it (see SetJobView).
struct JobView {
  std::string job_id;  // Empty: no job configured.
  bool ended = false;  // Done, failed or aborted.
  std::string metric_name;
};

class TrainerLink {
 public:
  explicit TrainerLink(LinkOptions options);
  ~TrainerLink();
  TrainerLink(const TrainerLink&) = delete;
  TrainerLink& operator=(const TrainerLink&) = delete;

  // Where the link learns the daemon's job (called without the link's lock
  // held; it may take other locks). Default: no job.
  void SetJobView(std::function<JobView()> view);
  // Parameters handed to the trainer with every task.
  void SetParams(std::map<std::string, std::string> params);
  // The job requires differential privacy: tasks say so
  // (TrainerTask.require_dp) and a TRAIN result without its privacy cost is
  // refused, naming what is missing.
  void SetRequireDp(bool require_dp);

  // --- Trainer side. Errors carry the codes listed in trainer_link.proto.
  absl::StatusOr<v1::AttachReply> Attach(const v1::AttachRequest& request);
  absl::StatusOr<v1::NextTaskReply> NextTask(
      const v1::NextTaskRequest& request);
  absl::Status ReportValidation(const v1::ValidationRequest& request);
  absl::Status SubmitResult(const v1::SubmitResultRequest& request);
  absl::StatusOr<v1::HeartbeatReply> Heartbeat(
      const v1::HeartbeatRequest& request);
  absl::Status Detach(const v1::DetachRequest& request);

  // --- Daemon side.
  // The trainer process `pid` ended (`how`, e.g. "exited with status 1"): its
  // session, if any, is dropped now rather than at lease expiry.
  void TrainerExited(int64_t pid, const std::string& how);
  // Learner calls (see learner/learner.h). Each waits at most the task
  // timeout; a trainer failure, a bad result, an expired lease or Shutdown
  // ends the wait with the reason.
  absl::StatusOr<Model> InitialModel();
  absl::StatusOr<Metrics> Validate(const Model& global, uint32_t round);
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel);
  // Ends every wait (Unavailable) and refuses further calls.
  void Shutdown();
  // See Learner::WaitingFor and Learner::SetWaitingListener: "waiting for
  // trainer" while a task is published and no trainer is attached. The
  // listener runs on the link's watcher thread.
  std::string WaitingFor();
  void SetWaitingListener(std::function<void()> changed);

 private:
  struct Session {
    std::string id;
    std::string name;
    int64_t pid = 0;
    std::string job;  // The job this trainer works for ("" until known).
    absl::Time attached;
    absl::Time lease_until;
    std::vector<uint64_t> cancelled;
  };
  enum class TaskState { kQueued, kRunning, kFinished };
  struct Task {
    v1::TrainerTask proto;
    const Model* global = nullptr;     // Identity of a TRAIN task's model.
    std::vector<TensorSpec> expected;  // TRAIN: the result's tensors.
    TaskState state = TaskState::kQueued;
    std::string session;
    bool submitting = false;
    std::optional<Metrics> validation;
    absl::Status outcome;  // Set when finished with an error.
    std::optional<Model> result;
    uint64_t sample_count = 0;
    v1::PayloadKind payload_kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
    std::optional<v1::PrivacyCost> privacy;  // As the trainer reported it.
    absl::Time deadline;
  };

  JobView View();
  // OK unless `request` (for `task`) lacks a privacy cost the job requires
  // or reports an invalid one.
  static absl::Status CheckPrivacyReport(
      const Task& task, const v1::SubmitResultRequest& request);
  // A new task (the model file written first, without the lock). Supersedes
  // the current task.
  absl::StatusOr<std::shared_ptr<Task>> Publish(v1::TrainerTaskKind kind,
                                                const Model* global,
                                                uint32_t round,
                                                bool want_validation);
  // Waits until `ready` or the task finishes, its deadline, Shutdown or
  // `cancel`. Returns the task's failure, if any.
  absl::Status Wait(const std::shared_ptr<Task>& task, bool until_validation,
                    const std::atomic<bool>* cancel);
  void Finish(Task* task, absl::Status outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the task's files (after it finished).
  void Retire(const std::shared_ptr<Task>& task);
  absl::StatusOr<Session*> FindSession(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running task `task_id` of `session`, or the error the trainer gets.
  absl::StatusOr<Task*> HeldTask(const Session& session, uint64_t task_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropSession(const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease watcher's thread: drops a session whose lease ran out, and
  // tells the waiting listener when WaitingForLocked() changed.
  void WatchLeases();
  bool WaitingForTrainerLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const LinkOptions options_;
  std::function<JobView()> job_view_;  // Set before use; read without mu_.
  absl::Mutex view_mu_;

  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> params_ ABSL_GUARDED_BY(mu_);
  bool require_dp_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Session> session_ ABSL_GUARDED_BY(mu_);
  uint64_t session_changes_ ABSL_GUARDED_BY(mu_) = 0;
  // What the waiting listener was last told.
  bool told_waiting_ ABSL_GUARDED_BY(mu_) = false;
  // Held while the listener runs, so that replacing it waits for the call.
  absl::Mutex listener_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::function<void()> waiting_listener_ ABSL_GUARDED_BY(listener_mu_);
  std::shared_ptr<Task> task_ ABSL_GUARDED_BY(mu_);
  uint64_t next_task_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Outcomes of recent tasks, for a trainer that calls about one late.
  std::map<uint64_t, absl::Status> finished_ ABSL_GUARDED_BY(mu_);
  bool warned_waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::thread lease_thread_;
};

}  // namespace swarm::trainerlink

#endif  // SWARM_TRAINERLINK_TRAINER_LINK_H_
