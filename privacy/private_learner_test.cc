#include "privacy/private_learner.h"

#include <filesystem>
#include <memory>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/atomic_file.h"
#include "persist/test_util.h"
#include "privacy/rdp.h"

namespace swarm::privacy {
namespace {

using ::testing::HasSubstr;

// Trains nothing; reports `cost` (when set) with every result.
class FakeLearner final : public Learner {
 public:
  std::optional<v1::PrivacyCost> cost;
  std::map<std::string, std::string> params;
  int trained = 0;

  absl::StatusOr<Model> InitialModel() override { return Tiny(); }
  absl::StatusOr<Metrics> Validate(const Model&, uint32_t) override {
    return Metrics{{"accuracy", 0.5}};
  }
  absl::StatusOr<TrainOutput> Train(const Model&, uint32_t,
                                    const std::atomic<bool>&) override {
    ++trained;
    TrainOutput out;
    out.model = *Tiny();
    out.sample_count = 10;
    out.privacy = cost;
    return out;
  }
  absl::Status ConfigureForJob(
      const std::map<std::string, std::string>& job_params) override {
    params = job_params;
    return absl::OkStatus();
  }

 private:
  static absl::StatusOr<Model> Tiny() {
    return Model::Create({*MakeTensorSpec("w", v1::DTYPE_F32, {2})});
  }
};

v1::PrivacyCost Cost() {
  v1::PrivacyCost cost;
  cost.set_sampling_rate(0.01);
  cost.set_noise_multiplier(1.0);
  cost.set_steps(100);
  return cost;
}

v1::JobConfig Job(bool require_dp = false) {
  v1::JobConfig job;
  job.set_job_id("job-1");
  job.set_num_rounds(7);
  job.set_require_dp(require_dp);
  (*job.mutable_learner_params())["dp_noise_multiplier"] = "1";
  return job;
}

struct Site {
  FakeLearner* fake;
  std::unique_ptr<PrivateLearner> learner;
};

Site MakeSite(const std::string& root, double max_epsilon,
              std::optional<v1::PrivacyCost> cost = Cost()) {
  auto fake = std::make_unique<FakeLearner>();
  fake->cost = cost;
  FakeLearner* raw = fake.get();
  v1::PrivacyPolicy policy;
  policy.set_max_epsilon(max_epsilon);
  return {raw, std::make_unique<PrivateLearner>(std::move(fake), policy,
                                                persist::Workspace(root), "a")};
}

// Validate then Train, as the driver does.
absl::StatusOr<TrainOutput> Round(PrivateLearner& learner, uint32_t round) {
  const Model global = *learner.InitialModel();
  std::atomic<bool> cancel{false};
  absl::StatusOr<Metrics> metrics = learner.Validate(global, round);
  if (!metrics.ok()) return metrics.status();
  return learner.Train(global, round, cancel);
}

double Expected(uint64_t steps) {
  return *DpSgdEpsilon(0.01, 1.0, steps, kDefaultDelta);
}

TEST(PrivateLearnerTest, ChargesEveryRoundAndSurvivesARestart) {
  persist::testutil::ScopedTempDir dir;
  {
    Site site = MakeSite(dir.path(), 0);
    ASSERT_TRUE(site.learner->ConfigureJob(Job()).ok());
    EXPECT_EQ(site.fake->params["dp_rounds"], "7");
    EXPECT_EQ(site.fake->params["dp_delta"], "1.0000000000000001e-05");
    for (uint32_t r = 0; r < 3; ++r) {
      absl::StatusOr<TrainOutput> out = Round(*site.learner, r);
      ASSERT_TRUE(out.ok()) << out.status();
      // Each result carries the spend after its own charge.
      ASSERT_TRUE(out->spent.has_value());
      EXPECT_NEAR(out->spent->epsilon(), Expected(100 * (r + 1)), 1e-9);
      EXPECT_EQ(out->spent->rounds(), r + 1);
      EXPECT_EQ(out->spent->delta(), kDefaultDelta);
    }
    std::optional<v1::PrivacySpent> spent = site.learner->Spent();
    ASSERT_TRUE(spent.has_value());
    EXPECT_NEAR(spent->epsilon(), Expected(300), 1e-9);
    EXPECT_EQ(spent->rounds(), 3u);
    EXPECT_EQ(spent->steps(), 300u);
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/job-1/privacy.json"));
  // A new daemon on the same workspace continues the count.
  Site site = MakeSite(dir.path(), 0);
  ASSERT_TRUE(site.learner->ConfigureJob(Job()).ok());
  EXPECT_NEAR(site.learner->Spent()->epsilon(), Expected(300), 1e-9);
  ASSERT_TRUE(Round(*site.learner, 3).ok());
  EXPECT_NEAR(site.learner->Spent()->epsilon(), Expected(400), 1e-9);
  v1::SiteStatus status;
  status.set_job_id("job-1");
  site.learner->AddToStatus(&status);
  EXPECT_NEAR(status.privacy().epsilon(), Expected(400), 1e-9);
  EXPECT_EQ(status.privacy().delta(), kDefaultDelta);
}

// The budget admits round 3 only if it stays within: with room for two
// rounds and a bit, the third is refused before training, with the reason.
TEST(PrivateLearnerTest, StopsAtTheBudget) {
  persist::testutil::ScopedTempDir dir;
  const double budget = (Expected(200) + Expected(300)) / 2;
  Site site = MakeSite(dir.path(), budget);
  ASSERT_TRUE(site.learner->ConfigureJob(Job()).ok());
  ASSERT_TRUE(Round(*site.learner, 0).ok());
  ASSERT_TRUE(Round(*site.learner, 1).ok());
  absl::StatusOr<TrainOutput> third = Round(*site.learner, 2);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(third.status().message(), HasSubstr("privacy budget exhausted"));
  EXPECT_THAT(third.status().message(), HasSubstr("budget"));
  // Marked: the site stops for the job, and its aggregator is told so.
  EXPECT_TRUE(StoppedForJob(third.status()));
  EXPECT_EQ(site.fake->trained, 2);
  EXPECT_TRUE(site.learner->Spent()->budget_exhausted());
  EXPECT_NEAR(site.learner->Spent()->epsilon(), Expected(200), 1e-9);
  EXPECT_LE(site.learner->Spent()->epsilon(), budget);
}

// A first round that alone exceeds the budget is withheld, not charged.
TEST(PrivateLearnerTest, WithholdsAResultBeyondTheBudget) {
  persist::testutil::ScopedTempDir dir;
  Site site = MakeSite(dir.path(), Expected(100) / 2);
  ASSERT_TRUE(site.learner->ConfigureJob(Job()).ok());
  absl::StatusOr<TrainOutput> first = Round(*site.learner, 0);
  EXPECT_THAT(first.status().message(), HasSubstr("privacy budget exhausted"));
  EXPECT_TRUE(StoppedForJob(first.status()));
  EXPECT_EQ(site.learner->Spent()->rounds(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/job-1/privacy.json"));
}

TEST(PrivateLearnerTest, RequiredDpRefusesAResultWithoutCost) {
  persist::testutil::ScopedTempDir dir;
  Site site = MakeSite(dir.path(), 0, std::nullopt);
  ASSERT_TRUE(site.learner->ConfigureJob(Job(/*require_dp=*/true)).ok());
  absl::StatusOr<TrainOutput> out = Round(*site.learner, 0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status().message(),
              HasSubstr("requires differential privacy"));
  EXPECT_FALSE(StoppedForJob(out.status()));
  // Not required: the result passes, uncharged.
  ASSERT_TRUE(site.learner->ConfigureJob(Job(false)).ok());
  EXPECT_TRUE(Round(*site.learner, 0).ok());
  EXPECT_FALSE(site.learner->Spent().has_value());
}

TEST(PrivateLearnerTest, CorruptLedgerRefusesTheJob) {
  persist::testutil::ScopedTempDir dir;
  std::filesystem::create_directories(dir.path() + "/job-1");
  ASSERT_TRUE(persist::WriteFileAtomically(dir.path() + "/job-1/privacy.json",
                                           "{broken")
                  .ok());
  Site site = MakeSite(dir.path(), 0);
  absl::Status configured = site.learner->ConfigureJob(Job());
  EXPECT_EQ(configured.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(configured.message(), HasSubstr("must not restart from zero"));
}

// DP asked for in the site's own params: the job's rounds and the site's δ
// still reach the learner (for dp_target_epsilon).
TEST(PrivateLearnerTest, PlannedRoundsReachASiteThatAsksForDp) {
  persist::testutil::ScopedTempDir dir;
  auto fake = std::make_unique<FakeLearner>();
  FakeLearner* raw = fake.get();
  v1::PrivacyPolicy policy;
  policy.set_delta(1e-6);
  PrivateLearner learner(std::move(fake), policy,
                         persist::Workspace(dir.path()), "a",
                         {{"dp_target_epsilon", "3"}});
  v1::JobConfig job = Job();
  job.clear_learner_params();
  ASSERT_TRUE(learner.ConfigureJob(job).ok());
  EXPECT_EQ(raw->params["dp_rounds"], "7");
  EXPECT_EQ(raw->params["dp_delta"], "9.9999999999999995e-07");
  // Neither the site nor the job asks: nothing is added.
  PrivateLearner plain(std::make_unique<FakeLearner>(), policy,
                       persist::Workspace(dir.path()), "a");
  ASSERT_TRUE(plain.ConfigureJob(job).ok());
  EXPECT_EQ(static_cast<FakeLearner*>(plain.inner())->params.count("dp_rounds"),
            0u);
}

TEST(PrivateLearnerTest, ValidatesThePolicy) {
  v1::PrivacyPolicy policy;
  EXPECT_TRUE(ValidatePolicy(policy).ok());
  policy.set_max_epsilon(-1);
  EXPECT_THAT(ValidatePolicy(policy).message(), HasSubstr("max_epsilon"));
  policy.set_max_epsilon(3);
  policy.set_delta(1.5);
  EXPECT_THAT(ValidatePolicy(policy).message(), HasSubstr("privacy.delta"));
}

}  // namespace
}  // namespace swarm::privacy
