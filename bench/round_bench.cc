// round_bench: time per round of whole jobs across real processes (issue 4,
// item 7). For 2, 4, 8 and 16 sites it starts one swarm-client daemon per
// site on loopback (listen port 0; each prints "listening on HOST:PORT"),
// writes their site configs and the job config into a temporary folder,
// configures every site and starts the job over gRPC, waits until every site
// is done, stops the daemons, and reads the per-round times from their logs.
//
//   round_bench [--client PATH] [--sites 2,4,8,16] [--rounds 20]
//               [--max-concurrent N] [--insecure] [--keep] [--scrape-hz HZ]
//               [--model-size 1KiB] [--link-mbit N]
//               [--variant star[,broadcast][,chain][,broadcast+chain]
//                          [,momentum][,adam]]
//               [--tensors 2304MiB,512MiB,256MiB] [--offload]
//               [--lean-min-bytes N]
//
// --lean-min-bytes sets the job's lean_memory_min_model_bytes (0: every
// model is held the lean way, as a file mapping; default 128 MiB).
//
// Every result line prints sent_mib_per_round: the model bytes all sites
// sent to peers (their round histories' bytes_sent), per round, final
// distribution included, averaged over the job's rounds.
//
// --scrape-hz HZ turns metrics_listen on at every site (127.0.0.1:0) and
// runs a scraper thread that GETs every site's /metrics HZ times per second
// while the job runs (issue 15: a scrape must not slow the round); it
// prints the scrapes made, failed and their mean time.
//
// --model-size sets the test learner's model (one F32 tensor; default
// 1 KiB); each size then also prints every daemon's peak resident memory
// (VmHWM, read before the daemons stop) and the most any one held divided by
// the model size, `peak_rss_over_model` (issue 13's memory budget).
//
// --tensors SIZE,SIZE,... (issue 13, item 5) gives the test learner one F32
// tensor per size instead of one (its `tensors` param; the model size is
// their sum, and a tensor may be larger than 2 GiB); --offload sets the
// job's disk_offload. Each size also prints, per site, the peak
// resident memory (VmHWM) and the peak anonymous and file-backed resident
// memory (RssAnon, RssFile of /proc/PID/status, sampled every 10 ms), each
// in MiB and as a multiple of the model size S, against issue 13's budget
// (VmHWM <= 3 S + 100 MiB; RssAnon <= 1.5 S + 100 MiB with disk offload).
// After every job the bench checks that best.safetensors and
// last.safetensors are byte-identical at every site, and fails if not. On
// loopback a model of 1 GiB or more raises the job's liveness timeouts as
// for a link of kLoopbackMbitForTimeouts (a 3 GiB scatter takes tens of
// seconds even there).
//
// --link-mbit N (issue 13, item 4) runs every daemon in its own network
// namespace behind a veth pair on a bridge (tests/support/netns.h; the bench
// itself moves into the hub namespace that holds the bridge, so its calls
// reach the sites), each site's link capped at N Mbit/s both ways by tc's
// tbf on both ends of its veth pair. Before each job it times one model (at
// most 10 s of link time, at least 1 MiB) from the first site to the second
// and refuses to go on if that beat the cap by more than 5%. It then prints
// `link_ratio`: the median round divided by the time one model takes over
// one link at N Mbit/s (the star sends N-1 models out of one site and takes
// N-1 in at another: about 2(N-1)). The job's liveness timeouts are scaled
// to the links (TimeoutsForLink) and printed. It needs root; without it, or
// where namespaces, veth pairs or tbf cannot be made, it exits 1 with "cannot
// run link-limited mode: <why>", never falling back to loopback. The
// namespaces, veth pairs, bridge and qdiscs are removed when the run ends,
// fails or is interrupted (SIGINT, SIGTERM); a run killed outright leaves
// them, and the next run (or fault test) removes those whose process is
// gone.
//
// --variant NAME[,NAME...] (default star) picks how a round moves models:
// each variant is the set of job-config fields it sets (kVariants below); the
// name is printed in every result line. With several, each size runs them in
// turn (the same sites, links and load).
//
// --client defaults to ../cli/swarm-client next to this binary (the build
// tree's layout). The job: the test learner with a 1 KiB model (256 F32) and
// no training time, every site a trainer and a candidate, default settings
// otherwise (max_concurrent_submissions 1). Like a real deployment the sites
// talk mTLS: the bench provisions a CA, a certificate per site and an admin
// certificate for itself (its Configure/Start/Status calls); --insecure runs
// plaintext instead.
//
// A round's time is measured from one scatter to the next: the aggregator of
// round r-1 logs "round r: scattering ..." when round r starts, and the
// last aggregator logs "job ...: finishing" when the last round is over. So
// it covers the whole cycle: learn tasks out, validation and training,
// permission, upload, aggregation, persisting the global model, election.
// Log lines carry millisecond timestamps from the one system clock all the
// daemons share. Prints, per size, the median (and min, p90, max) ms per
// round, the whole job's wall time, the CPU time all daemons used per round
// (user + system, from /proc; a figure other work on the machine barely
// skews, unlike the wall times: the load average is printed too), the most
// threads any one daemon had during the job (sampled every 10 ms), and as
// its last line
//   round_ms_16=<median at 16 sites>
// (the target is <= 30 ms at 16 sites).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/byte_size.h"
#include "google/protobuf/util/json_util.h"
#include "proto/swarm.grpc.pb.h"
#include "proto/swarm.pb.h"
#include "rpc/tls.h"
#include "security/provision.h"
#include "tests/integration/http_get.h"
#include "tests/support/netns.h"

extern char** environ;

namespace swarm {
namespace {

constexpr char kJobId[] = "round-bench";
constexpr char kAdmin[] = "round-bench";

// How a round moves models: the job-config fields a variant sets on top of
// the bench's job.
struct RoundVariant {
  const char* name;
  const char* what;
  void (*apply)(v1::JobConfig* job);
};
constexpr RoundVariant kVariants[] = {
    {"star",
     "the default round: the scattering site sends each trainer the model, "
     "each trainer sends its result to the aggregator (sets no job field)",
     [](v1::JobConfig*) {}},
    {"broadcast",
     "the learn task flows along the trainers, each forwarding it to the "
     "next as it arrives (broadcast_learn_tasks); results as in the star",
     [](v1::JobConfig* job) { job->set_broadcast_learn_tasks(true); }},
    {"chain",
     "learn tasks as in the star; the results reach the aggregator as one "
     "partial sum passed from trainer to trainer, each adding its own "
     "(reduce_results_in_chain)",
     [](v1::JobConfig* job) { job->set_reduce_results_in_chain(true); }},
    {"broadcast+chain",
     "the learn task broadcast along the trainers and the results reduced "
     "along a chain: about one model out of and one into the aggregator",
     [](v1::JobConfig* job) {
       job->set_broadcast_learn_tasks(true);
       job->set_reduce_results_in_chain(true);
     }},
    {"momentum",
     "the star with server momentum (server_optimizer): every learn task "
     "carries one model-sized F32 state tensor more; the aggregator steps",
     [](v1::JobConfig* job) {
       job->set_server_optimizer(v1::SERVER_OPTIMIZER_MOMENTUM);
     }},
    {"adam",
     "the star with server Adam: learn tasks carry two state tensors",
     [](v1::JobConfig* job) {
       job->set_server_optimizer(v1::SERVER_OPTIMIZER_ADAM);
     }},
};

const RoundVariant* FindVariant(absl::string_view name) {
  for (const RoundVariant& variant : kVariants) {
    if (name == variant.name) return &variant;
  }
  return nullptr;
}

std::string VariantList(const std::vector<const RoundVariant*>& variants) {
  std::string names;
  for (const RoundVariant* variant : variants) {
    absl::StrAppend(&names, names.empty() ? "" : ",", variant->name);
  }
  return names;
}

std::string VariantNames() {
  std::string names;
  for (const RoundVariant& variant : kVariants) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", variant.name);
  }
  return names;
}

// Set by SIGINT or SIGTERM: the job wait stops, the daemons are stopped and
// the namespaces removed as after any failure.
std::atomic<bool> interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free,
              "set from a signal handler");

