// Memory per site with a large model (issue 13, item 1): three real daemons
// over mTLS train a 256 MiB model (one F32 tensor, the test learner) for
// three rounds with the job's defaults (so lean memory is on: the model is
// above lean_memory_min_model_bytes). Each daemon's peak resident memory
// (VmHWM from /proc, read before it stops) must stay within issue 13's
// budget, 3 x the model + 100 MiB (868 MiB), and every site must end with
// the same best and last models.
//
// Measured beside a busy core (as under ctest -j2): 728-809 MiB. Before
// the aggregate went on as a mapping of its file (it stayed in memory for
// the whole next round at an aggregator that also gathered that round) and
// malloc kept to two arenas, up to 1272 MiB.
//
// Under a sanitizer the figure measures the sanitizer's shadow memory and
// quarantine, not Swarm: the test skips, saying so.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "proto/swarm.pb.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

constexpr uint64_t kModelBytes = 256ull << 20;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint32_t kRounds = 3;

// "VmHWM:" of /proc/PID/status in bytes, or 0.
uint64_t PeakResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmHWM:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    uint64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) {
      return kib * 1024;
    }
  }
  return 0;
}

TEST(MemoryTest, ThreeSitesTrainA256MiBModelWithinTheBudget) {
  if (TimeScale() > 1) {
    GTEST_SKIP() << "under a sanitizer, resident memory counts its shadow "
                    "memory and quarantine, not Swarm's buffers";
  }
  LocalSwarm swarm("memory");
  const std::vector<std::string> names = {"site-1", "site-2", "site-3"};
  for (size_t k = 0; k < names.size(); ++k) {
    absl::Status started = swarm.StartSite(
        names[k], {{"size", absl::StrCat(kModelBytes / sizeof(float))},
                   {"delta", absl::StrCat(0.125 * (k + 1))},
                   {"sample_count", "1"}});
    ASSERT_TRUE(started.ok()) << started;
  }
  v1::JobConfig job;
  job.set_job_id("memory-256mib");
  for (const std::string& name : names) *job.add_sites() = swarm.Info(name);
  job.set_num_rounds(kRounds);
  job.set_round_timeout_ms(120000);
  job.set_request_to_submit_max_wait_ms(120000);
  job.set_final_result_ack_timeout_ms(60000);
  // A 256 MiB task takes a while to stream on a loaded 2-core machine.
  job.set_learn_task_ack_timeout_ms(60000);
  job.set_failover_timeout_ms(30000);
  const std::string job_path = swarm.WriteJob(job);

  const absl::Time started = absl::Now();
  CommandResult start = swarm.Swarmctl({"start", "--job", job_path});
  ASSERT_EQ(start.code(), 0) << start.ToString();
  absl::Status done =
      swarm.WaitAllDone(job.job_id(), absl::Now() + absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done << "\n" << swarm.Logs();
  std::fprintf(stderr, "[ memory ] %d sites, %d rounds of %d MiB: done in %s\n",
               static_cast<int>(names.size()), kRounds,
               static_cast<int>(kModelBytes / kMiB),
               absl::FormatDuration(absl::Now() - started).c_str());

  const uint64_t budget = kModelBytes * 3 + 100 * kMiB;
  for (const std::string& name : names) {
    const uint64_t peak = PeakResidentBytes(swarm.site(name).process->pid());
    ASSERT_GT(peak, 0u) << "no VmHWM for " << name;
    std::fprintf(stderr,
                 "[ memory ] %s: peak resident %.0f MiB = %.2f x the model "
                 "(budget 3x + 100 MiB = %.0f MiB: %s)\n",
                 name.c_str(), static_cast<double>(peak) / kMiB,
                 static_cast<double>(peak) / kModelBytes,
                 static_cast<double>(budget) / kMiB,
                 peak <= budget ? "within" : "over");
    EXPECT_LE(peak, budget) << name << "\n" << swarm.Logs();
  }

  // Lean memory changes how models are held, not what they are.
  std::optional<Model> first_best, first_last;
  for (const std::string& name : names) {
    const std::string folder =
        absl::StrCat(swarm.Workspace(name), "/", job.job_id());
    absl::StatusOr<Model> best =
        Model::LoadSafetensors(folder + "/best.safetensors");
    absl::StatusOr<Model> last =
        Model::LoadSafetensors(folder + "/last.safetensors");
    ASSERT_TRUE(best.ok()) << name << ": " << best.status();
    ASSERT_TRUE(last.ok()) << name << ": " << last.status();
    ASSERT_EQ(best->total_bytes(), kModelBytes);
    if (!first_best.has_value()) {
      first_best = std::move(*best);
      first_last = std::move(*last);
      continue;
    }
    // Byte comparisons of the mapped files (no copies).
    EXPECT_TRUE(best->tensor_data(0) == first_best->tensor_data(0))
        << name << ": another BEST";
    EXPECT_TRUE(last->tensor_data(0) == first_last->tensor_data(0))
        << name << ": another LAST";
  }
  absl::Status stopped = swarm.StopAll(absl::Seconds(30));
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace swarm::testing
