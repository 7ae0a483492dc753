// FaultInjectionModelStore: a ModelStore wrapper that makes a site's disk
// fail on demand, in the manner of LevelDB's FaultInjectionTestEnv: the
// store underneath is untouched while writes fail, so a test can check both
// what the site did about the error and that nothing on "disk" was torn.
//
//   MemoryModelStore memory;
//   FaultInjectionModelStore store(&memory);
//   store.FailWrites(absl::ResourceExhaustedError(
//       "write /ws/jobs/j/state.json: No space left on device"));
//
// Thread-safe (the driver writes from worker tasks).
#ifndef SWARM_CONTROLLER_FAULT_INJECTION_MODEL_STORE_H_
#define SWARM_CONTROLLER_FAULT_INJECTION_MODEL_STORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/storage_error.h"
#include "controller/model_store.h"

namespace swarm {

class FaultInjectionModelStore final : public ModelStore {
 public:
  // REQUIRES: `base` outlives this store.
  explicit FaultInjectionModelStore(ModelStore* base) : base_(base) {}

  // From now on every write fails with `error` (marked AsStorageError, as a
  // real disk's error would be) and leaves the store underneath as it was;
  // OK makes writes work again.
  void FailWrites(absl::Status error) {
    absl::MutexLock lock(&mu_);
    write_error_ = AsStorageError(std::move(error));
  }
  // From now on every write first waits `delay` (a slow disk). A real
  // sleep: for tests on real thread pools only.
  void SlowWrites(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    write_delay_ = delay;
  }
  // The directory OffloadDir answers (results then stream to real files
  // there when the job offloads); empty: the base store's.
  void set_offload_dir(std::string dir) {
    absl::MutexLock lock(&mu_);
    offload_dir_ = std::move(dir);
  }
  // Writes refused so far.
  int failed_writes() const {
    absl::MutexLock lock(&mu_);
    return failed_writes_;
  }

  absl::StatusOr<std::optional<StoredJob>> LoadUnfinishedJob() override {
    return base_->LoadUnfinishedJob();
  }
  absl::Status SaveJobConfig(const v1::JobConfig& job) override {
    if (absl::Status fault = WriteFault(); !fault.ok()) return fault;
    return base_->SaveJobConfig(job);
  }
  absl::Status SaveState(const v1::JobState& state) override {
    if (absl::Status fault = WriteFault(); !fault.ok()) return fault;
    return base_->SaveState(state);
  }
  absl::Status SaveGlobal(const std::string& job, uint32_t round,
                          const Model& model,
                          const std::map<std::string, std::string>& metadata,
                          bool keep_round) override {
    if (absl::Status fault = WriteFault(); !fault.ok()) return fault;
    return base_->SaveGlobal(job, round, model, metadata, keep_round);
  }
  absl::Status SaveHeldBest(
      const std::string& job, const Model& model,
      const std::map<std::string, std::string>& metadata) override {
    if (absl::Status fault = WriteFault(); !fault.ok()) return fault;
    return base_->SaveHeldBest(job, model, metadata);
  }
  absl::StatusOr<std::shared_ptr<const Model>> LoadHeldBest(
      const std::string& job) override {
    return base_->LoadHeldBest(job);
  }
  absl::StatusOr<std::shared_ptr<const Model>> LoadRound(
      const std::string& job, uint32_t round) override {
    return base_->LoadRound(job, round);
  }
  absl::Status SetAsideRound(const std::string& job, uint32_t round,
                             const std::string& tag) override {
    if (absl::Status fault = WriteFault(); !fault.ok()) return fault;
    return base_->SetAsideRound(job, round, tag);
  }
  absl::Status SaveFinal(
      const std::string& job, v1::ModelKind kind, const Model& model,
      const std::map<std::string, std::string>& metadata) override {
    if (absl::Status fault = WriteFault(); !fault.ok()) return fault;
    return base_->SaveFinal(job, kind, model, metadata);
  }
  absl::StatusOr<std::shared_ptr<const Model>> LoadFinal(
      const std::string& job, v1::ModelKind kind) override {
    return base_->LoadFinal(job, kind);
  }
  std::string OffloadDir(const std::string& job) override {
    {
      absl::MutexLock lock(&mu_);
      if (!offload_dir_.empty()) return offload_dir_;
    }
    return base_->OffloadDir(job);
  }
  absl::Status ClearOffload(const std::string& job) override {
    return base_->ClearOffload(job);
  }

 private:
  // The injected error, counted, or OK.
  absl::Status WriteFault() {
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      delay = write_delay_;
    }
    if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
    absl::MutexLock lock(&mu_);
    if (!write_error_.ok()) ++failed_writes_;
    return write_error_;
  }

  ModelStore* const base_;
  mutable absl::Mutex mu_;
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);
  std::string offload_dir_ ABSL_GUARDED_BY(mu_);
  int failed_writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration write_delay_ ABSL_GUARDED_BY(mu_);
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_FAULT_INJECTION_MODEL_STORE_H_