void OnInterrupt(int) { interrupted.store(true); }

struct Options {
  std::string client;
  std::vector<int> sizes = {2, 4, 8, 16};
  int rounds = 20;
  bool keep = false;
  int max_concurrent = 0;  // 0: the job default.
  // Plaintext instead of the default mTLS.
  bool insecure = false;
  // Scrapes of every site's /metrics per second during the job (0: none).
  double scrape_hz = 0;
  // The test learner's model: one F32 tensor of this many bytes.
  uint64_t model_bytes = 1024;
  // Each site's link capped at this many Mbit/s both ways, every site in its
  // own network namespace (0: all on loopback, no cap).
  int link_mbit = 0;
  const RoundVariant* variant = &kVariants[0];  // The job being run.
  // --variant a,b: each size runs every variant in turn.
  std::vector<const RoundVariant*> variants = {&kVariants[0]};
  // With --tensors: the bytes of each F32 tensor (empty: one tensor of
  // model_bytes).
  std::vector<uint64_t> tensor_bytes;
  // Sets the job's disk_offload.
  bool offload = false;
  // Set (>= 0): the job's lean_memory_min_model_bytes.
  int64_t lean_min_bytes = -1;
};

// On loopback, models of at least this size get the job's liveness
// timeouts scaled as for a link of kLoopbackMbitForTimeouts Mbit/s: mTLS on
// a loaded 2-core machine moves a few hundred MB/s, so with their LAN
// defaults (5 s) a scatter of multi-GiB learn tasks looks like dead
// trainers.
constexpr uint64_t kLoopbackScaledTimeoutsMinBytes = 1ull << 30;
constexpr int kLoopbackMbitForTimeouts = 800;

// The link shape of --link-mbit: tbf's rate is the cap; the burst and the
// queue (latency) follow from it.
// - burst: at least 64 KiB, because veth hands tbf TCP segments of up to
//   64 KiB at once (GSO) and tbf must split a packet larger than its bucket;
//   and at least 5 ms at the rate, so one timer wake-up releases a batch of
//   packets instead of one (fewer wake-ups on a busy 2-core machine). It is
//   the most a link can run ahead of the rate: 64 KiB over a 64 MiB model
//   (at 100 Mbit/s) is 0.1%.
// - latency 50 ms: the queue holds 50 ms of traffic at the rate. That is
//   far more than the path's own round trip (well under 1 ms on veth), so
//   TCP's halving of its window after a drop does not leave the link idle,
//   even with one flow; and short enough that a small call's packet queued
//   behind a model's packets waits at most 50 ms in tbf, far below the job's
//   call deadlines (seconds).
testing::LinkShape ShapeFor(int mbit) {
  const uint64_t rate = static_cast<uint64_t>(mbit) * 1000000;
  testing::LinkShape shape;
  shape.rate_bits_per_second = rate;
  shape.burst_bytes = std::max<uint64_t>(64 * 1024, rate / 8 / 200);
  shape.latency = absl::Milliseconds(50);
  return shape;
}

// The time one model of `bytes` takes over one link at `mbit` Mbit/s.
double ModelOverLinkSeconds(uint64_t bytes, int mbit) {
  return static_cast<double>(bytes) * 8 / (static_cast<double>(mbit) * 1e6);
}

// With --link-mbit: the job's liveness timeouts raised to what a scatter
// takes over the capped links, so that they keep meaning "down or cut off"
// rather than "still receiving". Their defaults assume a LAN: at 8 sites,
// 64 MiB and 100 Mbit/s the scatterer's N-1 learn tasks share its link for
// about 38 s, and with the defaults the scatter stopped waiting for every
// remote trainer 5 s after its own (local) task was acknowledged
// (failover_timeout_ms), and a trainer's requests to submit, sent while the
// aggregator was still receiving its own task from the same site, timed out
// (request_to_submit_message_timeout_ms, 5 s) until the trainer failed the
// round over to a backup: a round of one or two results, not the star. Each is
// raised to twice a scatter, (N-1) models over one link, and never lowered
// below its default.
struct LinkTimeouts {
  uint64_t failover_timeout_ms = 0;
  uint64_t request_to_submit_message_timeout_ms = 0;
  uint64_t learn_task_ack_timeout_ms = 0;
};

LinkTimeouts TimeoutsForLink(const Options& options, int sites) {
  const int mbit =
      options.link_mbit > 0 ? options.link_mbit : kLoopbackMbitForTimeouts;
  const double scatter_s =
      (sites - 1) * ModelOverLinkSeconds(options.model_bytes, mbit);
  const uint64_t twice_scatter_ms = static_cast<uint64_t>(2000 * scatter_s);
  LinkTimeouts timeouts;
  timeouts.failover_timeout_ms = std::max<uint64_t>(5000, twice_scatter_ms);
  timeouts.request_to_submit_message_timeout_ms =
      std::max<uint64_t>(5000, twice_scatter_ms);
  timeouts.learn_task_ack_timeout_ms =
      std::max<uint64_t>(60000, twice_scatter_ms);
  return timeouts;
}

struct Daemon {
  std::string name;
  pid_t pid = -1;
  int stdout_fd = -1;
  std::string address;
  std::string metrics_address;  // With --scrape-hz.
  std::string log_path;
};

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  auto status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(std::string(status.message()));
  }
  return json;
}

