// Outgoing calls from one site to another. Implemented over gRPC
// (GrpcPeerTransport) and, for simulations, over an in-process fake network.
//
// Calls block until the peer answered or the call failed; the controller
// makes them from worker tasks only. A transport or authentication failure is
// a non-OK status; an application outcome (retry, rejected, ...) is in the
// reply.
#ifndef SWARM_CONTROLLER_PEER_TRANSPORT_H_
#define SWARM_CONTROLLER_PEER_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {

class PeerTransport {
 public:
  virtual ~PeerTransport() = default;

  // A job was configured: a transport may connect to its sites ahead of the
  // first round (a TLS handshake then does not land inside a round).
  virtual void PrepareForJob(const v1::JobConfig& job) {}

  // Streams a learn task; an OK reply with OUTCOME_OK is the acknowledgement.
  // `timeout`: the job's learn_task_ack_timeout (a large model may extend it).
  virtual absl::StatusOr<v1::Reply> SendLearnTask(
      const v1::SiteInfo& to, const v1::ModelHeader& header,
      std::shared_ptr<const Model> model, absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::SubmitPermissionReply> RequestToSubmit(
      const v1::SiteInfo& to, const v1::SubmitPermissionRequest& request,
      absl::Duration timeout) = 0;
  // `model` may be null for a failed result (header.failed()).
  virtual absl::StatusOr<v1::Reply> SubmitResult(
      const v1::SiteInfo& to, const v1::ModelHeader& header,
      std::shared_ptr<const Model> model) = 0;
  virtual absl::StatusOr<v1::Reply> ShareBest(
      const v1::SiteInfo& to, const v1::ShareBestRequest& request,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::Reply> SendFinalResult(
      const v1::SiteInfo& to, const v1::ModelHeader& header,
      std::shared_ptr<const Model> model, absl::Duration timeout) = 0;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_PEER_TRANSPORT_H_
