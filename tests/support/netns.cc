#include "tests/support/netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/support/process.h"

namespace swarm::testing {
namespace {

constexpr char kPrefix[] = "swft";
constexpr char kSubnet[] = "10.77.0.";
constexpr char kHubAddress[] = "10.77.0.1";

std::string FindTool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string path = absl::StrCat(dir, name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

int ThreadCount() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "Threads:")) {
      int n = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &n)) return n;
    }
  }
  return -1;
}

// stdout of a command, or an error with the command, its exit and stderr.
absl::StatusOr<std::string> Output(const std::vector<std::string>& argv,
                                   absl::Duration timeout = absl::Seconds(30)) {
  static std::atomic<int> counter{0};
  const std::string prefix =
      absl::StrCat("/tmp/swft-cmd-", getpid(), "-", counter++);
  CommandResult result = RunCommand(argv, prefix, timeout);
  std::remove(absl::StrCat(prefix, ".out").c_str());
  std::remove(absl::StrCat(prefix, ".err").c_str());
  if (result.code() != 0) {
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(argv, " "), ": ", result.exit.ToString(),
                     result.timed_out ? " (timed out)" : "", ": ",
                     absl::StripAsciiWhitespace(result.err)));
  }
  return result.out;
}

}  // namespace

absl::Status RunTool(const std::vector<std::string>& argv,
                     absl::Duration timeout) {
  return Output(argv, timeout).status();
}

NetnsLab& NetnsLab::Get() {
  static NetnsLab* lab = new NetnsLab();
  return *lab;
}

std::vector<std::string> NetnsLab::RemoveStale() {
  std::vector<std::string> removed;
  absl::StatusOr<std::string> list = Output({ip_, "netns", "list"});
  if (!list.ok()) return removed;
  for (absl::string_view line :
       absl::StrSplit(*list, '\n', absl::SkipEmpty())) {
    const std::string name(
        absl::StripAsciiWhitespace(line.substr(0, line.find(' '))));
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, kPrefix)) continue;
    const size_t dash = rest.find('-');
    if (dash == absl::string_view::npos) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(rest.substr(0, dash), &pid) || pid <= 0) continue;
    if (pid == getpid()) continue;
    if (kill(pid, 0) == 0 || errno == EPERM) continue;  // Its run is alive.
    if (RunTool({ip_, "netns", "del", name}).ok()) removed.push_back(name);
  }
  return removed;
}