// Starts `client --config config` with stdout on a pipe and stderr in
// `log_path`; waits for its "listening on HOST:PORT" line. `prefix` (e.g.
// `ip netns exec NS`), when not empty, runs the client: it must exec the
// client in its own process, so that daemon->pid is the client's.
absl::Status Launch(const std::vector<std::string>& prefix,
                    const std::string& client, const std::string& config,
                    bool insecure, bool metrics, Daemon* daemon) {
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addclose(&actions, out[1]);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO,
                                   daemon->log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> args = prefix;
  for (const std::string& arg : {client, std::string("--config"), config}) {
    args.push_back(arg);
  }
  if (insecure) args.push_back("--insecure");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int spawned = posix_spawn(&daemon->pid, args[0].c_str(), &actions,
                                  nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (spawned != 0) {
    close(out[0]);
    daemon->pid = -1;
    return absl::InternalError(
        absl::StrCat("cannot start ", args[0], ": ", std::strerror(spawned)));
  }
  daemon->stdout_fd = out[0];
  std::string seen;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (true) {
    const size_t newline = seen.find('\n');
    if (newline != std::string::npos) {
      const std::string line = seen.substr(0, newline);
      seen.erase(0, newline + 1);
      absl::string_view view = line;
      if (absl::ConsumePrefix(&view, "listening on ")) {
        daemon->address = std::string(view);
        if (!metrics) return absl::OkStatus();
      } else if (absl::ConsumePrefix(&view, "metrics listening on ")) {
        daemon->metrics_address = std::string(view);
        return absl::OkStatus();
      }
      continue;
    }
    const int left =
        static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left <= 0) break;
    pollfd fd{daemon->stdout_fd, POLLIN, 0};
    if (poll(&fd, 1, left) <= 0) continue;
    char buffer[512];
    const ssize_t n = read(daemon->stdout_fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    seen.append(buffer, static_cast<size_t>(n));
  }
  return absl::UnavailableError(
      absl::StrCat(daemon->name, " did not report its address (see ",
                   daemon->log_path, ")"));
}

// Waits until child `pid` ends, at most until `deadline`; reaps it and
// returns true if it ended.
bool WaitExit(pid_t pid, absl::Time deadline) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return waitpid(pid, nullptr, WNOHANG) == pid;
  bool ended = false;
  while (!ended) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) break;
    pollfd fd{pidfd, POLLIN, 0};
    ended = poll(&fd, 1, static_cast<int>(std::min<int64_t>(left, 1000))) > 0;
  }
  close(pidfd);
  return ended && waitpid(pid, nullptr, 0) == pid;
}

