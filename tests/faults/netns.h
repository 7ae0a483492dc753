// Network namespaces for the fault tests: a hub namespace holding a bridge,
// and one namespace per site joined to the bridge by a veth pair, each with
// its own address; plus the faults (link down, random loss, bandwidth cap,
// partitions) applied inside those namespaces only. Nothing touches the root
// namespace's interfaces, addresses, routes or firewall.
//
// NetnsLab is process-wide. Its Enter() (called once, from a gtest
// environment, before any other thread exists) removes namespaces a crashed
// earlier run left behind, creates this run's hub namespace
// "swft<pid>-hub" and moves the test process's (only) thread into it, so
// every thread and child the tests start later (gRPC's threads, swarmctl,
// the daemons before `ip netns exec` moves them) lives there and reaches the
// sites over the bridge. Leave() moves back and deletes the hub. When it
// cannot be done (not root, no `ip`, namespaces or veth unavailable) it
// records why, and every test skips with that reason.
#ifndef SWARM_TESTS_FAULTS_NETNS_H_
#define SWARM_TESTS_FAULTS_NETNS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace swarm::testing {

// Runs argv (argv[0] a full path) to completion; an error with the command,
// its exit and stderr unless it exits 0.
absl::Status RunTool(const std::vector<std::string>& argv,
                     absl::Duration timeout = absl::Seconds(30));

class NetnsLab {
 public:
  static NetnsLab& Get();

  // See the header comment. Idempotent.
  void Enter();
  void Leave();

  // Empty when the lab is usable, else why not (for GTEST_SKIP).
  const std::string& unavailable() const { return unavailable_; }
  // "swft<pid>": every namespace of this run starts with it.
  const std::string& prefix() const { return prefix_; }
  const std::string& hub() const { return hub_; }
  // Paths of the tools (empty when missing).
  const std::string& ip() const { return ip_; }
  const std::string& iptables() const { return iptables_; }
  const std::string& tc() const { return tc_; }

  // Deletes every namespace named swft<pid>-* whose pid is not a running
  // process (a run that crashed or was killed). Returns the names removed.
  std::vector<std::string> RemoveStale();

 private:
  NetnsLab() = default;
  std::string unavailable_ = "the network namespace lab was not set up";
  std::string prefix_;
  std::string hub_;
  std::string ip_, iptables_, tc_;
  int home_fd_ = -1;  // The root namespace, to go back to.
  bool entered_ = false;
};

// One test's network: a bridge in the hub with address 10.77.0.1/24 (where
// the test, swarmctl and the status calls live) and one namespace per site
// at 10.77.0.<10+i>/24. Destroying it deletes the site namespaces (and with
// them the veth pairs) and the bridge, whatever happened in the test.
class Network {
 public:
  // `tag` makes the namespace names unique inside this run (e.g. "t3").
  explicit Network(const std::string& tag);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Creates the bridge; first problem, if any.
  absl::Status Create();
  // Adds site number `index` (1-based) named `name`; returns its address.
  absl::StatusOr<std::string> AddSite(const std::string& name, int index);

  // Namespace of a site, and its address (no port).
  std::string Namespace(const std::string& site) const;
  std::string Address(const std::string& site) const;
  // `ip netns exec NS` + argv, the prefix to run a program in a site.
  std::vector<std::string> Exec(const std::string& site,
                                std::vector<std::string> argv) const;

  // --- Faults.
  // The site's link (its veth end in the hub) down or up.
  absl::Status SetLink(const std::string& site, bool up);
  // Drops each packet arriving at the site (every peer, the test too) with
  // probability `percent`/100: one lossy hop on every path between sites.
  absl::Status AddLoss(const std::string& site, int percent);
  // Packets the loss rule dropped at the site so far.
  absl::StatusOr<int64_t> LossDrops(const std::string& site);
  // Caps the site's link at `rate` (e.g. "10mbit") both ways: tbf on the
  // site's egress and on the hub's egress towards it.
  absl::Status CapBandwidth(const std::string& site, const std::string& rate);
  // Drops every packet between `site` and each of `others` (both ways, at
  // `site`); the test's own address stays reachable. Heal removes them.
  absl::Status Partition(const std::string& site,
                         const std::vector<std::string>& others);
  absl::Status Heal(const std::string& site);

  // Human-readable state of the faults (iptables and tc of every site), for
  // failure messages.
  std::string Describe();

 private:
  absl::Status Ip(const std::vector<std::string>& args);
  absl::Status InSite(const std::string& site,
                      const std::vector<std::string>& argv);

  std::string tag_;
  bool bridge_ = false;
  struct Site {
    std::string ns;
    std::string address;
    std::string hub_dev;  // The veth end in the hub ("v<index>").
  };
  std::vector<std::pair<std::string, Site>> sites_;
  const Site* Find(const std::string& name) const;
};

}  // namespace swarm::testing

#endif  // SWARM_TESTS_FAULTS_NETNS_H_
