// Starting a swarm-client daemon from a test or bench: run its command line,
// then wait for the "listening on HOST:PORT" line it prints once its Peer
// service is up (and, when it serves metrics, the "metrics listening on
// HOST:PORT" line after it). Shared by the integration harness
// (tests/integration/local_swarm.h) and the fault tests
// (tests/faults/netns_swarm.h), which differ only in the command line (the
// latter runs it inside a network namespace).
#ifndef SWARM_TESTS_SUPPORT_DAEMON_H_
#define SWARM_TESTS_SUPPORT_DAEMON_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/support/process.h"

namespace swarm::testing {

struct StartedDaemon {
  std::unique_ptr<Process> process;
  std::string address;          // HOST:PORT, as the daemon printed it.
  std::string metrics_address;  // HOST:PORT, or "" without metrics.
};

struct DaemonStart {
  std::string name;  // The site, for error messages.
  std::vector<std::string> argv;
  std::string log_path;  // The daemon's stderr (appended).
  // Waits for the "metrics listening on" line too.
  bool expect_metrics = false;
  // How long to wait for each line.
  absl::Duration timeout = absl::Seconds(30);
};

// Starts the daemon and waits for its handshake line(s). On failure the
// process (if started) is killed, and the error names the site, says what
// it printed instead and ends with the last 20 lines of its log.
absl::StatusOr<StartedDaemon> StartDaemon(const DaemonStart& start);

}  // namespace swarm::testing

#endif  // SWARM_TESTS_SUPPORT_DAEMON_H_