// SIGTERM to every daemon; one that has not ended 20 s later gets SIGKILL.
void Stop(std::vector<Daemon>& daemons) {
  for (Daemon& daemon : daemons) {
    if (daemon.pid > 0) kill(daemon.pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (Daemon& daemon : daemons) {
    if (daemon.pid > 0) {
      if (!WaitExit(daemon.pid, deadline)) {
        std::fprintf(stderr,
                     "round_bench: %s did not stop on SIGTERM: killed\n",
                     daemon.name.c_str());
        kill(daemon.pid, SIGKILL);
        waitpid(daemon.pid, nullptr, 0);
      }
      daemon.pid = -1;
    }
    if (daemon.stdout_fd >= 0) {
      close(daemon.stdout_fd);
      daemon.stdout_fd = -1;
    }
  }
}

// GETs every site's /metrics `hz` times per second from one thread, until
// Stop. Each GET is bounded (1 s); a tick that overruns starts the next at
// once.
class Scraper {
 public:
  Scraper(const std::vector<Daemon>& daemons, double hz) {
    if (hz <= 0) return;
    for (const Daemon& daemon : daemons) {
      addresses_.push_back(daemon.metrics_address);
    }
    period_ = absl::Seconds(1) / hz;
    thread_ = std::thread([this] { Loop(); });
  }
  ~Scraper() { Stop(); }

  void Stop() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  int scrapes() const { return scrapes_; }
  int failures() const { return failures_; }
  double mean_ms() const {
    return scrapes_ > 0 ? absl::ToDoubleMilliseconds(total_) / scrapes_ : 0;
  }
  const std::string& first_error() const { return first_error_; }

 private:
  void Loop() {
    absl::Time next = absl::Now();
    while (!stop_.HasBeenNotified()) {
      for (const std::string& address : addresses_) {
        const absl::Time start = absl::Now();
        absl::StatusOr<testing::HttpResponse> response =
            testing::HttpGet(address, "/metrics", start + absl::Seconds(1));
        total_ += absl::Now() - start;
        ++scrapes_;
        if (!response.ok() || response->status != 200 ||
            !absl::StrContains(response->body, "swarm_round")) {
          if (failures_++ == 0) {
            first_error_ = response.ok()
                               ? absl::StrCat("HTTP ", response->status)
                               : std::string(response.status().message());
          }
        }
      }
      next += period_;
      const absl::Duration wait = next - absl::Now();
      if (wait > absl::ZeroDuration()) {
        stop_.WaitForNotificationWithTimeout(wait);
      } else {
        next = absl::Now();
      }
    }
  }

  std::vector<std::string> addresses_;
  absl::Duration period_;
  absl::Notification stop_;
  std::thread thread_;
  // The loop's own; read after Stop.
  int scrapes_ = 0;
  int failures_ = 0;
  absl::Duration total_;
  std::string first_error_;
};

// CPU time (user + system) used so far by process `pid` and its threads.
double CpuMillis(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which is in parentheses): state is
  // field 3, utime 14, stime 15.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields =
      absl::StrSplit(text.substr(close + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 13) return 0;
  double utime = 0;
  double stime = 0;
  if (!absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double TotalCpuMillis(const std::vector<Daemon>& daemons) {
  double total = 0;
  for (const Daemon& daemon : daemons) {
    if (daemon.pid > 0) total += CpuMillis(daemon.pid);
  }
  return total;
}

// The number in field `field` ("Threads:", "VmHWM:") of /proc/PID/status
// (a " kB" unit dropped), or 0 if the process is gone.
uint64_t ProcStatusNumber(pid_t pid, absl::string_view field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    uint64_t value = 0;
    if (absl::StartsWith(line, field) &&
        absl::SimpleAtoi(
            absl::StripSuffix(
                absl::StripAsciiWhitespace(line.substr(field.size())), " kB"),
            &value)) {
      return value;
    }
  }
  return 0;
}

// The threads of process `pid` now (0 if it is gone).
int ThreadCount(pid_t pid) {
  return static_cast<int>(ProcStatusNumber(pid, "Threads:"));
}

// The peak resident memory of process `pid` so far (VmHWM), in bytes (0 if
// it is gone).
uint64_t PeakRssBytes(pid_t pid) {
  return ProcStatusNumber(pid, "VmHWM:") * 1024;
}

// Samples every daemon's thread count every 10 ms on its own thread while
// alive, keeping the most any one had (a held request or stream that parks
// a thread shows here).
class ThreadSampler {
 public:
  explicit ThreadSampler(const std::vector<Daemon>& daemons)
      : thread_([this, &daemons] {
          absl::MutexLock lock(&mu_);
          while (!mu_.AwaitWithTimeout(absl::Condition(&stop_),
                                       absl::Milliseconds(10))) {
            for (const Daemon& daemon : daemons) {
              if (daemon.pid > 0) {
                max_ = std::max(max_, ThreadCount(daemon.pid));
              }
            }
          }
        }) {}
  ~ThreadSampler() {
    if (thread_.joinable()) Stop();
  }
  ThreadSampler(const ThreadSampler&) = delete;
  ThreadSampler& operator=(const ThreadSampler&) = delete;

  // Stops sampling; returns the most threads seen.
  int Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    absl::MutexLock lock(&mu_);
    return max_;
  }

 private:
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int max_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// Peak memory of one daemon: VmHWM (read at the end) and the highest
// RssAnon and RssFile seen while sampling, in bytes.
struct DaemonMemory {
  uint64_t peak_rss = 0;
  uint64_t peak_rss_anon = 0;
  uint64_t peak_rss_file = 0;
};

// Samples every daemon's RssAnon and RssFile (/proc/PID/status) every 10 ms
// on its own thread, keeping each one's highest (issue 13: the budget with
// disk offload counts anonymous memory; file-backed pages of mapped models
// are the page cache's and can be reclaimed).
class MemorySampler {
 public:
  explicit MemorySampler(const std::vector<Daemon>& daemons)
      : memory_(daemons.size()), thread_([this, &daemons] {
          absl::MutexLock lock(&mu_);
          while (!mu_.AwaitWithTimeout(absl::Condition(&stop_),
                                       absl::Milliseconds(10))) {
            for (size_t i = 0; i < daemons.size(); ++i) {
              if (daemons[i].pid <= 0) continue;
              memory_[i].peak_rss_anon =
                  std::max(memory_[i].peak_rss_anon,
                           ProcStatusNumber(daemons[i].pid, "RssAnon:") * 1024);
              memory_[i].peak_rss_file =
                  std::max(memory_[i].peak_rss_file,
                           ProcStatusNumber(daemons[i].pid, "RssFile:") * 1024);
            }
          }
        }) {}
  ~MemorySampler() {
    if (thread_.joinable()) Stop();
  }
  MemorySampler(const MemorySampler&) = delete;
  MemorySampler& operator=(const MemorySampler&) = delete;

  // Stops sampling; returns each daemon's peaks (peak_rss not set).
  std::vector<DaemonMemory> Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    absl::MutexLock lock(&mu_);
    return memory_;
  }

 private:
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<DaemonMemory> memory_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Whether the files at `paths` all hold the same bytes (read in 4 MiB
// blocks); a file that cannot be read is an error naming it.
absl::StatusOr<bool> FilesIdentical(const std::vector<std::string>& paths) {
  if (paths.size() < 2) return true;
  std::vector<std::unique_ptr<std::ifstream>> files;
  for (const std::string& path : paths) {
    files.push_back(std::make_unique<std::ifstream>(path, std::ios::binary));
    if (!*files.back()) {
      return absl::NotFoundError(absl::StrCat("cannot open ", path));
    }
  }
  constexpr size_t kBlock = 4 << 20;
  std::string first(kBlock, '\0');
  std::string other(kBlock, '\0');
  while (true) {
    files[0]->read(first.data(), kBlock);
    const std::streamsize got = files[0]->gcount();
    for (size_t i = 1; i < files.size(); ++i) {
      files[i]->read(other.data(), kBlock);
      if (files[i]->gcount() != got ||
          std::memcmp(first.data(), other.data(), static_cast<size_t>(got)) !=
              0) {
        return false;
      }
    }
    if (got < static_cast<std::streamsize>(kBlock)) return true;
  }
}

// After a job: whether best.safetensors and last.safetensors are the same
// bytes at every site (workspace <dir>/<site>); prints one line each.
absl::Status CheckFinalModelsIdentical(const std::string& dir,
                                       const std::vector<Daemon>& daemons) {
  for (const char* name : {"best.safetensors", "last.safetensors"}) {
    std::vector<std::string> paths;
    for (const Daemon& daemon : daemons) {
      paths.push_back(
          absl::StrCat(dir, "/", daemon.name, "/", kJobId, "/", name));
    }
    absl::StatusOr<bool> identical = FilesIdentical(paths);
    if (!identical.ok()) return identical.status();
    const bool same = *identical;
    std::error_code error;
    const uintmax_t bytes = std::filesystem::file_size(paths[0], error);
    std::printf("sites=%d %s identical_at_every_site=%s (%s)\n",
                static_cast<int>(daemons.size()), name, same ? "yes" : "no",
                error ? "size unknown" : bench::HumanBytes(bytes).c_str());
    if (!same) {
      return absl::InternalError(
          absl::StrCat(name, " differs between the sites (see ", dir, ")"));
    }
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

// The 1-minute load average (other work on the machine skews the figures).
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  in >> first;
  return first;
}

// The time at the start of a log line ("2026-11-30T06:13:50.123Z ...").
std::optional<absl::Time> LineTime(absl::string_view line) {
  const size_t space = line.find(' ');
  if (space == absl::string_view::npos) return std::nullopt;
  absl::Time time;
  std::string error;
  if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ",
                       std::string(line.substr(0, space)), absl::UTCTimeZone(),
                       &time, &error)) {
    return std::nullopt;
  }
  return time;
}

struct SizeResult {
  int sites = 0;
  std::vector<double> round_ms;
  double job_ms = 0;
  // CPU time all daemons used from the start of the job to its end.
  double cpu_ms = 0;
  // Model bytes all sites sent to peers over the job (their round history,
  // RoundRecord.bytes_sent); 0 when a history call failed.
  uint64_t bytes_sent = 0;
  // The most threads one daemon had at once during the job (sampled).
  int max_threads = 0;
  // Each daemon's peak resident memory (VmHWM) at the end of the job.
  std::vector<uint64_t> peak_rss;
  // Each daemon's peaks (VmHWM, and sampled RssAnon and RssFile).
  std::vector<DaemonMemory> memory;
  // With --scrape-hz: GETs of /metrics made, failed, their mean time.
  int scrapes = 0;
  int scrape_failures = 0;
  double scrape_ms = 0;
  // With --link-mbit: one model's raw transfer from the first site to the
  // second before the job (0 bytes: not measured).
  uint64_t link_check_bytes = 0;
  double link_check_s = 0;
};

constexpr char kLinkRefusal[] = "cannot run link-limited mode: ";

// The namespaces of one job with --link-mbit: one per site, each site's
// link capped. Sets `addresses` to the sites' addresses (no port).
absl::Status BuildLinkLimitedNetwork(const Options& options,
                                     const std::vector<std::string>& names,
                                     testing::Network* network,
                                     std::vector<std::string>* addresses) {
  if (absl::Status created = network->Create(); !created.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kLinkRefusal, "cannot make the bridge: ", created.message()));
  }
  const testing::LinkShape shape = ShapeFor(options.link_mbit);
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StatusOr<std::string> address =
        network->AddSite(names[i], static_cast<int>(i) + 1);
    if (!address.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(kLinkRefusal, "cannot make the namespace of ", names[i],
                       ": ", address.status().message()));
    }
    if (absl::Status capped = network->CapBandwidth(names[i], shape);
        !capped.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(kLinkRefusal, "cannot cap the link of ", names[i],
                       " with tbf: ", capped.message()));
    }
    addresses->push_back(*address);
  }
  return absl::OkStatus();
}

