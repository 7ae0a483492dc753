// Operator mistakes against real daemons (issue 34): each is refused before
// anything changes, saying what to do instead, and loses nothing.
//   - start of a finished job (its final models are kept);
//   - start after every site restarted (names swarmctl resume);
//   - start with a site down or frozen (nothing configured anywhere; the
//     same command works once the site is back);
//   - a site that dies after those checks, before its configure (the sites
//     configured before it are rolled back; the same command works once it
//     is back), a job reloaded before its start (started afresh), and a
//     resume with a site still down (nothing rolled back);
//   - status and fetch while the sites run another job or this one;
//   - sites of another wire protocol major version (a simulated peer), and
//     a peer older than the version exchange, which keeps working.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/tls.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Time Deadline(absl::Duration d) { return absl::Now() + d * TimeScale(); }

v1::JobConfig JobOf(LocalSwarm& swarm, const std::string& job_id,
                    const std::vector<std::string>& sites, uint32_t rounds) {
  v1::JobConfig job;
  job.set_job_id(job_id);
  for (const std::string& name : sites) *job.add_sites() = swarm.Info(name);
  job.set_num_rounds(rounds);
  job.set_seed(7);
  job.set_metric_name("accuracy");
  return job;
}

// The site's status for any job (job_id empty: none).
v1::SiteStatus StatusOf(LocalSwarm& swarm, const std::string& site) {
  absl::StatusOr<v1::StatusReply> reply = swarm.Status(site);
  EXPECT_TRUE(reply.ok()) << reply.status();
  return reply.ok() ? reply->status() : v1::SiteStatus();
}

// Waits until `site` reports round >= `round` of its job.
void WaitForRound(LocalSwarm& swarm, const std::string& site, uint32_t round) {
  const absl::Time deadline = Deadline(absl::Seconds(60));
  while (StatusOf(swarm, site).round() < round) {
    ASSERT_LT(absl::Now(), deadline) << swarm.Logs();
    absl::SleepFor(absl::Milliseconds(50));  // polling a real daemon
  }
}

const std::map<std::string, std::string> kSlow = {{"size", "256"},
                                                  {"train_ms", "150"}};

TEST(OperatorTest, AFinishedJobIsNotRunAgainOverItsModels) {
  LocalSwarm swarm("operator_finished");
  for (const char* name : {"site-a", "site-b"}) {
    ASSERT_TRUE(swarm.StartSite(name, {{"size", "256"}}).ok());
  }
  const std::string job = swarm.WriteJob(
      JobOf(swarm, "finished-1", {"site-a", "site-b"}, /*rounds=*/2));
  ASSERT_EQ(swarm.Swarmctl({"start", "--job", job}).code(), 0);
  ASSERT_TRUE(swarm.WaitAllDone("finished-1", Deadline(absl::Seconds(60))).ok())
      << swarm.Logs();
  const std::string best =
      swarm.Workspace("site-a") + "/finished-1/best.safetensors";
  absl::StatusOr<std::string> before = ReadBytes(best);
  ASSERT_TRUE(before.ok()) << before.status();
  struct stat first {};
  ASSERT_EQ(stat(best.c_str(), &first), 0);

  const CommandResult again = swarm.Swarmctl({"start", "--job", job});
  EXPECT_EQ(again.code(), 1) << again.ToString();
  EXPECT_THAT(again.err, HasSubstr("job finished-1: it already finished"));
  EXPECT_THAT(again.err, HasSubstr("finished-1/best.safetensors"));
  EXPECT_THAT(again.err, HasSubstr("swarmctl fetch --site"));
  EXPECT_THAT(again.err, HasSubstr("--rerun-finished"));
  EXPECT_THAT(again.out, Not(HasSubstr("configured")));
  EXPECT_EQ(StatusOf(swarm, "site-a").state(), v1::SITE_STATE_DONE);
  EXPECT_EQ(StatusOf(swarm, "site-b").state(), v1::SITE_STATE_DONE);
  absl::SleepFor(absl::Milliseconds(300));  // nothing may touch the model
  struct stat second {};
  ASSERT_EQ(stat(best.c_str(), &second), 0);
  EXPECT_EQ(first.st_mtim.tv_nsec, second.st_mtim.tv_nsec);
  EXPECT_EQ(first.st_mtim.tv_sec, second.st_mtim.tv_sec);
  EXPECT_EQ(*ReadBytes(best), *before);
}

