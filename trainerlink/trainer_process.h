// TrainerProcess: launch mode's supervisor. Starts the trainer command (in
// its own process group, with a clean signal mask and the given environment
// added), restarts it with exponential backoff whenever it exits, and stops it
// (SIGTERM to the group, SIGKILL after a grace period) on Stop.
#ifndef SWARM_TRAINERLINK_TRAINER_PROCESS_H_
#define SWARM_TRAINERLINK_TRAINER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace swarm::trainerlink {

struct TrainerProcessOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH.
  std::string working_dir;        // Empty: the daemon's.
  std::map<std::string, std::string> env;  // Added to the daemon's.
  absl::Duration first_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Seconds(30);
  // A run at least this long resets the backoff to first_backoff.
  absl::Duration healthy_run = absl::Seconds(60);
  absl::Duration stop_grace = absl::Seconds(5);
};

class TrainerProcess {
 public:
  // `on_exit(pid, how)` runs on the supervisor thread after each exit.
  TrainerProcess(TrainerProcessOptions options,
                 std::function<void(int64_t, const std::string&)> on_exit);
  ~TrainerProcess();  // Stop().
  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;

  // Starts the supervisor (and the first run of the command).
  void Start();
  // Stops the trainer and the supervisor; returns when both are gone.
  void Stop();
  // The running trainer's pid, or 0.
  pid_t pid();
  // Runs started so far (1 after the first start).
  int starts();

 private:
  void Supervise();
  absl::StatusOr<pid_t> Spawn();

  const TrainerProcessOptions options_;
  const std::function<void(int64_t, const std::string&)> on_exit_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  pid_t child_ ABSL_GUARDED_BY(mu_) = 0;
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace swarm::trainerlink

#endif  // SWARM_TRAINERLINK_TRAINER_PROCESS_H_