// Times one model (at most 10 s of link time, at least 1 MiB) from the
// first site to the second on the idle network: a refusal naming the figures
// if it beat the cap by more than 5% (the cap does not hold).
absl::Status CheckLinkCap(const Options& options,
                          const std::vector<std::string>& names,
                          testing::Network* network, SizeResult* result) {
  if (names.size() < 2) return absl::OkStatus();
  const uint64_t ten_seconds =
      static_cast<uint64_t>(options.link_mbit) * 1000000 / 8 * 10;
  const uint64_t bytes = std::max<uint64_t>(
      1 << 20, std::min<uint64_t>(options.model_bytes, ten_seconds));
  const double at_cap = ModelOverLinkSeconds(bytes, options.link_mbit);
  absl::StatusOr<absl::Duration> took = network->TimeTransfer(
      names[0], names[1], bytes,
      absl::Now() + absl::Seconds(10) + absl::Seconds(3 * at_cap));
  if (!took.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kLinkRefusal,
        "cannot send between two sites: ", took.status().message()));
  }
  result->link_check_bytes = bytes;
  result->link_check_s = absl::ToDoubleSeconds(*took);
  if (result->link_check_s < at_cap / 1.05) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%sthe cap does not hold: %s from %s to %s took %.3f s, %.1f Mbit/s "
        "over a %d Mbit/s cap (%.3f s at the cap)",
        kLinkRefusal, bench::HumanBytes(bytes), names[0], names[1],
        result->link_check_s, bytes * 8 / result->link_check_s / 1e6,
        options.link_mbit, at_cap));
  }
  return absl::OkStatus();
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(
      values.size() - 1, static_cast<size_t>(q * (values.size() - 1) + 0.5));
  return values[index];
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Per-round times from the daemons' logs: scatter of round r to scatter of
// round r + 1, and the last scatter to "finishing".
absl::StatusOr<std::vector<double>> RoundTimes(
    const std::vector<Daemon>& daemons, int rounds) {
  std::map<int, absl::Time> scatter;
  std::optional<absl::Time> finishing;
  for (const Daemon& daemon : daemons) {
    std::ifstream in(daemon.log_path);
    std::string line;
    while (std::getline(in, line)) {
      const size_t bar = line.find("| ");
      if (bar == std::string::npos) continue;
      absl::string_view message = absl::string_view(line).substr(bar + 2);
      std::optional<absl::Time> time = LineTime(line);
      if (!time.has_value()) continue;
      if (absl::ConsumePrefix(&message, "round ") &&
          absl::StrContains(message, ": scattering")) {
        int round = 0;
        if (absl::SimpleAtoi(message.substr(0, message.find(':')), &round)) {
          scatter[round] = *time;
        }
      } else if (absl::StartsWith(
                     message, absl::StrCat("job ", kJobId, ": finishing"))) {
        finishing = *time;
      }
    }
  }
  if (static_cast<int>(scatter.size()) != rounds || !finishing.has_value()) {
    return absl::InternalError(absl::StrFormat(
        "found %d scatter lines and %s finishing line in the logs, expected "
        "%d and one",
        static_cast<int>(scatter.size()), finishing ? "a" : "no", rounds));
  }
  std::vector<double> times;
  for (int round = 0; round < rounds; ++round) {
    const absl::Time end =
        round + 1 < rounds ? scatter.at(round + 1) : *finishing;
    times.push_back(absl::ToDoubleMilliseconds(end - scatter.at(round)));
  }
  return times;
}

