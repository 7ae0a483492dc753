// swarmctl init: everything a new job needs, in one folder, from a list of
// sites and a learner:
//
//   DIR/job.json                        the job config
//   DIR/ca/ca.key, ca.crt               the project CA (swarmctl provision)
//   DIR/sites/<site>/site.json          the site config, beside the site's
//   DIR/sites/<site>/key.pem, cert.pem, ca.crt   certificate
//   DIR/admins/<admin>/...              the operator's identity
//
// and the exact commands to run on each machine. With `local` > 0 the sites
// are site-1..site-N on 127.0.0.1 (free ports), every path is absolute, and
// the printed commands run the trial as they are.
#ifndef SWARM_CLI_INIT_PROJECT_H_
#define SWARM_CLI_INIT_PROJECT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace swarm {

struct InitOptions {
  std::string out;  // DIR
  // NAME=HOST:PORT entries (--site, or one a line from --sites FILE).
  std::vector<std::string> sites;
  int local = 0;                // --local N (exclusive with sites)
  std::string learner = "mlp";  // mlp | external | test
  std::string job_id = "swarm-job";
  int rounds = 5;
  std::string admin = "admin";
  bool force = false;  // write into an existing DIR
  // The programs as the printed commands name them (the local ones; a
  // remote site's command names swarm-client as installed there).
  std::string swarmctl = "swarmctl";
  std::string swarm_client = "swarm-client";
};

// Reads --sites FILE: one NAME=HOST:PORT a line; blank lines and lines
// starting with '#' are skipped. Errors name the file and line.
absl::StatusOr<std::vector<std::string>> ReadSitesFile(const std::string& path);

// Writes the folder; returns the commands to print. InvalidArgument (naming
// the flag or entry) for bad options, AlreadyExists naming DIR when it
// exists without `force`; nothing is written then.
absl::StatusOr<std::string> InitProject(const InitOptions& options);

}  // namespace swarm

#endif  // SWARM_CLI_INIT_PROJECT_H_
