#include "rpc/stream_watchdog.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace swarm {

StreamWatchdog::StreamWatchdog() : thread_([state = state_] { Run(*state); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
  }
  if (thread_.get_id() == std::this_thread::get_id()) {
    // The last reference went on the watchdog's own thread (a cancel let
    // the last stream go): the thread ends by itself once the cancel
    // returns, holding its State.
    thread_.detach();
  } else {
    thread_.join();
  }
}

void StreamWatchdog::Watch(grpc::ServerContextBase* context,
                           absl::Time deadline) {
  absl::MutexLock lock(&state_->mu);
  state_->watched[context] = Watched{
      deadline,
      absl::StrCat("a model stream from ", context->peer(), ": too slow"),
      [context] { context->TryCancel(); }, /*under_lock=*/true};
  ++state_->version;
}

void StreamWatchdog::Watch(const void* key, absl::Time deadline,
                           std::string what, std::function<void()> cancel) {
  absl::MutexLock lock(&state_->mu);
  state_->watched[key] = Watched{deadline, std::move(what), std::move(cancel)};
  ++state_->version;
}

void StreamWatchdog::Forget(const void* key) {
  absl::MutexLock lock(&state_->mu);
  if (state_->watched.erase(key) > 0) ++state_->version;
}

void StreamWatchdog::Run(State& state) {
  absl::MutexLock lock(&state.mu);
  while (!state.stopping) {
    absl::Time next = absl::InfiniteFuture();
    const absl::Time now = absl::Now();
    std::vector<std::function<void()>> unlocked;
    for (auto it = state.watched.begin(); it != state.watched.end();) {
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
        it = state.watched.erase(it);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    if (!unlocked.empty()) {
      state.mu.Unlock();
      // The cancels go before the lock is taken again: the last reference
      // to a stream (and through it to this watchdog) may go with them.
      for (std::function<void()>& cancel : unlocked) {
        cancel();
        cancel = nullptr;
      }
      unlocked.clear();
      state.mu.Lock();
      continue;  // The map may have changed meanwhile.
    }
    const uint64_t version = state.version;
    auto changed = [&state, version]() ABSL_SHARED_LOCKS_REQUIRED(state.mu) {
      return state.stopping || state.version != version;
    };
    state.mu.AwaitWithDeadline(absl::Condition(&changed), next);
  }
}

}  // namespace swarm
