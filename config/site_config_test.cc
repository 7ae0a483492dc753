#include "config/site_config.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A scratch directory, removed with its contents at the end of the test.
class TempDir : public persist::testutil::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("swarm_site_config") {}
};

v1::SiteConfig Base() {
  v1::SiteConfig config;
  config.set_name("site-a");
  config.set_listen_address("0.0.0.0:7001");
  config.set_workspace("/tmp/ws");
  config.mutable_learner()->set_kind("test");
  return config;
}

std::string ErrorOf(const v1::SiteConfig& config) {
  absl::Status status = ValidateSiteConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(SiteConfigTest, LoadsAValidFile) {
  TempDir dir;
  std::string path = dir.Write("site.json", R"({
    "name": "site-a",
    "listen_address": "[::]:7001",
    "workspace": "/var/lib/swarm/site-a",
    "learner": {"kind": "test", "params": {"delta": "0.5", "samples": "10"}}
  })");
  absl::StatusOr<v1::SiteConfig> config = LoadSiteConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name(), "site-a");
  EXPECT_EQ(config->listen_address(), "[::]:7001");
  EXPECT_EQ(config->workspace(), "/var/lib/swarm/site-a");
  EXPECT_EQ(config->learner().kind(), "test");
  EXPECT_EQ(config->learner().params().at("delta"), "0.5");
  EXPECT_EQ(config->learner().params().at("samples"), "10");
}

TEST(SiteConfigTest, CamelCaseNamesAreAccepted) {
  absl::StatusOr<v1::SiteConfig> config = ParseSiteConfigJson(
      R"({"name": "b", "listenAddress": "h:1", "workspace": "w",
          "learner": {"kind": "mlp"}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen_address(), "h:1");
  EXPECT_TRUE(ValidateSiteConfig(*config).ok());
}

TEST(SiteConfigTest, UnknownFieldsAreRefused) {
  absl::StatusOr<v1::SiteConfig> config =
      ParseSiteConfigJson(R"({"name": "a", "listen": "h:1"})");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              HasSubstr("site config: unknown field \"listen\""));
  config = ParseSiteConfigJson(R"({"learner": {"kind": "test", "lr": "1"}})");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("unknown field \"learner.lr\""));
  // Parameter values are strings.
  config = ParseSiteConfigJson(R"({"learner": {"params": {"lr": 0.1}}})");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("learner.params"));
}

TEST(SiteConfigTest, BadName) {
  v1::SiteConfig config = Base();
  config.set_name("site a");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("name: \"site a\" has a character outside"));
  config.set_name("");
  EXPECT_THAT(ErrorOf(config), HasSubstr("name: empty"));
  config.set_name("..");
  EXPECT_THAT(ErrorOf(config), HasSubstr("name: \"..\" is not allowed"));
}

TEST(SiteConfigTest, BadListenAddress) {
  v1::SiteConfig config = Base();
  config.set_listen_address("7001");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("listen_address: \"7001\" is not host:port (missing "
                        "\":port\")"));
  config.set_listen_address("0.0.0.0:70000");
  EXPECT_THAT(ErrorOf(config), HasSubstr("(port must be in 1..65535)"));
  // Port 0: any free port.
  config.set_listen_address("127.0.0.1:0");
  EXPECT_TRUE(ValidateSiteConfig(config).ok());
  config.set_listen_address("");
  EXPECT_THAT(ErrorOf(config), HasSubstr("listen_address: empty"));
}