absl::StatusOr<SizeResult> RunSize(const Options& options, int sites) {
  char pattern[] = "/tmp/round_bench.XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp failed");
  }
  const std::string dir = pattern;
  // Destroyed last (after the daemons stopped): removes the namespaces, and
  // with them the veth pairs and qdiscs, and the bridge.
  std::unique_ptr<testing::Network> network;
  std::vector<Daemon> daemons(sites);
  std::vector<std::string> names;
  for (int i = 0; i < sites; ++i) {
    names.push_back(absl::StrFormat("site-%02d", i));
  }
  SizeResult result;
  result.sites = sites;
  absl::Status status = absl::OkStatus();
  // Where each site listens (no port): its namespace's address with
  // --link-mbit, else loopback.
  std::vector<std::string> hosts(sites, "127.0.0.1");
  if (options.link_mbit > 0) {
    network = std::make_unique<testing::Network>(absl::StrCat("b", sites));
    hosts.clear();
    status = BuildLinkLimitedNetwork(options, names, network.get(), &hosts);
    if (status.ok())
      status = CheckLinkCap(options, names, network.get(), &result);
  }
  // mTLS (the default): a CA, a certificate per site and one for this
  // bench as the admin. Certificates name the host (127.0.0.1, or the
  // site's namespace address), not the port, so they can be issued before
  // the daemons pick their ports.
  const std::string pki = absl::StrCat(dir, "/pki");
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (!options.insecure && status.ok()) {
    v1::JobConfig provisional;
    provisional.set_job_id(kJobId);
    provisional.set_num_rounds(1);
    for (int i = 0; i < sites; ++i) {
      v1::SiteInfo* info = provisional.add_sites();
      info->set_name(names[i]);
      info->set_address(absl::StrCat(hosts[i], ":", i + 1));
    }
    security::ProvisionOptions provision;
    provision.admins = {kAdmin};
    absl::StatusOr<security::ProvisionReport> report =
        security::Provision(provisional, pki, provision);
    absl::StatusOr<security::TlsIdentity> admin =
        report.ok()
            ? security::LoadTlsIdentity(absl::StrCat(pki, "/admins/", kAdmin))
            : absl::StatusOr<security::TlsIdentity>(report.status());
    if (admin.ok()) {
      credentials = security::ClientCredentials(*admin);
    } else {
      status = admin.status();
    }
  }
  for (int i = 0; i < sites && status.ok(); ++i) {
    Daemon& daemon = daemons[i];
    daemon.name = names[i];
    daemon.log_path = absl::StrCat(dir, "/", daemon.name, ".log");
    v1::SiteConfig site;
    site.set_name(daemon.name);
    site.set_listen_address(absl::StrCat(hosts[i], ":0"));
    site.set_workspace(absl::StrCat(dir, "/", daemon.name));
    site.mutable_learner()->set_kind("test");
    (*site.mutable_learner()->mutable_params())["size"] =
        absl::StrCat(options.model_bytes / 4);
    if (!options.tensor_bytes.empty()) {
      std::vector<std::string> elements;
      for (uint64_t bytes : options.tensor_bytes) {
        elements.push_back(absl::StrCat(bytes / 4));
      }
      (*site.mutable_learner()->mutable_params())["tensors"] =
          absl::StrJoin(elements, ",");
    }
    if (!options.insecure) {
      site.set_tls_dir(absl::StrCat(pki, "/sites/", daemon.name));
    }
    if (options.scrape_hz > 0) {
      site.set_metrics_listen(absl::StrCat(hosts[i], ":0"));
    }
    absl::StatusOr<std::string> json = ToJson(site);
    if (!json.ok()) {
      status = json.status();
      break;
    }
    const std::string path = absl::StrCat(dir, "/", daemon.name, ".json");
    status = WriteFile(path, *json);
    if (status.ok()) {
      status = Launch(network != nullptr ? network->Exec(daemon.name, {})
                                         : std::vector<std::string>{},
                      options.client, path, options.insecure,
                      options.scrape_hz > 0, &daemon);
    }
  }
  if (status.ok()) {
    v1::JobConfig job;
    job.set_job_id(kJobId);
    for (const Daemon& daemon : daemons) {
      v1::SiteInfo* info = job.add_sites();
      info->set_name(daemon.name);
      info->set_address(daemon.address);
    }
    job.set_num_rounds(options.rounds);
    job.set_seed(7);
    if (options.max_concurrent > 0) {
      job.set_max_concurrent_submissions(options.max_concurrent);
    }
    if (options.offload) job.set_disk_offload(true);
    if (options.lean_min_bytes >= 0) {
      job.set_lean_memory_min_model_bytes(
          static_cast<uint64_t>(options.lean_min_bytes));
    }
    if (options.link_mbit > 0 ||
        options.model_bytes >= kLoopbackScaledTimeoutsMinBytes) {
      const LinkTimeouts timeouts = TimeoutsForLink(options, sites);
      job.set_failover_timeout_ms(timeouts.failover_timeout_ms);
      job.set_request_to_submit_message_timeout_ms(
          timeouts.request_to_submit_message_timeout_ms);
      job.set_learn_task_ack_timeout_ms(timeouts.learn_task_ack_timeout_ms);
      std::printf(
          "sites=%d job timeouts scaled to the link%s: "
          "failover_timeout_ms=%llu "
          "request_to_submit_message_timeout_ms=%llu "
          "learn_task_ack_timeout_ms=%llu\n",
          sites,
          options.link_mbit > 0 ? ""
                                : absl::StrFormat(" (loopback, as %d Mbit/s)",
                                                  kLoopbackMbitForTimeouts)
                                      .c_str(),
          static_cast<unsigned long long>(timeouts.failover_timeout_ms),
          static_cast<unsigned long long>(
              timeouts.request_to_submit_message_timeout_ms),
          static_cast<unsigned long long>(timeouts.learn_task_ack_timeout_ms));
      std::fflush(stdout);
    }
    options.variant->apply(&job);
    absl::StatusOr<std::string> json = ToJson(job);
    if (json.ok()) {
      status = WriteFile(absl::StrCat(dir, "/job.json"), *json);
    } else {
      status = json.status();
    }
    // A round's allowance: 5 s, and with --link-mbit three times what the
    // star's 2(N-1) models over one link take.
    absl::Duration per_round = absl::Seconds(5);
    // The deadline of a Configure or Status call. With --link-mbit a reply
    // crosses a link that model streams keep full: tbf's queue drops some
    // of its packets, and TCP resends them after its retransmission timeout
    // (1 s, doubling).
    absl::Duration call_deadline = absl::Seconds(10);
    // Start answers once the first round's learn tasks are out, at most at
    // the call's deadline: with --link-mbit that is a whole scatter.
    absl::Duration start_deadline = absl::Seconds(10);
    if (options.link_mbit > 0) {
      per_round += absl::Seconds(
          3 * 2 * sites *
          ModelOverLinkSeconds(options.model_bytes, options.link_mbit));
      call_deadline = absl::Seconds(60);
      start_deadline = per_round;
    } else if (options.model_bytes >= kLoopbackScaledTimeoutsMinBytes) {
      // A multi-GiB round on loopback: about 2(N-1) + 3 models moved and
      // two written, at well under 100 MB/s each on a busy machine.
      per_round += absl::Seconds(
          (2 * sites + 3) *
          ModelOverLinkSeconds(options.model_bytes, kLoopbackMbitForTimeouts) *
          3);
      call_deadline = absl::Seconds(60);
      start_deadline = per_round;
    }
    std::vector<std::unique_ptr<v1::Peer::Stub>> stubs;
    for (const Daemon& daemon : daemons) {
      stubs.push_back(
          v1::Peer::NewStub(grpc::CreateChannel(daemon.address, credentials)));
    }
    for (int i = 0; i < sites && status.ok(); ++i) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + call_deadline));
      v1::ConfigureRequest request;
      request.set_sender(kAdmin);
      *request.mutable_job() = job;
      v1::Reply reply;
      grpc::Status rpc = stubs[i]->Configure(&context, request, &reply);
      if (!rpc.ok() || reply.outcome() != v1::OUTCOME_OK) {
        status = absl::InternalError(absl::StrCat("configure ", daemons[i].name,
                                                  ": ", rpc.error_message(),
                                                  reply.message()));
      }
    }
    const double cpu_before = TotalCpuMillis(daemons);
    ThreadSampler threads(daemons);
    MemorySampler memory(daemons);
    Scraper scraper(daemons, status.ok() ? options.scrape_hz : 0);
    const absl::Time start = absl::Now();
    if (status.ok()) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + start_deadline));
      v1::StartRequest request;
      request.set_sender(kAdmin);
      request.set_job_id(kJobId);
      v1::Reply reply;
      grpc::Status rpc = stubs[0]->Start(&context, request, &reply);
      if (!rpc.ok() || reply.outcome() != v1::OUTCOME_OK) {
        status = absl::InternalError(
            absl::StrCat("start: ", rpc.error_message(), reply.message()));
      }
    }
    // Wait until every site is done.
    const absl::Time deadline =
        absl::Now() + absl::Seconds(30) + options.rounds * per_round;
    for (int i = 0; i < sites && status.ok(); ++i) {
      uint64_t version = 0;
      while (true) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + call_deadline));
        v1::StatusRequest request;
        request.set_job_id(kJobId);
        request.set_sender(kAdmin);
        request.set_wait_for_change_ms(version == 0 ? 0 : 5000);
        request.set_known_version(version);
        v1::StatusReply reply;
        grpc::Status rpc = stubs[i]->Status(&context, request, &reply);
        if (!rpc.ok()) {
          status = absl::InternalError(absl::StrCat(
              "status of ", daemons[i].name, ": ", rpc.error_message()));
          break;
        }
        version = reply.version();
        const v1::SiteState state = reply.status().state();
        if (state == v1::SITE_STATE_DONE) break;
        if (state == v1::SITE_STATE_FAILED || state == v1::SITE_STATE_ABORTED) {
          status = absl::InternalError(absl::StrCat(
              daemons[i].name, " ended ", v1::SiteState_Name(state), ": ",
              reply.status().last_error()));
          break;
        }
        if (interrupted.load()) {
          status = absl::CancelledError("interrupted (SIGINT or SIGTERM)");
          break;
        }
        if (absl::Now() > deadline) {
          status = absl::DeadlineExceededError(
              absl::StrCat(daemons[i].name, " did not finish; state ",
                           v1::SiteState_Name(state)));
          break;
        }
      }
    }
    result.job_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    result.cpu_ms = TotalCpuMillis(daemons) - cpu_before;
    // What the round moved: every site's bytes sent, from its history.
    for (int i = 0; i < sites && status.ok(); ++i) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + call_deadline));
      v1::HistoryRequest request;
      request.set_job_id(kJobId);
      request.set_sender(kAdmin);
      v1::HistoryReply reply;
      grpc::Status rpc = stubs[i]->History(&context, request, &reply);
      if (!rpc.ok()) {
        result.bytes_sent = 0;
        break;
      }
      for (const v1::RoundRecord& round : reply.rounds()) {
        result.bytes_sent += round.bytes_sent();
      }
    }
    result.max_threads = threads.Stop();
    result.memory = memory.Stop();
    scraper.Stop();
    result.scrapes = scraper.scrapes();
    result.scrape_failures = scraper.failures();
    result.scrape_ms = scraper.mean_ms();
    if (scraper.failures() > 0 && status.ok()) {
      status = absl::InternalError(
          absl::StrCat(scraper.failures(), " of ", scraper.scrapes(),
                       " scrapes failed, the first: ", scraper.first_error()));
    }
  }
  for (size_t i = 0; i < daemons.size(); ++i) {
    if (daemons[i].pid <= 0) continue;
    result.peak_rss.push_back(PeakRssBytes(daemons[i].pid));
    if (i < result.memory.size()) {
      result.memory[i].peak_rss = result.peak_rss.back();
    }
  }
  Stop(daemons);
  if (status.ok()) status = CheckFinalModelsIdentical(dir, daemons);
  if (status.ok()) {
    absl::StatusOr<std::vector<double>> times =
        RoundTimes(daemons, options.rounds);
    if (times.ok()) {
      result.round_ms = std::move(*times);
    } else {
      status = times.status();
    }
  }
  if (!status.ok() || options.keep) {
    std::fprintf(stderr, "round_bench: %d sites: files kept in %s\n", sites,
                 dir.c_str());
  } else {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  if (!status.ok()) return status;
  return result;
}

