// The metrics endpoint scraped by a real Prometheus server (issue 15): a
// 3-site job with metrics on, Debian's `prometheus` scraping every site each
// second from a config this test writes, and checks through Prometheus's
// HTTP API that the counters add up across sites and the histograms have
// samples. One site logs with --log-format json; its log is checked to be
// one JSON object per line.
//
// Skipped, with the reason, where the prometheus binary is missing or does
// not run (tests/install_deps.sh installs it).
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_get.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

constexpr uint32_t kRounds = 4;
constexpr int kSites = 3;

// The prometheus binary: $SWARM_PROMETHEUS, else the first on $PATH.
std::string FindPrometheus() {
  if (const char* path = std::getenv("SWARM_PROMETHEUS")) return path;
  const char* search = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(search != nullptr ? search : "/usr/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/prometheus");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

class PrometheusServer {
 public:
  PrometheusServer(std::string binary, std::string dir)
      : binary_(std::move(binary)), dir_(std::move(dir)) {}
  ~PrometheusServer() {
    if (process_ != nullptr && process_->running()) {
      process_->Signal(SIGTERM).IgnoreError();
      if (!process_->Wait(absl::Now() + absl::Seconds(10)).ok()) {
        process_->Kill();
      }
    }
  }

  const std::string& address() const { return address_; }
  std::string Log() const {
    return LastLines(ReadFileOrEmpty(absl::StrCat(dir_, "/prometheus.log")),
                     30);
  }

  // Writes the config (scrape every second) and starts the server on a free
  // port; waits until it is ready. A port taken in between is tried again.
  absl::Status Start(const std::vector<std::string>& targets) {
    const std::string config = absl::StrCat(dir_, "/prometheus.yml");
    std::ofstream(config) << "global:\n"
                             "  scrape_interval: 1s\n"
                             "  scrape_timeout: 1s\n"
                             "  evaluation_interval: 1s\n"
                             "scrape_configs:\n"
                             "  - job_name: swarm\n"
                             "    static_configs:\n"
                             "      - targets: ['"
                          << absl::StrJoin(targets, "', '") << "']\n";
    absl::Status last = absl::UnknownError("not started");
    for (int attempt = 0; attempt < 3; ++attempt) {
      absl::StatusOr<int> port = PickFreePort();
      if (!port.ok()) return port.status();
      address_ = absl::StrCat("127.0.0.1:", *port);
      absl::StatusOr<std::unique_ptr<Process>> started = Process::Start(
          {binary_, absl::StrCat("--config.file=", config),
           absl::StrCat("--storage.tsdb.path=", dir_, "/prometheus-data"),
           absl::StrCat("--web.listen-address=", address_), "--log.level=warn"},
          absl::StrCat(dir_, "/prometheus.out"),
          absl::StrCat(dir_, "/prometheus.log"));
      if (!started.ok()) return started.status();
      process_ = std::move(*started);
      last = WaitReady(absl::Now() + absl::Seconds(60) * TimeScale());
      if (last.ok()) return last;
      process_->Kill();
    }
    return last;
  }

  // The value of `expr` when it is one sample; NotFound when it has none.
  absl::StatusOr<double> Query(const std::string& expr) {
    absl::StatusOr<HttpResponse> response =
        HttpGet(address_, absl::StrCat("/api/v1/query?query=", UrlEncode(expr)),
                absl::Now() + absl::Seconds(10));
    if (!response.ok()) return response.status();
    const nlohmann::json reply =
        nlohmann::json::parse(response->body, nullptr, false);
    if (response->status != 200 || reply.is_discarded() ||
        reply.value("status", "") != "success") {
      return absl::InternalError(absl::StrCat(
          "query ", expr, ": HTTP ", response->status, ": ", response->body));
    }
    const nlohmann::json& result = reply["data"]["result"];
    if (result.empty())
      return absl::NotFoundError(absl::StrCat(expr, ": none"));
    if (result.size() != 1) {
      return absl::InternalError(
          absl::StrCat(expr, ": ", result.size(), " series"));
    }
    return std::stod(result[0]["value"][1].get<std::string>());
  }

  // Polls `expr` (Prometheus has no long poll) until it equals `want`.
  absl::Status WaitFor(const std::string& expr, double want,
                       absl::Time deadline) {
    absl::StatusOr<double> got;
    do {
      got = Query(expr);
      if (got.ok() && *got == want) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(200));
    } while (absl::Now() < deadline);
    return absl::DeadlineExceededError(absl::StrCat(
        expr, " = ", got.ok() ? absl::StrCat(*got) : got.status().ToString(),
        ", want ", want));
  }

 private:
  absl::Status WaitReady(absl::Time deadline) {
    while (absl::Now() < deadline) {
      if (!process_->running() || process_->Wait(absl::Now()).ok()) {
        return absl::UnavailableError("prometheus exited");
      }
      absl::StatusOr<HttpResponse> ready =
          HttpGet(address_, "/-/ready", absl::Now() + absl::Seconds(2));
      if (ready.ok() && ready->status == 200) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(100));
    }
    return absl::DeadlineExceededError("prometheus not ready");
  }

  const std::string binary_;
  const std::string dir_;
  std::string address_;
  std::unique_ptr<Process> process_;
};

