#include "controller/model_store.h"

#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "persist/atomic_file.h"

namespace swarm {

absl::StatusOr<std::optional<StoredJob>>
WorkspaceModelStore::LoadUnfinishedJob() {
  SWARM_ASSIGN_OR_RETURN(std::vector<std::string> jobs, workspace_.ListJobs());
  std::optional<StoredJob> newest;
  for (const std::string& id : jobs) {
    absl::StatusOr<v1::JobState> state = workspace_.ReadState(id);
    if (!state.ok()) continue;  // Never configured to the end, or no state.
    const v1::SiteState site_state = state->state();
    const bool ended = site_state == v1::SITE_STATE_DONE ||
                       site_state == v1::SITE_STATE_FAILED ||
                       site_state == v1::SITE_STATE_ABORTED;
    // A job configured but not yet started counts too: the daemon may have
    // died between the start and the first state write (its learn tasks
    // then find it in the job; start_timeout_ms bounds the wait).
    if (ended) continue;
    if (newest.has_value() &&
        newest->state.updated_time_ms() >= state->updated_time_ms()) {
      continue;
    }
    SWARM_ASSIGN_OR_RETURN(v1::JobConfig job, workspace_.ReadJobConfig(id));
    StoredJob stored;
    stored.job = std::move(job);
    stored.state = *std::move(state);
    newest = std::move(stored);
  }
  if (!newest.has_value()) return newest;
  const std::string& id = newest->job.job_id();
  if (newest->state.global_round() >= 0) {
    absl::StatusOr<Model> global =
        Model::LoadSafetensors(workspace_.GlobalModelPath(id));
    bool matches = false;
    if (global.ok()) {
      auto round = global->metadata().find("round");
      matches = round != global->metadata().end() &&
                round->second == absl::StrCat(newest->state.global_round());
    }
    if (matches) {
      newest->global = std::make_shared<const Model>(*std::move(global));
    } else {
      // The state names a global model the file does not hold (a crash
      // between the two writes): nothing to resume from here.
      newest->state.set_global_round(-1);
    }
  }
  return newest;
}

absl::Status WorkspaceModelStore::SaveJobConfig(const v1::JobConfig& job) {
  SWARM_RETURN_IF_ERROR(workspace_.EnsureJobDirs(job.job_id()));
  return workspace_.WriteJobConfig(job);
}

absl::Status WorkspaceModelStore::SaveState(const v1::JobState& state) {
  return workspace_.WriteState(state);
}

absl::Status WorkspaceModelStore::SaveGlobal(
    const std::string& job, uint32_t round, const Model& model,
    const std::map<std::string, std::string>& metadata, bool keep_round) {
  if (keep_round) {
    SWARM_RETURN_IF_ERROR(
        model.SaveSafetensors(workspace_.RoundModelPath(job, round), metadata));
  }
  return model.SaveSafetensors(workspace_.GlobalModelPath(job), metadata);
}

absl::StatusOr<Model> WorkspaceModelStore::MapGlobal(const std::string& job) {
  return Model::LoadSafetensors(workspace_.GlobalModelPath(job));
}

absl::Status WorkspaceModelStore::SaveHeldBest(
    const std::string& job, const Model& model,
    const std::map<std::string, std::string>& metadata) {
  return model.SaveSafetensors(workspace_.HeldBestPath(job), metadata);
}

absl::StatusOr<std::shared_ptr<const Model>> WorkspaceModelStore::LoadHeldBest(
    const std::string& job) {
  SWARM_ASSIGN_OR_RETURN(Model model,
                         Model::LoadSafetensors(workspace_.HeldBestPath(job)));
  return std::make_shared<const Model>(std::move(model));
}

absl::StatusOr<std::shared_ptr<const Model>> WorkspaceModelStore::LoadRound(
    const std::string& job, uint32_t round) {
  SWARM_ASSIGN_OR_RETURN(
      Model model,
      Model::LoadSafetensors(workspace_.RoundModelPath(job, round)));
  return std::make_shared<const Model>(std::move(model));
}

absl::Status WorkspaceModelStore::SetAsideRound(const std::string& job,
                                                uint32_t round,
                                                const std::string& tag) {
  const std::string from = workspace_.RoundModelPath(job, round);
  const std::string to = workspace_.DroppedRoundModelPath(job, round, tag);
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::ErrnoToStatus(
        errno, absl::StrCat("setting aside ", from, " as ", to));
  }
  return persist::FsyncDirectory(workspace_.RoundsDir(job));
}