// After the sites restarted, a finished job is not held in memory any more;
// its final models on disk still keep it from being run over.
TEST(OperatorTest, AFinishedJobIsNotRunAgainAfterTheSitesRestarted) {
  LocalSwarm swarm("operator_finished_restart");
  for (const char* name : {"site-a", "site-b"}) {
    ASSERT_TRUE(swarm.StartSite(name, {{"size", "256"}}).ok());
  }
  const std::string job = swarm.WriteJob(
      JobOf(swarm, "finished-2", {"site-a", "site-b"}, /*rounds=*/2));
  ASSERT_EQ(swarm.Swarmctl({"start", "--job", job}).code(), 0);
  ASSERT_TRUE(swarm.WaitAllDone("finished-2", Deadline(absl::Seconds(60))).ok())
      << swarm.Logs();
  const std::string last =
      swarm.Workspace("site-a") + "/finished-2/last.safetensors";
  absl::StatusOr<std::string> before = ReadBytes(last);
  ASSERT_TRUE(before.ok()) << before.status();
  // Clean restarts (SIGTERM): the daemon lands the writes it queued, DONE
  // among them, before it exits (SiteDriver::FinishWrites). A kill -9 within
  // milliseconds of DONE can beat that write (CI saw it twice): the job is
  // then reloaded as interrupted and `start` names `resume` instead.
  ASSERT_TRUE(swarm.RestartSite("site-a", /*kill=*/false).ok()) << swarm.Logs();
  ASSERT_TRUE(swarm.RestartSite("site-b", /*kill=*/false).ok()) << swarm.Logs();

  const CommandResult again = swarm.Swarmctl({"start", "--job", job});
  EXPECT_EQ(again.code(), 1) << again.ToString();
  EXPECT_THAT(again.err,
              HasSubstr("job finished-2 already finished at site site-a"));
  EXPECT_THAT(again.err, HasSubstr(swarm.Workspace("site-a") + "/finished-2"));
  EXPECT_THAT(again.err, HasSubstr("--rerun-finished"));
  EXPECT_THAT(again.out, Not(HasSubstr("started")));
  EXPECT_EQ(StatusOf(swarm, "site-a").job_id(), "");
  EXPECT_EQ(*ReadBytes(last), *before);

  // Asked for explicitly, it runs again.
  const CommandResult rerun =
      swarm.Swarmctl({"start", "--job", job, "--rerun-finished"});
  EXPECT_EQ(rerun.code(), 0) << rerun.ToString() << swarm.Logs();
  EXPECT_TRUE(swarm.WaitAllDone("finished-2", Deadline(absl::Seconds(60))).ok())
      << swarm.Logs();
}

TEST(OperatorTest, StartAfterEverySiteRestartedNamesResume) {
  LocalSwarm swarm("operator_restart");
  for (const char* name : {"site-a", "site-b"}) {
    ASSERT_TRUE(swarm.StartSite(name, kSlow).ok());
  }
  const std::string job = swarm.WriteJob(
      JobOf(swarm, "restart-1", {"site-a", "site-b"}, /*rounds=*/200));
  ASSERT_EQ(swarm.Swarmctl({"start", "--job", job}).code(), 0);
  WaitForRound(swarm, "site-a", 3);
  ASSERT_TRUE(swarm.RestartSite("site-a").ok()) << swarm.Logs();
  ASSERT_TRUE(swarm.RestartSite("site-b").ok()) << swarm.Logs();

  const CommandResult start = swarm.Swarmctl({"start", "--job", job});
  EXPECT_EQ(start.code(), 1) << start.ToString();
  EXPECT_THAT(start.err, HasSubstr("job restart-1: it was interrupted"));
  EXPECT_THAT(start.err,
              HasSubstr(absl::StrCat("swarmctl resume --job ", job)));
  EXPECT_THAT(start.err, HasSubstr("resumes from the global model of round"));
  // The hint works as written.
  const CommandResult resume = swarm.Swarmctl({"resume", "--job", job});
  EXPECT_EQ(resume.code(), 0) << resume.ToString() << swarm.Logs();
  EXPECT_EQ(swarm.Swarmctl({"abort", "--job", job}).code(), 0);
}

