// What a site keeps on disk for its job (design section 5). The controller
// calls it from worker tasks, never under its lock; implementations are
// thread-safe, and the controller never writes one file from two tasks at
// once.
//
// Durability, per method below, for WorkspaceModelStore (persist/):
// - "atomic, fsynced": the file is written to a temporary sibling, fsynced,
//   renamed over its name and its directory fsynced
//   (persist/atomic_file.h): after a crash the file is the old one or the
//   new one, never torn, and once the call returned OK the new one survives
//   a power loss. A mapping of the old file (MapGlobal) stays valid.
// - Two files in one call are two such writes, not one: a crash between
//   them leaves the first new and the second old.
// - Reads see the last completed write; they take no lock on the files.
// MemoryModelStore keeps everything in memory (no durability; each call is
// atomic under its mutex).
#ifndef SWARM_CONTROLLER_MODEL_STORE_H_
#define SWARM_CONTROLLER_MODEL_STORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/model.h"
#include "persist/workspace.h"
#include "proto/swarm.pb.h"

namespace swarm {

// A job a site was in, as its workspace holds it (for a restart).
struct StoredJob {
  v1::JobConfig job;
  v1::JobState state;
  // The global model of state.global_round(), or null.
  std::shared_ptr<const Model> global;
};

class ModelStore {
 public:
  virtual ~ModelStore() = default;
  // The job this site was last in, if it has not ended (configured or
  // started: the newest state file); nullopt when there is none. Default:
  // none. Read only. A global model file whose "round" does not match the
  // state (a crash between SaveGlobal and SaveState) is not returned: the
  // state's global_round is then -1.
  virtual absl::StatusOr<std::optional<StoredJob>> LoadUnfinishedJob() {
    return std::nullopt;
  }
  // job.json: atomic, fsynced; first creates the job's directories
  // (rounds/, offload/) and fsyncs their parents.
  virtual absl::Status SaveJobConfig(const v1::JobConfig& job) = 0;
  // state.json: atomic, fsynced (creates the job's directories if missing).
  virtual absl::Status SaveState(const v1::JobState& state) = 0;
  // The current global model (the input of `round`); with `keep_round`
  // also as that round's model. Each file atomic and fsynced; with
  // `keep_round` two writes, the round's file first, then global.safetensors
  // (a crash between them leaves the round's file new and global old).
  virtual absl::Status SaveGlobal(
      const std::string& job, uint32_t round, const Model& model,
      const std::map<std::string, std::string>& metadata, bool keep_round) = 0;
  // The best model's copy at the site that scored it (held-best.safetensors;
  // metadata "round" names its round): atomic, fsynced. Its load (read
  // into memory); NotFound when absent.
  virtual absl::Status SaveHeldBest(
      const std::string& job, const Model& model,
      const std::map<std::string, std::string>& metadata) = 0;
  virtual absl::StatusOr<std::shared_ptr<const Model>> LoadHeldBest(
      const std::string& job) = 0;
  // A round's kept global model, read into memory; NotFound when absent.
  virtual absl::StatusOr<std::shared_ptr<const Model>> LoadRound(
      const std::string& job, uint32_t round) = 0;
  // Sets round `round`'s kept model aside under `tag` (it is of a chain
  // that lost): LoadRound no longer finds it. OK when there is none.
  // Atomic (a rename) and durable (the folder is fsynced) on disk.
  virtual absl::Status SetAsideRound(const std::string& job, uint32_t round,
                                     const std::string& tag) = 0;
  // The current global model (SaveGlobal's file) mapped read-only, so that
  // it is held as a file mapping (lean memory). A later SaveGlobal renames a
  // new file over it: the mapping keeps the old contents. Default:
  // Unimplemented.
  virtual absl::StatusOr<Model> MapGlobal(const std::string& job) {
    return absl::UnimplementedError("this store keeps no global model file");
  }
  // BEST or LAST, as received at the end of the job (metadata included):
  // atomic, fsynced. InvalidArgument for another kind.
  virtual absl::Status SaveFinal(
      const std::string& job, v1::ModelKind kind, const Model& model,
      const std::map<std::string, std::string>& metadata) = 0;
  // Read into memory; NotFound when absent.
  virtual absl::StatusOr<std::shared_ptr<const Model>> LoadFinal(
      const std::string& job, v1::ModelKind kind) = 0;
  // Directory for disk-offloaded results; empty when the store has none.
  // A path only: nothing is created (SaveJobConfig made the directory).
  virtual std::string OffloadDir(const std::string& job) = 0;
  // Removes every file under OffloadDir (the directory stays): not atomic
  // (one unlink at a time; the first error is returned after trying the
  // rest) and not fsynced (scratch data: a crash may leave files behind,
  // which the daemon's start-up clears, Workspace::CleanStaleOffloadAll).
  virtual absl::Status ClearOffload(const std::string& job) = 0;
};

// Files under a persist::Workspace.
class WorkspaceModelStore final : public ModelStore {
 public:
  explicit WorkspaceModelStore(std::string root)
      : workspace_(std::move(root)) {}
  absl::StatusOr<std::optional<StoredJob>> LoadUnfinishedJob() override;
  absl::Status SaveJobConfig(const v1::JobConfig& job) override;
  absl::Status SaveState(const v1::JobState& state) override;
  absl::Status SaveGlobal(const std::string& job, uint32_t round,
                          const Model& model,
                          const std::map<std::string, std::string>& metadata,
                          bool keep_round) override;
  absl::Status SaveHeldBest(
      const std::string& job, const Model& model,
      const std::map<std::string, std::string>& metadata) override;
  absl::StatusOr<std::shared_ptr<const Model>> LoadHeldBest(
      const std::string& job) override;
  absl::StatusOr<std::shared_ptr<const Model>> LoadRound(
      const std::string& job, uint32_t round) override;
  absl::Status SetAsideRound(const std::string& job, uint32_t round,
                             const std::string& tag) override;
  absl::StatusOr<Model> MapGlobal(const std::string& job) override;
  absl::Status SaveFinal(
      const std::string& job, v1::ModelKind kind, const Model& model,
      const std::map<std::string, std::string>& metadata) override;
  absl::StatusOr<std::shared_ptr<const Model>> LoadFinal(
      const std::string& job, v1::ModelKind kind) override;
  std::string OffloadDir(const std::string& job) override;
  absl::Status ClearOffload(const std::string& job) override;
  const persist::Workspace& workspace() const { return workspace_; }