void NetnsLab::Enter() {
  if (entered_) return;
  entered_ = true;
  prefix_ = absl::StrCat(kPrefix, getpid());
  hub_ = absl::StrCat(prefix_, "-hub");
  ip_ = FindTool("ip");
  iptables_ = FindTool("iptables");
  tc_ = FindTool("tc");
  if (geteuid() != 0) {
    unavailable_ =
        "not root: creating network namespaces, veth pairs and qdiscs needs "
        "root";
    return;
  }
  if (ip_.empty() || iptables_.empty() || tc_.empty()) {
    unavailable_ =
        absl::StrCat("missing tools (Debian iproute2 and iptables): ip=",
                     ip_.empty() ? "missing" : ip_,
                     " iptables=", iptables_.empty() ? "missing" : iptables_,
                     " tc=", tc_.empty() ? "missing" : tc_);
    return;
  }
  // setns moves only the calling thread; threads started later inherit it.
  // So this must run while the process has no other thread.
  if (const int threads = ThreadCount(); threads != 1) {
    unavailable_ = absl::StrCat("the process already runs ", threads,
                                " threads; cannot move it into a namespace");
    return;
  }
  const std::vector<std::string> stale = RemoveStale();
  if (!stale.empty()) {
    std::fprintf(stderr, "[ netns ] removed namespaces of a dead run: %s\n",
                 absl::StrJoin(stale, ", ").c_str());
  }
  if (absl::Status added = RunTool({ip_, "netns", "add", hub_}); !added.ok()) {
    unavailable_ =
        absl::StrCat("network namespaces unavailable: ", added.message());
    return;
  }
  // A veth pair inside the hub tells whether veth works here at all.
  absl::Status veth = RunTool({ip_, "-n", hub_, "link", "add", "probe0", "type",
                               "veth", "peer", "name", "probe1"});
  if (!veth.ok()) {
    unavailable_ = absl::StrCat("veth unavailable: ", veth.message());
    RunTool({ip_, "netns", "del", hub_}).IgnoreError();
    return;
  }
  RunTool({ip_, "-n", hub_, "link", "del", "probe0"}).IgnoreError();
  RunTool({ip_, "-n", hub_, "link", "set", "lo", "up"}).IgnoreError();
  home_fd_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  const std::string hub_path = absl::StrCat("/run/netns/", hub_);
  const int hub_fd = open(hub_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (home_fd_ < 0 || hub_fd < 0 || setns(hub_fd, CLONE_NEWNET) != 0) {
    unavailable_ =
        absl::StrCat("cannot enter ", hub_path, ": ", std::strerror(errno));
    if (hub_fd >= 0) close(hub_fd);
    RunTool({ip_, "netns", "del", hub_}).IgnoreError();
    return;
  }
  close(hub_fd);
  unavailable_.clear();
  std::fprintf(stderr, "[ netns ] this run's namespaces: %s-*; hub %s\n",
               prefix_.c_str(), hub_.c_str());
}

void NetnsLab::Leave() {
  if (!entered_ || !unavailable_.empty()) return;
  if (home_fd_ >= 0) {
    setns(home_fd_, CLONE_NEWNET);
    close(home_fd_);
    home_fd_ = -1;
  }
  // Whatever a test left (it should have removed its own).
  absl::StatusOr<std::string> list = Output({ip_, "netns", "list"});
  if (list.ok()) {
    for (absl::string_view line :
         absl::StrSplit(*list, '\n', absl::SkipEmpty())) {
      const std::string name(line.substr(0, line.find(' ')));
      if (absl::StartsWith(name, absl::StrCat(prefix_, "-"))) {
        RunTool({ip_, "netns", "del", name}).IgnoreError();
      }
    }
  }
  unavailable_ = "the network namespace lab was torn down";
}

// --- Network.

Network::Network(const std::string& tag) : tag_(tag) {}

Network::~Network() {
  NetnsLab& lab = NetnsLab::Get();
  // The veth pairs first: deleting a namespace only drops its name, and the
  // kernel frees the namespace (and the pair with it) some time later, so
  // the next case could find "v<i>" still there.
  for (const auto& [name, site] : sites_) {
    RunTool({lab.ip(), "-n", lab.hub(), "link", "del", site.hub_dev})
        .IgnoreError();
    RunTool({lab.ip(), "netns", "del", site.ns}).IgnoreError();
  }
  if (bridge_) {
    RunTool({lab.ip(), "-n", lab.hub(), "link", "del", "br0"}).IgnoreError();
  }
}

absl::Status Network::Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {NetnsLab::Get().ip()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunTool(argv);
}

absl::Status Network::Create() {
  const std::string& hub = NetnsLab::Get().hub();
  // A bridge a previous test of this run failed to remove.
  Ip({"-n", hub, "link", "del", "br0"}).IgnoreError();
  if (absl::Status s = Ip({"-n", hub, "link", "add", "br0", "type", "bridge"});
      !s.ok()) {
    return s;
  }
  bridge_ = true;
  if (absl::Status s = Ip({"-n", hub, "addr", "add",
                           absl::StrCat(kHubAddress, "/24"), "dev", "br0"});
      !s.ok()) {
    return s;
  }
  return Ip({"-n", hub, "link", "set", "br0", "up"});
}

absl::StatusOr<std::string> Network::AddSite(const std::string& name,
                                             int index) {
  NetnsLab& lab = NetnsLab::Get();
  Site site;
  site.ns = absl::StrCat(lab.prefix(), "-", tag_, "-", name);
  site.address = absl::StrCat(kSubnet, 10 + index);
  site.hub_dev = absl::StrCat("v", index);
  RunTool({lab.ip(), "netns", "del", site.ns}).IgnoreError();
  // One a previous case of this run failed to remove.
  RunTool({lab.ip(), "-n", lab.hub(), "link", "del", site.hub_dev})
      .IgnoreError();
  if (absl::Status s = Ip({"netns", "add", site.ns}); !s.ok()) return s;
  sites_.emplace_back(name, site);
  // The pair is made in the hub; its site end goes straight into the site.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"-n", lab.hub(), "link", "add", site.hub_dev, "type", "veth",
            "peer", "name", "eth0", "netns", site.ns},
           {"-n", lab.hub(), "link", "set", site.hub_dev, "master", "br0"},
           {"-n", lab.hub(), "link", "set", site.hub_dev, "up"},
           {"-n", site.ns, "link", "set", "lo", "up"},
           {"-n", site.ns, "addr", "add", absl::StrCat(site.address, "/24"),
            "dev", "eth0"},
           {"-n", site.ns, "link", "set", "eth0", "up"}}) {
    if (absl::Status s = Ip(args); !s.ok()) return s;
  }
  return site.address;
}

const Network::Site* Network::Find(const std::string& name) const {
  for (const auto& [n, site] : sites_) {
    if (n == name) return &site;
  }
  return nullptr;
}

std::string Network::Namespace(const std::string& site) const {
  const Site* s = Find(site);
  return s == nullptr ? "" : s->ns;
}

std::string Network::Address(const std::string& site) const {
  const Site* s = Find(site);
  return s == nullptr ? "" : s->address;
}