TEST(OperatorTest, AStartWithASiteDownOrFrozenChangesNothing) {
  LocalSwarm swarm("operator_partial");
  for (const char* name : {"site-a", "site-b", "site-c"}) {
    ASSERT_TRUE(swarm.StartSite(name, {{"size", "256"}}).ok());
  }
  const std::string job = swarm.WriteJob(
      JobOf(swarm, "partial-1", {"site-a", "site-b", "site-c"}, /*rounds=*/2));
  // site-c frozen: it takes connections and answers nothing.
  ASSERT_EQ(kill(swarm.site("site-c").process->pid(), SIGSTOP), 0);
  const CommandResult frozen = swarm.Swarmctl({"start", "--job", job});
  EXPECT_EQ(frozen.code(), 1) << frozen.ToString();
  EXPECT_THAT(frozen.err, HasSubstr("nothing was changed on any site"));
  EXPECT_THAT(frozen.err, HasSubstr("site site-c"));
  EXPECT_EQ(StatusOf(swarm, "site-a").job_id(), "");
  EXPECT_EQ(StatusOf(swarm, "site-b").job_id(), "");
  // Back: the same command runs the job.
  ASSERT_EQ(kill(swarm.site("site-c").process->pid(), SIGCONT), 0);
  const CommandResult start = swarm.Swarmctl({"start", "--job", job});
  ASSERT_EQ(start.code(), 0) << start.ToString();
  ASSERT_TRUE(swarm.WaitAllDone("partial-1", Deadline(absl::Seconds(60))).ok())
      << swarm.Logs();

  // A site down (its address answers nothing): refused the same way.
  const std::string next = swarm.WriteJob(
      JobOf(swarm, "partial-2", {"site-a", "site-b", "site-c"}, 2),
      "next.json");
  swarm.site("site-b").process->Kill();
  const CommandResult down = swarm.Swarmctl({"start", "--job", next});
  EXPECT_EQ(down.code(), 1) << down.ToString();
  EXPECT_THAT(down.err, HasSubstr("site site-b"));
  EXPECT_EQ(StatusOf(swarm, "site-a").job_id(), "partial-1");
  EXPECT_EQ(StatusOf(swarm, "site-c").job_id(), "partial-1");
}

TEST(OperatorTest, StatusAndFetchSayWhatTheSitesRun) {
  LocalSwarm swarm("operator_status");
  for (const char* name : {"site-a", "site-b", "site-c"}) {
    ASSERT_TRUE(swarm.StartSite(name, kSlow).ok());
  }
  const std::string running = swarm.WriteJob(
      JobOf(swarm, "running-1", {"site-a", "site-b"}, /*rounds=*/200));
  const std::string other = swarm.WriteJob(
      JobOf(swarm, "other-1", {"site-a", "site-b", "site-c"}, 2), "other.json");
  ASSERT_EQ(swarm.Swarmctl({"start", "--job", running}).code(), 0);
  WaitForRound(swarm, "site-a", 1);

  const CommandResult status = swarm.Swarmctl({"status", "--job", other});
  EXPECT_EQ(status.code(), 1) << status.ToString();
  EXPECT_THAT(status.out, HasSubstr("runs job running-1"));
  EXPECT_THAT(status.out, HasSubstr("no job"));  // site-c
  EXPECT_THAT(status.out, Not(HasSubstr("unreachable")));

  const CommandResult start = swarm.Swarmctl({"start", "--job", other});
  EXPECT_EQ(start.code(), 1) << start.ToString();
  EXPECT_THAT(start.err, HasSubstr("site site-a"));
  EXPECT_THAT(start.err, HasSubstr("runs job running-1"));
  EXPECT_EQ(StatusOf(swarm, "site-c").job_id(), "");

  const CommandResult fetch = swarm.Swarmctl(
      {"fetch", "--site", swarm.site("site-a").address, "--which", "best",
       "--out", swarm.dir() + "/best.safetensors", "--job-id", "running-1"});
  EXPECT_EQ(fetch.code(), 1) << fetch.ToString();
  EXPECT_THAT(fetch.err, HasSubstr("job running-1 is still running on site"));
  EXPECT_THAT(fetch.err, HasSubstr("(round "));
  EXPECT_EQ(swarm.Swarmctl({"abort", "--job", running}).code(), 0);
}

