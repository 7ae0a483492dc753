// External trainers over the trainer link (issue 12, "Done when" item 1):
// real swarm-client daemons whose learner is a NumPy trainer
// (scripted_trainer.py, the Python SDK) in launch mode or attach mode.
//
// The scripted trainer mirrors the test learner: element i of the initial
// model is i / 32, training adds the site's delta (a multiple of 1/8), sample
// counts are powers of two. So every round's FedAvg is exact in float32 and
// the final model is compared with ==.
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "persist/workspace.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";
constexpr uint64_t kSize = 64;
constexpr double kInitScale = 1.0 / 32;

struct TrainerSite {
  std::string name;
  bool attach = false;
  double delta = 0.125;
  uint64_t samples = 2;
  std::map<std::string, std::string> params;  // Extra learner params.
  uint32_t lease_ms = 0;
  uint32_t task_timeout_ms = 0;
  // Attach mode: the test starts the trainer itself, later (RunJob does not).
  bool attach_later = false;
};

// Why the Python side cannot run here, or "" when it can.
std::string PythonMissing() {
  CommandResult probe = RunCommand(
      {kPython, "-c", "import grpc, google.protobuf, numpy"},
      absl::StrCat(::testing::TempDir(), "/python-probe"), absl::Seconds(30));
  if (probe.code() != 0) {
    return absl::StrCat(kPython,
                        " cannot import grpc/protobuf/numpy (install "
                        "python3-grpcio python3-protobuf python3-numpy): ",
                        probe.err);
  }
  return "";
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string missing = PythonMissing();
    if (!missing.empty()) GTEST_SKIP() << missing;
  }

  v1::TrainerConfig Trainer(const TrainerSite& site) {
    v1::TrainerConfig trainer;
    trainer.set_mode(site.attach ? "attach" : "launch");
    if (!site.attach) {
      trainer.add_command(kPython);
      trainer.add_command(SWARM_SCRIPTED_TRAINER);
      (*trainer.mutable_env())["PYTHONPATH"] = SWARM_PYTHON_DIR;
      trainer.set_restart_backoff_ms(200);
    }
    trainer.set_lease_ms(site.lease_ms);
    trainer.set_task_timeout_ms(site.task_timeout_ms);
    return trainer;
  }

  // Starts an attach-mode site's trainer as the user would; `env` adds
  // "NAME=value" entries.
  std::unique_ptr<Process> StartAttached(LocalSwarm& swarm,
                                         const std::string& name,
                                         std::vector<std::string> env = {},
                                         const std::string& label = "trainer") {
    const std::string socket =
        absl::StrCat(swarm.Workspace(name), "/trainer/link.sock");
    std::vector<std::string> argv = {
        "/usr/bin/env", absl::StrCat("SWARM_TRAINER_SOCKET=", socket),
        absl::StrCat("PYTHONPATH=", SWARM_PYTHON_DIR)};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(kPython);
    argv.push_back(SWARM_SCRIPTED_TRAINER);
    absl::StatusOr<std::unique_ptr<Process>> process = Process::Start(
        argv, absl::StrCat(swarm.dir(), "/", name, "-", label, ".out"),
        absl::StrCat(swarm.dir(), "/", name, "-", label, ".err"));
    EXPECT_TRUE(process.ok()) << process.status();
    return process.ok() ? std::move(*process) : nullptr;
  }

  // Starts the sites, runs `rounds` rounds, waits for DONE everywhere.
  void RunJob(LocalSwarm& swarm, const std::string& job_id,
              const std::vector<TrainerSite>& sites, uint32_t rounds,
              std::map<std::string, std::unique_ptr<Process>>* attached,
              std::function<void(const std::atomic<bool>& stop)> during = {}) {
    for (const TrainerSite& site : sites) {
      std::map<std::string, std::string> params = site.params;
      params["size"] = absl::StrCat(kSize);
      params["init_scale"] = absl::StrCat(kInitScale);
      params["delta"] = absl::StrCat(site.delta);
      params["sample_count"] = absl::StrCat(site.samples);
      absl::Status started =
          swarm.StartExternalSite(site.name, Trainer(site), params);
      ASSERT_TRUE(started.ok()) << started;
      if (site.attach && !site.attach_later) {
        (*attached)[site.name] = StartAttached(swarm, site.name);
      }
    }
    v1::JobConfig job;
    job.set_job_id(job_id);
    for (const TrainerSite& site : sites)
      *job.add_sites() = swarm.Info(site.name);
    job.set_num_rounds(rounds);
    job.set_min_responses_required(1);
    job.set_wait_after_min_responses_ms(20000);
    job.set_round_timeout_ms(60000);
    job.set_request_to_submit_interval_ms(100);
    job.set_learn_task_ack_timeout_ms(10000);
    job.set_final_result_ack_timeout_ms(30000);
    (*job.mutable_learner_params())["metrics"] = "0:0.25,1:0.75,2:0.5,3:0.5";
    const std::string path = swarm.WriteJob(job);
    const absl::Time start = absl::Now();
    CommandResult started = swarm.Swarmctl({"start", "--job", path});
    ASSERT_EQ(started.code(), 0) << started.ToString();
    // `during` runs beside the job (e.g. the user restarting a trainer).
    std::atomic<bool> stop{false};
    std::thread beside;
    if (during) beside = std::thread([&] { during(stop); });
    absl::Status done = swarm.WaitAllDone(
        job_id, absl::Now() + absl::Seconds(120) * TimeScale());
    stop = true;
    if (beside.joinable()) beside.join();
    ASSERT_TRUE(done.ok()) << done << "\n" << swarm.Logs();
    std::fprintf(stderr, "[ %s ] %d sites, %d rounds: done in %s\n",
                 job_id.c_str(), static_cast<int>(sites.size()), rounds,
                 absl::FormatDuration(absl::Now() - start).c_str());
  }

  // The LAST model of every site must equal init + the sum of `steps`.
  void ExpectLast(LocalSwarm& swarm, const std::string& job_id,
                  const std::vector<TrainerSite>& sites,
                  const std::vector<double>& steps, bool exact) {
    for (const TrainerSite& site : sites) {
      SCOPED_TRACE(site.name);
      persist::Workspace workspace(swarm.Workspace(site.name));
      absl::StatusOr<Model> last =
          Model::LoadSafetensors(workspace.LastModelPath(job_id));
      ASSERT_TRUE(last.ok()) << last.status();
      ASSERT_EQ(last->num_tensors(), 1u);
      EXPECT_EQ(last->spec(0).name, "weight");
      ASSERT_EQ(last->spec(0).byte_size, kSize * 4);
      for (uint64_t i = 0; i < kSize; ++i) {
        double want = static_cast<float>(i) * static_cast<float>(kInitScale);
        for (double step : steps) want += step;
        float got;
        std::memcpy(&got, last->tensor_data(0).data() + 4 * i, 4);
        if (exact) {
          ASSERT_EQ(got, static_cast<float>(want)) << "element " << i;
        } else {
          ASSERT_NEAR(got, want, 1e-5) << "element " << i;
        }
      }
    }
  }

  // Sum(s_k d_k) / Sum(s_k) over `sites` whose names are not in `missing`.
  static double Step(const std::vector<TrainerSite>& sites,
                     const std::vector<std::string>& missing = {}) {
    double weighted = 0, weight = 0;
    for (const TrainerSite& site : sites) {
      if (std::find(missing.begin(), missing.end(), site.name) !=
          missing.end()) {
        continue;
      }
      weighted += site.samples * site.delta;
      weight += site.samples;
    }
    return weighted / weight;
  }
};