std::vector<std::string> Network::Exec(const std::string& site,
                                       std::vector<std::string> argv) const {
  std::vector<std::string> full = {NetnsLab::Get().ip(), "netns", "exec",
                                   Namespace(site)};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

absl::Status Network::InSite(const std::string& site,
                             const std::vector<std::string>& argv) {
  if (Find(site) == nullptr) {
    return absl::NotFoundError(absl::StrCat("no site ", site));
  }
  return RunTool(Exec(site, argv));
}

absl::Status Network::SetLink(const std::string& site, bool up) {
  const Site* s = Find(site);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no site ", site));
  return Ip({"-n", NetnsLab::Get().hub(), "link", "set", s->hub_dev,
             up ? "up" : "down"});
}

absl::Status Network::AddLoss(const std::string& site, int percent) {
  return InSite(site,
                {NetnsLab::Get().iptables(), "-w", "-A", "INPUT", "-i", "eth0",
                 "-m", "statistic", "--mode", "random", "--probability",
                 absl::StrCat(percent / 100.0), "-j", "DROP"});
}

absl::StatusOr<int64_t> Network::LossDrops(const std::string& site) {
  if (Find(site) == nullptr) {
    return absl::NotFoundError(absl::StrCat("no site ", site));
  }
  absl::StatusOr<std::string> rules =
      Output(Exec(site, {NetnsLab::Get().iptables(), "-w", "-L", "INPUT", "-v",
                         "-x", "-n"}));
  if (!rules.ok()) return rules.status();
  int64_t drops = 0;
  for (absl::string_view line : absl::StrSplit(*rules, '\n')) {
    if (!absl::StrContains(line, "statistic")) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t packets = 0;
    if (!fields.empty() && absl::SimpleAtoi(fields[0], &packets)) {
      drops += packets;
    }
  }
  return drops;
}

absl::Status Network::AddTbf(const std::string& site,
                             const std::vector<std::string>& params) {
  const Site* s = Find(site);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no site ", site));
  NetnsLab& lab = NetnsLab::Get();
  std::vector<std::string> egress = {lab.tc(), "qdisc", "add", "dev",
                                     "eth0",   "root",  "tbf"};
  egress.insert(egress.end(), params.begin(), params.end());
  if (absl::Status st = InSite(site, egress); !st.ok()) return st;
  std::vector<std::string> ingress = {lab.tc(),   "-n",   lab.hub(),
                                      "qdisc",    "add",  "dev",
                                      s->hub_dev, "root", "tbf"};
  ingress.insert(ingress.end(), params.begin(), params.end());
  return RunTool(ingress);
}

absl::Status Network::CapBandwidth(const std::string& site,
                                   const std::string& rate) {
  return AddTbf(site, {"rate", rate, "burst", "32kbit", "latency", "400ms"});
}

absl::Status Network::CapBandwidth(const std::string& site,
                                   const LinkShape& shape) {
  if (shape.rate_bits_per_second == 0 || shape.burst_bytes == 0 ||
      shape.latency <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "a link shape needs a rate, a burst and a latency");
  }
  // tc reads a bare size as bytes; "bit" is bits per second.
  return AddTbf(
      site, {"rate", absl::StrCat(shape.rate_bits_per_second, "bit"), "burst",
             absl::StrCat(shape.burst_bytes), "latency",
             absl::StrCat(absl::ToInt64Microseconds(shape.latency), "us")});
}