// A TCP relay in front of one site (the job config names the relay's
// address): it passes every connection through, except that when the
// `gate_at`-th connection arrives it first runs `on_gate` (the test kills
// the site) and then closes that connection unanswered. swarmctl opens one
// connection per call, so with gate_at 2 the site answers the start's
// status check and is gone when its configure comes: exactly the moment
// between the checks and its configure.
class GateRelay {
 public:
  GateRelay(int target_port, int gate_at, std::function<void()> on_gate)
      : target_port_(target_port),
        gate_at_(gate_at),
        on_gate_(std::move(on_gate)) {}
  ~GateRelay() {
    if (thread_.joinable()) {
      const char byte = 0;
      (void)!write(wake_[1], &byte, 1);
      thread_.join();
    }
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
      if (fd >= 0) close(fd);
    }
  }

  absl::Status Start() {
    if (pipe(wake_) != 0) return absl::InternalError("pipe");
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (listen_fd_ < 0 ||
        bind(listen_fd_, reinterpret_cast<sockaddr*>(&address),
             sizeof(address)) != 0 ||
        listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address),
                    &length) != 0) {
      return absl::InternalError("cannot listen on 127.0.0.1");
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int connections() const { return connections_; }

 private:
  int ConnectTarget() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(target_port_);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&address),
                           sizeof(address)) == 0) {
      return fd;
    }
    if (fd >= 0) close(fd);
    return -1;
  }

  static bool WriteAll(int fd, const char* data, ssize_t size) {
    while (size > 0) {
      const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
      if (n <= 0) return false;
      data += n;
      size -= n;
    }
    return true;
  }

  void Run() {
    std::vector<std::pair<int, int>> pairs;  // client, target
    while (true) {
      std::vector<pollfd> fds = {{wake_[0], POLLIN, 0},
                                 {listen_fd_, POLLIN, 0}};
      for (const auto& [client, target] : pairs) {
        fds.push_back({client, POLLIN, 0});
        fds.push_back({target, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents != 0) break;
      const size_t polled = pairs.size();  // A new pair waits a round.
      if (fds[1].revents & POLLIN) {
        const int client = accept(listen_fd_, nullptr, nullptr);
        if (client >= 0) {
          const int count = ++connections_;
          const int target = count == gate_at_ ? -1 : ConnectTarget();
          if (count == gate_at_) on_gate_();
          if (target < 0) {
            close(client);
          } else {
            pairs.emplace_back(client, target);
          }
        }
      }
      std::vector<std::pair<int, int>> open(pairs.begin() + polled,
                                            pairs.end());
      for (size_t i = 0; i < polled; ++i) {
        bool alive = true;
        for (int side = 0; side < 2 && alive; ++side) {
          const pollfd& p = fds[2 + 2 * i + side];
          if (p.revents == 0) continue;
          const int from = side == 0 ? pairs[i].first : pairs[i].second;
          const int to = side == 0 ? pairs[i].second : pairs[i].first;
          char buffer[65536];
          const ssize_t n = read(from, buffer, sizeof(buffer));
          alive = n > 0 && WriteAll(to, buffer, n);
        }
        if (alive) {
          open.push_back(pairs[i]);
        } else {
          close(pairs[i].first);
          close(pairs[i].second);
        }
      }
      pairs.swap(open);
    }
    for (const auto& [client, target] : pairs) {
      close(client);
      close(target);
    }
  }

  const int target_port_;
  const int gate_at_;
  std::function<void()> on_gate_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<int> connections_{0};
  std::thread thread_;
};

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port))
      << address;
  return port;
}