absl::Status WorkspaceModelStore::SaveFinal(
    const std::string& job, v1::ModelKind kind, const Model& model,
    const std::map<std::string, std::string>& metadata) {
  if (kind == v1::MODEL_KIND_BEST) {
    return model.SaveSafetensors(workspace_.BestModelPath(job), metadata);
  }
  if (kind == v1::MODEL_KIND_LAST) {
    return model.SaveSafetensors(workspace_.LastModelPath(job), metadata);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("not a final model kind: ", v1::ModelKind_Name(kind)));
}

absl::StatusOr<std::shared_ptr<const Model>> WorkspaceModelStore::LoadFinal(
    const std::string& job, v1::ModelKind kind) {
  const std::string path = kind == v1::MODEL_KIND_BEST
                               ? workspace_.BestModelPath(job)
                               : workspace_.LastModelPath(job);
  SWARM_ASSIGN_OR_RETURN(Model model, Model::LoadSafetensors(path));
  return std::make_shared<const Model>(std::move(model));
}

std::string WorkspaceModelStore::OffloadDir(const std::string& job) {
  return workspace_.OffloadDir(job);
}

absl::Status WorkspaceModelStore::ClearOffload(const std::string& job) {
  return workspace_.ClearOffload(job);
}

absl::Status MemoryModelStore::SaveJobConfig(const v1::JobConfig&) {
  return absl::OkStatus();
}

absl::Status MemoryModelStore::SaveState(const v1::JobState& state) {
  absl::MutexLock lock(&mu_);
  state_ = state;
  return absl::OkStatus();
}

absl::Status MemoryModelStore::SaveGlobal(
    const std::string&, uint32_t round, const Model& model,
    const std::map<std::string, std::string>& metadata, bool keep_round) {
  if (!keep_round) return absl::OkStatus();
  SWARM_ASSIGN_OR_RETURN(Model copy, model.Clone());
  copy.metadata() = metadata;
  absl::MutexLock lock(&mu_);
  rounds_[round] = std::make_shared<const Model>(std::move(copy));
  return absl::OkStatus();
}

absl::Status MemoryModelStore::SaveHeldBest(
    const std::string&, const Model& model,
    const std::map<std::string, std::string>& metadata) {
  SWARM_ASSIGN_OR_RETURN(Model copy, model.Clone());
  copy.metadata() = metadata;
  absl::MutexLock lock(&mu_);
  held_best_ = std::make_shared<const Model>(std::move(copy));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Model>> MemoryModelStore::LoadHeldBest(
    const std::string&) {
  absl::MutexLock lock(&mu_);
  if (held_best_ == nullptr) return absl::NotFoundError("no held best model");
  return held_best_;
}

absl::StatusOr<std::shared_ptr<const Model>> MemoryModelStore::LoadRound(
    const std::string&, uint32_t round) {
  absl::MutexLock lock(&mu_);
  auto it = rounds_.find(round);
  if (it == rounds_.end()) {
    return absl::NotFoundError(absl::StrCat("no model of round ", round));
  }
  return it->second;
}

absl::Status MemoryModelStore::SetAsideRound(const std::string&, uint32_t round,
                                             const std::string& tag) {
  absl::MutexLock lock(&mu_);
  auto it = rounds_.find(round);
  if (it == rounds_.end()) return absl::OkStatus();
  set_aside_[{round, tag}] = std::move(it->second);
  rounds_.erase(it);
  return absl::OkStatus();
}

absl::Status MemoryModelStore::SaveFinal(
    const std::string&, v1::ModelKind kind, const Model& model,
    const std::map<std::string, std::string>& metadata) {
  SWARM_ASSIGN_OR_RETURN(Model copy, model.Clone());
  copy.metadata() = metadata;
  absl::MutexLock lock(&mu_);
  finals_[kind] = std::make_shared<const Model>(std::move(copy));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Model>> MemoryModelStore::LoadFinal(
    const std::string&, v1::ModelKind kind) {
  absl::MutexLock lock(&mu_);
  auto it = finals_.find(kind);
  if (it == finals_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no ", v1::ModelKind_Name(kind), " model yet"));
  }
  return it->second;
}

v1::JobState MemoryModelStore::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

}  // namespace swarm
