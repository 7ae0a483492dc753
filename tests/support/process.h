// A small process harness for the tests (and the benches): starts a program
// with fork/exec, reads lines from its stdout, sends it signals and waits for
// it, all with deadlines. A child dies with the test process
// (PR_SET_PDEATHSIG), and a Process still running when destroyed is killed and
// reaped, so no daemon outlives a test.
#ifndef SWARM_TESTS_SUPPORT_PROCESS_H_
#define SWARM_TESTS_SUPPORT_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace swarm::testing {

// How a process ended.
struct ExitInfo {
  bool exited = false;  // Exited normally (exit_code valid).
  int exit_code = -1;
  int signal = 0;  // Killed by this signal when !exited.
  std::string ToString() const;
};

class Process {
 public:
  // Runs argv[0] (a path) with `argv`. stdout goes to a pipe that ReadLine
  // reads when `stdout_path` is empty, else to that file; stderr goes to
  // `stderr_path` (appended). The environment is inherited.
  static absl::StatusOr<std::unique_ptr<Process>> Start(
      const std::vector<std::string>& argv, const std::string& stdout_path,
      const std::string& stderr_path);

  ~Process();  // Kills (SIGKILL) and reaps the process if still running.
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return !exit_.has_value(); }

  // The next line of the stdout pipe (without '\n'). DeadlineExceeded at
  // `deadline`; OutOfRange at end of file.
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);

  absl::Status Signal(int signal);
  // Waits until the process ends; DeadlineExceeded at `deadline` (the
  // process keeps running).
  absl::StatusOr<ExitInfo> Wait(absl::Time deadline);
  // SIGKILL and reap. Safe to call on a process that already ended.
  void Kill();

 private:
  Process(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}
  // Reaps the process if it ended (non-blocking).
  bool Poll();

  const pid_t pid_;
  int stdout_fd_;  // -1 when stdout goes to a file.
  std::string buffer_;
  std::optional<ExitInfo> exit_;
};

// A finished command.
struct CommandResult {
  ExitInfo exit;
  bool timed_out = false;
  std::string out;
  std::string err;
  // "exit 2; stdout: ...; stderr: ..." for failure messages.
  std::string ToString() const;
  // The exit code, or -1 when the command did not exit normally.
  int code() const { return exit.exited && !timed_out ? exit.exit_code : -1; }
};

// Runs `argv` to completion with stdout and stderr captured through files
// named `<capture_prefix>.out` / `.err`; kills it at `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::string& capture_prefix,
                         absl::Duration timeout);

// Whole file as a string; empty when unreadable.
std::string ReadFileOrEmpty(const std::string& path);
// The last `lines` lines of `text`.
std::string LastLines(const std::string& text, int lines);

}  // namespace swarm::testing

#endif  // SWARM_TESTS_SUPPORT_PROCESS_H_
