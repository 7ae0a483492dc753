// Server optimizers in real daemons (docs/server-optimizers.md): the
// optimizer's state travels with the global model, is kept with it on disk,
// and comes back after kill -9 and `swarmctl resume`: the resumed job's
// global models equal, bit for bit, those of the same job run without a
// fault. The final models carry no state.
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

constexpr uint32_t kRounds = 6;
constexpr char kStatePrefix[] = "swarm.server_optimizer.";

// The MLP on 20,000 Fashion-MNIST images, one site: training depends only
// on the seed and the round, so two runs of one job give the same models.
// About half a second a round here: room to kill the site mid-job.
v1::SiteConfig MlpSite() {
  v1::SiteConfig config;
  config.mutable_learner()->set_kind("mlp");
  auto& params = *config.mutable_learner()->mutable_params();
  params["max_train_samples"] = "20000";
  params["sites"] = "1";
  params["site_index"] = "0";
  params["partition"] = "iid";
  params["hidden"] = "64";
  params["batch_size"] = "50";
  params["epochs"] = "2";
  return config;
}

v1::JobConfig Job(LocalSwarm& swarm, v1::ServerOptimizer optimizer) {
  v1::JobConfig job;
  job.set_job_id("server-opt");
  *job.add_sites() = swarm.Info("a");
  job.set_num_rounds(kRounds);
  job.set_min_responses_required(1);
  job.set_wait_after_min_responses_ms(1000);
  job.set_round_timeout_ms(60000);
  job.set_request_to_submit_interval_ms(100);
  job.set_learn_task_ack_timeout_ms(10000);
  job.set_keep_round_models(true);
  job.set_server_optimizer(optimizer);
  return job;
}

