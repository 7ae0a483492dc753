// swarmctl report against real daemons (issue 15): every site's per-round
// history over the History RPC (mTLS), the report's rounds and sites, a site
// that no longer answers (the report is written from the others and names
// it), and a job that no site knows (an error naming the job and the sites).
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kRounds = 3;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ReportTest, CollectsEverySitesHistory) {
  LocalSwarm swarm("report_test");
  for (const char* name : {"site-a", "site-b", "site-c"}) {
    ASSERT_TRUE(swarm
                    .StartSite(name, {{"size", "256"},
                                      {"train_ms", "20"},
                                      {"metrics", "0:0.5,1:0.625,2:0.75"}})
                    .ok());
  }
  v1::JobConfig job;
  job.set_job_id("report-1");
  for (const std::string& name : swarm.site_names()) {
    *job.add_sites() = swarm.Info(name);
  }
  job.set_num_rounds(kRounds);
  job.set_seed(5);
  job.set_metric_name("accuracy");
  const std::string job_path = swarm.WriteJob(job);
  ASSERT_EQ(swarm.Swarmctl({"start", "--job", job_path}).code(), 0);
  ASSERT_TRUE(swarm
                  .WaitAllDone("report-1",
                               absl::Now() + absl::Seconds(60) * TimeScale())
                  .ok())
      << swarm.Logs();

  // The History RPC itself, with a deadline.
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::HistoryRequest request;
    request.set_job_id("report-1");
    request.set_sender("admin");
    v1::HistoryReply reply;
    ASSERT_TRUE(swarm.Stub("site-b").History(&context, request, &reply).ok());
    EXPECT_TRUE(reply.known());
    EXPECT_EQ(reply.site(), "site-b");
    EXPECT_EQ(reply.state(), v1::SITE_STATE_DONE);
    ASSERT_EQ(reply.rounds_size(), kRounds);
    for (int r = 0; r < kRounds; ++r) {
      EXPECT_EQ(reply.rounds(r).round(), static_cast<uint32_t>(r));
      EXPECT_TRUE(reply.rounds(r).trained()) << r;
      EXPECT_GT(reply.rounds(r).seconds(), 0) << r;
    }
  }

  const std::string out = absl::StrCat(swarm.dir(), "/report");
  const CommandResult all =
      swarm.Swarmctl({"report", "--job", job_path, "--out", out});
  ASSERT_EQ(all.code(), 0) << all.ToString();
  EXPECT_THAT(all.out, HasSubstr("3 of 3 sites answered"));
  const nlohmann::json report =
      nlohmann::json::parse(ReadAll(out + "/report.json"));
  ASSERT_EQ(report["rounds"].size(), static_cast<size_t>(kRounds));
  int aggregated = 0;
  for (const auto& site : report["sites"]) {
    EXPECT_TRUE(site["answered"].get<bool>()) << site;
    EXPECT_EQ(site["state"], "done");
    EXPECT_EQ(site["rounds_trained"], kRounds);
    EXPECT_EQ(site["rounds_missed"], 0);
    aggregated += site["rounds_aggregated"].get<int>();
  }
  EXPECT_EQ(aggregated, kRounds);  // One aggregator per round.
  const double means[] = {0.5, 0.625, 0.75};
  for (int r = 0; r < kRounds; ++r) {
    const auto& round = report["rounds"][r];
    EXPECT_EQ(round["round"], r);
    EXPECT_EQ(round["participants"].size(), 3u) << round;
    EXPECT_TRUE(round["missing"].empty()) << round;
    EXPECT_THAT(job.sites(0).name() + job.sites(1).name() + job.sites(2).name(),
                HasSubstr(round["aggregator"].get<std::string>()));
    EXPECT_DOUBLE_EQ(round["mean_metric"].get<double>(), means[r]) << round;
    EXPECT_DOUBLE_EQ(round["best_so_far"].get<double>(), means[r]) << round;
    // Two trainers' 1 KiB results to the aggregator, at least.
    EXPECT_GE(round["bytes_sent"].get<uint64_t>(), 2048u) << round;
    EXPECT_GE(round["bytes_received"].get<uint64_t>(), 2048u) << round;
    EXPECT_GT(round["phase_seconds"]["training"].get<double>(), 0.01) << round;
  }
  const std::string csv = ReadAll(out + "/report.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), kRounds + 1);
  EXPECT_THAT(ReadAll(out + "/report.html"),
              HasSubstr("id=\"learning-curve\" data-points=\"6\""));

  // A site that no longer answers: named, and the report still written.
  swarm.site("site-c").process->Kill();
  const std::string partial = absl::StrCat(swarm.dir(), "/partial");
  const CommandResult without = swarm.Swarmctl(
      {"report", "--job", job_path, "--out", partial, "--timeout-ms", "3000"});
  ASSERT_EQ(without.code(), 0) << without.ToString();
  EXPECT_THAT(without.err, HasSubstr("site site-c"));
  EXPECT_THAT(without.err, HasSubstr("did not answer"));
  EXPECT_THAT(without.out, HasSubstr("2 of 3 sites answered"));
  const nlohmann::json two =
      nlohmann::json::parse(ReadAll(partial + "/report.json"));
  EXPECT_THAT(two["missing_sites"].get<std::vector<std::string>>(),
              ElementsAre("site-c"));
  EXPECT_EQ(two["rounds"].size(), static_cast<size_t>(kRounds));
  EXPECT_THAT(ReadAll(partial + "/report.html"),
              HasSubstr("Site site-c did not answer"));

  // A job no site knows: an error naming the job and every site asked.
  job.set_job_id("no-such-job");
  const std::string unknown_path = swarm.WriteJob(job, "unknown.json");
  const CommandResult unknown = swarm.Swarmctl(
      {"report", "--job", unknown_path, "--out",
       absl::StrCat(swarm.dir(), "/unknown"), "--timeout-ms", "3000"});
  EXPECT_EQ(unknown.code(), 1) << unknown.ToString();
  for (const char* needle :
       {"no site knows job no-such-job", "site-a", "site-b", "site-c"}) {
    EXPECT_THAT(unknown.err, HasSubstr(needle)) << unknown.ToString();
  }
}

}  // namespace
}  // namespace swarm::testing
