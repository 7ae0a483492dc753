#include "security/certificates.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm::security {
namespace {

using ::testing::ElementsAre;

TEST(CertificatesTest, CaIsSelfSignedAndMarked) {
  absl::StatusOr<KeyAndCert> ca = CreateCa("test CA");
  ASSERT_TRUE(ca.ok()) << ca.status();
  absl::StatusOr<CertInfo> info = ParseCertificate(ca->cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->is_ca);
  EXPECT_EQ(info->common_name, "test CA");
  EXPECT_EQ(info->role, kCaRole);
  EXPECT_LT(info->not_before, absl::Now());
  EXPECT_GT(info->not_after, absl::Now() + absl::Hours(24 * 3000));
}

TEST(CertificatesTest, SiteCertificateCarriesNameRoleAndAltNames) {
  KeyAndCert ca = *CreateCa("ca");
  CertRequest request;
  request.common_name = "site-a";
  request.role = kSiteRole;
  request.dns_names = {"a.example.org", "localhost"};
  request.ip_addresses = {"127.0.0.1", "::1"};
  absl::StatusOr<KeyAndCert> cert = IssueCertificate(ca, request);
  ASSERT_TRUE(cert.ok()) << cert.status();
  CertInfo info = *ParseCertificate(cert->cert_pem);
  EXPECT_FALSE(info.is_ca);
  EXPECT_EQ(info.common_name, "site-a");
  EXPECT_EQ(info.role, kSiteRole);
  EXPECT_THAT(info.dns_names, ElementsAre("a.example.org", "localhost"));
  EXPECT_THAT(info.ip_addresses, ElementsAre("127.0.0.1", "::1"));
}

TEST(CertificatesTest, ValidityCanBeChosen) {
  KeyAndCert ca = *CreateCa("ca");
  CertRequest request;
  request.common_name = "old";
  request.role = kAdminRole;
  request.not_before = absl::Now() - absl::Hours(48);
  request.not_after = absl::Now() - absl::Hours(24);
  CertInfo info = *ParseCertificate(IssueCertificate(ca, request)->cert_pem);
  EXPECT_LT(info.not_after, absl::Now());
  EXPECT_EQ(info.role, kAdminRole);
}

TEST(CertificatesTest, KeyAlgorithmCanBeChosen) {
  KeyAndCert ca = *CreateCa("ca");
  CertRequest request;
  request.common_name = "site-rsa";
  request.role = kSiteRole;
  request.key_algorithm = KeyAlgorithm::kRsa2048;
  absl::StatusOr<KeyAndCert> cert = IssueCertificate(ca, request);
  ASSERT_TRUE(cert.ok()) << cert.status();
  EXPECT_THAT(cert->key_pem, ::testing::HasSubstr("BEGIN PRIVATE KEY"));
  EXPECT_GT(cert->key_pem.size(), 1500u);  // RSA 2048; EC P-256 is ~240.
  EXPECT_EQ(ParseCertificate(cert->cert_pem)->common_name, "site-rsa");
  request.key_algorithm = KeyAlgorithm::kEcP256;
  EXPECT_LT(IssueCertificate(ca, request)->key_pem.size(), 400u);
}

TEST(CertificatesTest, RefusesBadRequests) {
  KeyAndCert ca = *CreateCa("ca");
  CertRequest request;
  request.role = kSiteRole;
  EXPECT_FALSE(IssueCertificate(ca, request).ok());
  request.common_name = "x";
  request.role = "root";
  EXPECT_FALSE(IssueCertificate(ca, request).ok());
  request.role = kSiteRole;
  KeyAndCert broken = ca;
  broken.key_pem = "not a key";
  EXPECT_FALSE(IssueCertificate(broken, request).ok());
  EXPECT_FALSE(ParseCertificate("garbage").ok());
}

TEST(CertificatesTest, IpLiterals) {
  EXPECT_TRUE(IsIpAddress("10.1.2.3"));
  EXPECT_TRUE(IsIpAddress("::1"));
  EXPECT_FALSE(IsIpAddress("localhost"));
  EXPECT_FALSE(IsIpAddress("[::1]"));
}

}  // namespace
}  // namespace swarm::security