TEST_F(TrainerTest, LaunchAndAttachSitesGiveTheExactAggregates) {
  LocalSwarm swarm("trainer-exact");
  // Samples 2 + 4 + 2 = 8; every step is exact.
  std::vector<TrainerSite> sites = {{"site-a", false, 0.125, 2, {}},
                                    {"site-b", false, 0.25, 4, {}},
                                    {"site-c", true, 0.625, 2, {}}};
  std::map<std::string, std::unique_ptr<Process>> attached;
  // While site-c's trainer is attached, a second one is refused, and so is
  // one that speaks another protocol version.
  std::string second_err, version_err;
  RunJob(swarm, "trainer-exact", sites, 4, &attached,
         [&](const std::atomic<bool>&) {
           const absl::Time until = absl::Now() + absl::Seconds(30);
           while (!absl::StrContains(
                      ReadFileOrEmpty(swarm.site("site-c").log_path),
                      ") attached (lease") &&
                  absl::Now() < until) {
             absl::SleepFor(absl::Milliseconds(50));
           }
           for (const auto& [label, env] :
                std::vector<std::pair<std::string, std::string>>{
                    {"second", "SCRIPTED_PROTOCOL_VERSION=1"},
                    {"version", "SCRIPTED_PROTOCOL_VERSION=9"}}) {
             std::unique_ptr<Process> other = StartAttached(
                 swarm, "site-c", {env, "SCRIPTED_CONNECT_TIMEOUT=1"}, label);
             absl::StatusOr<ExitInfo> exit =
                 other->Wait(absl::Now() + absl::Seconds(30));
             EXPECT_TRUE(exit.ok() && exit->exited && exit->exit_code == 3)
                 << label << ": " << (exit.ok() ? exit->ToString() : "hangs");
             (label == "second" ? second_err : version_err) = ReadFileOrEmpty(
                 absl::StrCat(swarm.dir(), "/site-c-", label, ".err"));
           }
         });
  if (HasFailure()) return;
  EXPECT_THAT(second_err,
              HasSubstr("site site-c already has a trainer attached: "
                        "scripted-trainer"));
  EXPECT_THAT(version_err,
              HasSubstr("the trainer speaks version 9, site site-c's daemon "
                        "speaks version 1"));
  const double step = Step(sites);
  ASSERT_EQ(step, 0.3125);
  ExpectLast(swarm, "trainer-exact", sites, {step, step, step, step}, true);
  // The attached trainer's loop ends with the job.
  absl::StatusOr<ExitInfo> exited =
      attached["site-c"]->Wait(absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(exited.ok()) << "the attached trainer did not end with the job";
  EXPECT_TRUE(exited->exited && exited->exit_code == 0) << exited->ToString();
  EXPECT_THAT(ReadFileOrEmpty(absl::StrCat(swarm.dir(), "/site-c-trainer.err")),
              HasSubstr("scripted trainer: job ended"));
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(20)).ok());
}

