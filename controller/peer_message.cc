#include "controller/peer_message.h"

namespace swarm {

absl::string_view CallKindName(CallKind kind) {
  switch (kind) {
    case CallKind::kLearnTask:
      return "LearnTask";
    case CallKind::kRequestToSubmit:
      return "RequestToSubmit";
    case CallKind::kSubmitResult:
      return "SubmitResult";
    case CallKind::kShareBest:
      return "ShareBest";
    case CallKind::kFinalResult:
      return "FinalResult";
  }
  return "unknown";
}

uint32_t PeerMessage::round() const {
  switch (kind) {
    case CallKind::kRequestToSubmit:
      return permission.round();
    case CallKind::kShareBest:
      return share_best.best().round();
    default:
      return header.round();
  }
}

const std::string& PeerMessage::sender() const {
  switch (kind) {
    case CallKind::kRequestToSubmit:
      return permission.sender();
    case CallKind::kShareBest:
      return share_best.sender();
    default:
      return header.sender();
  }
}

}  // namespace swarm
