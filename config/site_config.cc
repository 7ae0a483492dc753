#include "config/site_config.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "config/validation.h"

namespace swarm {

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
  if (config.workspace().empty()) errors.push_back("workspace: empty");
  if (config.learner().kind().empty()) {
    errors.push_back("learner.kind: empty (e.g. \"mlp\" or \"test\")");
  }
  for (const auto& [key, value] : config.learner().params()) {
    if (key.empty()) errors.push_back("learner.params: empty key");
  }
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
