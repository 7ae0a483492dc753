// A site's workspace on disk (design section 5):
//   <root>/<job>/job.json                the accepted JobConfig (JSON)
//   <root>/<job>/state.json              JobState: last round, best record
//   <root>/<job>/global.safetensors      the current global model
//   <root>/<job>/best.safetensors        at the end: the best global model
//   <root>/<job>/last.safetensors        at the end: the last global model
//   <root>/<job>/held-best.safetensors   the best model's copy at its holder
//   <root>/<job>/rounds/round-000012.safetensors   per-round global models
//   <root>/<job>/offload/                disk-offloaded results of a round
// Every file is replaced atomically (atomic_file.h).
#ifndef SWARM_PERSIST_WORKSPACE_H_
#define SWARM_PERSIST_WORKSPACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/swarm.pb.h"

namespace swarm::persist {

// Paths and small files of one site's workspace. Holds no state besides the
// root, so it is cheap to copy and safe to share between threads; callers
// serialise writes to the same job's files themselves.
class Workspace {
 public:
  // `root` need not exist yet (EnsureJobDirs creates it). Trailing slashes
  // are dropped; an empty root means the current directory.
  explicit Workspace(std::string root);

  const std::string& root() const { return root_; }

  // OK for [A-Za-z0-9._-]{1,64} other than "." and "..": such an id names
  // exactly one directory inside the workspace. InvalidArgument otherwise,
  // naming the id and the rule.
  static absl::Status ValidateJobId(absl::string_view job_id);

  // Path getters. They do not validate: the caller must have checked
  // `job_id` with ValidateJobId (every Status-returning method below does).
  std::string JobDir(absl::string_view job_id) const;
  std::string JobConfigPath(absl::string_view job_id) const;    // job.json
  std::string StatePath(absl::string_view job_id) const;        // state.json
  std::string GlobalModelPath(absl::string_view job_id) const;  // global.
  std::string BestModelPath(absl::string_view job_id) const;    // best.
  std::string LastModelPath(absl::string_view job_id) const;    // last.
  // held-best.safetensors: the best model's copy at the site that scored it.
  std::string HeldBestPath(absl::string_view job_id) const;
  std::string RoundsDir(absl::string_view job_id) const;  // rounds
  // rounds/round-000012.safetensors (at least six digits).
  std::string RoundModelPath(absl::string_view job_id, uint32_t round) const;
  // Where a kept round model of a chain that lost goes (design section 6):
  // rounds/round-000012.<tag>.dropped.safetensors, so that rounds/ names
  // only the winning chain's models.
  std::string DroppedRoundModelPath(absl::string_view job_id, uint32_t round,
                                    absl::string_view tag) const;
  std::string OffloadDir(absl::string_view job_id) const;  // offload

  // Creates the job directory, rounds/ and offload/ (like mkdir -p) and makes
  // the new directory entries durable.
  absl::Status EnsureJobDirs(absl::string_view job_id) const;

  // job.json, as protobuf JSON, written atomically (creates the job dirs).
  absl::Status WriteJobConfig(const v1::JobConfig& config) const;
  // NotFound when absent; DataLoss when the file is not a JobConfig of
  // `job_id`. Unknown JSON fields are ignored (files of a newer version).
  absl::StatusOr<v1::JobConfig> ReadJobConfig(absl::string_view job_id) const;

  // state.json, likewise.
  absl::Status WriteState(const v1::JobState& state) const;
  absl::StatusOr<v1::JobState> ReadState(absl::string_view job_id) const;

  // Removes everything under offload/ of `job_id` (the directory stays). OK
  // when there is no offload directory.
  absl::Status ClearOffload(absl::string_view job_id) const;

  // For start-up, before any job runs: clears offload/ of every job
  // directory under the root and removes the temporary files
  // (".<name>.tmp.<pid>.<hex>") that crashed writers left in job directories
  // and rounds/. Entries whose names are not valid job ids, and symlinks, are
  // left alone. Carries on after an error and returns the first one.
  absl::Status CleanStaleOffloadAll() const;

  // For start-up: creates the root (like mkdir -p) and proves it writable by
  // creating, syncing and removing a temporary file in it. FailedPrecondition
  // or the errno's code otherwise, naming the root and the reason (e.g. a
  // read-only file system), so a daemon can refuse to start instead of
  // failing in its first round.
  absl::Status CheckWritable() const;

  // The job ids that have a directory under the root, sorted.
  absl::StatusOr<std::vector<std::string>> ListJobs() const;

 private:
  std::string root_;
};

}  // namespace swarm::persist

#endif  // SWARM_PERSIST_WORKSPACE_H_