TEST(PrometheusTest, CountersAddUpAcrossSites) {
  const std::string binary = FindPrometheus();
  if (binary.empty()) {
    GTEST_SKIP() << "no prometheus binary on PATH (Debian package "
                    "`prometheus`, installed by tests/install_deps.sh)";
  }
  const CommandResult version =
      RunCommand({binary, "--version"}, ::testing::TempDir() + "/prom_version",
                 absl::Seconds(30));
  if (version.code() != 0) {
    GTEST_SKIP() << binary << " --version does not run: " << version.ToString();
  }

  const absl::Time test_start = absl::Now();
  LocalSwarm swarm("prometheus_test");
  std::vector<std::string> targets;
  for (int i = 0; i < kSites; ++i) {
    const std::string name =
        absl::StrCat("site-", std::string(1, static_cast<char>('a' + i)));
    std::vector<std::string> extra;
    if (i == kSites - 1) extra = {"--log-format", "json"};
    absl::Status started = swarm.StartSiteWithMetrics(
        name,
        {{"size", "1024"},
         {"train_ms", "100"},
         {"metrics", "0:0.5,1:0.875,2:0.625,3:0.75"}},
        extra);
    ASSERT_TRUE(started.ok()) << started;
    targets.push_back(swarm.site(name).metrics_address);
  }

  PrometheusServer prometheus(binary, swarm.dir());
  absl::Status started = prometheus.Start(targets);
  ASSERT_TRUE(started.ok()) << started << "\n" << prometheus.Log();
  const absl::Time deadline = absl::Now() + absl::Seconds(60) * TimeScale();
  // Every site is scraped before the job starts.
  ASSERT_TRUE(
      prometheus.WaitFor("sum(up{job=\"swarm\"})", kSites, deadline).ok())
      << prometheus.Log();
  ASSERT_TRUE(
      prometheus.WaitFor("sum(swarm_state{state=\"idle\"})", kSites, deadline)
          .ok());

  v1::JobConfig job;
  job.set_job_id("prom-1");
  for (const std::string& name : swarm.site_names()) {
    *job.add_sites() = swarm.Info(name);
  }
  job.set_num_rounds(kRounds);
  job.set_seed(3);
  job.set_wait_after_min_responses_ms(2000);
  job.set_round_timeout_ms(60000);
  job.set_request_to_submit_interval_ms(100);
  job.set_chunk_size(4096);
  const std::string job_path = swarm.WriteJob(job);
  const CommandResult start = swarm.Swarmctl({"start", "--job", job_path});
  ASSERT_EQ(start.code(), 0) << start.ToString();
  absl::Status done = swarm.WaitAllDone(job.job_id(), deadline);
  ASSERT_TRUE(done.ok()) << done << "\n" << swarm.Logs();

  // The counters add up across sites once Prometheus scraped the end.
  const int trained = kSites * kRounds;
  struct Expect {
    std::string expr;
    double want;
  };
  const std::vector<Expect> expects = {
      {"sum(swarm_jobs_ended_total{outcome=\"done\"})", kSites},
      {"sum(swarm_state{state=\"done\"})", kSites},
      {"sum(swarm_rounds_completed_total)", kRounds},
      {"sum(swarm_rounds_trained_total)", trained},
      {"sum(swarm_results_accepted_total)", trained},
      {"sum(swarm_permissions_granted_total)", trained},
      {"sum(swarm_results_rejected_total)", 0},
      // Every site trained every round: one round duration and one
      // training phase per site and round.
      {"sum(swarm_round_duration_seconds_count)", trained},
      {"sum(swarm_phase_seconds_count{phase=\"training\"})", trained},
      // train_ms 100 per round (some latitude for when the watcher looks).
      {"count(swarm_phase_seconds_sum{phase=\"training\"} >= 0.3)", kSites},
      // Accepted by the aggregators == submitted by the trainers.
      {"sum(swarm_results_accepted_total) - sum(swarm_rounds_trained_total)",
       0},
      // Histograms: the +Inf bucket is the count.
      {"sum(swarm_phase_seconds_bucket{le=\"+Inf\"}) - "
       "sum(swarm_phase_seconds_count)",
       0},
      {"count(swarm_best_metric == 0.875)", kSites},
      {"count(swarm_best_metric_round == 1)", kSites},
      {"count(process_resident_memory_bytes > 0)", kSites},
      {"count(process_cpu_seconds_total > 0)", kSites},
      {"count(count by (site) (swarm_round))", kSites},
      // Results that crossed the network: all but the aggregator's own
      // (which goes through the site's loopback, not a transport).
      {"sum(swarm_peer_calls_total{kind=\"submit_result\",outcome=\"ok\"})",
       trained - kRounds},
      {"sum(swarm_peer_calls_total{outcome=\"error\"}) or vector(0)", 0},
      {"count(sum by (site) (swarm_peer_model_bytes_sent_total) > 0)", kSites},
      // What one site sent whole, another received whole (a clean job: no
      // stream refused after it arrived, none broken, no failover).
      {"sum(swarm_peer_model_bytes_received_total) - "
       "sum(swarm_peer_model_bytes_sent_total)",
       0},
      {"sum(swarm_peer_models_received_total) - "
       "sum(swarm_peer_models_sent_total)",
       0},
      {"count(sum by (site) (swarm_peer_models_received_total) > 0)", kSites},
      {"sum(swarm_peer_streams_broken_total) or vector(0)", 0},
      {"sum(swarm_digest_failures_total) or vector(0)", 0},
      {"sum(swarm_failovers_total) + sum(swarm_rejoins_total) + "
       "sum(swarm_trainers_dropped_total)",
       0},
  };
  for (const Expect& expect : expects) {
    EXPECT_TRUE(prometheus.WaitFor(expect.expr, expect.want, deadline).ok())
        << prometheus.WaitFor(expect.expr, expect.want, absl::Now());
  }
  // Some site gathered and aggregated.
  absl::StatusOr<double> aggregating =
      prometheus.Query("sum(swarm_phase_seconds_count{phase=\"aggregating\"})");
  ASSERT_TRUE(aggregating.ok()) << aggregating.status();
  EXPECT_GE(*aggregating, 1);
  absl::StatusOr<double> median = prometheus.Query(
      "histogram_quantile(0.5, sum by (le) "
      "(swarm_phase_seconds_bucket{phase=\"training\"}))");
  ASSERT_TRUE(median.ok()) << median.status();
  EXPECT_GE(*median, 0.05);

  // The JSON-logging site: one object per line with the fixed keys, the job
  // and rounds where known.
  const std::string json_site = swarm.site_names().back();
  const std::string log = ReadFileOrEmpty(swarm.site(json_site).log_path);
  int lines = 0;
  bool saw_job_and_round = false;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    const nlohmann::json object =
        nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
    ASSERT_TRUE(object.is_object()) << "not a JSON object: " << line;
    EXPECT_TRUE(object.contains("time") && object.contains("level") &&
                object.contains("msg"))
        << line;
    EXPECT_EQ(object.value("site", ""), json_site) << line;
    if (object.value("job", "") == "prom-1" && object.contains("round")) {
      saw_job_and_round = true;
    }
    ++lines;
  }
  EXPECT_GT(lines, 5);
  EXPECT_TRUE(saw_job_and_round) << LastLines(log, 20);

  EXPECT_TRUE(swarm.StopAll(absl::Seconds(20)).ok());
  std::fprintf(stderr, "[ prometheus_test ] %d sites, %d rounds: %s\n", kSites,
               kRounds, absl::FormatDuration(absl::Now() - test_start).c_str());
}

