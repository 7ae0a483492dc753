#include "security/secagg_keys.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/atomic_file.h"
#include "security/certificates.h"

namespace swarm::security {
namespace {

using ::testing::HasSubstr;

class SecAggKeysTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ca_ = new KeyAndCert(*CreateCa("job CA"));
    other_ca_ = new KeyAndCert(*CreateCa("another CA"));
  }
  static KeyAndCert Issue(const KeyAndCert& ca, const std::string& name) {
    CertRequest request;
    request.common_name = name;
    request.role = kSiteRole;
    return *IssueCertificate(ca, request);
  }
  static ModelSigner SignerOf(const KeyAndCert& identity) {
    return *ModelSigner::Create(identity.key_pem, identity.cert_pem);
  }
  static ModelSignatureVerifier Verifier() {
    return *ModelSignatureVerifier::Create(ca_->cert_pem);
  }
  static KeyAndCert* ca_;
  static KeyAndCert* other_ca_;
};
KeyAndCert* SecAggKeysTest::ca_ = nullptr;
KeyAndCert* SecAggKeysTest::other_ca_ = nullptr;

TEST_F(SecAggKeysTest, ASignedKeyVerifiesForItsSiteAndJobOnly) {
  const ModelSigner signer = SignerOf(Issue(*ca_, "site-a"));
  absl::StatusOr<AgreementKey> key = AgreementKey::Generate();
  ASSERT_TRUE(key.ok());
  absl::StatusOr<SignedAgreementKey> signed_key =
      SignAgreementKey(signer, "job-1", *key);
  ASSERT_TRUE(signed_key.ok()) << signed_key.status();
  EXPECT_EQ(signed_key->site, "site-a");
  EXPECT_EQ(signed_key->public_key, key->public_key());
  EXPECT_TRUE(VerifyAgreementKey(Verifier(), "job-1", *signed_key).ok());
  // Replayed into another job: refused.
  const absl::Status other_job =
      VerifyAgreementKey(Verifier(), "job-2", *signed_key);
  EXPECT_EQ(other_job.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other_job.message(),
              HasSubstr("secure-aggregation key of site-a for job job-2"));
}

TEST_F(SecAggKeysTest, ASubstitutedKeyIsRefusedNamingTheSite) {
  // The aggregator (site-m) swaps site-a's public key for its own, keeping
  // site-a's signature and certificate.
  absl::StatusOr<SignedAgreementKey> signed_key = SignAgreementKey(
      SignerOf(Issue(*ca_, "site-a")), "job-1", *AgreementKey::Generate());
  ASSERT_TRUE(signed_key.ok());
  SignedAgreementKey forged = *signed_key;
  forged.public_key = AgreementKey::Generate()->public_key();
  const absl::Status refused = VerifyAgreementKey(Verifier(), "job-1", forged);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("site-a"));
  EXPECT_THAT(refused.message(), HasSubstr("does not verify"));
  // Or signs its own key and claims it is site-a's.
  absl::StatusOr<SignedAgreementKey> own = SignAgreementKey(
      SignerOf(Issue(*ca_, "site-m")), "job-1", *AgreementKey::Generate());
  ASSERT_TRUE(own.ok());
  own->site = "site-a";
  EXPECT_EQ(VerifyAgreementKey(Verifier(), "job-1", *own).code(),
            absl::StatusCode::kPermissionDenied);
  // Or uses a certificate from another CA that names site-a.
  absl::StatusOr<SignedAgreementKey> foreign =
      SignAgreementKey(SignerOf(Issue(*other_ca_, "site-a")), "job-1",
                       *AgreementKey::Generate());
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(VerifyAgreementKey(Verifier(), "job-1", *foreign).code(),
            absl::StatusCode::kPermissionDenied);
  // A key of the wrong size is bad input.
  SignedAgreementKey short_key = *signed_key;
  short_key.public_key = "short";
  EXPECT_EQ(VerifyAgreementKey(Verifier(), "job-1", short_key).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SecAggKeysTest, TheKeyFileIsPrivateAndSurvivesARestart) {
  const std::string dir =
      std::filesystem::path(::testing::TempDir()) / "secagg_keys_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/secagg.key";
  absl::StatusOr<AgreementKey> first = LoadOrCreateAgreementKey(path);
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat info {};
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  absl::StatusOr<AgreementKey> again = LoadOrCreateAgreementKey(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->public_key(), first->public_key());
  // A damaged file is not replaced by a new key silently.
  ASSERT_TRUE(persist::WriteFileAtomically(path, "not a key").ok());
  absl::StatusOr<AgreementKey> damaged = LoadOrCreateAgreementKey(path);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), HasSubstr("secagg.key"));
}

}  // namespace
}  // namespace swarm::security
