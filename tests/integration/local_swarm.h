// LocalSwarm: real swarm-client daemons on loopback for integration tests.
// Each site gets a site config (listen port 0, its own workspace, the test
// learner) in a fresh temporary folder; the daemon's stderr log is kept
// beside it. Helpers run swarmctl, talk to sites through the generated gRPC
// stub, wait for a job to finish, and stop the daemons (each must exit 0 on
// SIGTERM). Whatever still runs when the LocalSwarm is destroyed is killed;
// the folder is removed unless the test failed.
//
// Everything runs with mTLS: the LocalSwarm makes a project CA, a
// certificate for every site it starts (its tls_dir) and one for the admin
// "admin" that swarmctl (--tls-dir) and Stub() use.
#ifndef SWARM_TESTS_INTEGRATION_LOCAL_SWARM_H_
#define SWARM_TESTS_INTEGRATION_LOCAL_SWARM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/swarm.grpc.pb.h"
#include "proto/swarm.pb.h"
#include "rpc/tls.h"
#include "security/certificates.h"
#include "tests/support/process.h"

namespace swarm::testing {

// The programs under test (set by CMake).
std::string SwarmClientPath();
std::string SwarmctlPath();

// Scales the tests' deadlines: 1 normally, more under sanitizers.
int TimeScale();

// `message` as indented protobuf JSON (field names as in the .proto).
std::string ToJson(const google::protobuf::Message& message);
// A fresh folder <$TMPDIR or /tmp>/<prefix>-<label>-XXXXXX (label made
// file-name safe).
std::string MakeTempDir(absl::string_view prefix, absl::string_view label);

struct SiteProcess {
  std::string name;
  std::string address;  // 127.0.0.1:PORT, as the daemon printed it.
  // 127.0.0.1:PORT of the metrics endpoint (StartSiteWithMetrics), or "".
  std::string metrics_address;
  std::string workspace;
  std::string config_path;
  std::string log_path;
  std::unique_ptr<Process> process;
  std::unique_ptr<v1::Peer::Stub> stub;  // Made by LocalSwarm::Stub.
};

// How the sites and the test talk: mTLS (the default) or --insecure.
enum class Transport { kMutualTls, kInsecure };

class LocalSwarm {
 public:
  // `label` names the temporary folder (e.g. the test's name).
  explicit LocalSwarm(absl::string_view label,
                      Transport transport = Transport::kMutualTls);
  ~LocalSwarm();
  LocalSwarm(const LocalSwarm&) = delete;
  LocalSwarm& operator=(const LocalSwarm&) = delete;

  const std::string& dir() const { return dir_; }

  // Writes the site config (test learner with `learner_params`), starts
  // swarm-client and waits for its "listening on HOST:PORT" line.
  // `max_calls_per_peer` > 0 sets that site config field.
  absl::Status StartSite(
      const std::string& name,
      const std::map<std::string, std::string>& learner_params,
      uint32_t max_calls_per_peer = 0);
  // StartSite with metrics_listen "127.0.0.1:0" (and `extra_args` on the
  // daemon's command line); also waits for the "metrics listening on" line.
  absl::Status StartSiteWithMetrics(
      const std::string& name,
      const std::map<std::string, std::string>& learner_params,
      const std::vector<std::string>& extra_args = {});
  // The same with learner.kind "external" and `trainer` as the site
  // config's trainer block (an external trainer over the trainer link).
  absl::Status StartExternalSite(
      const std::string& name, const v1::TrainerConfig& trainer,
      const std::map<std::string, std::string>& learner_params);
  // A site with the test's own site config (e.g. its privacy policy or
  // another learner); name, workspace and tls_dir are set here, and the
  // listen address unless the config has one.
  absl::Status StartSiteWithSiteConfig(const std::string& name,
                                       v1::SiteConfig config);
  // Stops `name` (SIGKILL when `kill`, as a power cut; else SIGTERM and a
  // clean exit) and starts it again with the same config, workspace and
  // port (the job config's address stays valid).
  absl::Status RestartSite(const std::string& name, bool kill = true);
  // <dir>/ws-<name>: the workspace a site gets.
  std::string Workspace(const std::string& name) const;
  SiteProcess& site(const std::string& name);
  // Names in start order.
  const std::vector<std::string>& site_names() const { return names_; }
  // {name, address} of a started site, for a job config.
  v1::SiteInfo Info(const std::string& name);

  // Writes `text` to <dir>/<name>; returns the path.
  std::string WriteFile(const std::string& name, const std::string& text);
  // Writes `job` as JSON (proto field names); returns the path.
  std::string WriteJob(const v1::JobConfig& job,
                       const std::string& name = "job.json");

  // Runs swarmctl with `args` to completion.
  CommandResult Swarmctl(const std::vector<std::string>& args,
                         absl::Duration timeout = absl::Seconds(60));
  // Starts swarmctl in the background, stdout and stderr to files
  // <dir>/<name>.out / .err.
  absl::StatusOr<std::unique_ptr<Process>> StartSwarmctl(
      const std::vector<std::string>& args, const std::string& name);

  // A stub to `site` acting as the admin.
  v1::Peer::Stub& Stub(const std::string& site);
  // A stub to `site` presenting the identity `as` (issued on first use;
  // role kSiteRole or kAdminRole).
  std::unique_ptr<v1::Peer::Stub> StubAs(const std::string& site,
                                         const std::string& as,
                                         const std::string& role);
  // An identity signed by this swarm's CA (issued on first use), e.g. for a
  // stand-in peer run by the test; its folder is <dir>/pki/<name>.
  const security::TlsIdentity& Identity(const std::string& name,
                                        const std::string& role);
  const std::string& admin_tls_dir() const { return admin_tls_dir_; }
  // This swarm's CA, e.g. to issue an odd certificate (expired, ...).
  const security::KeyAndCert& ca() const { return ca_; }
  // Status RPC; `wait_ms` > 0 long-polls for a change from `known_version`.
  absl::StatusOr<v1::StatusReply> Status(const std::string& site,
                                         const std::string& job_id = "",
                                         uint64_t wait_ms = 0,
                                         uint64_t known_version = 0);
  // Waits (long-polling Status) until every site reports DONE for `job_id`.
  // Fails at once when a site reports FAILED or ABORTED, naming it and its
  // last error, and at `deadline` naming the sites not done.
  absl::Status WaitAllDone(const std::string& job_id, absl::Time deadline);

  // SIGTERM to every running site; each must exit with status 0 within
  // `timeout`. Returns the first problem.
  absl::Status StopAll(absl::Duration timeout);

  // The last `lines` log lines of every site, for failure messages.
  std::string Logs(int lines = 40);

 private:
  absl::Status StartSiteWithConfig(
      const std::string& name, v1::SiteConfig config,
      const std::vector<std::string>& extra_args = {});

  std::string dir_;
  security::KeyAndCert ca_;
  std::map<std::string, security::TlsIdentity> identities_;
  std::string admin_tls_dir_;
  Transport transport_;
  int commands_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, SiteProcess> sites_;
};

// Whole file as bytes; NotFound when absent.
absl::StatusOr<std::string> ReadBytes(const std::string& path);
bool FileExists(const std::string& path);
// Regular files directly inside `dir` (names, sorted); empty when absent.
std::vector<std::string> ListFiles(const std::string& dir);

}  // namespace swarm::testing

#endif  // SWARM_TESTS_INTEGRATION_LOCAL_SWARM_H_
