// Early-return helpers for absl::Status / absl::StatusOr (Abseil 20220623 has
// no public equivalents).
#ifndef SWARM_COMMON_STATUS_MACROS_H_
#define SWARM_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SWARM_CONCAT_INNER_(a, b) a##b
#define SWARM_CONCAT_(a, b) SWARM_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the caller if not OK.
#define SWARM_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status swarm_status_ = (expr);         \
    if (!swarm_status_.ok()) return swarm_status_; \
  } while (0)

// `lhs` = value of `expr` (an absl::StatusOr<T>), or returns its status.
#define SWARM_ASSIGN_OR_RETURN(lhs, expr)                                     \
  SWARM_ASSIGN_OR_RETURN_IMPL_(SWARM_CONCAT_(swarm_statusor_, __LINE__), lhs, \
                               expr)
#define SWARM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

#endif  // SWARM_COMMON_STATUS_MACROS_H_
