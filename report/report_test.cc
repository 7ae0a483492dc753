#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "report/job_report.h"
#include "report/round_recorder.h"

namespace swarm {
namespace report {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const absl::Time kStart = absl::FromUnixSeconds(1800000000);

absl::Time At(int ms) { return kStart + absl::Milliseconds(ms); }

// A status of `site` in job "job-1".
v1::StatusReply Status(v1::SiteState state, uint32_t round,
                       const std::string& aggregator = "site-a") {
  v1::StatusReply reply;
  v1::SiteStatus* s = reply.mutable_status();
  s->set_site("site-b");
  s->set_job_id("job-1");
  s->set_state(state);
  s->set_round(round);
  s->set_aggregator(aggregator);
  return reply;
}

double Phase(const v1::RoundRecord& r, const std::string& phase) {
  for (const v1::PhaseTime& p : r.phases()) {
    if (p.phase() == phase) return p.seconds();
  }
  return 0;
}

TEST(RoundRecorderTest, RecordsATrainersRounds) {
  RoundRecorder recorder;
  v1::StatusReply s = Status(v1::SITE_STATE_CONFIGURED, 0);
  recorder.Observe(s, At(0), {0, 0});
  s = Status(v1::SITE_STATE_TRAINING, 0);
  recorder.Observe(s, At(100), {0, 1000});
  s = Status(v1::SITE_STATE_WAITING_FOR_PERMISSION, 0);
  s.mutable_status()->mutable_counters()->set_rounds_trained(1);
  (*s.mutable_status()->mutable_metrics())["accuracy"] = 0.5;
  recorder.Observe(s, At(400), {0, 1000});
  s.mutable_status()->set_state(v1::SITE_STATE_SUBMITTING);
  recorder.Observe(s, At(500), {0, 1000});
  s.mutable_status()->set_state(v1::SITE_STATE_IDLE);
  recorder.Observe(s, At(800), {600, 1000});
  // Round 1, aggregated by site-c at attempt 1 (a failover).
  s = Status(v1::SITE_STATE_TRAINING, 1, "site-c");
  s.mutable_status()->set_attempt(1);
  s.mutable_status()->mutable_counters()->set_rounds_trained(1);
  (*s.mutable_status()->mutable_metrics())["accuracy"] = 0.5;
  recorder.Observe(s, At(1000), {600, 2000});
  s.mutable_status()->set_state(v1::SITE_STATE_DONE);
  s.mutable_status()->mutable_counters()->set_failovers(1);
  s.mutable_status()->mutable_counters()->set_rounds_trained(2);
  (*s.mutable_status()->mutable_metrics())["accuracy"] = 0.7;
  recorder.Observe(s, At(1500), {1200, 2000});

  const v1::HistoryReply history = recorder.History("job-1", At(2000));
  ASSERT_TRUE(history.known());
  EXPECT_EQ(history.site(), "site-b");
  EXPECT_EQ(history.state(), v1::SITE_STATE_DONE);
  ASSERT_EQ(history.rounds_size(), 2);
  const v1::RoundRecord& r0 = history.rounds(0);
  EXPECT_EQ(r0.round(), 0u);
  EXPECT_TRUE(r0.trained());
  EXPECT_FALSE(r0.aggregated());
  EXPECT_EQ(r0.aggregator(), "site-a");
  EXPECT_DOUBLE_EQ(r0.metrics().at("accuracy"), 0.5);
  EXPECT_DOUBLE_EQ(Phase(r0, "training"), 0.3);
  EXPECT_DOUBLE_EQ(Phase(r0, "waiting_for_permission"), 0.1);
  EXPECT_DOUBLE_EQ(Phase(r0, "submitting"), 0.3);
  EXPECT_DOUBLE_EQ(Phase(r0, "waiting_for_task"), 0.2);
  EXPECT_DOUBLE_EQ(r0.seconds(), 0.9);  // 100 ms .. 1000 ms
  EXPECT_EQ(r0.bytes_sent(), 600u);
  EXPECT_EQ(r0.bytes_received(), 1000u);
  EXPECT_EQ(r0.start_time_ms(), absl::ToUnixMillis(At(100)));
  const v1::RoundRecord& r1 = history.rounds(1);
  EXPECT_EQ(r1.attempt(), 1u);
  EXPECT_EQ(r1.aggregator(), "site-c");
  EXPECT_EQ(r1.failovers(), 1u);
  EXPECT_TRUE(r1.trained());
  EXPECT_DOUBLE_EQ(r1.metrics().at("accuracy"), 0.7);
  EXPECT_DOUBLE_EQ(r1.seconds(), 0.5);
  EXPECT_EQ(r1.bytes_sent(), 600u);
  EXPECT_EQ(r1.bytes_received(), 0u);
  EXPECT_EQ(r1.outcome(), "");
}

TEST(RoundRecorderTest, CreditsACompletionToTheRoundItClosed) {
  RoundRecorder recorder;
  v1::StatusReply s = Status(v1::SITE_STATE_GATHERING, 4, "site-b");
  s.mutable_status()->mutable_counters()->set_results_accepted(2);
  recorder.Observe(s, At(0), {});
  // Closing round 4 and scattering round 5 happen between two polls.
  s = Status(v1::SITE_STATE_TRAINING, 5, "site-a");
  s.mutable_status()->mutable_counters()->set_results_accepted(3);
  s.mutable_status()->mutable_counters()->set_rounds_completed(1);
  s.mutable_status()->mutable_counters()->set_trainers_dropped(1);
  recorder.Observe(s, At(50), {});
  const v1::HistoryReply history = recorder.History("", At(60));
  ASSERT_EQ(history.rounds_size(), 2);
  EXPECT_EQ(history.rounds(0).round(), 4u);
  EXPECT_TRUE(history.rounds(0).aggregated());
  EXPECT_EQ(history.rounds(0).results_accepted(), 3u);
  EXPECT_EQ(history.rounds(0).trainers_dropped(), 1u);
  EXPECT_FALSE(history.rounds(1).aggregated());
  EXPECT_EQ(history.rounds(1).outcome(), "running");
  EXPECT_DOUBLE_EQ(history.rounds(1).seconds(), 0.01);
}

TEST(RoundRecorderTest, AFailedRoundSaysWhy) {
  RoundRecorder recorder;
  recorder.Observe(Status(v1::SITE_STATE_TRAINING, 0), At(0), {});
  v1::StatusReply s = Status(v1::SITE_STATE_FAILED, 0);
  s.mutable_status()->set_end_reason("learner crashed");
  recorder.Observe(s, At(10), {});
  const v1::HistoryReply history = recorder.History("job-1", At(20));
  ASSERT_EQ(history.rounds_size(), 1);
  EXPECT_EQ(history.rounds(0).outcome(), "failed: learner crashed");
  EXPECT_EQ(history.end_reason(), "learner crashed");
}

TEST(RoundRecorderTest, KeepsTheLastJobsOnly) {
  RoundRecorder recorder(/*max_jobs=*/2, /*max_rounds=*/3);
  for (const char* job : {"j1", "j2", "j3"}) {
    for (uint32_t round = 0; round < 5; ++round) {
      v1::StatusReply s = Status(v1::SITE_STATE_TRAINING, round);
      s.mutable_status()->set_job_id(job);
      recorder.Observe(s, At(round * 10), {});
    }
  }
  EXPECT_FALSE(recorder.History("j1", At(100)).known());
  EXPECT_TRUE(recorder.History("j2", At(100)).known());
  const v1::HistoryReply latest = recorder.History("", At(100));
  EXPECT_EQ(latest.job_id(), "j3");
  ASSERT_EQ(latest.rounds_size(), 3);
  EXPECT_EQ(latest.rounds(0).round(), 2u);
  EXPECT_FALSE(recorder.History("nope", At(100)).known());
  // Statuses without a job record nothing.
  RoundRecorder idle;
  v1::StatusReply s = Status(v1::SITE_STATE_IDLE, 0);
  s.mutable_status()->clear_job_id();
  idle.Observe(s, At(0), {});
  EXPECT_FALSE(idle.History("", At(0)).known());
}

TEST(RoundRecorderTest, HistoryWhileObserving) {
  // The watcher thread observes while gRPC threads read the history.
  RoundRecorder recorder;
  std::thread watcher([&recorder] {
    for (uint32_t round = 0; round < 200; ++round) {
      v1::StatusReply s = Status(v1::SITE_STATE_TRAINING, round);
      s.mutable_status()->mutable_counters()->set_rounds_trained(round);
      recorder.Observe(s, At(static_cast<int>(round) * 10), {round, round});
    }
  });
  size_t seen = 0;
  for (int i = 0; i < 200; ++i) {
    const v1::HistoryReply history = recorder.History("job-1", At(5000));
    EXPECT_GE(static_cast<size_t>(history.rounds_size()), seen);
    seen = history.rounds_size();
  }
  watcher.join();
  EXPECT_EQ(recorder.History("job-1", At(5000)).rounds_size(), 200);
}

// --- JobReport -------------------------------------------------------------

v1::JobConfig Job() {
  v1::JobConfig job;
  job.set_job_id("job-1");
  job.set_metric_name("accuracy");
  for (const char* name : {"site-a", "site-b", "site-c"}) {
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
    site->set_address(std::string("127.0.0.1:") + (name + 5));
  }
  return job;
}

v1::RoundRecord Record(uint32_t round, bool trained, double accuracy,
                       bool aggregated = false) {
  v1::RoundRecord r;
  r.set_round(round);
  r.set_trained(trained);
  r.set_aggregated(aggregated);
  r.set_aggregator(round % 2 == 0 ? "site-a" : "site-b");
  if (trained) (*r.mutable_metrics())["accuracy"] = accuracy;
  v1::PhaseTime* phase = r.add_phases();
  phase->set_phase("training");
  phase->set_seconds(1.0 + round);
  r.set_seconds(2.0 + round);
  r.set_bytes_sent(100);
  r.set_bytes_received(10);
  return r;
}

std::vector<SiteHistory> ThreeSites() {
  const v1::JobConfig job = Job();
  std::vector<SiteHistory> sites(3);
  for (int i = 0; i < 3; ++i) {
    sites[i].site = job.sites(i);
    sites[i].reply.set_known(true);
    sites[i].reply.set_site(job.sites(i).name());
    sites[i].reply.set_state(v1::SITE_STATE_DONE);
  }
  // site-a aggregates the even rounds, site-b the odd ones; site-b misses
  // round 1. Accuracies: round 0: 0.5, 0.7; round 1: 0.4; round 2: 0.8, 0.8.
  *sites[0].reply.add_rounds() = Record(0, true, 0.5, true);
  *sites[0].reply.add_rounds() = Record(1, true, 0.4);
  *sites[0].reply.add_rounds() = Record(2, true, 0.8, true);
  *sites[1].reply.add_rounds() = Record(0, true, 0.7);
  *sites[1].reply.add_rounds() = Record(1, false, 0, true);
  *sites[1].reply.add_rounds() = Record(2, true, 0.8);
  sites[2].status = absl::UnavailableError("connection refused");
  return sites;
}

TEST(JobReportTest, CombinesTheSitesRounds) {
  absl::StatusOr<JobReport> report =
      JobReport::Build(Job(), ThreeSites(), {{0, 0.55}, {2, 0.81}});
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->rounds().size(), 3u);
  const RoundRow& r0 = report->rounds()[0];
  EXPECT_EQ(r0.aggregator, "site-a");
  EXPECT_THAT(r0.participants, ElementsAre("site-a", "site-b"));
  EXPECT_THAT(r0.missing, IsEmpty());
  EXPECT_DOUBLE_EQ(*r0.mean_metric, 0.6);
  EXPECT_DOUBLE_EQ(*r0.best_so_far, 0.6);
  EXPECT_DOUBLE_EQ(*r0.test_metric, 0.55);
  EXPECT_DOUBLE_EQ(r0.seconds, 2.0);
  EXPECT_EQ(r0.bytes_sent, 200u);
  const RoundRow& r1 = report->rounds()[1];
  EXPECT_EQ(r1.aggregator, "site-b");
  EXPECT_THAT(r1.missing, ElementsAre("site-b"));
  EXPECT_DOUBLE_EQ(*r1.mean_metric, 0.4);
  EXPECT_DOUBLE_EQ(*r1.best_so_far, 0.6);  // Higher is better.
  EXPECT_FALSE(r1.test_metric.has_value());
  EXPECT_DOUBLE_EQ(*report->rounds()[2].best_so_far, 0.8);
  // Training: mean of the two sites' 2 s in round 1.
  EXPECT_EQ(r1.phase_seconds[1].first, "training");
  EXPECT_DOUBLE_EQ(r1.phase_seconds[1].second, 2.0);
  EXPECT_THAT(report->MissingSites(), ElementsAre("site-c"));
  ASSERT_EQ(report->sites().size(), 3u);
  EXPECT_EQ(report->sites()[0].rounds_aggregated, 2);
  EXPECT_EQ(report->sites()[1].rounds_missed, 1);
  EXPECT_EQ(report->sites()[1].rounds_trained, 2);
  EXPECT_FALSE(report->sites()[2].answered);
  EXPECT_THAT(report->sites()[2].error, HasSubstr("connection refused"));
}

TEST(JobReportTest, LowerIsBetterKeepsTheLowestMean) {
  v1::JobConfig job = Job();
  job.set_metric_direction(v1::METRIC_LOWER_IS_BETTER);
  absl::StatusOr<JobReport> report = JobReport::Build(job, ThreeSites(), {});
  ASSERT_TRUE(report.ok());
  EXPECT_DOUBLE_EQ(*report->rounds()[1].best_so_far, 0.4);
  EXPECT_DOUBLE_EQ(*report->rounds()[2].best_so_far, 0.4);
}

TEST(JobReportTest, NoSiteKnowsTheJob) {
  std::vector<SiteHistory> sites = ThreeSites();
  sites[0].reply.set_known(false);
  sites[1].reply.set_known(false);
  absl::StatusOr<JobReport> report = JobReport::Build(Job(), sites, {});
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(report.status().message(), HasSubstr("no site knows job job-1"));
  for (const char* site :
       {"site-a", "site-b", "site-c", "connection refused"}) {
    EXPECT_THAT(report.status().message(), HasSubstr(site));
  }
}

// The value of the attribute `name` in the element whose id is `id`.
std::string Attribute(const std::string& html, const std::string& id,
                      const std::string& name) {
  const size_t element = html.find("id=\"" + id + "\"");
  if (element == std::string::npos) return "";
  const size_t start = html.rfind('<', element);
  const size_t end = html.find('>', element);
  const std::string tag = html.substr(start, end - start);
  const size_t at = tag.find(" " + name + "=\"");
  if (at == std::string::npos) return "";
  const size_t value = at + name.size() + 3;
  return tag.substr(value, tag.find('"', value) - value);
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(JobReportTest, HtmlIsSelfContainedWithCountedPlots) {
  std::vector<SiteHistory> sites = ThreeSites();
  sites[0].site.set_name("site-a<script>");
  absl::StatusOr<JobReport> report =
      JobReport::Build(Job(), sites, {{0, 0.55}, {2, 0.81}});
  ASSERT_TRUE(report.ok());
  const std::string html = report->Html();
  // 3 mean points, 3 best-so-far points, 2 test points.
  EXPECT_EQ(Attribute(html, "learning-curve", "data-points"), "8");
  EXPECT_EQ(Count(html, "class=\"pt pt-mean\""), 3);
  EXPECT_EQ(Count(html, "class=\"pt pt-test\""), 2);
  EXPECT_EQ(Attribute(html, "round-time", "data-points"), "3");
  EXPECT_EQ(Attribute(html, "aggregators", "data-points"), "3");
  EXPECT_EQ(Attribute(html, "participation", "data-points"), "9");
  EXPECT_THAT(html, HasSubstr("site-a&lt;script&gt;"));
  EXPECT_THAT(html, Not(HasSubstr("site-a<script>")));
  EXPECT_THAT(html,
              HasSubstr("Site site-c did not answer: connection refused"));
  // Nothing fetched at view time.
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("href=")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
}

TEST(JobReportTest, CsvAndJsonCarryTheSameRounds) {
  absl::StatusOr<JobReport> report =
      JobReport::Build(Job(), ThreeSites(), {{0, 0.55}});
  ASSERT_TRUE(report.ok());
  const std::vector<std::string> lines =
      absl::StrSplit(report->Csv(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[0], HasSubstr("round,attempt,aggregator,participants,"
                                  "missing,mean_accuracy,best_mean_accuracy,"
                                  "test_accuracy,seconds,waiting_for_task_"
                                  "seconds,training_seconds"));
  EXPECT_THAT(lines[1], HasSubstr("0,0,site-a,site-a;site-b,,0.6,0.6,0.55,2,"));
  EXPECT_THAT(lines[2], HasSubstr("1,0,site-b,site-a,site-b,0.4,0.6,,3,"));
  const nlohmann::json json = nlohmann::json::parse(report->Json());
  EXPECT_EQ(json["job_id"], "job-1");
  ASSERT_EQ(json["rounds"].size(), 3u);
  EXPECT_EQ(json["rounds"][1]["missing"][0], "site-b");
  EXPECT_TRUE(json["rounds"][1]["test_metric"].is_null());
  EXPECT_DOUBLE_EQ(json["rounds"][0]["phase_seconds"]["training"], 1.0);
  EXPECT_EQ(json["missing_sites"][0], "site-c");
  EXPECT_EQ(json["sites"][2]["answered"], false);
}

// Differential privacy: the recorder keeps the site's epsilon as it stands
// at the end of each round (the last status of the round).
TEST(RoundRecorderTest, RecordsThePrivacySpentPerRound) {
  RoundRecorder recorder;
  auto with_epsilon = [](v1::StatusReply s, double epsilon) {
    s.mutable_status()->mutable_privacy()->set_epsilon(epsilon);
    s.mutable_status()->mutable_privacy()->set_delta(1e-5);
    return s;
  };
  recorder.Observe(Status(v1::SITE_STATE_CONFIGURED, 0), At(0), {0, 0});
  recorder.Observe(Status(v1::SITE_STATE_TRAINING, 0), At(100), {0, 0});
  // Charged before the result leaves: the next status shows it.
  recorder.Observe(
      with_epsilon(Status(v1::SITE_STATE_WAITING_FOR_PERMISSION, 0), 0.5),
      At(200), {0, 0});
  recorder.Observe(with_epsilon(Status(v1::SITE_STATE_TRAINING, 1), 0.5),
                   At(300), {0, 0});
  recorder.Observe(with_epsilon(Status(v1::SITE_STATE_SUBMITTING, 1), 0.75),
                   At(400), {0, 0});
  recorder.Observe(with_epsilon(Status(v1::SITE_STATE_DONE, 1), 0.75), At(500),
                   {0, 0});
  const v1::HistoryReply history = recorder.History("job-1", At(600));
  ASSERT_EQ(history.rounds_size(), 2);
  ASSERT_TRUE(history.rounds(0).has_privacy_epsilon());
  EXPECT_DOUBLE_EQ(history.rounds(0).privacy_epsilon(), 0.5);
  EXPECT_DOUBLE_EQ(history.rounds(0).privacy_delta(), 1e-5);
  EXPECT_DOUBLE_EQ(history.rounds(1).privacy_epsilon(), 0.75);
  // A site without privacy records none.
  RoundRecorder plain;
  plain.Observe(Status(v1::SITE_STATE_TRAINING, 0), At(0), {0, 0});
  EXPECT_FALSE(plain.History("job-1", At(100)).rounds(0).has_privacy_epsilon());
}

// A curve per site of the epsilon it spent, in the HTML, CSV and JSON.
TEST(JobReportTest, ShowsEachSitesEpsilonOverTheRounds) {
  std::vector<SiteHistory> sites = ThreeSites();
  // site-a spends 1, 2, 3 in rounds 0..2; site-b 0.5 then 1 (it missed
  // round 1: its epsilon stays).
  const double a[] = {1, 2, 3};
  const double b[] = {0.5, 0.5, 1};
  for (int i = 0; i < 3; ++i) {
    sites[0].reply.mutable_rounds(i)->set_privacy_epsilon(a[i]);
    sites[0].reply.mutable_rounds(i)->set_privacy_delta(1e-5);
    sites[1].reply.mutable_rounds(i)->set_privacy_epsilon(b[i]);
    sites[1].reply.mutable_rounds(i)->set_privacy_delta(1e-6);
  }
  absl::StatusOr<JobReport> report = JobReport::Build(Job(), sites, {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_DOUBLE_EQ(report->rounds()[1].epsilon.at("site-a"), 2);
  EXPECT_DOUBLE_EQ(report->rounds()[1].epsilon.at("site-b"), 0.5);
  EXPECT_DOUBLE_EQ(*report->sites()[0].epsilon, 3);
  EXPECT_DOUBLE_EQ(report->sites()[1].delta, 1e-6);
  EXPECT_FALSE(report->sites()[2].epsilon.has_value());
  const std::string html = report->Html();
  EXPECT_EQ(Attribute(html, "privacy-epsilon", "data-points"), "6");
  EXPECT_EQ(Count(html, "class=\"pt pt-epsilon\""), 6);
  EXPECT_EQ(Count(html, "class=\"series-epsilon\" data-site=\"site-a\""), 1);
  EXPECT_EQ(Count(html, "class=\"series-epsilon\" data-site=\"site-b\""), 1);
  EXPECT_THAT(html, HasSubstr("round 2, site-a: epsilon 3.0000"));
  EXPECT_THAT(html, HasSubstr("site-b (1, delta 1e-06)"));
  const std::vector<std::string> lines =
      absl::StrSplit(report->Csv(), '\n', absl::SkipEmpty());
  EXPECT_THAT(lines[0], HasSubstr(",outcome,epsilon"));
  EXPECT_THAT(lines[3], HasSubstr(",site-a=3;site-b=1"));
  const nlohmann::json json = nlohmann::json::parse(report->Json());
  EXPECT_DOUBLE_EQ(json["rounds"][0]["epsilon"]["site-b"], 0.5);
  EXPECT_DOUBLE_EQ(json["sites"][0]["epsilon"], 3);
  EXPECT_TRUE(json["sites"][2]["epsilon"].is_null());
  // Without privacy: no such plot.
  absl::StatusOr<JobReport> plain = JobReport::Build(Job(), ThreeSites(), {});
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(plain->Html(), Not(HasSubstr("privacy-epsilon")));
}

TEST(JobReportTest, ParsesAMetricColumn) {
  absl::StatusOr<std::map<uint32_t, double>> values = ParseMetricCsv(
      "round,aggregator,mean_validation_accuracy,test_accuracy\n"
      "0,site-1,0.1,0.71\n1,site-2,,0.75\n2,site-1,0.8,\n",
      "test_accuracy");
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->size(), 2u);
  EXPECT_DOUBLE_EQ(values->at(1), 0.75);
  EXPECT_FALSE(ParseMetricCsv("round,x\n0,1\n", "test_accuracy").ok());
  EXPECT_FALSE(
      ParseMetricCsv("round,test_accuracy\n0,abc\n", "test_accuracy").ok());
  EXPECT_FALSE(ParseMetricCsv("", "test_accuracy").ok());
}

}  // namespace
}  // namespace report
}  // namespace swarm
