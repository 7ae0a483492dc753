// Cancels model streams that run longer than allowed, so a stalled sender
// cannot hold a call (and what it has assembled so far) forever, and
// forwarded streams whose next hop stopped taking frames. One thread sleeps
// until the earliest deadline.
#ifndef SWARM_RPC_STREAM_WATCHDOG_H_
#define SWARM_RPC_STREAM_WATCHDOG_H_

#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace swarm {

class StreamWatchdog {
 public:
  StreamWatchdog();
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Cancels the call of `context` at `deadline` unless forgotten first.
  // REQUIRES: Forget(context) before the context goes away.
  void Watch(grpc::ServerContextBase* context, absl::Time deadline);

  // Runs `cancel` on the watchdog's thread at `deadline` unless `key` is
  // forgotten or watched again first; `what` is logged (empty: nothing is:
  // a timer that decides for itself). Watching a key again
  // moves its deadline. The watchdog's lock is not held while `cancel` runs
  // (it may call back into the watchdog, as gRPC reactions that a cancel
  // runs inline do), so `cancel` must own what it touches: Forget does not
  // wait for it.
  void Watch(const void* key, absl::Time deadline, std::string what,
             std::function<void()> cancel);

  // For a server context: returns once a running cancel of `key` has
  // finished.
  void Forget(const void* key);
  void Forget(grpc::ServerContextBase* context) {
    Forget(static_cast<const void*>(context));
  }

 private:
  struct Watched {
    absl::Time deadline;
    std::string what;
    std::function<void()> cancel;
    // A server context's cancel runs under the lock (Forget waits for it).
    bool under_lock = false;
  };
  void Run();

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped by every change, so that the thread looks again.
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const void*, Watched> watched_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace swarm

#endif  // SWARM_RPC_STREAM_WATCHDOG_H_
