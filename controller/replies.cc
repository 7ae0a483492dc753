#include "controller/replies.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace swarm {

v1::Reply MakeReply(v1::Outcome outcome, std::string message) {
  v1::Reply reply;
  reply.set_outcome(outcome);
  reply.set_message(std::move(message));
  return reply;
}

v1::Reply ReplyFromStatus(const absl::Status& status) {
  if (status.ok()) return MakeReply(v1::OUTCOME_OK, "");
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
      return MakeReply(v1::OUTCOME_BAD_REQUEST, std::string(status.message()));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      return MakeReply(v1::OUTCOME_RETRY, std::string(status.message()));
    case absl::StatusCode::kCancelled:
      return MakeReply(v1::OUTCOME_ABORTED, std::string(status.message()));
    default:
      return MakeReply(v1::OUTCOME_REJECTED, std::string(status.message()));
  }
}

absl::Status StatusFromReply(const absl::StatusOr<v1::Reply>& reply) {
  if (!reply.ok()) return reply.status();
  if (reply->outcome() == v1::OUTCOME_OK) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(v1::Outcome_Name(reply->outcome()), ": ", reply->message()));
}

absl::Status StatusFromHopReply(const absl::StatusOr<v1::Reply>& reply) {
  if (!reply.ok()) return reply.status();
  if (reply->outcome() == v1::OUTCOME_OK) return absl::OkStatus();
  return absl::FailedPreconditionError(reply->message());
}

void AddRelayed(const std::string& next, const absl::StatusOr<v1::Reply>& reply,
                v1::Reply* into) {
  v1::RelayOutcome* hop = into->add_relayed();
  hop->set_site(next);
  if (!reply.ok()) {
    hop->set_transport_failed(true);
    hop->set_message(std::string(reply.status().message()));
    return;
  }
  hop->set_outcome(reply->outcome());
  hop->set_message(reply->message());
  for (const v1::RelayOutcome& later : reply->relayed()) {
    *into->add_relayed() = later;
  }
}

}  // namespace swarm