// A metrics address in use, or one that does not parse, refuses the
// daemon's start with a message naming the field (no Prometheus needed).
TEST(MetricsListenTest, BadOrUsedAddressRefusesTheStart) {
  LocalSwarm swarm("metrics_listen_test", Transport::kInsecure);
  ASSERT_TRUE(swarm.StartSiteWithMetrics("site-a", {}).ok());
  const std::string taken = swarm.site("site-a").metrics_address;
  ASSERT_FALSE(taken.empty());
  const HttpResponse scrape =
      HttpGet(taken, "/metrics", absl::Now() + absl::Seconds(10)).value();
  EXPECT_EQ(scrape.status, 200);
  EXPECT_THAT(scrape.body, ::testing::HasSubstr("swarm_state{site=\"site-a\""));
  EXPECT_EQ(HttpGet(taken, "/", absl::Now() + absl::Seconds(10))->status, 404);

  struct Case {
    std::string address;
    int exit_code;
    std::string says;
  };
  for (const Case& bad :
       {Case{taken, 1, "metrics_listen: " + taken + " is in use"},
        Case{"localhost", 2,
             "metrics_listen: \"localhost\" is not host:port"}}) {
    const std::string config = swarm.WriteFile(
        "site-b.json",
        absl::StrCat(R"({"name": "site-b", "listen_address": "127.0.0.1:0",
                         "workspace": ")",
                     swarm.Workspace("site-b"),
                     R"(", "learner": {"kind": "test"},
                         "metrics_listen": ")",
                     bad.address, R"("})"));
    const CommandResult run =
        RunCommand({SwarmClientPath(), "--config", config, "--insecure"},
                   absl::StrCat(swarm.dir(), "/site-b-run"), absl::Seconds(30));
    EXPECT_EQ(run.code(), bad.exit_code) << run.ToString();
    EXPECT_THAT(run.err, ::testing::HasSubstr(bad.says)) << run.ToString();
    EXPECT_THAT(run.out, ::testing::Not(::testing::HasSubstr("listening on")));
  }
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace swarm::testing