// The start is all-or-nothing: site-c dies after the checks passed and
// before its configure; the sites configured before it are rolled back (not
// left waiting for a start, nor reloaded by a restart as an interrupted
// job), and the same command runs the job once site-c is back.
TEST(OperatorTest, AStartThatFailsPartWayIsRolledBack) {
  LocalSwarm swarm("operator_rollback");
  for (const char* name : {"site-a", "site-b", "site-c"}) {
    ASSERT_TRUE(swarm.StartSite(name, {{"size", "256"}}).ok());
  }
  const pid_t site_c = swarm.site("site-c").process->pid();
  GateRelay relay(PortOf(swarm.site("site-c").address), /*gate_at=*/2,
                  [site_c] { kill(site_c, SIGKILL); });
  ASSERT_TRUE(relay.Start().ok());
  v1::JobConfig config =
      JobOf(swarm, "rollback-1", {"site-a", "site-b", "site-c"}, 2);
  config.mutable_sites(2)->set_address(relay.address());
  const std::string job = swarm.WriteJob(config);

  const CommandResult failed = swarm.Swarmctl({"start", "--job", job});
  // (gRPC may try the dead address again: more connections, all closed.)
  ASSERT_GE(relay.connections(), 2)
      << "swarmctl never came to site-c's configure; " << failed.ToString();
  EXPECT_EQ(failed.code(), 1) << failed.ToString();
  EXPECT_THAT(failed.err, HasSubstr("site site-c"));
  EXPECT_THAT(failed.err, HasSubstr("configure failed"));
  EXPECT_THAT(failed.err,
              HasSubstr("was not started on any site; rolled back its "
                        "configuration on site-a, site-b"));
  EXPECT_THAT(failed.err, HasSubstr("run the same command again"));
  for (const char* name : {"site-a", "site-b"}) {
    const v1::SiteStatus status = StatusOf(swarm, name);
    EXPECT_EQ(status.job_id(), "rollback-1") << name;
    EXPECT_EQ(status.state(), v1::SITE_STATE_ABORTED) << name;
    EXPECT_THAT(status.last_error(), HasSubstr("rolled back")) << name;
  }
  // What the rollback leaves in a workspace: the job's config and its
  // state (aborted), which a restart does not reload. The restart is a
  // clean one (SIGTERM): a site answers the abort before its state file
  // says ABORTED (the write follows within milliseconds), so a power cut
  // right after the rollback may still find the job CONFIGURED on disk and
  // reload it - harmless, since a start configures such a job afresh
  // (AJobReloadedBeforeItsStartIsStartedAfresh). A kill -9 200 ms after
  // the rollback showed exactly that in CI.
  EXPECT_THAT(ListFiles(swarm.Workspace("site-a") + "/rollback-1"),
              ::testing::IsSupersetOf({"job.json", "state.json"}));
  ASSERT_TRUE(swarm.RestartSite("site-a", /*kill=*/false).ok())
      << swarm.Logs();
  EXPECT_EQ(StatusOf(swarm, "site-a").job_id(), "");

  // site-c is back (same address): the very same command runs the job.
  ASSERT_TRUE(swarm.RestartSite("site-c").ok()) << swarm.Logs();
  const CommandResult again = swarm.Swarmctl({"start", "--job", job});
  ASSERT_EQ(again.code(), 0) << again.ToString() << swarm.Logs();
  ASSERT_TRUE(swarm.WaitAllDone("rollback-1", Deadline(absl::Seconds(60))).ok())
      << swarm.Logs();
}

// A resume rolls nothing back: with one site still down, the sites that
// reloaded the job keep it (nothing aborted), and the same command resumes
// it once that site is back.
TEST(OperatorTest, AResumeWithASiteStillDownKeepsTheReloadedJob) {
  LocalSwarm swarm("operator_resume_down");
  for (const char* name : {"site-a", "site-b", "site-c"}) {
    ASSERT_TRUE(swarm.StartSite(name, kSlow).ok());
  }
  const std::string job = swarm.WriteJob(JobOf(
      swarm, "resume-down-1", {"site-a", "site-b", "site-c"}, /*rounds=*/200));
  ASSERT_EQ(swarm.Swarmctl({"start", "--job", job}).code(), 0);
  WaitForRound(swarm, "site-a", 3);
  ASSERT_TRUE(swarm.RestartSite("site-a").ok()) << swarm.Logs();
  ASSERT_TRUE(swarm.RestartSite("site-b").ok()) << swarm.Logs();
  swarm.site("site-c").process->Kill();

  const CommandResult down = swarm.Swarmctl({"resume", "--job", job});
  EXPECT_EQ(down.code(), 1) << down.ToString();
  EXPECT_THAT(down.err, HasSubstr("site site-c"));
  EXPECT_THAT(down.err, HasSubstr("job resume-down-1 was not resumed"));
  EXPECT_THAT(down.err, Not(HasSubstr("rolled back")));
  for (const char* name : {"site-a", "site-b"}) {
    const v1::SiteStatus status = StatusOf(swarm, name);
    EXPECT_EQ(status.job_id(), "resume-down-1") << name;
    EXPECT_NE(status.state(), v1::SITE_STATE_ABORTED) << name;
    EXPECT_TRUE(status.rejoined()) << name;
  }
  ASSERT_TRUE(swarm.RestartSite("site-c").ok()) << swarm.Logs();
  const CommandResult resume = swarm.Swarmctl({"resume", "--job", job});
  EXPECT_EQ(resume.code(), 0) << resume.ToString() << swarm.Logs();
  EXPECT_EQ(swarm.Swarmctl({"abort", "--job", job}).code(), 0);
}

