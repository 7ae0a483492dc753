#include "common/version.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace swarm {
namespace {

using ::testing::HasSubstr;

v1::ProtocolVersion Version(uint32_t major, uint32_t minor) {
  v1::ProtocolVersion version;
  version.set_major_version(major);
  version.set_minor_version(minor);
  return version;
}

TEST(VersionTest, SameMajorIsCompatibleWhateverTheMinor) {
  EXPECT_TRUE(
      CheckProtocolCompatible(Version(kWireProtocolMajor, 0), "s1").ok());
  EXPECT_TRUE(
      CheckProtocolCompatible(Version(kWireProtocolMajor, 99), "s1").ok());
}

TEST(VersionTest, AnotherMajorIsRefusedNamingBothVersions) {
  absl::Status status =
      CheckProtocolCompatible(Version(kWireProtocolMajor + 1, 0), "site s2");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("site s2 speaks wire protocol ",
                                     kWireProtocolMajor + 1, ".0")));
  EXPECT_THAT(status.message(), HasSubstr(ProtocolText(OwnProtocolVersion())));
}

TEST(VersionTest, APeerThatSendsNoVersionSpeaksOnePointZero) {
  EXPECT_EQ(ProtocolText(PeerProtocolVersion(v1::ProtocolVersion(), false)),
            "1.0");
  EXPECT_EQ(ProtocolText(PeerProtocolVersion(Version(3, 2), true)), "3.2");
}

TEST(VersionTest, VersionTextNamesReleaseCommitAndProtocol) {
  const std::string text = VersionText("swarmctl");
  EXPECT_THAT(text, HasSubstr(absl::StrCat("swarmctl ", ReleaseVersion())));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("git commit ", GitCommit())));
  EXPECT_THAT(text, HasSubstr("wire protocol 1."));
}

}  // namespace
}  // namespace swarm
