#include "rpc/stream_watchdog.h"

#include <grpcpp/server_context.h>

#include <algorithm>

#include "common/logging.h"

namespace swarm {

StreamWatchdog::StreamWatchdog() : thread_([this] { Run(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StreamWatchdog::Watch(grpc::ServerContextBase* context,
                           absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  watched_[context] = deadline;
}

void StreamWatchdog::Forget(grpc::ServerContextBase* context) {
  absl::MutexLock lock(&mu_);
  watched_.erase(context);
}

void StreamWatchdog::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    const absl::Time now = absl::Now();
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (it->second <= now) {
        // Under the lock: Forget (before the context goes away) waits for it.
        SWARM_LOG_WARNING("cancelling a model stream from %s: too slow",
                          it->first->peer());
        it->first->TryCancel();
        it = watched_.erase(it);
      } else {
        next = std::min(next, it->second);
        ++it;
      }
    }
    const size_t size = watched_.size();
    auto changed = [this, size]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || watched_.size() != size;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), next);
  }
}

}  // namespace swarm