// An attach-mode site says "waiting for trainer" in its status (and in
// `swarmctl status`) while it has a task and no trainer; once the user starts
// the trainer, the job runs to the exact aggregates.
TEST_F(TrainerTest, AttachSiteShowsWaitingForTrainerUntilOneAttaches) {
  LocalSwarm swarm("trainer-waiting");
  std::vector<TrainerSite> sites = {{"site-a", false, 0.125, 2, {}},
                                    {"site-c", true, 0.625, 2, {}}};
  sites[1].attach_later = true;
  std::map<std::string, std::unique_ptr<Process>> attached;
  std::atomic<bool> saw_waiting{false};
  std::string table;
  RunJob(swarm, "trainer-waiting", sites, 2, &attached,
         [&](const std::atomic<bool>& stop) {
           const absl::Time deadline =
               absl::Now() + absl::Seconds(30) * TimeScale();
           while (!stop && !saw_waiting && absl::Now() < deadline) {
             absl::StatusOr<v1::StatusReply> status = swarm.Status("site-c");
             if (status.ok() &&
                 status->status().waiting_for() == "waiting for trainer") {
               saw_waiting = true;
               table = swarm
                           .Swarmctl({"status", "--job",
                                      absl::StrCat(swarm.dir(), "/job.json")})
                           .out;
             } else {
               absl::SleepFor(absl::Milliseconds(50));
             }
           }
           // The user starts the trainer; it lives as long as this thread.
           attached["site-c"] = StartAttached(swarm, "site-c");
           while (!stop) absl::SleepFor(absl::Milliseconds(50));
         });
  if (HasFailure()) return;
  EXPECT_TRUE(saw_waiting) << "site-c never showed \"waiting for trainer\"";
  EXPECT_THAT(table, HasSubstr("waiting for trainer"));
  absl::StatusOr<v1::StatusReply> after = swarm.Status("site-c");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->status().waiting_for(), "");
  const double full = Step(sites);
  ExpectLast(swarm, "trainer-waiting", sites, {full, full}, true);
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(20)).ok());
}

