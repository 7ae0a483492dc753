// The site config (site.json, v1::SiteConfig): how one site's daemon
// (swarm-client) runs. Example:
//   {"name": "site-a", "listen_address": "0.0.0.0:7001",
//    "workspace": "/var/lib/swarm/site-a",
//    "learner": {"kind": "test", "params": {"delta": "0.5"}}}
#ifndef SWARM_CONFIG_SITE_CONFIG_H_
#define SWARM_CONFIG_SITE_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/swarm.pb.h"

namespace swarm {

// Proto3 JSON, unknown fields refused. InvalidArgument "site config: <field>:
// ...". No validation.
absl::StatusOr<v1::SiteConfig> ParseSiteConfigJson(absl::string_view json);

// Checks every rule and reports all violations in one InvalidArgument
// ("invalid site config: <field>: <rule>; ..."): name is a name (1..64 of
// [A-Za-z0-9._-], not "." / ".."); listen_address is host:port (port
// 1..65535, IPv6 as [::]:port); metrics_listen empty or host:port like
// listen_address (port 0 allowed for both); workspace non-empty; learner.kind non-empty;
// learner.params keys non-empty; with learner.kind "external": trainer.mode
// "launch" (with a command) or "attach" (without command, working_dir or
// env), a socket path that fits a Unix socket address; trainer set only with
// kind "external". Whether the learner kind exists is the
// learner factory's call (learner/learner_factory.h).
absl::Status ValidateSiteConfig(const v1::SiteConfig& config);

// The trainer link's socket: trainer.socket_path, or by default
// <workspace>/trainer/link.sock.
std::string TrainerSocketPath(const v1::SiteConfig& config);

// Read + parse + validate. Errors name the path; an unreadable file also
// gives strerror.
absl::StatusOr<v1::SiteConfig> LoadSiteConfig(const std::string& path);

}  // namespace swarm

#endif  // SWARM_CONFIG_SITE_CONFIG_H_
