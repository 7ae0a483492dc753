#include "persist/workspace.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "persist/atomic_file.h"
#include "persist/file_util.h"

namespace swarm::persist {
namespace fs = std::filesystem;
namespace {

constexpr size_t kMaxJobIdLength = 64;

absl::Status FsError(const std::error_code& ec, absl::string_view what,
                     const fs::path& path) {
  return ErrnoError(ec.value(), what, path.string());
}

template <typename ProtoStatus>
absl::Status FromProtoStatus(const ProtoStatus& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status WriteProtoJson(const google::protobuf::Message& message,
                            const std::string& path) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  absl::Status status = FromProtoStatus(
      google::protobuf::util::MessageToJsonString(message, &json, options));
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot encode ", path, " as JSON: ", status.message()));
  }
  if (json.empty() || json.back() != '\n') json.push_back('\n');
  return WriteFileAtomically(path, json);
}

absl::Status ReadProtoJson(const std::string& path,
                           google::protobuf::Message* message) {
  SWARM_ASSIGN_OR_RETURN(std::string json, ReadFileToString(path));
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  absl::Status status = FromProtoStatus(
      google::protobuf::util::JsonStringToMessage(json, message, options));
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat(path, " is not a valid ",
                                            message->GetDescriptor()->name(),
                                            " in JSON: ", status.message()));
  }
  return absl::OkStatus();
}

// Creates `dir` and its missing ancestors, then fsyncs the parent of each
// directory it created so that the new entries survive a crash.
absl::Status MakeDir(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> missing;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec);
       p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec) return FsError(ec, "cannot create directory", dir);
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", dir.string(),
                     ": a non-directory is in the way"));
  }
  for (const fs::path& created : missing) {
    const fs::path parent = created.parent_path();
    SWARM_RETURN_IF_ERROR(
        FsyncDirectory(parent.empty() ? std::string(".") : parent.string()));
  }
  return absl::OkStatus();
}

// The entries of `dir`; an empty list when `dir` does not exist.
absl::StatusOr<std::vector<fs::directory_entry>> ListDir(const fs::path& dir) {
  std::vector<fs::directory_entry> entries;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return entries;
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    entries.push_back(*it);
  }
  if (ec) return FsError(ec, "cannot list directory", dir);
  return entries;
}

// Removes the temporary files in `dir`; counts them in *removed.
absl::Status RemoveTempFiles(const fs::path& dir, int* removed) {
  SWARM_ASSIGN_OR_RETURN(std::vector<fs::directory_entry> entries,
                         ListDir(dir));
  absl::Status first_error;
  for (const fs::directory_entry& entry : entries) {
    std::error_code ec;
    if (!IsTempFileName(entry.path().filename().string()) ||
        !entry.is_regular_file(ec) || entry.is_symlink(ec)) {
      continue;
    }
    if (!fs::remove(entry.path(), ec) && ec) {
      first_error.Update(
          FsError(ec, "cannot remove stale temporary file", entry.path()));
      continue;
    }
    ++*removed;
  }
  return first_error;
}

}  // namespace

Workspace::Workspace(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  if (root_.empty()) root_ = ".";
}

absl::Status Workspace::ValidateJobId(absl::string_view job_id) {
  if (job_id.empty() || job_id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id \"", absl::CHexEscape(job_id.substr(0, 100)), "\" has ",
        job_id.size(), " characters; it must have 1 to ", kMaxJobIdLength));
  }
  for (char c : job_id) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("job id \"", absl::CHexEscape(job_id), "\" contains '",
                       absl::CHexEscape(absl::string_view(&c, 1)),
                       "'; only [A-Za-z0-9._-] are allowed"));
    }
  }
  if (job_id == "." || job_id == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("job id \"", job_id,
                     "\" is not allowed: it names a directory outside "
                     "the job's own"));
  }
  return absl::OkStatus();
}

std::string Workspace::JobDir(absl::string_view job_id) const {
  return absl::StrCat(root_ == "/" ? "" : root_, "/", job_id);
}
std::string Workspace::JobConfigPath(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/job.json");
}
std::string Workspace::StatePath(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/state.json");
}
std::string Workspace::GlobalModelPath(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/global.safetensors");
}
std::string Workspace::BestModelPath(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/best.safetensors");
}
std::string Workspace::LastModelPath(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/last.safetensors");
}
std::string Workspace::HeldBestPath(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/held-best.safetensors");
}
std::string Workspace::RoundsDir(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/rounds");
}
std::string Workspace::RoundModelPath(absl::string_view job_id,
                                      uint32_t round) const {
  return absl::StrFormat("%s/round-%06u.safetensors", RoundsDir(job_id), round);
}
std::string Workspace::DroppedRoundModelPath(absl::string_view job_id,
                                             uint32_t round,
                                             absl::string_view tag) const {
  return absl::StrFormat("%s/round-%06u.%s.dropped.safetensors",
                         RoundsDir(job_id), round, tag);
}
std::string Workspace::OffloadDir(absl::string_view job_id) const {
  return absl::StrCat(JobDir(job_id), "/offload");
}

