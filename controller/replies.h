// The one place that maps outcomes to replies and back (design section 4):
// an application outcome travels in a Reply; a status is what the site's own
// code passes around.
#ifndef SWARM_CONTROLLER_REPLIES_H_
#define SWARM_CONTROLLER_REPLIES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/swarm.pb.h"

namespace swarm {

v1::Reply MakeReply(v1::Outcome outcome, std::string message);
inline v1::Reply OkReply(std::string message) {
  return MakeReply(v1::OUTCOME_OK, std::move(message));
}

// A status as the reply a peer gets: INVALID_ARGUMENT, DATA_LOSS and
// OUT_OF_RANGE are BAD_REQUEST; UNAVAILABLE and RESOURCE_EXHAUSTED are
// RETRY; CANCELLED is ABORTED; every other error is REJECTED.
v1::Reply ReplyFromStatus(const absl::Status& status);

// A reply as a status, for callers that treat both alike: OK only for
// OUTCOME_OK, FAILED_PRECONDITION "<OUTCOME>: <message>" otherwise; a failed
// call keeps its status.
absl::Status StatusFromReply(const absl::StatusOr<v1::Reply>& reply);
// The same for the next hop's answer to a partial sum passed on (chain
// reduction): a refusal keeps the message as it is, so that a failure
// passed back along the chain does not grow a prefix per hop.
absl::Status StatusFromHopReply(const absl::StatusOr<v1::Reply>& reply);

// A forwarded stream (ModelHeader.relay_to): appends to `into` how site
// `next` answered the forward (`reply`: its reply, or why the call to it
// failed), then the answers `next` gave for the sites after it.
void AddRelayed(const std::string& next, const absl::StatusOr<v1::Reply>& reply,
                v1::Reply* into);

}  // namespace swarm

#endif  // SWARM_CONTROLLER_REPLIES_H_
