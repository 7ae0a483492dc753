// NetnsSwarm: real swarm-client daemons, each in its own network namespace
// (see netns.h), for the fault tests. Like LocalSwarm (tests/integration):
// a temporary folder with the certificates (made by `swarmctl provision` from
// the job config, as an operator would), one site config and workspace per
// site, the daemons' logs; swarmctl and Status calls as the admin. Unlike it,
// a site listens on a fixed address of its namespace (10.77.0.<10+i>:7001),
// so it can be killed, frozen and restarted with the same config and
// workspace, and the network between the sites can be cut, made lossy or
// slow, and partitioned.
//
// Destroying it kills every daemon and removes the namespaces; the folder is
// kept when the test failed (or SWARM_FAULTS_KEEP is set).
#ifndef SWARM_TESTS_FAULTS_NETNS_SWARM_H_
#define SWARM_TESTS_FAULTS_NETNS_SWARM_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/swarm.grpc.pb.h"
#include "proto/swarm.pb.h"
#include "tests/support/netns.h"
#include "tests/support/process.h"

namespace swarm::testing {

constexpr int kSitePort = 7001;

// Every site's status at one moment (an error where a site did not answer).
using Snapshot = std::map<std::string, absl::StatusOr<v1::SiteStatus>>;

// How a job ended, as WaitJobEnd saw it.
struct JobOutcome {
  bool all_done = false;
  // Why the wait ended when not all_done: "every site ended", "no progress
  // for 60s", "deadline".
  std::string reason;
  absl::Duration elapsed;
  // One line per site: state, round, aggregator, trained rounds, last error.
  std::string table;
};

class NetnsSwarm {
 public:
  // `label` names the folder; `tag` the namespaces (unique in the run).
  NetnsSwarm(const std::string& label, const std::string& tag);
  ~NetnsSwarm();
  NetnsSwarm(const NetnsSwarm&) = delete;
  NetnsSwarm& operator=(const NetnsSwarm&) = delete;

  const std::string& dir() const { return dir_; }
  Network& net() { return net_; }

  // The bridge, a namespace per site, and a job config naming the sites at
  // their addresses (the rest left to the test).
  absl::Status CreateNetwork(const std::vector<std::string>& sites);
  v1::JobConfig BaseJob(const std::string& job_id) const;
  // Writes `job` to <dir>/job.json and provisions the CA, every site's
  // certificate and the admin "admin" with swarmctl.
  absl::Status WriteJobAndProvision(const v1::JobConfig& job);
  const std::string& job_path() const { return job_path_; }
  // Writes `job` as <dir>/<file_name> (another job file for swarmctl);
  // returns its path.
  absl::StatusOr<std::string> WriteJobFile(const v1::JobConfig& job,
                                           const std::string& file_name);

  // Starts (or restarts, with the same config and workspace) a site's daemon
  // in its namespace and waits for "listening on ...".
  absl::Status StartSite(const std::string& name);
  absl::Status StartAll();
  void Kill(const std::string& name);  // SIGKILL and reap.
  absl::Status Signal(const std::string& name, int signal);
  bool Running(const std::string& name);
  std::string Workspace(const std::string& name) const;
  const std::vector<std::string>& names() const { return names_; }

  // swarmctl (as the admin) from the hub namespace.
  CommandResult Swarmctl(const std::vector<std::string>& args,
                         absl::Duration timeout = absl::Seconds(60));

  // Status of one site (deadline `timeout`), and of all of them.
  absl::StatusOr<v1::SiteStatus> Status(const std::string& name,
                                        const std::string& job_id,
                                        absl::Duration timeout);
  Snapshot Poll(const std::string& job_id);

  // Polls until `done(snapshot)`; DeadlineExceeded naming `what` (and the
  // last snapshot) at `deadline`.
  absl::Status WaitFor(const std::string& job_id,
                       const std::function<bool(const Snapshot&)>& done,
                       absl::Time deadline, const std::string& what);

  // Waits until every site is DONE; or every site ended (DONE, FAILED,
  // ABORTED, or its daemon is dead); or nothing changed for `stall`; or
  // `deadline`.
  JobOutcome WaitJobEnd(const std::string& job_id, absl::Time deadline,
                        absl::Duration stall);
  // Every site has <ws>/<job>/best.safetensors and last.safetensors, each
  // byte-identical to the first site's. The first problem otherwise.
  absl::Status CheckFinalFiles(const std::string& job_id);
  // The same over `sites` only (e.g. the survivors of a case).
  absl::Status CheckFinalFiles(const std::string& job_id,
                               const std::vector<std::string>& sites);

  // A site's log (last `lines`), and all of them.
  std::string Log(const std::string& name, int lines = 30);
  std::string Logs(int lines = 30);

  static std::string Table(const Snapshot& snapshot);

 private:
  struct Site {
    std::string address;  // HOST:PORT
    std::string config_path;
    std::string log_path;
    std::unique_ptr<Process> process;
    std::unique_ptr<v1::Peer::Stub> stub;
  };
  v1::Peer::Stub& Stub(const std::string& name);

  std::string dir_;
  Network net_;
  std::vector<std::string> names_;
  std::map<std::string, Site> sites_;
  std::string job_path_;
  int commands_ = 0;
  int starts_ = 0;
};

}  // namespace swarm::testing

#endif  // SWARM_TESTS_FAULTS_NETNS_SWARM_H_