TEST_F(TrainerTest, KilledTrainersAreRestartedOrWaitedFor) {
  LocalSwarm swarm("trainer-killed");
  std::vector<TrainerSite> sites = {
      {"site-a", false, 0.125, 2, {}},
      // Launch mode: killed in round 1, restarted by the daemon.
      {"site-b", false, 0.25, 4, {{"bad.1", "die"}}},
      // Attach mode: killed in round 2; its lease (1.5 s) runs out, the task
      // fails, and the user's restarted trainer takes round 3.
      {"site-c", true, 0.625, 2, {{"bad.2", "die"}}, 1500}};
  std::map<std::string, std::unique_ptr<Process>> attached;
  // The user restarts the attached trainer when it dies.
  std::unique_ptr<Process> restarted;
  RunJob(swarm, "trainer-killed", sites, 4, &attached,
         [&](const std::atomic<bool>& stop) {
           // This thread outlives the restarted trainer: a child started by
           // Process dies with the thread that started it (PDEATHSIG).
           Process* first = attached["site-c"].get();
           while (!stop && first != nullptr) {
             if (restarted == nullptr &&
                 first->Wait(absl::Now() + absl::Milliseconds(100)).ok()) {
               restarted = StartAttached(swarm, "site-c");
             }
             if (restarted != nullptr) absl::SleepFor(absl::Milliseconds(50));
           }
         });
  if (HasFailure()) return;
  const double full = Step(sites);
  ExpectLast(swarm, "trainer-killed", sites,
             {full, Step(sites, {"site-b"}), Step(sites, {"site-c"}), full},
             false);
  const std::string log_b = ReadFileOrEmpty(swarm.site("site-b").log_path);
  EXPECT_THAT(log_b, HasSubstr("was killed by signal 9"));
  EXPECT_THAT(log_b, HasSubstr("restarting in"));
  EXPECT_THAT(log_b, HasSubstr("round 1: training"));
  const std::string log_c = ReadFileOrEmpty(swarm.site("site-c").log_path);
  EXPECT_THAT(log_c, HasSubstr("stopped answering: no call for 1.5s (its "
                               "lease) during task"));
  EXPECT_THAT(log_c, HasSubstr("round 2: training"));
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(20)).ok());
}

TEST_F(TrainerTest, BadResultsFailTheirRoundWithTheReason) {
  LocalSwarm swarm("trainer-bad");
  std::vector<TrainerSite> sites = {{"site-a", false, 0.125, 2, {}},
                                    {"site-b",
                                     false,
                                     0.25,
                                     4,
                                     {{"bad.0", "name"},
                                      {"bad.1", "shape"},
                                      {"bad.2", "dtype"},
                                      {"bad.3", "nan"},
                                      {"bad.4", "zero"},
                                      {"bad.5", "silent"}},
                                     0,
                                     3000},
                                    {"site-c", false, 0.625, 2, {}}};
  std::map<std::string, std::unique_ptr<Process>> attached;
  RunJob(swarm, "trainer-bad", sites, 6, &attached);
  if (HasFailure()) return;
  // Site b never contributes; a and c (2 + 2 samples) are exact.
  const double step = Step(sites, {"site-b"});
  ASSERT_EQ(step, 0.375);
  ExpectLast(swarm, "trainer-bad", sites, std::vector<double>(6, step), true);
  const std::string log = ReadFileOrEmpty(swarm.site("site-b").log_path);
  for (const std::string& reason :
       {std::string("tensor \"bogus\": not in the task's model"),
        std::string("tensor \"weight\": shape [63], the task's model has [64]"),
        std::string("tensor \"weight\": dtype F64, the task's model has F32"),
        std::string("tensor \"weight\": element 3 is NaN or infinite"),
        std::string("sample_count is 0"),
        std::string("no result from the trainer within 3s")}) {
    SCOPED_TRACE(reason);
    // The daemon reports the round failed, and the trainer got the error.
    EXPECT_THAT(log, HasSubstr(reason));
  }
  for (int round = 0; round < 6; ++round) {
    EXPECT_THAT(log, HasSubstr(absl::StrCat("round ", round, ": training")));
  }
  EXPECT_THAT(log, HasSubstr("scripted trainer: result refused: submit: "
                             "result of task"));
  EXPECT_TRUE(swarm.StopAll(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace swarm::testing
