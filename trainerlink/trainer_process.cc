#include "trainerlink/trainer_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

extern char** environ;

namespace swarm::trainerlink {
namespace {

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended (wait status ", status, ")");
}

}  // namespace

TrainerProcess::TrainerProcess(
    TrainerProcessOptions options,
    std::function<void(int64_t, const std::string&)> on_exit)
    : options_(std::move(options)), on_exit_(std::move(on_exit)) {}

TrainerProcess::~TrainerProcess() { Stop(); }

void TrainerProcess::Start() {
  thread_ = std::thread([this] { Supervise(); });
}

pid_t TrainerProcess::pid() {
  absl::MutexLock lock(&mu_);
  return child_;
}

int TrainerProcess::starts() {
  absl::MutexLock lock(&mu_);
  return starts_;
}

absl::StatusOr<pid_t> TrainerProcess::Spawn() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq == nullptr) continue;
    env[std::string(*e, eq - *e)] = eq + 1;
  }
  for (const auto& [key, value] : options_.env) env[key] = value;
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options_.argv;
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options_.working_dir.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions,
                                         options_.working_dir.c_str());
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(),
                               envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start trainer command [", absl::StrJoin(args, " "),
                     "]", options_.working_dir.empty() ? "" : " in ",
                     options_.working_dir, ": ", strerror(err)));
  }
  return pid;
}

void TrainerProcess::Supervise() {
  absl::Duration backoff = options_.first_backoff;
  while (true) {
    const absl::Time started = absl::Now();
    absl::StatusOr<pid_t> child;
    {
      // Spawned under the lock, so Stop either prevents the start or sees
      // the child.
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      child = Spawn();
      if (child.ok()) {
        child_ = *child;
        ++starts_;
      }
    }
    std::string how;
    if (child.ok()) {
      SWARM_LOG_INFO("trainer started: pid %d, [%s]", *child,
                     absl::StrJoin(options_.argv, " "));
      int status = 0;
      while (waitpid(*child, &status, 0) < 0 && errno == EINTR) {
      }
      how = DescribeExit(status);
      {
        absl::MutexLock lock(&mu_);
        child_ = 0;
      }
      on_exit_(*child, how);
    } else {
      how = std::string(child.status().message());
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (absl::Now() - started >= options_.healthy_run) {
      backoff = options_.first_backoff;
    }
    SWARM_LOG_WARNING("trainer %s; restarting in %s", how,
                      absl::FormatDuration(backoff));
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    if (stopping_) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void TrainerProcess::Stop() {
  pid_t pid = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    pid = child_;
  }
  if (pid > 0) {
    kill(-pid, SIGTERM);
    absl::MutexLock lock(&mu_);
    auto gone = [this, pid]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return child_ != pid;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&gone), options_.stop_grace)) {
      SWARM_LOG_WARNING("trainer pid %d did not stop within %s: killing it",
                        pid, absl::FormatDuration(options_.stop_grace));
      kill(-pid, SIGKILL);
    }
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace swarm::trainerlink
