#include "rpc/stream_watchdog.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
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
  watched_[context] = Watched{
      deadline,
      absl::StrCat("a model stream from ", context->peer(), ": too slow"),
      [context] { context->TryCancel(); }, /*under_lock=*/true};
  ++version_;
}

void StreamWatchdog::Watch(const void* key, absl::Time deadline,
                           std::string what, std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  watched_[key] = Watched{deadline, std::move(what), std::move(cancel)};
  ++version_;
}

void StreamWatchdog::Forget(const void* key) {
  absl::MutexLock lock(&mu_);
  if (watched_.erase(key) > 0) ++version_;
}

void StreamWatchdog::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    const absl::Time now = absl::Now();
    std::vector<std::function<void()>> unlocked;
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (it->second.deadline <= now) {
        if (!it->second.what.empty()) {
          SWARM_LOG_WARNING("cancelling %s", it->second.what);
        }
        if (it->second.under_lock) {
          // Under the lock: Forget (before the call goes away) waits for it.
          it->second.cancel();
        } else {
          unlocked.push_back(std::move(it->second.cancel));
        }
        it = watched_.erase(it);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    if (!unlocked.empty()) {
      mu_.Unlock();
      for (const std::function<void()>& cancel : unlocked) cancel();
      mu_.Lock();
      continue;  // The map may have changed meanwhile.
    }
    const uint64_t version = version_;
    auto changed = [this, version]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || version_ != version;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), next);
  }
}

}  // namespace swarm
