// Validators and readers shared by the job config (job_config.h) and the site
// config (site_config.h). Every error message starts with the field it is
// about, e.g. `sites[1].address: "x" is not host:port (missing ":port")`.
#ifndef SWARM_CONFIG_VALIDATION_H_
#define SWARM_CONFIG_VALIDATION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace swarm {

// Longest job id or site name.
inline constexpr size_t kMaxNameLength = 64;
// Config files larger than this are refused unread.
inline constexpr uint64_t kMaxConfigFileBytes = 16ull << 20;

// A job id or site name: 1..64 characters of [A-Za-z0-9._-], and not "." or
// ".." (names become directory names and certificate common names).
// InvalidArgument "<field>: ..." otherwise.
absl::Status ValidateName(absl::string_view field, absl::string_view name);

struct HostPort {
  // Without brackets for IPv6 ("::1").
  std::string host;
  uint16_t port = 0;
};

// Parses "host:port": a host name or IPv4 address ([A-Za-z0-9._-], at most
// 253 characters) or a bracketed IPv6 address ("[::1]", "[fe80::1%eth0]"),
// then ":" and a decimal port in 1..65535. The error message does not name a
// field (see ValidateHostPort).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// ParseHostPort with "<field>: " in front of the error.
absl::Status ValidateHostPort(absl::string_view field,
                              absl::string_view address);

// Reads a whole (small) file. Errors name `what` (e.g. "job config"), the
// path and strerror: `job config /x/job.json: cannot open: No such file or
// directory`. Files over kMaxConfigFileBytes are refused.
absl::StatusOr<std::string> ReadConfigFile(const std::string& path,
                                           absl::string_view what);

// Parses proto3 JSON into `message` (cleared first). Unknown fields are
// refused. Errors are InvalidArgument and name the field, rewritten from
// protobuf's wording: `unknown field "sites[0].adress"`,
// `round_timeout_ms: invalid value -5 for type TYPE_UINT64 (durations are
// unsigned integer milliseconds)`.
absl::Status ParseJsonConfig(absl::string_view json,
                             google::protobuf::Message* message);

}  // namespace swarm

#endif  // SWARM_CONFIG_VALIDATION_H_
