#include "security/provision.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/atomic_file.h"
#include "security/identity.h"

namespace swarm::security {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ProvisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("provision_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    job_.set_job_id("job1");
    auto* a = job_.add_sites();
    a->set_name("site-a");
    a->set_address("127.0.0.1:7001");
    auto* b = job_.add_sites();
    b->set_name("site-b");
    b->set_address("b.example.org:7002");
    b->add_extra_sans("10.0.0.2");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  mode_t Mode(const std::string& path) {
    struct stat st;
    EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 0777;
  }
  std::string Read(const std::string& path) {
    return *persist::ReadFileToString(path);
  }
  std::filesystem::path dir_;
  v1::JobConfig job_;
};

TEST_F(ProvisionTest, WritesOneFolderPerSiteAndAdminWithPrivateKeys) {
  ProvisionOptions options;
  options.admins = {"alice"};
  absl::StatusOr<ProvisionReport> report =
      Provision(job_, dir_.string(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->created_ca);
  EXPECT_EQ(report->folders.size(), 3u);
  const std::string d = dir_.string();
  EXPECT_EQ(Mode(d + "/ca/ca.key"), 0600u);
  EXPECT_EQ(Mode(d + "/ca"), 0700u);
  for (const std::string who :
       {"sites/site-a", "sites/site-b", "admins/alice"}) {
    EXPECT_EQ(Mode(d + "/" + who + "/key.pem"), 0600u) << who;
    EXPECT_EQ(Mode(d + "/" + who + "/cert.pem"), 0644u) << who;
    EXPECT_EQ(Read(d + "/" + who + "/ca.crt"), Read(d + "/ca/ca.crt"));
    // The CA key is not part of what a site or admin receives.
    EXPECT_FALSE(std::filesystem::exists(d + "/" + who + "/ca.key"));
    absl::StatusOr<TlsIdentity> identity = LoadTlsIdentity(d + "/" + who);
    ASSERT_TRUE(identity.ok()) << identity.status();
  }
  CertInfo a = *ParseCertificate(Read(d + "/sites/site-a/cert.pem"));
  EXPECT_EQ(a.common_name, "site-a");
  EXPECT_EQ(a.role, kSiteRole);
  EXPECT_THAT(a.ip_addresses, ElementsAre("127.0.0.1"));
  CertInfo b = *ParseCertificate(Read(d + "/sites/site-b/cert.pem"));
  EXPECT_THAT(b.dns_names, ElementsAre("b.example.org"));
  EXPECT_THAT(b.ip_addresses, ElementsAre("10.0.0.2"));
  CertInfo alice = *ParseCertificate(Read(d + "/admins/alice/cert.pem"));
  EXPECT_EQ(alice.common_name, "alice");
  EXPECT_EQ(alice.role, kAdminRole);
}

TEST_F(ProvisionTest, RotatingOneSiteKeepsTheCaAndTheOthers) {
  ASSERT_TRUE(Provision(job_, dir_.string(), {}).ok());
  const std::string d = dir_.string();
  const std::string ca = Read(d + "/ca/ca.crt");
  const std::string a = Read(d + "/sites/site-a/cert.pem");
  const std::string b = Read(d + "/sites/site-b/cert.pem");
  ProvisionOptions rotate;
  rotate.only_sites = {"site-b"};
  absl::StatusOr<ProvisionReport> report = Provision(job_, d, rotate);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->created_ca);
  EXPECT_EQ(Read(d + "/ca/ca.crt"), ca);
  EXPECT_EQ(Read(d + "/sites/site-a/cert.pem"), a);
  EXPECT_NE(Read(d + "/sites/site-b/cert.pem"), b);
  EXPECT_TRUE(LoadTlsIdentity(d + "/sites/site-b").ok());
}

TEST_F(ProvisionTest, RefusesUnknownSitesAndAdminsNamedLikeSites) {
  ProvisionOptions unknown;
  unknown.only_sites = {"site-z"};
  absl::StatusOr<ProvisionReport> report =
      Provision(job_, dir_.string(), unknown);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(),
              HasSubstr("site-z: not a site of job job1"));
  ProvisionOptions clash;
  clash.admins = {"site-a"};
  report = Provision(job_, dir_.string(), clash);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(),
              HasSubstr("cannot have a site's name"));
}

TEST_F(ProvisionTest, MismatchedFilesAreRefusedOnLoad) {
  ASSERT_TRUE(Provision(job_, dir_.string(), {}).ok());
  const std::string d = dir_.string();
  // A certificate from another project's CA.
  KeyAndCert other_ca = *CreateCa("other");
  CertRequest request = SiteCertRequest(job_.sites(0));
  KeyAndCert foreign = *IssueCertificate(other_ca, request);
  ASSERT_TRUE(persist::WriteFileAtomically(d + "/sites/site-a/cert.pem",
                                           foreign.cert_pem)
                  .ok());
  absl::StatusOr<TlsIdentity> identity = LoadTlsIdentity(d + "/sites/site-a");
  ASSERT_FALSE(identity.ok());
  EXPECT_THAT(identity.status().message(),
              HasSubstr("does not verify against ca.crt"));
  EXPECT_FALSE(LoadTlsIdentity(d + "/sites/nobody").ok());
}

TEST_F(ProvisionTest, AKeyOfAnotherCertificateIsRefusedOnLoad) {
  ASSERT_TRUE(Provision(job_, dir_.string(), {}).ok());
  const std::string d = dir_.string();
  // site-b's key beside site-a's certificate (both from the same CA).
  absl::StatusOr<std::string> key_b =
      persist::ReadFileToString(d + "/sites/site-b/key.pem");
  ASSERT_TRUE(key_b.ok());
  ASSERT_TRUE(
      persist::WriteFileAtomically(d + "/sites/site-a/key.pem", *key_b).ok());
  absl::StatusOr<TlsIdentity> identity = LoadTlsIdentity(d + "/sites/site-a");
  ASSERT_FALSE(identity.ok());
  EXPECT_THAT(identity.status().message(),
              HasSubstr(d + "/sites/site-a/key.pem does not match"));
  ASSERT_TRUE(
      persist::WriteFileAtomically(d + "/sites/site-a/key.pem", "not a key")
          .ok());
  EXPECT_THAT(LoadTlsIdentity(d + "/sites/site-a").status().message(),
              HasSubstr("key.pem: not a PEM private key"));
}

}  // namespace
}  // namespace swarm::security
