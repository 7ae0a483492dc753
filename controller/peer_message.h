// One envelope for every call one site makes to another (design section 2):
// the transport, the loopback path and the fake network's faults treat every
// kind alike.
#ifndef SWARM_CONTROLLER_PEER_MESSAGE_H_
#define SWARM_CONTROLLER_PEER_MESSAGE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {

// The calls between sites.
enum class CallKind {
  kLearnTask,
  kRequestToSubmit,
  kSubmitResult,
  kShareBest,
  kFinalResult,
};
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
    return kind == CallKind::kLearnTask || kind == CallKind::kSubmitResult ||
           kind == CallKind::kFinalResult;
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
    return kind == CallKind::kRequestToSubmit ? permission.outcome()
                                              : reply.outcome();
  }
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_PEER_MESSAGE_H_