bool WaitFor(LocalSwarm& swarm, const std::string& job,
             const std::function<bool(const v1::SiteStatus&)>& ok,
             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout * TimeScale();
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::StatusReply> reply = swarm.Status("a", job);
    if (reply.ok() && ok(reply->status())) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// Tensor name -> bytes of a model file in site a's job folder.
std::map<std::string, std::string> Tensors(LocalSwarm& swarm,
                                           const std::string& job,
                                           const std::string& file) {
  const std::string path =
      absl::StrCat(swarm.Workspace("a"), "/", job, "/", file);
  absl::StatusOr<Model> model = Model::LoadSafetensors(path);
  EXPECT_TRUE(model.ok()) << path << ": " << model.status();
  std::map<std::string, std::string> out;
  if (!model.ok()) return out;
  for (size_t i = 0; i < model->num_tensors(); ++i) {
    out[model->spec(i).name] = std::string(model->tensor_data(i));
  }
  return out;
}

std::string RoundFile(uint32_t global_round) {
  char name[64];
  std::snprintf(name, sizeof(name), "rounds/round-%06u.safetensors",
                global_round);
  return name;
}

// Runs the job to its end; with `kill_after` > 0, kill -9 site a once
// round `kill_after`'s global model is on disk, restart it, resume.
void RunJob(LocalSwarm& swarm, const v1::JobConfig& job, uint32_t kill_after) {
  const std::string job_path = swarm.WriteJob(job);
  CommandResult start = swarm.Swarmctl({"start", "--job", job_path});
  ASSERT_EQ(start.code(), 0) << start.ToString() << swarm.Logs();
  if (kill_after > 0) {
    ASSERT_TRUE(WaitFor(
        swarm, job.job_id(),
        [&](const v1::SiteStatus& s) {
          return s.global_round() >= static_cast<int>(kill_after);
        },
        absl::Seconds(120)))
        << swarm.Logs();
    ASSERT_TRUE(swarm.RestartSite("a", /*kill=*/true).ok()) << swarm.Logs();
    ASSERT_TRUE(WaitFor(
        swarm, job.job_id(),
        [](const v1::SiteStatus& s) { return s.rejoined(); },
        absl::Seconds(30)))
        << swarm.Logs();
    CommandResult resumed = swarm.Swarmctl({"resume", "--job", job_path});
    ASSERT_EQ(resumed.code(), 0) << resumed.ToString() << swarm.Logs();
  }
  ASSERT_TRUE(swarm
                  .WaitAllDone(job.job_id(),
                               absl::Now() + absl::Seconds(240) * TimeScale())
                  .ok())
      << swarm.Logs();
}

class ServerOptimizerIntegrationTest
    : public ::testing::TestWithParam<v1::ServerOptimizer> {};

// The same job twice: once without a fault, once killed -9 after round 2's
// global model is on disk and resumed. The optimizer's state is in every
// kept global model (the step counter counts the optimizer's steps) and not
// in LAST; the resumed run's last global model and LAST equal the
// unfaulted run's bit for bit. (Had the resume lost the state, the steps
// after it would restart the moments from zero and the models would
// differ: the state is checked to be non-zero.)
TEST_P(ServerOptimizerIntegrationTest, StateSurvivesKillAndResumeBitForBit) {
  const v1::ServerOptimizer optimizer = GetParam();
  std::map<std::string, std::string> reference_global;
  std::map<std::string, std::string> reference_last;
  {
    LocalSwarm swarm(absl::StrCat("server-opt-ref-", optimizer));
    ASSERT_TRUE(swarm.StartSiteWithSiteConfig("a", MlpSite()).ok())
        << swarm.Logs();
    const v1::JobConfig job = Job(swarm, optimizer);
    ASSERT_NO_FATAL_FAILURE(RunJob(swarm, job, /*kill_after=*/0));
    for (uint32_t r = 1; r <= kRounds; ++r) {
      std::map<std::string, std::string> kept =
          Tensors(swarm, job.job_id(), RoundFile(r));
      auto step = kept.find(absl::StrCat(kStatePrefix, "step"));
      ASSERT_NE(step, kept.end()) << RoundFile(r) << " holds no state";
      int64_t steps = 0;
      ASSERT_EQ(step->second.size(), sizeof(steps));
      std::memcpy(&steps, step->second.data(), sizeof(steps));
      EXPECT_EQ(steps, r) << RoundFile(r);
    }
    reference_global = Tensors(swarm, job.job_id(), RoundFile(kRounds));
    reference_last = Tensors(swarm, job.job_id(), "last.safetensors");
    EXPECT_TRUE(swarm.StopAll(absl::Seconds(30)).ok());
  }
  ASSERT_FALSE(reference_last.empty());
  size_t state_tensors = 0;
  bool nonzero_state = false;
  for (const auto& [name, bytes] : reference_global) {
    if (!absl::StartsWith(name, kStatePrefix)) {
      ASSERT_EQ(reference_last.count(name), 1u) << name << " not in LAST";
      continue;
    }
    ++state_tensors;
    if (name != absl::StrCat(kStatePrefix, "step") &&
        bytes.find_first_not_of('\0') != std::string::npos) {
      nonzero_state = true;
    }
  }
  EXPECT_EQ(reference_last.size() + state_tensors, reference_global.size());
  for (const auto& [name, bytes] : reference_last) {
    EXPECT_FALSE(absl::StartsWith(name, kStatePrefix)) << "LAST holds " << name;
  }
  EXPECT_TRUE(nonzero_state);

  LocalSwarm swarm(absl::StrCat("server-opt-resume-", optimizer));
  ASSERT_TRUE(swarm.StartSiteWithSiteConfig("a", MlpSite()).ok())
      << swarm.Logs();
  const v1::JobConfig job = Job(swarm, optimizer);
  ASSERT_NO_FATAL_FAILURE(RunJob(swarm, job, /*kill_after=*/2));
  const std::map<std::string, std::string> global =
      Tensors(swarm, job.job_id(), RoundFile(kRounds));
  const std::map<std::string, std::string> last =
      Tensors(swarm, job.job_id(), "last.safetensors");
  ASSERT_EQ(global.size(), reference_global.size());
  for (const auto& [name, bytes] : reference_global) {
    auto it = global.find(name);
    ASSERT_NE(it, global.end()) << name;
    EXPECT_TRUE(it->second == bytes)
        << name << " of the resumed job's last global model differs";
  }
  EXPECT_TRUE(last == reference_last) << "LAST differs after the resume";
  std::fprintf(stderr,
               "[ server-opt ] %s: %zu model tensors, %zu state tensors; "
               "resumed run equals the unfaulted one bit for bit\n",
               v1::ServerOptimizer_Name(optimizer).c_str(),
               reference_last.size(), state_tensors);
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(30)).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ServerOptimizerIntegrationTest,
    ::testing::Values(v1::SERVER_OPTIMIZER_MOMENTUM, v1::SERVER_OPTIMIZER_ADAM),
    [](const ::testing::TestParamInfo<v1::ServerOptimizer>& info) {
      return v1::ServerOptimizer_Name(info.param);
    });

}  // namespace
}  // namespace swarm::testing
