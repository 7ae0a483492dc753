#include "cli/k8s_manifests.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/atomic_file.h"
#include "persist/test_util.h"
#include "security/certificates.h"
#include "security/identity.h"

namespace swarm {
namespace {

using persist::testutil::ScopedTempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

v1::JobConfig TwoSiteJob() {
  v1::JobConfig job;
  job.set_job_id("demo.job_1");
  job.set_num_rounds(2);
  v1::SiteInfo* a = job.add_sites();
  a->set_name("Site-A");
  a->set_address("site-a:7001");
  v1::SiteInfo* b = job.add_sites();
  b->set_name("site-b");
  b->set_address("site-b:7002");
  return job;
}

TEST(K8sManifestsTest, OneFilePerSiteAndAJob) {
  ScopedTempDir dir;
  K8sOptions options;
  options.namespace_name = "swarm-ns";
  options.image = "registry.example/swarm:1";
  absl::StatusOr<std::map<std::string, std::string>> files =
      GenerateK8sManifests(TwoSiteJob(), dir.Child("pki"), options);
  ASSERT_TRUE(files.ok()) << files.status();
  std::vector<std::string> names;
  for (const auto& [name, text] : *files) names.push_back(name);
  EXPECT_THAT(names, ElementsAre("job.yaml", "site-a.yaml", "site-b.yaml"));

  const std::string& a = files->at("site-a.yaml");
  for (const char* kind :
       {"kind: Secret", "kind: ConfigMap", "kind: PersistentVolumeClaim",
        "kind: Service", "kind: Deployment"}) {
    EXPECT_THAT(a, HasSubstr(kind));
  }
  EXPECT_THAT(a, HasSubstr("replicas: 1"));
  EXPECT_THAT(a, HasSubstr("image: registry.example/swarm:1"));
  EXPECT_THAT(a, HasSubstr("\"name\": \"Site-A\""));
  EXPECT_THAT(a, HasSubstr("\"listen_address\": \"0.0.0.0:7001\""));
  EXPECT_THAT(a, HasSubstr("readinessProbe"));
  EXPECT_THAT(a, HasSubstr("livenessProbe"));
  EXPECT_THAT(a, HasSubstr("\"swarmctl\", \"health\""));
  EXPECT_THAT(a, HasSubstr("limits:"));
  EXPECT_THAT(a, HasSubstr("-----BEGIN CERTIFICATE-----"));
  EXPECT_THAT(files->at("site-b.yaml"), HasSubstr("containerPort: 7002"));

  const std::string& job = files->at("job.yaml");
  EXPECT_THAT(job, HasSubstr("kind: Job"));
  EXPECT_THAT(job, HasSubstr("name: swarm-demo-job-1-start"));
  EXPECT_THAT(job, HasSubstr("--wait-healthy 300"));
  EXPECT_THAT(job, HasSubstr("\"job_id\": \"demo.job_1\""));

  // The site's certificate carries its Service names; the admin exists.
  absl::StatusOr<security::TlsIdentity> identity =
      security::LoadTlsIdentity(dir.Child("pki/sites/Site-A"));
  ASSERT_TRUE(identity.ok()) << identity.status();
  absl::StatusOr<security::CertInfo> info =
      security::ParseCertificate(identity->cert_pem);
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->dns_names,
              ElementsAre("site-a", "site-a.swarm-ns.svc",
                          "site-a.swarm-ns.svc.cluster.local"));
  // The Secret holds that certificate (its first base64 line).
  EXPECT_THAT(a, HasSubstr(identity->cert_pem.substr(28, 64)));
  EXPECT_TRUE(
      security::LoadTlsIdentity(dir.Child("pki/admins/k8s-operator")).ok());
}

TEST(K8sManifestsTest, AnAddressThatIsNotAServiceNameIsRefused) {
  ScopedTempDir dir;
  v1::JobConfig job = TwoSiteJob();
  job.mutable_sites(1)->set_address("10.0.0.7:7002");
  absl::StatusOr<std::map<std::string, std::string>> files =
      GenerateK8sManifests(job, dir.Child("pki"), K8sOptions());
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              HasSubstr("site site-b: address host \"10.0.0.7\""));
  job.mutable_sites(1)->set_address("Site_B:7002");
  EXPECT_FALSE(GenerateK8sManifests(job, dir.Child("pki"), K8sOptions()).ok());
  K8sOptions bad_namespace;
  bad_namespace.namespace_name = "Bad_NS";
  EXPECT_THAT(
      GenerateK8sManifests(TwoSiteJob(), dir.Child("pki"), bad_namespace)
          .status()
          .message(),
      HasSubstr("--namespace Bad_NS"));
}

TEST(K8sManifestsTest, RegeneratingReusesTheCa) {
  ScopedTempDir dir;
  ASSERT_TRUE(
      GenerateK8sManifests(TwoSiteJob(), dir.Child("pki"), K8sOptions()).ok());
  absl::StatusOr<std::string> ca =
      persist::ReadFileToString(dir.Child("pki/ca/ca.crt"));
  absl::StatusOr<std::string> cert =
      persist::ReadFileToString(dir.Child("pki/sites/site-b/cert.pem"));
  ASSERT_TRUE(ca.ok() && cert.ok());
  ASSERT_TRUE(
      GenerateK8sManifests(TwoSiteJob(), dir.Child("pki"), K8sOptions()).ok());
  EXPECT_EQ(*persist::ReadFileToString(dir.Child("pki/ca/ca.crt")), *ca);
  EXPECT_NE(*persist::ReadFileToString(dir.Child("pki/sites/site-b/cert.pem")),
            *cert);  // re-issued: that is how certificates rotate
}

}  // namespace
}  // namespace swarm
