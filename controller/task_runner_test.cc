// ThreadPoolRunner: due tasks run at once and in parallel, timed tasks run
// at their time (not before, and not much after, whatever else is posted),
// and destruction does not wait for future tasks.
#include "controller/task_runner.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

// A count to wait for, with a bound. (Not Latch or
// BlockingCounter: their waits run inside Debian's uninstrumented Abseil,
// where ThreadSanitizer cannot follow them; Mutex::AwaitWithDeadline is
// annotated, see common/tsan_absl_shim.cc.)
class Latch {
 public:
  explicit Latch(int count = 1) : count_(count) {}
  void CountDown() {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  bool WaitFor(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ <= 0; };
    return mu_.AwaitWithDeadline(absl::Condition(&done), absl::Now() + timeout);
  }
  void Wait() { WaitFor(absl::InfiniteDuration()); }

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_);
};

// Generous for a loaded 2-core machine under sanitizers; the faults this
// catches (a lost wake) leave the task unrun for good, or until the next
// unrelated post.
constexpr absl::Duration kSlack = absl::Seconds(5);

TEST(ThreadPoolRunnerTest, RunsEveryPostedTask) {
  std::atomic<int> ran{0};
  Latch done(1000);
  {
    ThreadPoolRunner runner(4);
    for (int i = 0; i < 1000; ++i) {
      runner.Post([&] {
        ran.fetch_add(1);
        done.CountDown();
      });
    }
    done.Wait();
  }
  EXPECT_EQ(ran.load(), 1000);
}

// Two due tasks that each wait for the other complete only if two workers
// run them at once: a post must not leave an idle worker asleep.
TEST(ThreadPoolRunnerTest, DueTasksRunInParallel) {
  ThreadPoolRunner runner(3);
  for (int trial = 0; trial < 50; ++trial) {
    Latch a_started, b_started;
    Latch finished(2);
    runner.Post([&] {
      a_started.CountDown();
      EXPECT_TRUE(b_started.WaitFor(kSlack));
      finished.CountDown();
    });
    runner.Post([&] {
      b_started.CountDown();
      EXPECT_TRUE(a_started.WaitFor(kSlack));
      finished.CountDown();
    });
    finished.Wait();
  }
}

TEST(ThreadPoolRunnerTest, TimedTaskRunsAtItsTimeNotBefore) {
  ThreadPoolRunner runner(2);
  const absl::Time when = absl::Now() + absl::Milliseconds(200);
  Latch ran;
  absl::Time ran_at;
  runner.PostAt(when, [&] {
    ran_at = absl::Now();
    ran.CountDown();
  });
  ASSERT_TRUE(ran.WaitFor(absl::Milliseconds(200) + kSlack));
  EXPECT_GE(ran_at, when);
}

// The watcher sleeps until the earliest time it knew; an earlier task posted
// later must wake it rather than wait behind the later deadline.
TEST(ThreadPoolRunnerTest, EarlierTimedTaskIsNotHeldBehindALaterOne) {
  ThreadPoolRunner runner(2);
  runner.PostAfter(absl::Hours(1), [] {});
  absl::SleepFor(absl::Milliseconds(20));  // The watcher is asleep.
  Latch ran;
  const absl::Time posted = absl::Now();
  runner.PostAfter(absl::Milliseconds(50), [&] { ran.CountDown(); });
  ASSERT_TRUE(ran.WaitFor(kSlack));
  EXPECT_LT(absl::Now() - posted, absl::Seconds(2));
}

// A timed task posted right behind a due one is not the queue's first when
// posted, yet comes before the time the watcher sleeps until: the watcher
// must still be told. (This once held a learn task back for 20 s: one
// worker watched a far timer, another took the due task, nobody watched the
// near one.)
TEST(ThreadPoolRunnerTest, TimedTaskPostedBehindADueOneIsNotHeld) {
  ThreadPoolRunner runner(3);
  runner.PostAfter(absl::Hours(1), [] {});
  absl::SleepFor(absl::Milliseconds(20));  // One worker watches it.
  for (int trial = 0; trial < 20; ++trial) {
    Latch ran;
    const absl::Time posted = absl::Now();
    // From a task, as the controller posts: a due task, then a timed one
    // while the due one is still queued.
    runner.Post([&] {
      runner.Post([] {});
      runner.PostAfter(absl::Milliseconds(5), [&] { ran.CountDown(); });
    });
    ASSERT_TRUE(ran.WaitFor(kSlack)) << trial;
    EXPECT_LT(absl::Now() - posted, absl::Seconds(2)) << trial;
  }
}

// Timers keep firing while due work streams through, and while the worker
// that watched the time is busy with a long task.
TEST(ThreadPoolRunnerTest, TimersFireWhileWorkersAreBusy) {
  ThreadPoolRunner runner(2);
  Latch release;
  // Occupies one worker for the whole test.
  runner.Post([&] { release.Wait(); });
  std::atomic<int> fired{0};
  Latch timers(20);
  for (int i = 0; i < 20; ++i) {
    runner.PostAfter(absl::Milliseconds(10 * i), [&] {
      fired.fetch_add(1);
      timers.CountDown();
    });
    runner.Post([] {});
  }
  Latch all;
  std::thread waiter([&] {
    timers.Wait();
    all.CountDown();
  });
  const bool in_time = all.WaitFor(kSlack);
  release.CountDown();
  if (!in_time) timers.Wait();  // Let the waiter finish before failing.
  waiter.join();
  EXPECT_TRUE(in_time) << "fired " << fired.load() << " of 20";
}

// Posts from inside tasks (the controller's continuations) at many times,
// from several threads at once: each runs exactly once.
TEST(ThreadPoolRunnerTest, ConcurrentPostsOfMixedTimesAllRun) {
  constexpr int kThreads = 4;
  constexpr int kEach = 300;
  std::atomic<int> ran{0};
  Latch done(kThreads * kEach * 2);
  ThreadPoolRunner runner(3);
  std::vector<std::thread> posters;
  for (int t = 0; t < kThreads; ++t) {
    posters.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        runner.PostAfter(absl::Microseconds((i * 37 + t * 11) % 3000), [&] {
          ran.fetch_add(1);
          done.CountDown();
          runner.Post([&] {
            ran.fetch_add(1);
            done.CountDown();
          });
        });
      }
    });
  }
  for (std::thread& poster : posters) poster.join();
  done.Wait();
  EXPECT_EQ(ran.load(), kThreads * kEach * 2);
}

TEST(ThreadPoolRunnerTest, DestructionDoesNotWaitForFutureTasks) {
  const absl::Time start = absl::Now();
  bool ran = false;
  {
    ThreadPoolRunner runner(4);
    runner.PostAfter(absl::Hours(1), [&ran] { ran = true; });
  }
  EXPECT_FALSE(ran);
  EXPECT_LT(absl::Now() - start, kSlack);
}

}  // namespace
}  // namespace swarm
