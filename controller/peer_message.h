// One envelope for every call one site makes to another (design section 2):
// the transport, the loopback path and the fake network's faults treat every
// kind alike.
#ifndef SWARM_CONTROLLER_PEER_MESSAGE_H_
#define SWARM_CONTROLLER_PEER_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {

// The calls between sites.
//
// Adding a kind (raft's raft.proto note, its util.go tables): add it here
// and its row to kCallKinds (a static_assert below fails until they agree),
// then handle it in each `switch (kind)` over CallKind, none of which has a
// `default:` (the build has -Werror=switch, so a missed one fails it):
//   controller/peer_message.cc   PeerMessage::round, sender
//   controller/site_driver.cc    SiteDriver::Loopback (the site to itself)
//   controller/fake_network.cc   FakeNetwork::Deliver (the simulations)
//   rpc/peer_client.cc           GrpcPeerTransport::SendUnary (unary kinds)
//   rpc/peer_service.cc          the service's method (and its rule)
// plus the machine's sender and handler of the new kind. A model stream
// kind also needs its ModelKind in AdmitStream (controller/admission.cc).
enum class CallKind {
  kLearnTask,
  kRequestToSubmit,
  kSubmitResult,
  kShareBest,
  kFinalResult,
};

// How a kind of call travels and is answered.
enum class CallShape {
  kModelStream,  // Header, chunks, trailer (ModelFrame); answered by Reply.
  kUnary,        // One request, one reply.
};
struct CallKindInfo {
  CallKind kind;
  // The Peer service's method (proto/swarm.proto), also the call's name in
  // logs and errors.
  const char* method;
  CallShape shape;
  // Answered by SubmitPermissionReply (PeerReply.permission), else Reply.
  bool permission_reply;
  // Who may make the call (checked by the receiving site against the
  // caller's certificate and the job).
  const char* who_may_call;
  // The call's label in metrics (swarm_peer_calls_total{kind=...}).
  const char* metric_label;
};
inline constexpr CallKindInfo kCallKinds[] = {
    {CallKind::kLearnTask, "LearnTask", CallShape::kModelStream, false,
     "the round's scatterer, a trainer handing the round over", "learn_task"},
    {CallKind::kRequestToSubmit, "RequestToSubmit", CallShape::kUnary, true,
     "a trainer of the job", "request_to_submit"},
    {CallKind::kSubmitResult, "SubmitResult", CallShape::kModelStream, false,
     "a trainer of the job (a result or a chain's partial sum)",
     "submit_result"},
    {CallKind::kShareBest, "ShareBest", CallShape::kUnary, false,
     "the aggregator of the final round", "share_best"},
    {CallKind::kFinalResult, "FinalResult", CallShape::kModelStream, false,
     "the final round's aggregator, or the best model's holder",
     "final_result"},
};
constexpr bool CallKindsInOrder() {
  for (size_t i = 0; i < std::size(kCallKinds); ++i) {
    if (static_cast<size_t>(kCallKinds[i].kind) != i) return false;
  }
  return std::size(kCallKinds) ==
         static_cast<size_t>(CallKind::kFinalResult) + 1;
}
static_assert(CallKindsInOrder(),
              "kCallKinds needs one row per CallKind, in the enum's order");
constexpr const CallKindInfo& InfoOf(CallKind kind) {
  return kCallKinds[static_cast<size_t>(kind)];
}
absl::string_view CallKindName(CallKind kind);

// A call to another site: a model stream (learn task, result, final model:
// `header` and `model`) or a small request (`permission`, `share_best`).
struct PeerMessage {
  CallKind kind = CallKind::kLearnTask;
  v1::ModelHeader header;
  // Null for a failed result (header.failed()).
  std::shared_ptr<const Model> model;
  v1::SubmitPermissionRequest permission;
  v1::ShareBestRequest share_best;
  // The call's deadline from its start (a model stream's transport may
  // extend it for a large model).
  absl::Duration timeout = absl::Seconds(10);
  // A broadcast's head (header.relay_to set): how long one write may wait
  // before the head is given up. Longer for a longer chain: a site frozen
  // further down stalls every hop above it until its own forwarder gives it
  // up, and no hop above may give up first. Zero: `timeout`.
  absl::Duration relay_stall = absl::ZeroDuration();

  bool is_model_stream() const {
    return InfoOf(kind).shape == CallShape::kModelStream;
  }
  // The round the call is about (a stream's header, a permission request's
  // round, the best record's round for ShareBest).
  uint32_t round() const;
  const std::string& sender() const;
};

// The answer to a PeerMessage: `permission` for kRequestToSubmit, `reply`
// for every other kind.
struct PeerReply {
  v1::Reply reply;
  v1::SubmitPermissionReply permission;

  // The outcome of whichever reply the kind uses.
  v1::Outcome outcome(CallKind kind) const {
    return InfoOf(kind).permission_reply ? permission.outcome()
                                         : reply.outcome();
  }
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_PEER_MESSAGE_H_
