// Outgoing calls from one site to another, asynchronous: Send returns at
// once and `done` runs when the peer answered or the call failed. Implemented
// over gRPC (rpc/GrpcPeerTransport) and by the in-process fake network.
//
// A transport or authentication failure is a non-OK status; an application
// outcome (retry, rejected, ...) is in the reply. Retrying is the caller's
// business (SiteDriver), never the transport's.
#ifndef SWARM_CONTROLLER_PEER_TRANSPORT_H_
#define SWARM_CONTROLLER_PEER_TRANSPORT_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/peer_message.h"
#include "proto/swarm.pb.h"

namespace swarm {

// How much earlier than its caller's deadline a held call (a RequestToSubmit
// waiting for a slot, a long-polled Status, a Start waiting for the first
// round) answers, so that the answer still reaches the caller in time. One
// margin for every path: PeerService (gRPC), SiteDriver's loopback to the
// site itself, and the fake network.
inline constexpr absl::Duration kHoldMargin = absl::Milliseconds(500);

class PeerTransport {
 public:
  using Done = std::function<void(absl::StatusOr<PeerReply>)>;

  virtual ~PeerTransport() = default;

  // A job was configured: a transport may connect to its sites ahead of the
  // first round (a TLS handshake then does not land inside a round).
  virtual void PrepareForJob(const v1::JobConfig& job) {}

  // Sends `message` to site `to`. `done` runs exactly once, on a thread of
  // the transport's choosing (never inside Send itself), with no lock of the
  // caller's held.
  virtual void Send(const v1::SiteInfo& to, PeerMessage message, Done done) = 0;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_PEER_TRANSPORT_H_
