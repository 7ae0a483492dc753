// StreamWatchdog's timers and its lifetime: shared by the streams it
// watches, it may lose its last reference on its own thread, inside a
// cancel (a relayed stream let go by the cancel that gave it up, after its
// service is gone).
#include "rpc/stream_watchdog.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

// Waits (bounded) for `done`.
bool WaitFor(const std::function<bool()>& done) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(StreamWatchdogTest, RunsACancelAtItsDeadlineAndNotAForgottenOne) {
  StreamWatchdog watchdog;
  std::atomic<int> fired{0};
  std::atomic<int> forgotten{0};
  int a = 0, b = 0;
  watchdog.Watch(&a, absl::Now() + absl::Milliseconds(20), "",
                 [&fired] { ++fired; });
  watchdog.Watch(&b, absl::Now() + absl::Milliseconds(20), "",
                 [&forgotten] { ++forgotten; });
  watchdog.Forget(&b);
  ASSERT_TRUE(WaitFor([&] { return fired.load() == 1; }));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(forgotten.load(), 0);
  EXPECT_EQ(fired.load(), 1);
}

TEST(StreamWatchdogTest, LastReferenceDroppedByItsOwnCancelEndsCleanly) {
  auto watchdog = std::make_shared<StreamWatchdog>();
  std::weak_ptr<StreamWatchdog> alive = watchdog;
  absl::Notification cancelled;
  int key = 0;
  // The cancel owns a reference (as a relayed stream's does, through the
  // stream); the test lets its own go, so the cancel's is the last one and
  // goes on the watchdog's thread once the cancel has run. Joining its own
  // thread there would abort the process (std::system_error).
  watchdog->Watch(&key, absl::Now() + absl::Milliseconds(10), "",
                  [keep = watchdog, &cancelled] { cancelled.Notify(); });
  watchdog.reset();
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(WaitFor([&] { return alive.expired(); }))
      << "the watchdog outlived its last reference";
}

}  // namespace
}  // namespace swarm
