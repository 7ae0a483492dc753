// What PeerService's files share (not part of its interface).
#ifndef SWARM_RPC_PEER_SERVICE_INTERNAL_H_
#define SWARM_RPC_PEER_SERVICE_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/time/time.h"

namespace swarm {

// How much earlier than its own deadline a forwarding site's call to the
// next hop ends, so that its answer (for itself and the hops after it)
// still reaches the previous hop in time.
inline constexpr absl::Duration kRelayMargin = absl::Seconds(1);

// The call's deadline (InfiniteFuture: none).
inline absl::Time CallDeadline(const grpc::ServerContextBase* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace swarm

#endif  // SWARM_RPC_PEER_SERVICE_INTERNAL_H_
