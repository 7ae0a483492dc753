// The versions a Swarm program reports (--version) and exchanges:
//   - the release version (the top CMakeLists.txt's project(VERSION), also
//     the Python SDK's swarm.__version__) and the git commit of the build;
//   - the wire protocol version, major.minor, that sites and swarmctl send
//     each other (ConfigureRequest.protocol, StatusReply.protocol).
//
// The compatibility rule (docs/design.md, "Compatibility"): programs of the
// same major version work together. A minor version may only add: new
// fields (with new numbers, never reusing one), new messages, new enum
// values, new RPCs; an older program ignores the fields it does not know
// (protobuf keeps them as unknown fields) and treats a missing field as its
// default. Anything else (a removed or renumbered field, a changed meaning)
// is a new major version, and mixed majors are refused at swarmctl start
// and at Configure, naming each version. A peer that sends no version is
// from before the exchange and speaks 1.0.
#ifndef SWARM_COMMON_VERSION_H_
#define SWARM_COMMON_VERSION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/swarm.pb.h"

namespace swarm {

inline constexpr uint32_t kWireProtocolMajor = 1;
// 1.2: ModelHeader.privacy_spent and trainer_stopped, ShareBestRequest's
// end reason and privacy spend (the privacy spend in the finals).
// 1.3: JobConfig.server_optimizer and its parameters; a learn task's model
// may carry the optimizer's state ("swarm.server_optimizer.*" tensors).
// swarmctl start refuses a server_optimizer job with a site below 1.3.
inline constexpr uint32_t kWireProtocolMinor = 3;

// "0.9.0".
const char* ReleaseVersion();
// "d6ff65f1a2b3" or "d6ff65f1a2b3-dirty" ("unknown" without git).
const char* GitCommit();
// This program's wire protocol version.
v1::ProtocolVersion OwnProtocolVersion();
// The version a peer sent: 1.0 when it sent none (older than the exchange).
v1::ProtocolVersion PeerProtocolVersion(const v1::ProtocolVersion& sent,
                                        bool present);
// "1.1".
std::string ProtocolText(const v1::ProtocolVersion& version);
// "0.9.0 (commit d6ff65f1a2b3)".
std::string BuildText();
// What --version prints for `program`: three lines, the release version,
// the git commit and the wire protocol version.
std::string VersionText(absl::string_view program);
// OK when `theirs` works with this program (same major); otherwise
// FailedPrecondition naming `who`, both versions and the rule.
absl::Status CheckProtocolCompatible(const v1::ProtocolVersion& theirs,
                                     absl::string_view who);

}  // namespace swarm

#endif  // SWARM_COMMON_VERSION_H_
