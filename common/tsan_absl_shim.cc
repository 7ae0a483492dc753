// ThreadSanitizer support for Debian's (uninstrumented) Abseil Mutex.
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer and Debian's Abseil. libabsl_synchronization is built
// without TSan: its Mutex parks threads on futexes, which TSan does not
// model, so TSan sees no ordering between critical sections and reports
// every access to guarded data (thousands of false races per test). The
// Mutex calls a binary makes are therefore wrapped here with TSan's mutex
// annotations and forwarded to the library (found with dlsym(RTLD_NEXT)):
// (This file is compiled into swarm_common only in ThreadSanitizer builds,
// so every binary that uses Abseil's Mutex gets it.)
// Lock/Unlock/TryLock as such, and Await[WithDeadline] and CondVar's waits
// as an unlock before the wait and a lock after it (the library releases the
// mutex while waiting; conditions it evaluates meanwhile are inside the
// annotated region, where TSan ignores accesses, as in an instrumented Abseil).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdlib>

namespace absl {
namespace {

template <typename Function>
Function RealAbsl(const char* symbol) {
  void* function = dlsym(RTLD_NEXT, symbol);
  if (function == nullptr) std::abort();
  return reinterpret_cast<Function>(function);
}

// Runs `take`, a library call that returns holding `mu`: annotated as a
// lock.
template <typename Take>
auto Locking(Mutex* mu, Take take) {
  __tsan_mutex_pre_lock(mu, 0);
  struct Taken {
    Mutex* mu;
    ~Taken() { __tsan_mutex_post_lock(mu, 0, 0); }
  } taken{mu};
  return take();
}

// Runs `wait`, a library call that releases `mu` while it waits and takes it
// again before it returns: annotated as an unlock, then a lock.
template <typename Wait>
auto Released(Mutex* mu, Wait wait) {
  __tsan_mutex_pre_unlock(mu, 0);
  struct Retaken {
    Mutex* mu;
    ~Retaken() {
      __tsan_mutex_post_unlock(mu, 0);
      __tsan_mutex_pre_lock(mu, 0);
      __tsan_mutex_post_lock(mu, 0, 0);
    }
  } retaken{mu};
  return wait();
}

}  // namespace

void Mutex::Lock() {
  static const auto real =
      RealAbsl<void (*)(Mutex*)>("_ZN4absl7debian35Mutex4LockEv");
  Locking(this, [&] { real(this); });
}

void Mutex::Unlock() {
  static const auto real =
      RealAbsl<void (*)(Mutex*)>("_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

bool Mutex::TryLock() {
  static const auto real =
      RealAbsl<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex7TryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
      0);
  return locked;
}

void Mutex::Await(const Condition& condition) {
  static const auto real = RealAbsl<void (*)(Mutex*, const Condition&)>(
      "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Released(this, [&] { real(this, condition); });
}

bool Mutex::AwaitWithDeadline(const Condition& condition, Time deadline) {
  static const auto real = RealAbsl<bool (*)(Mutex*, const Condition&, Time)>(
      "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_"
      "4TimeE");
  return Released(this, [&] { return real(this, condition, deadline); });
}

// LockWhen[WithDeadline] (Notification's waits use them): a lock once they
// return (the timed form holds the mutex whether or not the condition became
// true). The *WithTimeout forms are not wrapped: the library forwards them
// to the *WithDeadline ones through the PLT, so they reach the wrappers.
void Mutex::LockWhen(const Condition& condition) {
  static const auto real = RealAbsl<void (*)(Mutex*, const Condition&)>(
      "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, [&] { real(this, condition); });
}

bool Mutex::LockWhenWithDeadline(const Condition& condition, Time deadline) {
  static const auto real = RealAbsl<bool (*)(Mutex*, const Condition&, Time)>(
      "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_"
      "4TimeE");
  return Locking(this, [&] { return real(this, condition, deadline); });
}

// CondVar waits release `mu` inside the library and take it again before
// they return: annotated like Await.
void CondVar::Wait(Mutex* mu) {
  static const auto real = RealAbsl<void (*)(CondVar*, Mutex*)>(
      "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Released(mu, [&] { real(this, mu); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto real = RealAbsl<bool (*)(CondVar*, Mutex*, Time)>(
      "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Released(mu, [&] { return real(this, mu, deadline); });
}

}  // namespace absl
#endif  // __SANITIZE_THREAD__
