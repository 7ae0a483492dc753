// Differential privacy in real daemons (docs/privacy.md): the built-in MLP
// trains with DP-SGD on a small Fashion-MNIST subset; each site's accountant
// survives a kill -9, a restart and `swarmctl resume` without restarting the
// count, and a site with a budget stops training at it while the job goes on.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/safetensors.h"
#include "privacy/accountant.h"
#include "privacy/rdp.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

using ::testing::HasSubstr;

constexpr double kDelta = 1e-5;

// The MLP on a subset of `samples` Fashion-MNIST training images shared by
// `sites`, with DP-SGD at σ = 1.2, 2 epochs a round.
v1::SiteConfig MlpSite(double max_epsilon, uint32_t sites, uint32_t index,
                       uint32_t samples) {
  v1::SiteConfig config;
  config.mutable_learner()->set_kind("mlp");
  auto& params = *config.mutable_learner()->mutable_params();
  params["max_train_samples"] = absl::StrCat(samples);
  params["sites"] = absl::StrCat(sites);
  params["site_index"] = absl::StrCat(index);
  params["partition"] = "iid";
  params["hidden"] = "16";
  params["batch_size"] = "50";
  params["epochs"] = "2";
  params["dp_noise_multiplier"] = "1.2";
  config.mutable_privacy()->set_max_epsilon(max_epsilon);
  config.mutable_privacy()->set_delta(kDelta);
  return config;
}

v1::JobConfig Job(LocalSwarm& swarm, const std::string& id,
                  const std::vector<std::string>& sites, uint32_t rounds) {
  v1::JobConfig job;
  job.set_job_id(id);
  for (const std::string& site : sites) *job.add_sites() = swarm.Info(site);
  job.set_num_rounds(rounds);
  job.set_min_responses_required(1);
  job.set_wait_after_min_responses_ms(1000);
  job.set_round_timeout_ms(60000);
  job.set_request_to_submit_interval_ms(100);
  job.set_learn_task_ack_timeout_ms(10000);
  job.set_require_dp(true);
  return job;
}

absl::StatusOr<v1::SiteStatus> SiteStatus(LocalSwarm& swarm,
                                          const std::string& site,
                                          const std::string& job) {
  absl::StatusOr<v1::StatusReply> reply = swarm.Status(site, job);
  if (!reply.ok()) return reply.status();
  return reply->status();
}

