#include "common/version.h"

#include "absl/strings/str_cat.h"
#include "common/build_info.h"

namespace swarm {

const char* ReleaseVersion() { return SWARM_VERSION_STRING; }

const char* GitCommit() { return SWARM_GIT_COMMIT_STRING; }

v1::ProtocolVersion OwnProtocolVersion() {
  v1::ProtocolVersion version;
  version.set_major_version(kWireProtocolMajor);
  version.set_minor_version(kWireProtocolMinor);
  return version;
}

v1::ProtocolVersion PeerProtocolVersion(const v1::ProtocolVersion& sent,
                                        bool present) {
  if (present && sent.major_version() > 0) return sent;
  v1::ProtocolVersion old;
  old.set_major_version(1);
  old.set_minor_version(0);
  return old;
}

std::string ProtocolText(const v1::ProtocolVersion& version) {
  return absl::StrCat(version.major_version(), ".", version.minor_version());
}

std::string BuildText() {
  return absl::StrCat(ReleaseVersion(), " (commit ", GitCommit(), ")");
}

std::string VersionText(absl::string_view program) {
  return absl::StrCat(program, " ", ReleaseVersion(), "\ngit commit ",
                      GitCommit(), "\nwire protocol ",
                      ProtocolText(OwnProtocolVersion()), "\n");
}

absl::Status CheckProtocolCompatible(const v1::ProtocolVersion& theirs,
                                     absl::string_view who) {
  if (theirs.major_version() == kWireProtocolMajor) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      who, " speaks wire protocol ", ProtocolText(theirs), ", this program ",
      ProtocolText(OwnProtocolVersion()),
      ": only the same major version works together (docs/design.md, "
      "\"Compatibility\")"));
}

}  // namespace swarm
