// Robust aggregation in real multi-process jobs (issue 32): seven
// swarm-client daemons, one of which attacks (its update sign-flipped and
// scaled by 10, claiming 100 times its samples, its validation metric a
// lie), and one job per robust method on the same daemons. Each job must
// end on the honest trajectory, clip the liar's claim once per round
// (SiteCounters.sample_claims_clipped), and keep the round the honest
// trainers rank best as BEST.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "config/job_config.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "persist/workspace.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

constexpr int kSites = 7;  // Bulyan with f = 1 needs 7.
constexpr uint32_t kRounds = 3;
constexpr uint64_t kSize = 256;
constexpr double kDelta = 0.125;
constexpr double kInitScale = 1.0 / 32;

std::string SiteName(int i) { return absl::StrCat("site-", i); }

struct Method {
  v1::AggregationMethod method;
  // How far the last model may be from the honest one per element.
  double tolerance;
};

class RobustJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    swarm_ = std::make_unique<LocalSwarm>("robust", Transport::kInsecure);
    for (int i = 0; i < kSites; ++i) {
      std::map<std::string, std::string> params = {
          {"size", absl::StrCat(kSize)},
          {"init_scale", absl::StrCat(kInitScale)},
          {"delta", absl::StrCat(kDelta)},
          {"sample_count", "1"},
          // The honest trainers rank round 2 best.
          {"metrics", "0:0.5,1:0.625,2:0.75"}};
      if (i == kSites - 1) {
        params["attack"] = "sign_flip";
        params["attack_scale"] = "10";
        params["attack_samples"] = "100";
        // The liar says round 0's model is perfect and the others useless.
        params["metrics"] = "0:1,1:0,2:0";
      }
      absl::Status started = swarm_->StartSite(SiteName(i), params);
      ASSERT_TRUE(started.ok()) << started;
    }
  }

  void RunJob(const std::string& job_id, const Method& method) {
    SCOPED_TRACE(job_id);
    v1::JobConfig job;
    job.set_job_id(job_id);
    for (int i = 0; i < kSites; ++i)
      *job.add_sites() = swarm_->Info(SiteName(i));
    job.set_num_rounds(kRounds);
    job.set_seed(3);
    job.set_aggregation_method(method.method);
    job.set_tolerated_attackers(1);
    job.set_trim_fraction(0.2);  // Trims 1 of 7 at each end.
    job.set_max_claimed_samples(1);
    job.set_wait_after_min_responses_ms(2000);
    job.set_round_timeout_ms(60000);
    job.set_request_to_submit_interval_ms(100);
    const std::string path = swarm_->WriteJob(job);
    absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    CommandResult start = swarm_->Swarmctl({"start", "--job", path});
    ASSERT_EQ(start.code(), 0) << start.ToString();
    absl::Status done = swarm_->WaitAllDone(
        job_id, absl::Now() + absl::Seconds(60) * TimeScale());
    ASSERT_TRUE(done.ok()) << done << "\n" << swarm_->Logs();

    uint64_t clipped = 0;
    for (int i = 0; i < kSites; ++i) {
      absl::StatusOr<v1::StatusReply> reply =
          swarm_->Status(SiteName(i), job_id);
      ASSERT_TRUE(reply.ok()) << reply.status();
      clipped += reply->status().counters().sample_claims_clipped();
      // The median of the trainers' metrics: round 2, whatever the liar says.
      EXPECT_EQ(reply->status().best().round(), 2u) << SiteName(i);
    }
    EXPECT_EQ(clipped, kRounds) << "the liar's claim, once per round";

    persist::Workspace workspace(swarm_->Workspace(SiteName(0)));
    absl::StatusOr<Model> last =
        Model::LoadSafetensors(workspace.LastModelPath(job_id));
    ASSERT_TRUE(last.ok()) << last.status();
    ASSERT_EQ(last->num_tensors(), 1u);
    std::vector<float> values(kSize);
    std::memcpy(values.data(), last->tensor_data(0).data(), kSize * 4);
    for (uint64_t i = 0; i < kSize; ++i) {
      const double honest = i * kInitScale + kRounds * kDelta;
      ASSERT_NEAR(values[i], honest, method.tolerance) << "element " << i;
    }
  }

  std::unique_ptr<LocalSwarm> swarm_;
};

TEST_F(RobustJobTest, EveryRobustMethodKeepsTheHonestModel) {
  // The honest results are identical, so the rules that select or sort
  // return them exactly; centered clipping and the geometric median land
  // near them (clipping lets a radius / n share of the attacker through).
  const std::vector<std::pair<std::string, Method>> methods = {
      {"median", {v1::AGGREGATION_MEDIAN, 0}},
      {"trimmed", {v1::AGGREGATION_TRIMMED_MEAN, 0}},
      {"krum", {v1::AGGREGATION_MULTI_KRUM, 0}},
      {"bulyan", {v1::AGGREGATION_BULYAN, 0}},
      {"clipping", {v1::AGGREGATION_CENTERED_CLIPPING, 0.05}},
      {"geomedian", {v1::AGGREGATION_GEOMETRIC_MEDIAN, 0.01}},
  };
  for (const auto& [name, method] : methods) {
    RunJob(absl::StrCat("robust-", name), method);
  }
}

}  // namespace
}  // namespace swarm::testing
