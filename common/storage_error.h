// A failure of this process's own storage (a full, failing or read-only
// disk) as opposed to bad input from a peer: the data that was being
// written was fine, and sending it again to this site will not help. Code
// that writes a peer's data to disk marks its errors with AsStorageError;
// the controller then fails the site (so that its peers go on without it)
// instead of asking the peer to retry (design section 6; README "When
// things fail").
#ifndef SWARM_COMMON_STORAGE_ERROR_H_
#define SWARM_COMMON_STORAGE_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace swarm {

inline constexpr char kStorageErrorPayload[] = "type.swarm.dev/storage-error";

// `status` marked as a storage failure (OK stays OK). The message, which
// names the path and the operation, is kept.
inline absl::Status AsStorageError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kStorageErrorPayload, absl::Cord("1"));
  return status;
}

inline bool IsStorageError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kStorageErrorPayload).has_value();
}

}  // namespace swarm

#endif  // SWARM_COMMON_STORAGE_ERROR_H_