// "one F32 tensor" or "3 F32 tensors: 2.25 GiB, 512 MiB, 256 MiB".
std::string TensorsText(const Options& options) {
  if (options.tensor_bytes.empty()) return "one F32 tensor";
  std::vector<std::string> sizes;
  for (uint64_t bytes : options.tensor_bytes) {
    sizes.push_back(bench::HumanBytes(bytes));
  }
  return absl::StrCat(options.tensor_bytes.size(),
                      " F32 tensors: ", absl::StrJoin(sizes, ", "));
}

// One line per site: peak VmHWM, RssAnon and RssFile in MiB and as a
// multiple of the model size S, then each against issue 13's budget (peak
// RSS <= 3 S + 100 MiB; with disk offload, RssAnon <= 1.5 S + 100 MiB).
void PrintSiteMemory(const Options& options, const SizeResult& result) {
  const double s = static_cast<double>(options.model_bytes);
  const double mib = 1048576.0;
  const double rss_budget = 3 * s + 100 * mib;
  const double anon_budget = 1.5 * s + 100 * mib;
  uint64_t most_rss = 0;
  uint64_t most_anon = 0;
  for (size_t i = 0; i < result.memory.size(); ++i) {
    const DaemonMemory& m = result.memory[i];
    most_rss = std::max(most_rss, m.peak_rss);
    most_anon = std::max(most_anon, m.peak_rss_anon);
    std::printf(
        "sites=%d site=site-%02d peak_rss_mib=%.0f (%.2f S) "
        "peak_rss_anon_mib=%.0f (%.2f S) peak_rss_file_mib=%.0f (%.2f S)\n",
        result.sites, static_cast<int>(i), m.peak_rss / mib, m.peak_rss / s,
        m.peak_rss_anon / mib, m.peak_rss_anon / s, m.peak_rss_file / mib,
        m.peak_rss_file / s);
  }
  std::printf(
      "sites=%d budget: peak_rss max %.0f MiB %s 3 S + 100 MiB = %.0f MiB; "
      "peak_rss_anon max %.0f MiB %s 1.5 S + 100 MiB = %.0f MiB%s\n",
      result.sites, most_rss / mib, most_rss <= rss_budget ? "<=" : ">",
      rss_budget / mib, most_anon / mib, most_anon <= anon_budget ? "<=" : ">",
      anon_budget / mib,
      options.offload ? "" : " (that bound is for disk offload)");
}

std::string DefaultClient(const char* argv0) {
  std::error_code error;
  std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) self = std::filesystem::absolute(argv0, error);
  return (self.parent_path() / ".." / "cli" / "swarm-client")
      .lexically_normal()
      .string();
}