absl::Status Network::Partition(const std::string& site,
                                const std::vector<std::string>& others) {
  const std::string& iptables = NetnsLab::Get().iptables();
  // A chain of its own, so Heal removes exactly these rules.
  InSite(site, {iptables, "-w", "-N", "swarm-partition"}).IgnoreError();
  for (const char* chain : {"INPUT", "OUTPUT"}) {
    if (InSite(site, {iptables, "-w", "-C", chain, "-j", "swarm-partition"})
            .ok()) {
      continue;
    }
    if (absl::Status s = InSite(
            site, {iptables, "-w", "-I", chain, "1", "-j", "swarm-partition"});
        !s.ok()) {
      return s;
    }
  }
  for (const std::string& other : others) {
    const std::string address = Address(other);
    if (address.empty()) {
      return absl::NotFoundError(absl::StrCat("no site ", other));
    }
    for (const char* direction : {"-s", "-d"}) {
      if (absl::Status s =
              InSite(site, {iptables, "-w", "-A", "swarm-partition", direction,
                            address, "-j", "DROP"});
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Network::Heal(const std::string& site) {
  return InSite(site,
                {NetnsLab::Get().iptables(), "-w", "-F", "swarm-partition"});
}

namespace {

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A non-blocking TCP socket in network namespace `ns`. A socket belongs to
// the namespace of the thread that made it, for life; so a short thread
// enters `ns`, makes it and ends, and the caller never leaves its own.
absl::StatusOr<int> TcpSocketIn(const std::string& ns) {
  absl::StatusOr<int> result = absl::InternalError("not run");
  std::thread maker([&ns, &result] {
    const std::string path = absl::StrCat("/run/netns/", ns);
    Fd ns_fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (ns_fd.get() < 0) {
      result = Errno(absl::StrCat("open ", path));
      return;
    }
    if (setns(ns_fd.get(), CLONE_NEWNET) != 0) {
      result = Errno(absl::StrCat("setns ", path));
      return;
    }
    const int fd =
        socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    result = fd >= 0 ? absl::StatusOr<int>(fd) : Errno("socket");
  });
  maker.join();
  return result;
}

// poll() on `fds` until one is ready or `deadline`.
absl::Status PollUntil(std::vector<pollfd>& fds, absl::Time deadline,
                       const std::string& what) {
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("timed out ", what));
    }
    const int ready = poll(fds.data(), fds.size(),
                           static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno != EINTR) return Errno(absl::StrCat("poll ", what));
  }
}

}  // namespace

absl::StatusOr<absl::Duration> Network::TimeTransfer(const std::string& from,
                                                     const std::string& to,
                                                     uint64_t bytes,
                                                     absl::Time deadline) {
  const Site* sender = Find(from);
  const Site* receiver = Find(to);
  if (sender == nullptr || receiver == nullptr) {
    return absl::NotFoundError(absl::StrCat("no site ", from, " or ", to));
  }
  absl::StatusOr<int> listen_fd = TcpSocketIn(receiver->ns);
  if (!listen_fd.ok()) return listen_fd.status();
  Fd listener(*listen_fd);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;  // Any free port of the receiver's namespace.
  if (inet_pton(AF_INET, receiver->address.c_str(), &address.sin_addr) != 1) {
    return absl::InternalError(absl::StrCat("bad address ", receiver->address));
  }
  socklen_t length = sizeof(address);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&address), length) !=
          0 ||
      listen(listener.get(), 1) != 0 ||
      getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address),
                  &length) != 0) {
    return Errno(absl::StrCat("listen on ", receiver->address));
  }
  absl::StatusOr<int> send_fd = TcpSocketIn(sender->ns);
  if (!send_fd.ok()) return send_fd.status();
  Fd out(*send_fd);
  if (connect(out.get(), reinterpret_cast<sockaddr*>(&address), length) != 0 &&
      errno != EINPROGRESS) {
    return Errno(absl::StrCat("connect ", from, " to ", to));
  }
  std::vector<pollfd> accepting = {{listener.get(), POLLIN, 0}};
  if (absl::Status s = PollUntil(accepting, deadline, "accepting"); !s.ok()) {
    return s;
  }
  Fd in(
      accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (in.get() < 0) return Errno("accept");

  // Both ends on this thread, each moved when poll says it can be. The
  // bytes' values do not matter: one buffer serves both.
  std::vector<char> buffer(1 << 20);
  uint64_t sent = 0;
  uint64_t received = 0;
  const absl::Time start = absl::Now();
  while (received < bytes) {
    const short want_out = sent < bytes ? POLLOUT : 0;
    std::vector<pollfd> fds = {{in.get(), POLLIN, 0}, {out.get(), want_out, 0}};
    if (absl::Status s = PollUntil(fds, deadline, "transferring"); !s.ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat(s.message(), ": ", received, " of ", bytes,
                       " bytes arrived from ", from, " at ", to));
    }
    if ((fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t n = send(
          out.get(), buffer.data(),
          static_cast<size_t>(std::min<uint64_t>(buffer.size(), bytes - sent)),
          MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR) return Errno("send");
      if (n > 0) sent += static_cast<uint64_t>(n);
    }
    if ((fds[0].revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
      const ssize_t n = recv(in.get(), buffer.data(), buffer.size(), 0);
      if (n == 0) return absl::InternalError("connection closed early");
      if (n < 0 && errno != EAGAIN && errno != EINTR) return Errno("recv");
      if (n > 0) received += static_cast<uint64_t>(n);
    }
  }
  return absl::Now() - start;
}

std::string Network::Describe() {
  NetnsLab& lab = NetnsLab::Get();
  std::string out;
  for (const auto& [name, site] : sites_) {
    absl::StatusOr<std::string> rules =
        Output(Exec(name, {lab.iptables(), "-w", "-S"}));
    absl::StatusOr<std::string> qdisc =
        Output({lab.tc(), "-n", site.ns, "qdisc", "show", "dev", "eth0"});
    absl::StrAppend(&out, "--- ", name, " (", site.ns, ", ", site.address,
                    "):\n", rules.ok() ? *rules : rules.status().ToString(),
                    qdisc.ok() ? *qdisc : qdisc.status().ToString());
  }
  return out;
}

}  // namespace swarm::testing