TEST(SiteConfigTest, MetricsListenIsOptionalAndChecked) {
  v1::SiteConfig config = Base();
  EXPECT_TRUE(ValidateSiteConfig(config).ok());  // Off by default.
  for (const char* good :
       {"127.0.0.1:9464", "0.0.0.0:0", "[::1]:9464", "metrics.internal:9464"}) {
    config.set_metrics_listen(good);
    EXPECT_TRUE(ValidateSiteConfig(config).ok()) << good;
  }
  config.set_metrics_listen("9464");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("metrics_listen: \"9464\" is not host:port (missing "
                        "\":port\")"));
  config.set_metrics_listen("127.0.0.1:99999");
  EXPECT_THAT(ErrorOf(config), HasSubstr("metrics_listen: "));

  absl::StatusOr<v1::SiteConfig> parsed = ParseSiteConfigJson(
      R"({"name": "a", "listen_address": "h:1", "workspace": "w",
          "learner": {"kind": "test"}, "metrics_listen": "127.0.0.1:9464"})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metrics_listen(), "127.0.0.1:9464");
}

TEST(SiteConfigTest, MissingWorkspaceAndLearner) {
  v1::SiteConfig config = Base();
  config.clear_workspace();
  config.clear_learner();
  std::string error = ErrorOf(config);
  EXPECT_THAT(error, HasSubstr("invalid site config: workspace: empty"));
  EXPECT_THAT(error, HasSubstr("; learner.kind: empty"));
  config = Base();
  (*config.mutable_learner()->mutable_params())[""] = "1";
  EXPECT_THAT(ErrorOf(config), HasSubstr("learner.params: empty key"));
}

TEST(SiteConfigTest, FileErrorsNameThePath) {
  TempDir dir;
  std::string missing = dir.path() + "/nope.json";
  absl::StatusOr<v1::SiteConfig> config = LoadSiteConfig(missing);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(),
              AllOf(HasSubstr("site config " + missing),
                    HasSubstr("No such file or directory")));

  std::string bad = dir.Write("bad.json", R"({"name": "a", "port": 1})");
  config = LoadSiteConfig(bad);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("site config " + bad + ": unknown field \"port\""));

  std::string invalid =
      dir.Write("invalid.json",
                R"({"name": "a", "listen_address": "h", "workspace": "w",
          "learner": {"kind": "test"}})");
  config = LoadSiteConfig(invalid);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("invalid site config " + invalid +
                        ": listen_address: \"h\" is not host:port"));
}

TEST(SiteConfigTest, ExternalTrainerFields) {
  absl::StatusOr<v1::SiteConfig> parsed = ParseSiteConfigJson(R"({
    "name": "site-a", "listen_address": "0.0.0.0:7001", "workspace": "/ws",
    "learner": {"kind": "external", "params": {"lr": "0.1"}},
    "trainer": {"mode": "launch", "command": ["python3", "train.py"],
                "working_dir": "/srv", "env": {"OMP_NUM_THREADS": "1"},
                "lease_ms": 5000}
  })");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(ValidateSiteConfig(*parsed).ok());
  EXPECT_EQ(TrainerSocketPath(*parsed), "/ws/trainer/link.sock");
  parsed->mutable_trainer()->set_socket_path("/run/t.sock");
  EXPECT_EQ(TrainerSocketPath(*parsed), "/run/t.sock");

  v1::SiteConfig config = Base();
  config.mutable_learner()->set_kind("external");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("trainer.mode: \"\" (must be \"launch\" or "
                        "\"attach\")"));
  config.mutable_trainer()->set_mode("launch");
  EXPECT_THAT(ErrorOf(config), HasSubstr("trainer.command: empty"));
  config.mutable_trainer()->set_mode("attach");
  config.mutable_trainer()->add_command("x");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("trainer.command/working_dir/env: set in attach"));
  config.mutable_trainer()->clear_command();
  EXPECT_TRUE(ValidateSiteConfig(config).ok());
  config.mutable_trainer()->set_socket_path(std::string(120, 's'));
  EXPECT_THAT(ErrorOf(config), HasSubstr("is 120 bytes (a Unix socket path "
                                         "holds at most 107"));
  config = Base();
  config.mutable_trainer()->set_mode("attach");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("trainer: set, but learner.kind is \"test\""));
}

}  // namespace
}  // namespace swarm