 private:
  persist::Workspace workspace_;
};

// Keeps everything in memory (simulations and unit tests).
class MemoryModelStore final : public ModelStore {
 public:
  MemoryModelStore() = default;
  absl::Status SaveJobConfig(const v1::JobConfig& job) override;
  absl::Status SaveState(const v1::JobState& state) override;
  absl::Status SaveGlobal(const std::string& job, uint32_t round,
                          const Model& model,
                          const std::map<std::string, std::string>& metadata,
                          bool keep_round) override;
  absl::Status SaveHeldBest(
      const std::string& job, const Model& model,
      const std::map<std::string, std::string>& metadata) override;
  absl::StatusOr<std::shared_ptr<const Model>> LoadHeldBest(
      const std::string& job) override;
  absl::StatusOr<std::shared_ptr<const Model>> LoadRound(
      const std::string& job, uint32_t round) override;
  absl::Status SetAsideRound(const std::string& job, uint32_t round,
                             const std::string& tag) override;
  absl::Status SaveFinal(
      const std::string& job, v1::ModelKind kind, const Model& model,
      const std::map<std::string, std::string>& metadata) override;
  absl::StatusOr<std::shared_ptr<const Model>> LoadFinal(
      const std::string& job, v1::ModelKind kind) override;
  std::string OffloadDir(const std::string& job) override { return ""; }
  absl::Status ClearOffload(const std::string& job) override {
    return absl::OkStatus();
  }
  v1::JobState state() const;

 private:
  mutable absl::Mutex mu_;
  v1::JobState state_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Model> held_best_ ABSL_GUARDED_BY(mu_);
  std::map<v1::ModelKind, std::shared_ptr<const Model>> finals_
      ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::shared_ptr<const Model>> rounds_ ABSL_GUARDED_BY(mu_);
  // Set aside (SetAsideRound): (round, tag) -> model.
  std::map<std::pair<uint32_t, std::string>, std::shared_ptr<const Model>>
      set_aside_ ABSL_GUARDED_BY(mu_);
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_MODEL_STORE_H_
