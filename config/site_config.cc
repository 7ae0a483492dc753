#include "config/site_config.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "config/validation.h"

namespace swarm {
namespace {

// sockaddr_un.sun_path holds 108 bytes with the terminating NUL.
constexpr size_t kMaxSocketPath = 107;

// The external trainer's fields (learner.kind "external"); see TrainerConfig.
void ValidateTrainerConfig(const v1::SiteConfig& config,
                           std::vector<std::string>* errors) {
  const v1::TrainerConfig& trainer = config.trainer();
  if (config.learner().kind() != "external") {
    if (config.has_trainer()) {
      errors->push_back(absl::StrCat(
          "trainer: set, but learner.kind is \"", config.learner().kind(),
          "\" (the trainer is used only with learner.kind \"external\")"));
    }
    return;
  }
  if (trainer.mode() != "launch" && trainer.mode() != "attach") {
    errors->push_back(absl::StrCat("trainer.mode: \"", trainer.mode(),
                                   "\" (must be \"launch\" or \"attach\")"));
  }
  if (trainer.mode() == "launch" &&
      (trainer.command().empty() || trainer.command(0).empty())) {
    errors->push_back(
        "trainer.command: empty (launch mode needs the program to start, "
        "e.g. [\"python3\", \"train.py\"])");
  }
  if (trainer.mode() == "attach" &&
      (!trainer.command().empty() || !trainer.working_dir().empty() ||
       !trainer.env().empty())) {
    errors->push_back(
        "trainer.command/working_dir/env: set in attach mode (the daemon "
        "starts nothing; use mode \"launch\")");
  }
  const std::string socket = TrainerSocketPath(config);
  if (socket.size() > kMaxSocketPath) {
    errors->push_back(absl::StrCat(
        "trainer.socket_path: \"", socket, "\" is ", socket.size(),
        " bytes (a Unix socket path holds at most ", kMaxSocketPath,
        "; set a shorter trainer.socket_path)"));
  }
  for (const auto& [key, value] : trainer.env()) {
    if (key.empty() || key.find('=') != std::string::npos) {
      errors->push_back(absl::StrCat("trainer.env: bad variable name \"", key,
                                     "\""));
    }
  }
}

}  // namespace

std::string TrainerSocketPath(const v1::SiteConfig& config) {
  if (!config.trainer().socket_path().empty()) {
    return config.trainer().socket_path();
  }
  return absl::StrCat(config.workspace(), "/trainer/link.sock");
}

absl::StatusOr<v1::SiteConfig> ParseSiteConfigJson(absl::string_view json) {
  v1::SiteConfig config;
  absl::Status status = ParseJsonConfig(json, &config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("site config: ", status.message()));
  }
  return config;
}

absl::Status ValidateSiteConfig(const v1::SiteConfig& config) {
  std::vector<std::string> errors;
  auto add = [&errors](const absl::Status& status) {
    if (!status.ok()) errors.push_back(std::string(status.message()));
  };
  add(ValidateName("name", config.name()));
  // Port 0 asks the system for a free port (the daemon prints the one it got).
  const std::string& listen = config.listen_address();
  const bool any_port =
      listen.size() > 2 && listen.substr(listen.size() - 2) == ":0";
  add(ValidateHostPort(
      "listen_address",
      any_port ? listen.substr(0, listen.size() - 1) + "1" : listen));
  // Optional: empty means no metrics endpoint. Port 0 picks a free port.
  const std::string& metrics = config.metrics_listen();
  if (!metrics.empty()) {
    const bool any_metrics_port =
        metrics.size() > 2 && metrics.substr(metrics.size() - 2) == ":0";
    add(ValidateHostPort("metrics_listen",
                         any_metrics_port
                             ? metrics.substr(0, metrics.size() - 1) + "1"
                             : metrics));
  }
  if (config.workspace().empty()) errors.push_back("workspace: empty");
  if (config.learner().kind().empty()) {
    errors.push_back("learner.kind: empty (e.g. \"mlp\" or \"test\")");
  }
  for (const auto& [key, value] : config.learner().params()) {
    if (key.empty()) errors.push_back("learner.params: empty key");
  }
  ValidateTrainerConfig(config, &errors);
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid site config: ", absl::StrJoin(errors, "; ")));
}

absl::StatusOr<v1::SiteConfig> LoadSiteConfig(const std::string& path) {
  absl::StatusOr<std::string> text = ReadConfigFile(path, "site config");
  if (!text.ok()) return text.status();
  v1::SiteConfig config;
  absl::Status status = ParseJsonConfig(*text, &config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("site config ", path, ": ", status.message()));
  }
  status = ValidateSiteConfig(config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid site config ", path, ": ",
        absl::StripPrefix(status.message(), "invalid site config: ")));
  }
  return config;
}

}  // namespace swarm