// A start that never finished (swarmctl itself killed after configuring
// some sites: nothing rolled back), then those sites restarted: they reload
// a job that never started, which is configured anew, not "interrupted".
TEST(OperatorTest, AJobReloadedBeforeItsStartIsStartedAfresh) {
  LocalSwarm swarm("operator_unstarted");
  for (const char* name : {"site-a", "site-b"}) {
    ASSERT_TRUE(swarm.StartSite(name, {{"size", "256"}}).ok());
  }
  const v1::JobConfig config =
      JobOf(swarm, "unstarted-1", {"site-a", "site-b"}, 2);
  const std::string job = swarm.WriteJob(config);
  v1::ConfigureRequest request;
  request.set_sender("admin");
  *request.mutable_job() = config;
  *request.mutable_protocol() = OwnProtocolVersion();
  v1::Reply reply;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(swarm.Stub("site-a").Configure(&context, request, &reply).ok());
  }
  ASSERT_EQ(reply.outcome(), v1::OUTCOME_OK) << reply.message();
  // A clean restart: the configure is answered before its state write is on
  // disk, and a kill -9 right after the answer can beat it (CI saw it); a
  // SIGTERM lands it first (SiteDriver::FinishWrites).
  ASSERT_TRUE(swarm.RestartSite("site-a", /*kill=*/false).ok())
      << swarm.Logs();
  const v1::SiteStatus reloaded = StatusOf(swarm, "site-a");
  ASSERT_EQ(reloaded.job_id(), "unstarted-1");
  ASSERT_EQ(reloaded.state(), v1::SITE_STATE_CONFIGURED);
  ASSERT_TRUE(reloaded.rejoined());

  const CommandResult start = swarm.Swarmctl({"start", "--job", job});
  ASSERT_EQ(start.code(), 0) << start.ToString() << swarm.Logs();
  ASSERT_TRUE(
      swarm.WaitAllDone("unstarted-1", Deadline(absl::Seconds(60))).ok())
      << swarm.Logs();
}

// A stand-in peer of a chosen wire protocol version: answers Status (with
// that version, or none as a release older than the exchange) and accepts
// Configure and Start, counting the configures.
class VersionedPeer final : public v1::Peer::Service {
 public:
  explicit VersionedPeer(std::optional<v1::ProtocolVersion> version)
      : version_(std::move(version)) {}

  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*,
                      v1::StatusReply* reply) override {
    reply->mutable_status()->set_site("peer");
    if (version_.has_value()) {
      *reply->mutable_protocol() = *version_;
      reply->set_build("9.0.0 (commit simulated)");
    }
    return grpc::Status::OK;
  }
  grpc::Status Configure(grpc::ServerContext*,
                         const v1::ConfigureRequest* request,
                         v1::Reply* reply) override {
    ++configures;
    sent_protocol = ProtocolText(request->protocol());
    reply->set_outcome(v1::OUTCOME_OK);
    return grpc::Status::OK;
  }
  grpc::Status Start(grpc::ServerContext*, const v1::StartRequest*,
                     v1::Reply* reply) override {
    reply->set_outcome(v1::OUTCOME_OK);
    return grpc::Status::OK;
  }

  std::atomic<int> configures{0};
  std::string sent_protocol;

 private:
  std::optional<v1::ProtocolVersion> version_;
};

struct PeerServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