absl::Status Workspace::EnsureJobDirs(absl::string_view job_id) const {
  SWARM_RETURN_IF_ERROR(ValidateJobId(job_id));
  SWARM_RETURN_IF_ERROR(MakeDir(JobDir(job_id)));
  SWARM_RETURN_IF_ERROR(MakeDir(RoundsDir(job_id)));
  return MakeDir(OffloadDir(job_id));
}

absl::Status Workspace::WriteJobConfig(const v1::JobConfig& config) const {
  SWARM_RETURN_IF_ERROR(EnsureJobDirs(config.job_id()));
  return WriteProtoJson(config, JobConfigPath(config.job_id()));
}

absl::StatusOr<v1::JobConfig> Workspace::ReadJobConfig(
    absl::string_view job_id) const {
  SWARM_RETURN_IF_ERROR(ValidateJobId(job_id));
  const std::string path = JobConfigPath(job_id);
  v1::JobConfig config;
  SWARM_RETURN_IF_ERROR(ReadProtoJson(path, &config));
  if (config.job_id() != job_id) {
    return absl::DataLossError(absl::StrCat(path, " holds job_id \"",
                                            absl::CHexEscape(config.job_id()),
                                            "\", expected \"", job_id, "\""));
  }
  return config;
}

absl::Status Workspace::WriteState(const v1::JobState& state) const {
  SWARM_RETURN_IF_ERROR(EnsureJobDirs(state.job_id()));
  return WriteProtoJson(state, StatePath(state.job_id()));
}

absl::StatusOr<v1::JobState> Workspace::ReadState(
    absl::string_view job_id) const {
  SWARM_RETURN_IF_ERROR(ValidateJobId(job_id));
  const std::string path = StatePath(job_id);
  v1::JobState state;
  SWARM_RETURN_IF_ERROR(ReadProtoJson(path, &state));
  if (state.job_id() != job_id) {
    return absl::DataLossError(absl::StrCat(path, " holds job_id \"",
                                            absl::CHexEscape(state.job_id()),
                                            "\", expected \"", job_id, "\""));
  }
  return state;
}

absl::Status Workspace::ClearOffload(absl::string_view job_id) const {
  SWARM_RETURN_IF_ERROR(ValidateJobId(job_id));
  SWARM_ASSIGN_OR_RETURN(std::vector<fs::directory_entry> entries,
                         ListDir(OffloadDir(job_id)));
  absl::Status first_error;
  for (const fs::directory_entry& entry : entries) {
    std::error_code ec;
    fs::remove_all(entry.path(), ec);
    if (ec) {
      first_error.Update(
          FsError(ec, "cannot remove offload file", entry.path()));
    }
  }
  return first_error;
}

absl::Status Workspace::CheckWritable() const {
  const std::string root = root_.empty() ? std::string(".") : root_;
  absl::Status made = MakeDir(root);
  if (!made.ok()) {
    return absl::Status(
        made.code(),
        absl::StrCat("workspace ", root, " is not usable: ", made.message()));
  }
  absl::StatusOr<TempFile> probe = CreateTempSibling(root + "/.write-check");
  if (!probe.ok()) {
    return absl::Status(probe.status().code(),
                        absl::StrCat("workspace ", root, " is not writable: ",
                                     probe.status().message()));
  }
  absl::Status status = WriteFully(probe->fd, "ok", probe->path);
  status.Update(FsyncFd(probe->fd, probe->path));
  status.Update(CloseFd(probe->fd, probe->path));
  if (unlink(probe->path.c_str()) != 0) {
    status.Update(ErrnoError(errno, "cannot remove", probe->path));
  }
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("workspace ", root,
                                     " is not writable: ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status Workspace::CleanStaleOffloadAll() const {
  SWARM_ASSIGN_OR_RETURN(std::vector<std::string> jobs, ListJobs());
  absl::Status first_error;
  int removed_temp = 0;
  for (const std::string& job : jobs) {
    first_error.Update(ClearOffload(job));
    first_error.Update(RemoveTempFiles(JobDir(job), &removed_temp));
    first_error.Update(RemoveTempFiles(RoundsDir(job), &removed_temp));
  }
  if (removed_temp > 0) {
    SWARM_LOG_INFO("workspace %s: removed %d stale temporary file(s)", root_,
                   removed_temp);
  }
  return first_error;
}

absl::StatusOr<std::vector<std::string>> Workspace::ListJobs() const {
  SWARM_ASSIGN_OR_RETURN(std::vector<fs::directory_entry> entries,
                         ListDir(root_));
  std::vector<std::string> jobs;
  for (const fs::directory_entry& entry : entries) {
    std::error_code ec;
    const std::string name = entry.path().filename().string();
    if (!ValidateJobId(name).ok() || entry.is_symlink(ec) ||
        !entry.is_directory(ec)) {
      continue;
    }
    jobs.push_back(name);
  }
  std::sort(jobs.begin(), jobs.end());
  return jobs;
}

}  // namespace swarm::persist
