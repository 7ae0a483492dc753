// Network namespaces for the fault tests (tests/faults) and round_bench's
// link-limited mode (bench/round_bench --link-mbit): a hub namespace holding
// a bridge, and one namespace per site joined to the bridge by a veth pair,
// each with its own address; plus the faults (link down, random loss,
// bandwidth cap, partitions) applied inside those namespaces only. Nothing
// touches the root namespace's interfaces, addresses, routes or firewall.
//
// NetnsLab is process-wide. Its Enter() (called once, before any other
// thread exists: the fault tests call it from a gtest environment,
// round_bench first thing in main) removes namespaces a crashed earlier run
// left behind, creates this run's hub namespace "swft<pid>-hub" and moves the
// process's (only) thread into it, so every thread and child the process
// starts later (gRPC's threads, swarmctl, the daemons before `ip netns exec`
// moves them) lives there and reaches the sites over the bridge. Leave()
// moves back and deletes the hub. When it cannot be done (not root, no `ip`,
// namespaces or veth unavailable) it records why, and the caller skips (the
// tests) or refuses to run (the bench) with that reason.
#ifndef SWARM_TESTS_SUPPORT_NETNS_H_
#define SWARM_TESTS_SUPPORT_NETNS_H_

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

  // Empty when the lab is usable, else why not (for GTEST_SKIP, or the
  // bench's refusal).
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

// How tc's token bucket filter (tbf) shapes one direction of a link: at most
// `rate_bits_per_second` on average, bursts of at most `burst_bytes` at line
// speed, and packets that would wait longer than `latency` in its queue
// dropped (the queue holds rate x latency + burst bytes).
struct LinkShape {
  uint64_t rate_bits_per_second = 0;
  uint64_t burst_bytes = 0;
  absl::Duration latency;
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
  // The same with an explicit shape (both ways alike).
  absl::Status CapBandwidth(const std::string& site, const LinkShape& shape);
  // Drops every packet between `site` and each of `others` (both ways, at
  // `site`); the test's own address stays reachable. Heal removes them.
  absl::Status Partition(const std::string& site,
                         const std::vector<std::string>& others);
  absl::Status Heal(const std::string& site);

  // --- Measurements.
  // Sends `bytes` over one TCP connection from site `from` to site `to` and
  // returns the time from the connection's first byte sent to its last byte
  // received: what the path between them (both sites' links, with their
  // caps) carries. The sockets are made in the sites' namespaces; the
  // transfer runs on the calling thread, which stays in its own namespace.
  // DeadlineExceeded at `deadline`.
  absl::StatusOr<absl::Duration> TimeTransfer(const std::string& from,
                                              const std::string& to,
                                              uint64_t bytes,
                                              absl::Time deadline);

  // Human-readable state of the faults (iptables and tc of every site), for
  // failure messages.
  std::string Describe();

 private:
  absl::Status Ip(const std::vector<std::string>& args);
  absl::Status InSite(const std::string& site,
                      const std::vector<std::string>& argv);
  // tbf with `params` (after "root tbf") on the site's egress and on the
  // hub's egress towards it.
  absl::Status AddTbf(const std::string& site,
                      const std::vector<std::string>& params);

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

#endif  // SWARM_TESTS_SUPPORT_NETNS_H_