// Polls `site` until `ok(status)` or the deadline.
bool WaitFor(LocalSwarm& swarm, const std::string& site, const std::string& job,
             const std::function<bool(const v1::SiteStatus&)>& ok,
             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout * TimeScale();
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::SiteStatus> status = SiteStatus(swarm, site, job);
    if (status.ok() && ok(*status)) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// The ledger on disk and its ε, recomputed here from the charges.
privacy::Accountant Ledger(LocalSwarm& swarm, const std::string& site,
                           const std::string& job) {
  absl::StatusOr<privacy::Accountant> ledger = privacy::Accountant::Load(
      absl::StrCat(swarm.Workspace(site), "/", job, "/privacy.json"));
  EXPECT_TRUE(ledger.ok()) << ledger.status();
  return ledger.ok() ? *std::move(ledger) : privacy::Accountant();
}

double EpsilonOfSteps(const privacy::Accountant& ledger, uint64_t steps) {
  const v1::PrivacyCost& cost = ledger.charges().front().cost;
  return *privacy::DpSgdEpsilon(cost.sampling_rate(), cost.noise_multiplier(),
                                steps, kDelta);
}

// kill -9 in the middle of the job, restart, resume: the accountant comes
// back with every round charged before the kill, and the final ε is the
// composition of every round trained, before and after.
TEST(PrivacyIntegrationTest, EpsilonSurvivesKillRestartAndResume) {
  LocalSwarm swarm("privacy-resume");
  ASSERT_TRUE(swarm.StartSiteWithSiteConfig("a", MlpSite(0, 1, 0, 12000)).ok())
      << swarm.Logs();
  const v1::JobConfig job = Job(swarm, "dp-resume", {"a"}, 6);
  const std::string job_path = swarm.WriteJob(job);
  CommandResult start = swarm.Swarmctl({"start", "--job", job_path});
  ASSERT_EQ(start.code(), 0) << start.ToString() << swarm.Logs();
  ASSERT_TRUE(WaitFor(
      swarm, "a", job.job_id(),
      [](const v1::SiteStatus& s) {
        // Round 2's global model on disk: what the resume starts from.
        return s.privacy().rounds() >= 2 && s.global_round() >= 2;
      },
      absl::Seconds(120)))
      << swarm.Logs();
  ASSERT_TRUE(swarm.RestartSite("a", /*kill=*/true).ok()) << swarm.Logs();
  const privacy::Accountant before = Ledger(swarm, "a", job.job_id());
  ASSERT_GE(before.charges().size(), 2u);
  const double eps_before = *before.Epsilon(kDelta);
  // Reloaded: the status shows the ledger's count, not zero.
  ASSERT_TRUE(WaitFor(
      swarm, "a", job.job_id(),
      [](const v1::SiteStatus& s) { return s.rejoined(); }, absl::Seconds(30)))
      << swarm.Logs();
  absl::StatusOr<v1::SiteStatus> reloaded =
      SiteStatus(swarm, "a", job.job_id());
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->privacy().rounds(), before.charges().size());
  EXPECT_DOUBLE_EQ(reloaded->privacy().epsilon(), eps_before);

  CommandResult resumed = swarm.Swarmctl({"resume", "--job", job_path});
  ASSERT_EQ(resumed.code(), 0) << resumed.ToString() << swarm.Logs();
  ASSERT_TRUE(swarm
                  .WaitAllDone(job.job_id(),
                               absl::Now() + absl::Seconds(180) * TimeScale())
                  .ok())
      << swarm.Logs();
  const privacy::Accountant after = Ledger(swarm, "a", job.job_id());
  ASSERT_GT(after.charges().size(), before.charges().size());
  for (size_t i = 0; i < before.charges().size(); ++i) {
    EXPECT_EQ(after.charges()[i].round, before.charges()[i].round);
  }
  // ε after = ε of every step before plus the new rounds' steps.
  const double eps_after = EpsilonOfSteps(after, after.steps());
  EXPECT_GT(eps_after, eps_before);
  EXPECT_NEAR(EpsilonOfSteps(before, before.steps()), eps_before, 1e-9);
  absl::StatusOr<v1::SiteStatus> done = SiteStatus(swarm, "a", job.job_id());
  ASSERT_TRUE(done.ok());
  EXPECT_NEAR(done->privacy().epsilon(), eps_after, 1e-9);
  EXPECT_EQ(done->privacy().rounds(), after.charges().size());
  std::fprintf(stderr,
               "[ dp-resume ] epsilon %.4f after %zu round(s) before the "
               "kill, %.4f after %zu round(s) in all (delta %g)\n",
               eps_before, before.charges().size(), eps_after,
               after.charges().size(), kDelta);
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(30)).ok());
}

// A budget that admits two rounds of site a's training (DP-SGD at σ = 1.2,
// 2 epochs of its ~900 training images a round, batch 50).
double TwoRoundBudget() {
  // One round costs about ε(2 epochs); the budget sits between 2 and 3
  // rounds' worth.
  const double q = 50.0 / 900.0;
  const uint64_t steps = static_cast<uint64_t>(std::ceil(2 / q));
  return (*privacy::DpSgdEpsilon(q, 1.2, 2 * steps, kDelta) +
          *privacy::DpSgdEpsilon(q, 1.2, 3 * steps, kDelta)) /
         2;
}

// The metadata of `site`'s final model `kind` ("best", "last").
std::map<std::string, std::string> FinalMetadata(LocalSwarm& swarm,
                                                 const std::string& site,
                                                 const std::string& job,
                                                 const std::string& kind) {
  const std::string path =
      absl::StrCat(swarm.Workspace(site), "/", job, "/", kind, ".safetensors");
  absl::StatusOr<persist::SafetensorsLayout> layout =
      persist::ParseSafetensors(ReadFileOrEmpty(path), nullptr);
  EXPECT_TRUE(layout.ok()) << path << ": " << layout.status();
  return layout.ok() ? layout->metadata : std::map<std::string, std::string>();
}

