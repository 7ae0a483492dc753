// Where the controller's work runs: tasks posted now or for later.
//
// The controller never sleeps and never blocks waiting for another task: it
// posts continuations. ThreadPoolRunner runs them on worker threads with a
// real clock; ManualRunner runs them one by one on the caller's thread under
// virtual time, so simulations are deterministic.
#ifndef SWARM_CONTROLLER_TASK_RUNNER_H_
#define SWARM_CONTROLLER_TASK_RUNNER_H_

#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace swarm {

class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  virtual absl::Time Now() = 0;
  // Runs `task` soon, on some worker.
  virtual void Post(std::function<void()> task) = 0;
  // Runs `task` at or after `when`.
  virtual void PostAt(absl::Time when, std::function<void()> task) = 0;
  void PostAfter(absl::Duration delay, std::function<void()> task) {
    PostAt(Now() + delay, std::move(task));
  }
};

// Tasks ordered by time, then by posting order.
class TaskQueue {
 public:
  struct Entry {
    absl::Time when;
    uint64_t seq;
    std::function<void()> task;
  };
  void Push(absl::Time when, std::function<void()> task);
  bool empty() const { return heap_.empty(); }
  absl::Time next_time() const { return heap_.top().when; }
  std::function<void()> Pop();
  size_t size() const { return heap_.size(); }

 private:
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.when != b.when ? a.when > b.when : a.seq > b.seq;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, Later> heap_;
  uint64_t next_seq_ = 0;
};

// Worker threads and a real clock. Destruction runs no further tasks and
// joins the workers (tasks already running finish).
//
// A post wakes at most one worker: an idle one when the task is due, or the
// one worker that watches the earliest future task's time when the new task
// comes before it. The other idle workers sleep on; a daemon posts several
// tasks a round per peer, and waking every idle worker for each was most of
// its context switches.
class ThreadPoolRunner final : public TaskRunner {
 public:
  explicit ThreadPoolRunner(int num_threads);
  ~ThreadPoolRunner() override;
  ThreadPoolRunner(const ThreadPoolRunner&) = delete;
  ThreadPoolRunner& operator=(const ThreadPoolRunner&) = delete;

  absl::Time Now() override { return absl::Now(); }
  void Post(std::function<void()> task) override;
  void PostAt(absl::Time when, std::function<void()> task) override;

 private:
  void Work();

  // REQUIRES: mu_ held. Wakes one idle worker not already woken, if any
  // (returns whether it did), for a due task.
  bool WakeIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. Makes sure a worker will wake by `when`: recruits a
  // watcher, or wakes the one that sleeps past it.
  void WatchFor(absl::Time when) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  TaskQueue queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Idle workers with no time to watch wait on `due_`; the one worker that
  // waits for the earliest future task's time (`watching_`) on `timer_`.
  absl::CondVar due_;
  absl::CondVar timer_;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;   // Waiting on `due_`.
  int wakes_ ABSL_GUARDED_BY(mu_) = 0;  // Signals to `due_` not yet taken.
  bool watching_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time watch_until_ ABSL_GUARDED_BY(mu_);  // While watching_.
  std::vector<std::thread> threads_;
};

// Virtual time; tasks run only inside RunUntilIdle / AdvanceTo, on the
// caller's thread, in time order. Thread-compatible, not thread-safe: post
// only from the thread that runs it (tasks may post more tasks).
class ManualRunner final : public TaskRunner {
 public:
  explicit ManualRunner(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  ManualRunner(const ManualRunner&) = delete;
  ManualRunner& operator=(const ManualRunner&) = delete;

  absl::Time Now() override { return now_; }
  void Post(std::function<void()> task) override {
    PostAt(now_, std::move(task));
  }
  void PostAt(absl::Time when, std::function<void()> task) override {
    queue_.Push(std::max(when, now_), std::move(task));
  }

  // Runs tasks due by `until`, moving the clock to each task's time, then
  // sets the clock to `until`. Returns the number of tasks run.
  int AdvanceTo(absl::Time until);
  // Runs tasks (moving the clock forward as needed) until none is left or
  // `limit` tasks ran. Returns the number run.
  int RunUntilIdle(int limit = 1000000);
  size_t pending() const { return queue_.size(); }

 private:
  absl::Time now_;
  TaskQueue queue_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_TASK_RUNNER_H_
