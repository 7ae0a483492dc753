#include "controller/peer_message.h"

namespace swarm {

absl::string_view CallKindName(CallKind kind) { return InfoOf(kind).method; }

uint32_t PeerMessage::round() const {
  switch (kind) {
    case CallKind::kRequestToSubmit:
      return permission.round();
    case CallKind::kShareBest:
      return share_best.best().round();
    case CallKind::kLearnTask:
    case CallKind::kSubmitResult:
    case CallKind::kFinalResult:
      return header.round();
  }
  return header.round();
}

const std::string& PeerMessage::sender() const {
  switch (kind) {
    case CallKind::kRequestToSubmit:
      return permission.sender();
    case CallKind::kShareBest:
      return share_best.sender();
    case CallKind::kLearnTask:
    case CallKind::kSubmitResult:
    case CallKind::kFinalResult:
      return header.sender();
  }
  return header.sender();
}

}  // namespace swarm