// Site a's budget admits two rounds: it stops training at its budget and
// says why; the job goes on with b and ends on both. The final models carry
// both trainers' ε, the same at both sites.
TEST(PrivacyIntegrationTest, SiteStopsAtItsBudget) {
  LocalSwarm swarm("privacy-budget");
  const double budget = TwoRoundBudget();
  ASSERT_TRUE(
      swarm.StartSiteWithSiteConfig("a", MlpSite(budget, 2, 0, 2000)).ok())
      << swarm.Logs();
  ASSERT_TRUE(swarm.StartSiteWithSiteConfig("b", MlpSite(0, 2, 1, 2000)).ok())
      << swarm.Logs();
  const v1::JobConfig job = Job(swarm, "dp-budget", {"a", "b"}, 5);
  CommandResult start = swarm.Swarmctl({"start", "--job", swarm.WriteJob(job)});
  ASSERT_EQ(start.code(), 0) << start.ToString() << swarm.Logs();
  absl::Status done = swarm.WaitAllDone(
      job.job_id(), absl::Now() + absl::Seconds(240) * TimeScale());
  ASSERT_TRUE(done.ok()) << done << swarm.Logs();
  absl::StatusOr<v1::SiteStatus> a = SiteStatus(swarm, "a", job.job_id());
  absl::StatusOr<v1::SiteStatus> b = SiteStatus(swarm, "b", job.job_id());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->privacy().budget_exhausted()) << a->DebugString();
  EXPECT_LE(a->privacy().epsilon(), budget);
  EXPECT_EQ(a->privacy().rounds(), 2u) << a->DebugString();
  // It said why (its last error may since be another: as an aggregator it
  // notes the trainer that did not send a result, itself).
  EXPECT_THAT(ReadFileOrEmpty(swarm.site("a").log_path),
              HasSubstr("privacy budget exhausted: epsilon="));
  EXPECT_FALSE(b->privacy().budget_exhausted());
  EXPECT_EQ(b->privacy().rounds(), 5u);
  EXPECT_GT(b->privacy().epsilon(), a->privacy().epsilon());
  for (const char* kind : {"best", "last"}) {
    const std::map<std::string, std::string> at_a =
        FinalMetadata(swarm, "a", job.job_id(), kind);
    EXPECT_EQ(at_a.count("privacy.a") ? at_a.at("privacy.a") : "",
              absl::StrFormat("epsilon=%.6g delta=1e-05 rounds=2",
                              a->privacy().epsilon()))
        << kind;
    EXPECT_EQ(at_a.count("privacy.b") ? at_a.at("privacy.b") : "",
              absl::StrFormat("epsilon=%.6g delta=1e-05 rounds=5",
                              b->privacy().epsilon()))
        << kind;
    EXPECT_EQ(FinalMetadata(swarm, "b", job.job_id(), kind), at_a) << kind;
  }
  std::fprintf(stderr,
               "[ dp-budget ] a: epsilon %.4f of budget %.4f after %u rounds, "
               "stopped; b: epsilon %.4f after %u rounds\n",
               a->privacy().epsilon(), budget, a->privacy().rounds(),
               b->privacy().epsilon(), b->privacy().rounds());
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(30)).ok());
}

// With both trainers required (min_responses_required 2), site a at its
// budget leaves too few: the job ends early after the first round a does
// not train, at both sites, saying why.
TEST(PrivacyIntegrationTest, TooFewTrainersLeftEndsTheJobEarly) {
  LocalSwarm swarm("privacy-early");
  ASSERT_TRUE(
      swarm.StartSiteWithSiteConfig("a", MlpSite(TwoRoundBudget(), 2, 0, 2000))
          .ok())
      << swarm.Logs();
  ASSERT_TRUE(swarm.StartSiteWithSiteConfig("b", MlpSite(0, 2, 1, 2000)).ok())
      << swarm.Logs();
  v1::JobConfig job = Job(swarm, "dp-early", {"a", "b"}, 6);
  job.set_min_responses_required(2);
  CommandResult start = swarm.Swarmctl({"start", "--job", swarm.WriteJob(job)});
  ASSERT_EQ(start.code(), 0) << start.ToString() << swarm.Logs();
  absl::Status done = swarm.WaitAllDone(
      job.job_id(), absl::Now() + absl::Seconds(240) * TimeScale());
  ASSERT_TRUE(done.ok()) << done << swarm.Logs();
  for (const char* site : {"a", "b"}) {
    absl::StatusOr<v1::SiteStatus> status =
        SiteStatus(swarm, site, job.job_id());
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->state(), v1::SITE_STATE_DONE) << site;
    EXPECT_THAT(status->end_reason(),
                HasSubstr("early stop: too few trainers remain after round 2: "
                          "a stopped training at their privacy budget; 1 of 2 "
                          "trainer(s) left, fewer than "
                          "min_responses_required 2"))
        << site;
    // The model of round 2 is the last: no round 3 was scattered.
    EXPECT_EQ(FinalMetadata(swarm, site, job.job_id(), "last")["round"], "2")
        << site;
  }
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace swarm::testing
