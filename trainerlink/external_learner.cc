#include "trainerlink/external_learner.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "config/site_config.h"
#include "learner/learner_factory.h"
#include "persist/file_util.h"
#include "proto/trainer_link.grpc.pb.h"

namespace swarm::trainerlink {

namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

template <typename T>
grpc::Status Answer(absl::StatusOr<T> result, T* reply) {
  if (!result.ok()) return ToGrpc(result.status());
  *reply = std::move(*result);
  return grpc::Status::OK;
}

// mkdir -p with mode 0700 for folders it creates.
absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty() || dir == "/" || dir == ".") return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " exists and is not a folder"));
  }
  absl::Status parent = MakeDirs(persist::DirName(dir));
  if (!parent.ok()) return parent;
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return persist::ErrnoError(errno, "mkdir", dir);
  }
  return absl::OkStatus();
}

// Removes hand-off files a previous run left behind.
void CleanHandoffDir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (struct dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (absl::StartsWith(name, "task-")) {
      unlink(absl::StrCat(dir, "/", name).c_str());
    }
  }
  closedir(d);
}

absl::Duration MillisOr(uint32_t ms, absl::Duration fallback) {
  return ms == 0 ? fallback : absl::Milliseconds(ms);
}

}  // namespace

class LinkService final : public v1::TrainerLink::Service {
 public:
  explicit LinkService(TrainerLink* link) : link_(link) {}

  grpc::Status Attach(grpc::ServerContext*, const v1::AttachRequest* request,
                      v1::AttachReply* reply) override {
    return Answer(link_->Attach(*request), reply);
  }
  grpc::Status NextTask(grpc::ServerContext*,
                        const v1::NextTaskRequest* request,
                        v1::NextTaskReply* reply) override {
    return Answer(link_->NextTask(*request), reply);
  }
  grpc::Status ReportValidation(grpc::ServerContext*,
                                const v1::ValidationRequest* request,
                                v1::LinkReply* reply) override {
    return ToGrpc(link_->ReportValidation(*request));
  }
  grpc::Status SubmitResult(grpc::ServerContext*,
                            const v1::SubmitResultRequest* request,
                            v1::LinkReply* reply) override {
    return ToGrpc(link_->SubmitResult(*request));
  }
  grpc::Status Heartbeat(grpc::ServerContext*,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatReply* reply) override {
    return Answer(link_->Heartbeat(*request), reply);
  }
  grpc::Status Detach(grpc::ServerContext*, const v1::DetachRequest* request,
                      v1::LinkReply* reply) override {
    return ToGrpc(link_->Detach(*request));
  }

 private:
  TrainerLink* const link_;
};

ExternalLearner::ExternalLearner(v1::SiteConfig config, std::string socket_path)
    : config_(std::move(config)), socket_path_(std::move(socket_path)) {}

absl::StatusOr<std::unique_ptr<ExternalLearner>> ExternalLearner::Create(
    const v1::SiteConfig& config) {
  const std::string socket_path = TrainerSocketPath(config);
  const std::string handoff_dir = absl::StrCat(config.workspace(), "/trainer");
  absl::Status made = MakeDirs(handoff_dir);
  if (made.ok()) made = MakeDirs(persist::DirName(socket_path));
  if (!made.ok()) {
    return absl::Status(made.code(),
                        absl::StrCat("trainer link: ", made.message()));
  }
  chmod(handoff_dir.c_str(), 0700);
  CleanHandoffDir(handoff_dir);
  struct stat st;
  if (lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("trainer.socket_path ", socket_path,
                       " exists and is not a socket (refusing to replace it)"));
    }
    unlink(socket_path.c_str());  // Left by a previous run.
  }

  std::unique_ptr<ExternalLearner> learner(
      new ExternalLearner(config, socket_path));
  LinkOptions options;
  options.site = config.name();
  options.dir = handoff_dir;
  options.lease = MillisOr(config.trainer().lease_ms(), absl::Seconds(10));
  options.task_timeout =
      MillisOr(config.trainer().task_timeout_ms(), absl::Hours(1));
  options.waiting_hint =
      config.trainer().mode() == "launch"
          ? absl::StrCat("launch mode; socket ", socket_path)
          : absl::StrCat("attach mode: start the trainer with ", kSocketEnv,
                         "=", socket_path);
  learner->link_ = std::make_unique<TrainerLink>(options);
  learner->link_->SetParams(MergeLearnerParams(
      config.learner(), std::map<std::string, std::string>()));
  learner->service_ = std::make_unique<LinkService>(learner->link_.get());

  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_path),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(learner->service_.get());
  learner->server_ = builder.BuildAndStart();
  if (learner->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "trainer link: cannot listen on unix socket ", socket_path));
  }
  if (chmod(socket_path.c_str(), 0600) != 0) {
    return persist::ErrnoError(errno, "trainer link: chmod 0600", socket_path);
  }
  SWARM_LOG_INFO("trainer link on %s (%s mode)", socket_path,
                 config.trainer().mode());

  if (config.trainer().mode() == "launch") {
    TrainerProcessOptions process;
    process.argv.assign(config.trainer().command().begin(),
                        config.trainer().command().end());
    process.working_dir = config.trainer().working_dir();
    process.env.insert(config.trainer().env().begin(),
                       config.trainer().env().end());
    process.env[kSocketEnv] = socket_path;
    process.env["SWARM_SITE"] = config.name();
    process.first_backoff =
        MillisOr(config.trainer().restart_backoff_ms(), absl::Seconds(1));
    TrainerLink* link = learner->link_.get();
    learner->process_ = std::make_unique<TrainerProcess>(
        process, [link](int64_t pid, const std::string& how) {
          link->TrainerExited(pid, how);
        });
    learner->process_->Start();
  }
  return learner;
}

ExternalLearner::~ExternalLearner() { Shutdown(); }

void ExternalLearner::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (process_ != nullptr) process_->Stop();
  if (link_ != nullptr) link_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
    server_->Wait();
  }
  unlink(socket_path_.c_str());
}

void ExternalLearner::SetJobView(std::function<JobView()> view) {
  link_->SetJobView(std::move(view));
}

std::string ExternalLearner::WaitingFor() { return link_->WaitingFor(); }

void ExternalLearner::SetWaitingListener(std::function<void()> changed) {
  link_->SetWaitingListener(std::move(changed));
}

absl::StatusOr<Model> ExternalLearner::InitialModel() {
  return link_->InitialModel();
}

absl::StatusOr<Metrics> ExternalLearner::Validate(const Model& global,
                                                  uint32_t round) {
  return link_->Validate(global, round);
}

absl::StatusOr<TrainOutput> ExternalLearner::Train(
    const Model& global, uint32_t round, const std::atomic<bool>& cancel) {
  return link_->Train(global, round, cancel);
}

absl::Status ExternalLearner::ConfigureForJob(
    const std::map<std::string, std::string>& job_params) {
  link_->SetParams(MergeLearnerParams(config_.learner(), job_params));
  return absl::OkStatus();
}

absl::Status ExternalLearner::ConfigureJob(const v1::JobConfig& job) {
  link_->SetRequireDp(job.require_dp());
  return ConfigureForJob(std::map<std::string, std::string>(
      job.learner_params().begin(), job.learner_params().end()));
}

}  // namespace swarm::trainerlink
