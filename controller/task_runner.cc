#include "controller/task_runner.h"

#include <utility>

namespace swarm {

void TaskQueue::Push(absl::Time when, std::function<void()> task) {
  heap_.push(Entry{when, next_seq_++, std::move(task)});
}

std::function<void()> TaskQueue::Pop() {
  // priority_queue::top is const; the entry is moved out before pop.
  std::function<void()> task = std::move(const_cast<Entry&>(heap_.top()).task);
  heap_.pop();
  return task;
}

ThreadPoolRunner::ThreadPoolRunner(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this] { Work(); });
  }
}

ThreadPoolRunner::~ThreadPoolRunner() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    due_.SignalAll();
    timer_.SignalAll();
  }
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPoolRunner::Post(std::function<void()> task) {
  PostAt(absl::InfinitePast(), std::move(task));
}

void ThreadPoolRunner::PostAt(absl::Time when, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  queue_.Push(when, std::move(task));
  if (when <= absl::Now()) {
    // Due: an idle worker takes it, else the watcher does (a busy worker
    // takes over the watch when it is done).
    if (!WakeIdle() && watching_) timer_.Signal();
  } else {
    WatchFor(when);
  }
}

void ThreadPoolRunner::WatchFor(absl::Time when) {
  if (!watching_) {
    WakeIdle();  // It becomes the watcher.
  } else if (when < watch_until_) {
    timer_.Signal();  // The watcher sleeps until later: it looks again.
  }
}

bool ThreadPoolRunner::WakeIdle() {
  // A worker signalled but not yet running counts as idle until it runs:
  // signal only if some idle worker is not already woken.
  if (idle_ <= wakes_) return false;
  ++wakes_;
  due_.Signal();
  return true;
}

void ThreadPoolRunner::Work() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        if (stopping_) return;
        if (!queue_.empty()) {
          const absl::Time next = queue_.next_time();
          if (next <= absl::Now()) break;
          if (!watching_) {
            watching_ = true;
            watch_until_ = next;
            timer_.WaitWithDeadline(&mu_, next);
            watching_ = false;
            continue;
          }
        }
        ++idle_;
        due_.Wait(&mu_);
        --idle_;
        // Woken by a signal, or spuriously (then it takes a signalled
        // worker's place: the count of workers on their way stays right).
        if (wakes_ > 0) --wakes_;
      }
      task = queue_.Pop();
      // What is left needs a worker while this one runs `task`: one more
      // due task, or a watcher for the next time (nobody watches, or the
      // watcher sleeps past it: it was posted behind due tasks).
      if (!queue_.empty()) {
        const absl::Time next = queue_.next_time();
        if (next <= absl::Now()) {
          WakeIdle();
        } else {
          WatchFor(next);
        }
      }
    }
    task();
  }
}

int ManualRunner::AdvanceTo(absl::Time until) {
  int ran = 0;
  while (!queue_.empty() && queue_.next_time() <= until) {
    now_ = std::max(now_, queue_.next_time());
    std::function<void()> task = queue_.Pop();
    task();
    ++ran;
  }
  now_ = std::max(now_, until);
  return ran;
}

int ManualRunner::RunUntilIdle(int limit) {
  int ran = 0;
  while (!queue_.empty() && ran < limit) {
    now_ = std::max(now_, queue_.next_time());
    std::function<void()> task = queue_.Pop();
    task();
    ++ran;
  }
  return ran;
}

}  // namespace swarm
