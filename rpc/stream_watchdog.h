// Cancels model streams that run longer than allowed, so a stalled sender
// cannot hold a call (and what it has assembled so far) forever, and
// forwarded streams whose next hop stopped taking frames. One thread sleeps
// until the earliest deadline.
//
// Shared by the streams it watches (std::shared_ptr): a relayed stream
// forgets itself here when its last owner lets it go, which may be a gRPC
// thread after the service that made it is gone, or this watchdog's own
// thread running the stream's cancel. When that drops the last reference,
// the watchdog is destroyed on its own thread: it then lets the thread end
// by itself (detached) instead of joining it, and the thread's state
// (`State`) lives until the thread ends.
#ifndef SWARM_RPC_STREAM_WATCHDOG_H_
#define SWARM_RPC_STREAM_WATCHDOG_H_

#include <functional>
#include <map>
#include <memory>
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
  // What the thread uses: owned by the watchdog and the thread together.
  struct State {
    absl::Mutex mu;
    bool stopping ABSL_GUARDED_BY(mu) = false;
    // Bumped by every change, so that the thread looks again.
    uint64_t version ABSL_GUARDED_BY(mu) = 0;
    std::map<const void*, Watched> watched ABSL_GUARDED_BY(mu);
  };
  static void Run(State& state);

  const std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace swarm

#endif  // SWARM_RPC_STREAM_WATCHDOG_H_
