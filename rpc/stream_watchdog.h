// Cancels model streams that run longer than allowed, so a stalled sender
// cannot hold a call (and what it has assembled so far) forever. One thread
// sleeps until the earliest deadline.
#ifndef SWARM_RPC_STREAM_WATCHDOG_H_
#define SWARM_RPC_STREAM_WATCHDOG_H_

#include <map>
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
  void Forget(grpc::ServerContextBase* context);

 private:
  void Run();

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<grpc::ServerContextBase*, absl::Time> watched_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace swarm

#endif  // SWARM_RPC_STREAM_WATCHDOG_H_
