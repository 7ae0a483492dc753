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
          // Wake at the next task's time, or when something is posted.
          const size_t size = queue_.size();
          auto changed = [this, size]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
            return stopping_ || queue_.size() != size;
          };
          mu_.AwaitWithDeadline(absl::Condition(&changed), next);
        } else {
          auto posted = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
            return stopping_ || !queue_.empty();
          };
          mu_.Await(absl::Condition(&posted));
        }
      }
      task = queue_.Pop();
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