int Run(int argc, char** argv) {
  Options options;
  options.client = DefaultClient(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "round_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--client") {
      options.client = value();
    } else if (arg == "--sites") {
      options.sizes.clear();
      for (absl::string_view part : absl::StrSplit(value(), ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < 1) {
          std::fprintf(stderr, "round_bench: bad --sites\n");
          return 2;
        }
        options.sizes.push_back(n);
      }
    } else if (arg == "--rounds") {
      if (!absl::SimpleAtoi(value(), &options.rounds) || options.rounds < 1) {
        std::fprintf(stderr, "round_bench: bad --rounds\n");
        return 2;
      }
    } else if (arg == "--max-concurrent") {
      if (!absl::SimpleAtoi(value(), &options.max_concurrent)) {
        std::fprintf(stderr, "round_bench: bad --max-concurrent\n");
        return 2;
      }
    } else if (arg == "--keep") {
      options.keep = true;
    } else if (arg == "--model-size") {
      absl::StatusOr<uint64_t> bytes = bench::ParseBytes(value());
      if (!bytes.ok() || *bytes < 4 || *bytes % 4 != 0) {
        std::fprintf(stderr,
                     "round_bench: bad --model-size (a multiple of 4 bytes, "
                     "e.g. 64MiB)\n");
        return 2;
      }
      options.model_bytes = *bytes;
    } else if (arg == "--tensors") {
      options.tensor_bytes.clear();
      uint64_t total = 0;
      for (absl::string_view part : absl::StrSplit(value(), ',')) {
        absl::StatusOr<uint64_t> bytes = bench::ParseBytes(part);
        if (!bytes.ok() || *bytes < 4 || *bytes % 4 != 0 ||
            *bytes > (uint64_t{4} << 30)) {
          std::fprintf(stderr,
                       "round_bench: bad --tensors (sizes of at most 4GiB, "
                       "multiples of 4 bytes, e.g. 2304MiB,512MiB)\n");
          return 2;
        }
        options.tensor_bytes.push_back(*bytes);
        total += *bytes;
      }
      options.model_bytes = total;
    } else if (arg == "--offload") {
      options.offload = true;
    } else if (arg == "--lean-min-bytes") {
      if (!absl::SimpleAtoi(value(), &options.lean_min_bytes) ||
          options.lean_min_bytes < 0) {
        std::fprintf(stderr, "round_bench: bad --lean-min-bytes (>= 0)\n");
        return 2;
      }
    } else if (arg == "--insecure") {
      options.insecure = true;
    } else if (arg == "--scrape-hz") {
      if (!absl::SimpleAtod(value(), &options.scrape_hz) ||
          options.scrape_hz < 0 || options.scrape_hz > 1000) {
        std::fprintf(stderr, "round_bench: bad --scrape-hz (0..1000)\n");
        return 2;
      }
    } else if (arg == "--link-mbit") {
      if (!absl::SimpleAtoi(value(), &options.link_mbit) ||
          options.link_mbit < 1 || options.link_mbit > 100000) {
        std::fprintf(stderr, "round_bench: bad --link-mbit (1..100000)\n");
        return 2;
      }
    } else if (arg == "--variant") {
      options.variants.clear();
      for (absl::string_view name : absl::StrSplit(value(), ',')) {
        const RoundVariant* variant = FindVariant(name);
        if (variant == nullptr) {
          std::fprintf(stderr,
                       "round_bench: unknown --variant \"%s\"; known: %s\n",
                       std::string(name).c_str(), VariantNames().c_str());
          for (const RoundVariant& known : kVariants) {
            std::fprintf(stderr, "  %s: %s\n", known.name, known.what);
          }
          return 2;
        }
        options.variants.push_back(variant);
      }
      options.variant = options.variants.front();
    } else {
      std::fprintf(stderr,
                   "usage: round_bench [--client PATH] [--sites 2,4,8,16] "
                   "[--rounds 20] [--max-concurrent N] [--insecure] "
                   "[--keep] [--scrape-hz HZ] [--model-size 1KiB] "
                   "[--link-mbit N] [--variant %s[,...]] "
                   "[--tensors SIZE,SIZE,...] [--offload] [--lean-min-bytes N]\n",
                   VariantNames().c_str());
      return 2;
    }
  }
  if (options.link_mbit > 0 &&
      *std::max_element(options.sizes.begin(), options.sizes.end()) > 200) {
    std::fprintf(stderr,
                 "round_bench: --link-mbit runs at most 200 sites (one /24 "
                 "of addresses)\n");
    return 2;
  }
  if (access(options.client.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "round_bench: no swarm-client at %s (use --client)\n",
                 options.client.c_str());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  struct sigaction on_interrupt = {};
  on_interrupt.sa_handler = OnInterrupt;
  sigemptyset(&on_interrupt.sa_mask);
  sigaction(SIGINT, &on_interrupt, nullptr);
  sigaction(SIGTERM, &on_interrupt, nullptr);
  // Leaves the hub namespace and deletes it (and whatever a failed size left
  // in this run's namespaces) on every return below.
  struct LabExit {
    bool entered = false;
    ~LabExit() {
      if (entered) testing::NetnsLab::Get().Leave();
    }
  } lab_exit;
  if (options.link_mbit > 0) {
    // Before any other thread exists (gRPC starts its own with the first
    // channel): only the calling thread moves into the hub.
    testing::NetnsLab& lab = testing::NetnsLab::Get();
    lab.Enter();
    lab_exit.entered = true;
    if (!lab.unavailable().empty()) {
      std::fprintf(stderr, "round_bench: %s%s\n", kLinkRefusal,
                   lab.unavailable().c_str());
      return 1;
    }
  }
  std::printf(
      "round_bench: swarm-client %s, %s model (%s), test "
      "learner, %d rounds per job, %s, variants %s%s\n",
      options.client.c_str(), bench::HumanBytes(options.model_bytes).c_str(),
      TensorsText(options).c_str(), options.rounds,
      options.insecure ? "plaintext (--insecure)" : "mTLS",
      VariantList(options.variants).c_str(),
      options.offload ? ", disk offload" : "");
  if (options.link_mbit > 0) {
    const testing::LinkShape shape = ShapeFor(options.link_mbit);
    std::printf(
        "link-limited: every site in its own network namespace, its link "
        "capped at %d Mbit/s both ways (tbf burst %s, latency %s); one model "
        "over one link: %.4g s\n",
        options.link_mbit, bench::HumanBytes(shape.burst_bytes).c_str(),
        absl::FormatDuration(shape.latency).c_str(),
        ModelOverLinkSeconds(options.model_bytes, options.link_mbit));
  }
  std::fflush(stdout);
  std::map<int, double> medians;
  // With --link-mbit, per variant and size.
  std::map<std::string, std::map<int, double>> link_ratios;
  for (int sites : options.sizes) {
    for (const RoundVariant* variant : options.variants) {
      options.variant = variant;
      absl::StatusOr<SizeResult> result = RunSize(options, sites);
      if (!result.ok()) {
        std::fprintf(stderr, "round_bench: %d sites: %s\n", sites,
                     std::string(result.status().message()).c_str());
        return 1;
      }
      const double median = Median(result->round_ms);
      medians[sites] = median;
      if (result->link_check_bytes > 0) {
        const double at_cap =
            ModelOverLinkSeconds(result->link_check_bytes, options.link_mbit);
        std::printf(
            "sites=%d link_check: %s from site-00 to site-01 in %.3f s, %.1f "
            "Mbit/s (%.3f s at the %d Mbit/s cap: measured / cap time %.3f)\n",
            sites, bench::HumanBytes(result->link_check_bytes).c_str(),
            result->link_check_s,
            result->link_check_bytes * 8 / result->link_check_s / 1e6, at_cap,
            options.link_mbit, result->link_check_s / at_cap);
      }
      std::printf(
          "sites=%d variant=%s rounds=%d round_ms median=%.1f min=%.1f "
          "p90=%.1f "
          "max=%.1f job_ms=%.0f cpu_ms_per_round=%.1f "
          "max_threads_per_daemon=%d sent_mib_per_round=%.1f "
          "loadavg=%s\n",
          sites, options.variant->name, options.rounds, median,
          *std::min_element(result->round_ms.begin(), result->round_ms.end()),
          Percentile(result->round_ms, 0.9),
          *std::max_element(result->round_ms.begin(), result->round_ms.end()),
          result->job_ms, result->cpu_ms / options.rounds, result->max_threads,
          static_cast<double>(result->bytes_sent) / options.rounds /
              (1 << 20),
          LoadAverage().c_str());
      if (!result->peak_rss.empty()) {
        const uint64_t most =
            *std::max_element(result->peak_rss.begin(), result->peak_rss.end());
        std::vector<double> mib;
        for (uint64_t bytes : result->peak_rss)
          mib.push_back(bytes / 1048576.0);
        std::printf(
            "sites=%d peak_rss_mib max=%.1f median=%.1f "
            "peak_rss_over_model=%.2f (the most any daemon held / model "
            "bytes)\n",
            sites, most / 1048576.0, Median(mib),
            static_cast<double>(most) /
                static_cast<double>(options.model_bytes));
      }
      PrintSiteMemory(options, *result);
      if (options.link_mbit > 0) {
        const double model_s =
            ModelOverLinkSeconds(options.model_bytes, options.link_mbit);
        link_ratios[variant->name][sites] = median / 1000 / model_s;
        std::printf(
            "sites=%d variant=%s link_mbit=%d model_over_link_s=%.4g "
            "round_s_median=%.3f link_ratio=%.2f (median round / one model "
            "over "
            "one link; the star's is about 2(N-1) = %d)\n",
            sites, options.variant->name, options.link_mbit, model_s,
            median / 1000, link_ratios[variant->name][sites], 2 * (sites - 1));
      }
      if (options.scrape_hz > 0) {
        std::printf(
            "scrape_hz=%g scrapes=%d failed=%d mean_scrape_ms=%.2f (every "
            "site's /metrics)\n",
            options.scrape_hz, result->scrapes, result->scrape_failures,
            result->scrape_ms);
      }
      std::fflush(stdout);
    }
  }
  const int last = options.sizes.back();
  if (medians.count(16) > 0) {
    std::printf("round_ms_16=%.1f\n", medians[16]);
  } else {
    std::printf("round_ms_%d=%.1f\n", last, medians[last]);
  }
  if (options.link_mbit > 0) {
    for (const RoundVariant* variant : options.variants) {
      std::printf("link_ratio_%s_%d=%.2f\n", variant->name, last,
                  link_ratios[variant->name][last]);
    }
  }
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Run(argc, argv); }