PeerServer Serve(LocalSwarm& swarm, VersionedPeer* peer) {
  PeerServer served;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      "127.0.0.1:0",
      security::ServerCredentials(swarm.Identity("peer", security::kSiteRole)),
      &served.port);
  builder.RegisterService(peer);
  served.server = builder.BuildAndStart();
  return served;
}

TEST(OperatorTest, SitesOfAnotherProtocolMajorAreRefusedBeforeAnyChange) {
  LocalSwarm swarm("operator_protocol");
  ASSERT_TRUE(swarm.StartSite("site-a", {{"size", "256"}}).ok());
  v1::ProtocolVersion newer;
  newer.set_major_version(kWireProtocolMajor + 1);
  VersionedPeer peer(newer);
  PeerServer served = Serve(swarm, &peer);
  ASSERT_NE(served.server, nullptr);
  v1::JobConfig config = JobOf(swarm, "mixed-1", {"site-a"}, 2);
  v1::SiteInfo* other = config.add_sites();
  other->set_name("peer");
  other->set_address(absl::StrCat("127.0.0.1:", served.port));
  const std::string job = swarm.WriteJob(config);

  const CommandResult start = swarm.Swarmctl({"start", "--job", job});
  EXPECT_EQ(start.code(), 1) << start.ToString();
  EXPECT_THAT(start.err, HasSubstr("different wire protocol major versions"));
  EXPECT_THAT(start.err,
              HasSubstr(absl::StrCat(
                  "site site-a (", swarm.Info("site-a").address(),
                  "): wire protocol ", ProtocolText(OwnProtocolVersion()))));
  EXPECT_THAT(start.err,
              HasSubstr(absl::StrCat("site peer (127.0.0.1:", served.port,
                                     "): wire protocol ",
                                     kWireProtocolMajor + 1, ".0")));
  EXPECT_EQ(peer.configures, 0);
  EXPECT_EQ(StatusOf(swarm, "site-a").job_id(), "");

  // The daemon itself refuses a configure from another major version, and
  // takes one without a version (a swarmctl older than the exchange).
  v1::ConfigureRequest request;
  request.set_sender("admin");
  *request.mutable_job() = JobOf(swarm, "direct-1", {"site-a"}, 2);
  *request.mutable_protocol() = newer;
  v1::Reply reply;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(swarm.Stub("site-a").Configure(&context, request, &reply).ok());
  }
  EXPECT_EQ(reply.outcome(), v1::OUTCOME_BAD_REQUEST);
  EXPECT_THAT(reply.message(),
              HasSubstr(absl::StrCat("sender admin speaks wire protocol ",
                                     kWireProtocolMajor + 1, ".0")));
  request.clear_protocol();
  {
    grpc::ClientContext context;
    ASSERT_TRUE(swarm.Stub("site-a").Configure(&context, request, &reply).ok());
  }
  EXPECT_EQ(reply.outcome(), v1::OUTCOME_OK) << reply.message();
  served.server->Shutdown();
}

TEST(OperatorTest, APeerOlderThanTheVersionExchangeKeepsWorking) {
  LocalSwarm swarm("operator_older");
  ASSERT_TRUE(swarm.StartSite("site-a", {{"size", "256"}}).ok());
  VersionedPeer peer(std::nullopt);  // Sends no version: 1.0.
  PeerServer served = Serve(swarm, &peer);
  ASSERT_NE(served.server, nullptr);
  v1::JobConfig config = JobOf(swarm, "older-1", {"site-a"}, 2);
  v1::SiteInfo* other = config.add_sites();
  other->set_name("peer");
  other->set_address(absl::StrCat("127.0.0.1:", served.port));
  config.add_trainers("site-a");
  config.add_aggregator_candidates("site-a");
  const std::string job = swarm.WriteJob(config);

  const CommandResult start = swarm.Swarmctl({"start", "--job", job});
  EXPECT_EQ(start.code(), 0) << start.ToString() << swarm.Logs();
  EXPECT_EQ(peer.configures, 1);
  EXPECT_EQ(peer.sent_protocol, ProtocolText(OwnProtocolVersion()));
  EXPECT_EQ(StatusOf(swarm, "site-a").job_id(), "older-1");
  swarm.Swarmctl({"abort", "--job", job});
  served.server->Shutdown();
}

}  // namespace
}  // namespace swarm::testing
