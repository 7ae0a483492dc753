#include "tests/support/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace swarm::testing {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

ExitInfo FromWaitStatus(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) {
    info.exited = true;
    info.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    info.signal = WTERMSIG(status);
  }
  return info;
}

// How long Wait sleeps between checks. Test harness only: waitpid has no
// timeout, and a few milliseconds of latency do not matter here.
constexpr absl::Duration kWaitPollInterval = absl::Milliseconds(5);

}  // namespace

std::string ExitInfo::ToString() const {
  if (exited) return absl::StrCat("exit ", exit_code);
  if (signal != 0) {
    return absl::StrCat("killed by signal ", signal, " (", strsignal(signal),
                        ")");
  }
  return "still running";
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(
    const std::vector<std::string>& argv, const std::string& stdout_path,
    const std::string& stderr_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  // Everything the child needs is prepared before fork: after fork, in a
  // multithreaded parent, only async-signal-safe calls are allowed.
  std::vector<char*> args;
  for (const std::string& arg : argv)
    args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);

  int out_pipe[2] = {-1, -1};
  int out_fd = -1;
  if (stdout_path.empty()) {
    if (pipe2(out_pipe, O_CLOEXEC) != 0) return Errno("pipe2");
  } else {
    out_fd = open(stdout_path.c_str(),
                  O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out_fd < 0) return Errno(absl::StrCat("open ", stdout_path));
  }
  const int err_fd = open(stderr_path.c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    const absl::Status status = Errno(absl::StrCat("open ", stderr_path));
    if (out_fd >= 0) close(out_fd);
    if (out_pipe[0] >= 0) {
      close(out_pipe[0]);
      close(out_pipe[1]);
    }
    return status;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const absl::Status status = Errno("fork");
    close(err_fd);
    if (out_fd >= 0) close(out_fd);
    if (out_pipe[0] >= 0) {
      close(out_pipe[0]);
      close(out_pipe[1]);
    }
    return status;
  }
  if (pid == 0) {
    // Child. Die with the test, even if it crashes.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int child_out = stdout_path.empty() ? out_pipe[1] : out_fd;
    if (dup2(child_out, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0) {
      _exit(127);
    }
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(err_fd);
  if (out_fd >= 0) close(out_fd);
  if (out_pipe[1] >= 0) close(out_pipe[1]);
  return std::unique_ptr<Process>(new Process(pid, out_pipe[0]));
}

Process::~Process() {
  Kill();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

bool Process::Poll() {
  if (exit_.has_value()) return true;
  int status = 0;
  const pid_t done = waitpid(pid_, &status, WNOHANG);
  if (done == pid_) {
    exit_ = FromWaitStatus(status);
    return true;
  }
  return false;
}

absl::StatusOr<std::string> Process::ReadLine(absl::Time deadline) {
  if (stdout_fd_ < 0) {
    return absl::FailedPreconditionError("stdout is not a pipe");
  }
  while (true) {
    const size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no line from pid ", pid_, " in time (so far: \"", buffer_, "\")"));
    }
    pollfd fd = {stdout_fd_, POLLIN, 0};
    const int ready = poll(&fd, 1,
                           static_cast<int>(std::min<int64_t>(
                               absl::ToInt64Milliseconds(left) + 1, 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Errno("poll");
    }
    if (ready == 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("read");
    }
    if (n == 0) {
      return absl::OutOfRangeError(absl::StrCat(
          "pid ", pid_, " closed stdout (so far: \"", buffer_, "\")"));
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

absl::Status Process::Signal(int signal) {
  if (Poll()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pid ", pid_, " already ended: ", exit_->ToString()));
  }
  if (kill(pid_, signal) != 0) return Errno("kill");
  return absl::OkStatus();
}

absl::StatusOr<ExitInfo> Process::Wait(absl::Time deadline) {
  while (!Poll()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(kWaitPollInterval);
  }
  return *exit_;
}

void Process::Kill() {
  if (Poll()) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_ = FromWaitStatus(status);
}

std::string CommandResult::ToString() const {
  return absl::StrCat(timed_out ? "timed out; " : "", exit.ToString(),
                      "\n--- stdout:\n", out, "--- stderr:\n", err);
}

CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::string& capture_prefix,
                         absl::Duration timeout) {
  CommandResult result;
  const std::string out_path = absl::StrCat(capture_prefix, ".out");
  const std::string err_path = absl::StrCat(capture_prefix, ".err");
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  absl::StatusOr<std::unique_ptr<Process>> process =
      Process::Start(argv, out_path, err_path);
  if (!process.ok()) {
    result.err = std::string(process.status().message());
    return result;
  }
  absl::StatusOr<ExitInfo> exit = (*process)->Wait(absl::Now() + timeout);
  if (!exit.ok()) {
    result.timed_out = true;
    (*process)->Kill();
    exit = (*process)->Wait(absl::InfiniteFuture());
  }
  result.exit = *exit;
  result.out = ReadFileOrEmpty(out_path);
  result.err = ReadFileOrEmpty(err_path);
  return result;
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string LastLines(const std::string& text, int lines) {
  std::vector<absl::string_view> all =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  const size_t from =
      all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

}  // namespace swarm::testing
