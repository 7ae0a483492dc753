// Whole swarm jobs across real processes (issue 4, "Done when", item 1):
// swarm-client daemons on loopback, started with swarmctl, followed with
// `swarmctl status --watch` and long-polled Status, checked through the files
// every site wrote.
//
// The test learner is scripted so that every value is exact in float32: the
// initial weights are multiples of 1/32, every trainer adds a multiple of
// 1/8, sample counts are powers of two summing to a power of two, and the
// scripted metrics are multiples of 1/16. So each round's FedAvg result and
// each round's score are known exactly and compared with ==, and "the best
// model" is unambiguous.
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "config/election.h"
#include "config/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "persist/workspace.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kModelSize = 2048;  // 8 KiB: two 4 KiB chunks.
constexpr double kInitScale = 1.0 / 32;
constexpr uint32_t kRounds = 5;

struct SiteSpec {
  std::string name;
  bool trainer = true;
  bool candidate = true;
  double delta = 0.125;  // A multiple of 1/8.
  uint64_t samples = 1;  // A power of two.
  // Added to the job's metric script for this site (a multiple of 1/16).
  double metric_offset = 0;
};

struct JobSpec {
  std::string job_id;
  uint64_t seed = 0;
  std::vector<SiteSpec> sites;
  std::string starting_site;  // Empty: the first site.
  // Scripted validation metric per round (before each site's offset).
  std::vector<double> metrics;
  Transport transport = Transport::kMutualTls;
  // > 0: every site's max_calls_per_peer.
  uint32_t max_calls_per_peer = 0;
  // Lean memory for every model size (JobConfig
  // lean_memory_min_model_bytes 0): learn tasks and the initial model held
  // as file mappings, the aggregator's own result first.
  bool lean_memory = false;
  // broadcast_learn_tasks: each round's learn task goes along the trainers,
  // forwarded and checked against the scatterer's signature at each.
  bool broadcast = false;
  // reduce_results_in_chain: the results reach each round's aggregator as
  // one partial sum passed from trainer to trainer.
  bool chain = false;
};

bool ExactInFloat(double value) {
  return static_cast<double>(static_cast<float>(value)) == value;
}

std::vector<float> TensorValues(const Model& model) {
  std::vector<float> values;
  if (model.num_tensors() != 1) return values;
  absl::string_view data = model.tensor_data(0);
  values.resize(data.size() / sizeof(float));
  std::memcpy(values.data(), data.data(), values.size() * sizeof(float));
  return values;
}

// Index and values of the first differing element, for failure messages.
std::string FirstDifference(const std::vector<float>& got,
                            const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return absl::StrCat("size ", got.size(), " != ", want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return absl::StrFormat("element %d: %.9g != expected %.9g", i, got[i],
                             want[i]);
    }
  }
  return "equal";
}

class JobTest : public ::testing::Test {
 protected:
  void RunJob(const JobSpec& spec) {
    const std::string label =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    LocalSwarm swarm(label, spec.transport);
    SCOPED_TRACE(absl::StrCat("files in ", swarm.dir()));

    // --- Sites: one daemon each, its learner scripted by site params.
    for (const SiteSpec& site : spec.sites) {
      ASSERT_TRUE(ExactInFloat(site.delta));
      std::vector<std::string> entries;
      for (uint32_t r = 0; r < spec.metrics.size(); ++r) {
        entries.push_back(
            absl::StrCat(r, ":", spec.metrics[r] + site.metric_offset));
      }
      absl::Status started =
          swarm.StartSite(site.name,
                          {{"size", absl::StrCat(kModelSize)},
                           {"init_scale", absl::StrCat(kInitScale)},
                           {"delta", absl::StrCat(site.delta)},
                           {"sample_count", absl::StrCat(site.samples)},
                           {"metrics", absl::StrJoin(entries, ",")}},
                          spec.max_calls_per_peer);
      ASSERT_TRUE(started.ok()) << started;
    }

    // --- The job.
    v1::JobConfig job;
    job.set_job_id(spec.job_id);
    bool all_train = true;
    bool all_candidates = true;
    for (const SiteSpec& site : spec.sites) {
      *job.add_sites() = swarm.Info(site.name);
      all_train &= site.trainer;
      all_candidates &= site.candidate;
    }
    for (const SiteSpec& site : spec.sites) {
      if (!all_train && site.trainer) job.add_trainers(site.name);
      if (!all_candidates && site.candidate) {
        job.add_aggregator_candidates(site.name);
      }
    }
    if (!spec.starting_site.empty()) job.set_starting_site(spec.starting_site);
    job.set_num_rounds(kRounds);
    job.set_seed(spec.seed);
    job.set_wait_after_min_responses_ms(2000);
    job.set_round_timeout_ms(60000);
    job.set_max_concurrent_submissions(1);
    job.set_request_to_submit_interval_ms(100);
    job.set_request_to_submit_max_wait_ms(60000);
    job.set_request_to_submit_message_timeout_ms(5000);
    job.set_final_result_ack_timeout_ms(30000);
    job.set_learn_task_ack_timeout_ms(10000);
    job.set_chunk_size(4096);
    job.set_keep_round_models(true);
    if (spec.lean_memory) job.set_lean_memory_min_model_bytes(0);
    if (spec.broadcast) job.set_broadcast_learn_tasks(true);
    if (spec.chain) job.set_reduce_results_in_chain(true);
    const std::string job_path = swarm.WriteJob(job);
    absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(job_path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();

    // --- Start it and watch it.
    const absl::Time started = absl::Now();
    CommandResult start = swarm.Swarmctl({"start", "--job", job_path});
    ASSERT_EQ(start.code(), 0) << start.ToString();
    for (const SiteSpec& site : spec.sites) {
      EXPECT_THAT(start.out,
                  HasSubstr(absl::StrCat("configured site ", site.name, " (")));
    }
    EXPECT_THAT(start.out,
                HasSubstr(absl::StrCat("job ", spec.job_id, " started on site ",
                                       loaded->starting_site())));
    absl::StatusOr<std::unique_ptr<Process>> watch = swarm.StartSwarmctl(
        {"status", "--job", job_path, "--watch", "--interval-ms", "100"},
        "watch");
    ASSERT_TRUE(watch.ok()) << watch.status();

    absl::Status done = swarm.WaitAllDone(
        spec.job_id, absl::Now() + absl::Seconds(60) * TimeScale());
    ASSERT_TRUE(done.ok()) << done << "\n" << swarm.Logs();
    std::fprintf(stderr, "[ %s ] %d sites, %d rounds: done in %s\n",
                 spec.job_id.c_str(), static_cast<int>(spec.sites.size()),
                 kRounds, absl::FormatDuration(absl::Now() - started).c_str());

    absl::StatusOr<ExitInfo> watched =
        (*watch)->Wait(absl::Now() + absl::Seconds(15) * TimeScale());
    ASSERT_TRUE(watched.ok()) << "swarmctl status --watch did not end";
    const std::string watch_out =
        ReadFileOrEmpty(absl::StrCat(swarm.dir(), "/watch.out"));
    EXPECT_TRUE(watched->exited && watched->exit_code == 0)
        << watched->ToString() << "\n"
        << LastLines(watch_out, 20)
        << ReadFileOrEmpty(absl::StrCat(swarm.dir(), "/watch.err"));
    EXPECT_THAT(watch_out, HasSubstr(absl::StrCat("job ", spec.job_id,
                                                  " done on every site")));

    // --- Expected models and scores, from the script.
    double weight_sum = 0;
    for (const SiteSpec& site : spec.sites) {
      if (site.trainer) weight_sum += static_cast<double>(site.samples);
    }
    ASSERT_EQ(std::exp2(std::round(std::log2(weight_sum))), weight_sum)
        << "sample counts must sum to a power of two";
    double step = 0;  // What every round adds: sum(w * delta) / W.
    for (const SiteSpec& site : spec.sites) {
      if (site.trainer) step += static_cast<double>(site.samples) * site.delta;
    }
    step /= weight_sum;
    std::vector<std::vector<float>> global(kRounds + 1,
                                           std::vector<float>(kModelSize));
    for (uint64_t i = 0; i < kModelSize; ++i) {
      global[0][i] = static_cast<float>(i) * static_cast<float>(kInitScale);
      double value = global[0][i];
      for (uint32_t r = 1; r <= kRounds; ++r) {
        value += step;
        ASSERT_TRUE(ExactInFloat(value)) << "round " << r << " element " << i;
        global[r][i] = static_cast<float>(value);
      }
    }
    std::vector<double> score(kRounds);
    for (uint32_t r = 0; r < kRounds; ++r) {
      double sum = 0;
      for (const SiteSpec& site : spec.sites) {
        if (site.trainer) {
          sum += static_cast<double>(site.samples) *
                 (spec.metrics[r] + site.metric_offset);
        }
      }
      score[r] = sum / weight_sum;
    }
    const uint32_t best_round = static_cast<uint32_t>(
        std::max_element(score.begin(), score.end()) - score.begin());
    ASSERT_EQ(std::count(score.begin(), score.end(), score[best_round]), 1)
        << "the script must make the best round unique";
    ASSERT_NE(best_round, kRounds - 1)
        << "the script must not make the last round the best";

    // --- Who aggregated each round, and what it produced.
    std::map<std::string, std::set<uint32_t>> aggregated;  // site -> rounds
    std::set<std::string> aggregators;
    for (uint32_t round = 0; round < kRounds; ++round) {
      SCOPED_TRACE(absl::StrCat("round ", round));
      const std::vector<std::string> order = ElectionOrder(*loaded, round);
      ASSERT_FALSE(order.empty());
      const std::string& elected = order[0];
      aggregated[elected].insert(round);
      std::vector<std::string> holders;
      for (const SiteSpec& site : spec.sites) {
        persist::Workspace workspace(swarm.site(site.name).workspace);
        if (FileExists(workspace.RoundModelPath(spec.job_id, round + 1))) {
          holders.push_back(site.name);
        }
      }
      ASSERT_EQ(holders, std::vector<std::string>{elected})
          << "only the round's aggregator writes rounds/round-" << (round + 1);
      persist::Workspace workspace(swarm.site(elected).workspace);
      absl::StatusOr<Model> model = Model::LoadSafetensors(
          workspace.RoundModelPath(spec.job_id, round + 1));
      ASSERT_TRUE(model.ok()) << model.status();
      EXPECT_EQ(model->metadata()["aggregator"], elected);
      EXPECT_EQ(model->metadata()["round"], absl::StrCat(round + 1));
      EXPECT_EQ(model->metadata()["job"], spec.job_id);
      aggregators.insert(model->metadata()["aggregator"]);
      const std::vector<float> values = TensorValues(*model);
      EXPECT_TRUE(values == global[round + 1])
          << "the global model after round " << round
          << " is not the exact weighted average: "
          << FirstDifference(values, global[round + 1]);
    }
    EXPECT_GE(aggregators.size(), 2u)
        << "the election should vary the aggregator across rounds (seed "
        << spec.seed << ")";

    // --- Every site: done, its counters, its round files.
    for (const SiteSpec& site : spec.sites) {
      SCOPED_TRACE(absl::StrCat("site ", site.name));
      absl::StatusOr<v1::StatusReply> reply =
          swarm.Status(site.name, spec.job_id);
      ASSERT_TRUE(reply.ok()) << reply.status();
      const v1::SiteStatus& status = reply->status();
      EXPECT_EQ(status.state(), v1::SITE_STATE_DONE);
      EXPECT_EQ(status.role().trainer(), site.trainer);
      const v1::SiteCounters& counters = status.counters();
      const uint64_t rounds_aggregated = aggregated[site.name].size();
      const uint64_t trainers = static_cast<uint64_t>(loaded->trainers_size());
      EXPECT_EQ(counters.submissions_in_flight(), 0u);
      EXPECT_EQ(counters.rounds_completed(), rounds_aggregated);
      EXPECT_EQ(counters.results_rejected(), 0u);
      EXPECT_EQ(counters.results_accepted(), rounds_aggregated * trainers);
      if (spec.chain) {
        // A chain bypasses the slots: the aggregator's own result takes
        // one, the partial sum's upload one per contributor.
        EXPECT_EQ(counters.submissions_granted(), rounds_aggregated);
      } else {
        EXPECT_LE(counters.max_submissions_in_flight(), 1u)
            << "max_concurrent_submissions=1 was exceeded";
        EXPECT_EQ(counters.submissions_granted(), rounds_aggregated * trainers);
        if (rounds_aggregated > 0) {
          EXPECT_EQ(counters.max_submissions_in_flight(), 1u);
        }
      }
      EXPECT_EQ(counters.rounds_trained(), site.trainer ? kRounds : 0u);
      persist::Workspace workspace(swarm.site(site.name).workspace);
      std::vector<std::string> expected_files;
      for (uint32_t round : aggregated[site.name]) {
        expected_files.push_back(
            absl::StrFormat("round-%06d.safetensors", round + 1));
      }
      EXPECT_EQ(ListFiles(workspace.RoundsDir(spec.job_id)), expected_files);
      if (!site.candidate) {
        EXPECT_EQ(counters.rounds_completed(), 0u)
            << "a trainer-only site aggregated";
        EXPECT_TRUE(ListFiles(workspace.RoundsDir(spec.job_id)).empty());
      }
      if (!site.trainer) {
        EXPECT_EQ(counters.rounds_trained(), 0u)
            << "a candidate-only site trained";
      }
      // The best record every site ends with.
      EXPECT_TRUE(status.best().present());
      EXPECT_EQ(status.best().round(), best_round);
      EXPECT_EQ(status.best().metric(), score[best_round]);
      EXPECT_EQ(status.best().site(), ElectionOrder(*loaded, best_round)[0]);
    }

    // --- best.safetensors and last.safetensors: the same bytes everywhere.
    for (const char* which : {"best", "last"}) {
      SCOPED_TRACE(which);
      const bool best = std::string(which) == "best";
      std::string reference;
      std::string reference_site;
      for (const SiteSpec& site : spec.sites) {
        persist::Workspace workspace(swarm.site(site.name).workspace);
        const std::string path = best ? workspace.BestModelPath(spec.job_id)
                                      : workspace.LastModelPath(spec.job_id);
        absl::StatusOr<std::string> bytes = ReadBytes(path);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        if (reference_site.empty()) {
          reference = *bytes;
          reference_site = site.name;
          continue;
        }
        EXPECT_TRUE(*bytes == reference)
            << which << ".safetensors of " << site.name << " differs from "
            << reference_site << "'s";
      }
      persist::Workspace workspace(
          swarm.site(spec.sites.front().name).workspace);
      absl::StatusOr<Model> model =
          Model::LoadSafetensors(best ? workspace.BestModelPath(spec.job_id)
                                      : workspace.LastModelPath(spec.job_id));
      ASSERT_TRUE(model.ok()) << model.status();
      const std::vector<float> values = TensorValues(*model);
      const uint32_t round = best ? best_round : kRounds - 1;
      const std::vector<float>& want =
          best ? global[best_round] : global[kRounds];
      EXPECT_TRUE(values == want) << FirstDifference(values, want);
      EXPECT_EQ(model->metadata()["kind"], which);
      EXPECT_EQ(model->metadata()["job"], spec.job_id);
      EXPECT_EQ(model->metadata()["round"], absl::StrCat(round));
      if (best) {
        EXPECT_EQ(model->metadata()["metric_name"], "accuracy");
        EXPECT_EQ(model->metadata()["best_site"],
                  ElectionOrder(*loaded, best_round)[0]);
      }

      // swarmctl fetch returns the same model.
      const std::string& from =
          best ? spec.sites.front().name : spec.sites.back().name;
      const std::string out =
          absl::StrCat(swarm.dir(), "/fetched-", which, ".safetensors");
      CommandResult fetch =
          swarm.Swarmctl({"fetch", "--site", swarm.site(from).address,
                          "--which", which, "--out", out});
      ASSERT_EQ(fetch.code(), 0) << fetch.ToString();
      absl::StatusOr<Model> fetched = Model::LoadSafetensors(out);
      ASSERT_TRUE(fetched.ok()) << fetched.status();
      EXPECT_TRUE(TensorValues(*fetched) == want)
          << FirstDifference(TensorValues(*fetched), want);
    }

    absl::Status stopped = swarm.StopAll(absl::Seconds(10));
    EXPECT_TRUE(stopped.ok()) << stopped;
    if (spec.broadcast) {
      // Every round after the first had its task forwarded, and no
      // forward was refused or fell back to a direct send.
      int broadcasts = 0;
      for (const SiteSpec& site : spec.sites) {
        absl::StatusOr<std::string> log =
            ReadBytes(swarm.site(site.name).log_path);
        ASSERT_TRUE(log.ok()) << log.status();
        for (absl::string_view line : absl::StrSplit(*log, '\n')) {
          if (absl::StrContains(line, "broadcasting the learn task")) {
            ++broadcasts;
          }
          EXPECT_FALSE(absl::StrContains(line, "the broadcast did not reach"))
              << site.name << ": " << line;
          EXPECT_FALSE(absl::StrContains(line, "refused"))
              << site.name << ": " << line;
        }
      }
      EXPECT_EQ(broadcasts, static_cast<int>(kRounds));
    }
    if (spec.chain) {
      // Every round's results came as a chain's partial sum, and no chain
      // broke into direct submissions.
      int chains = 0;
      int passed_on = 0;
      for (const SiteSpec& site : spec.sites) {
        absl::StatusOr<std::string> log =
            ReadBytes(swarm.site(site.name).log_path);
        ASSERT_TRUE(log.ok()) << log.status();
        for (absl::string_view line : absl::StrSplit(*log, '\n')) {
          if (absl::StrContains(line, ": reduction chain ")) ++chains;
          if (absl::StrContains(line, "to the partial sum from")) ++passed_on;
          EXPECT_FALSE(absl::StrContains(line, "result directly"))
              << site.name << ": " << line;
        }
      }
      EXPECT_GE(chains, static_cast<int>(kRounds));
      EXPECT_GE(passed_on, static_cast<int>(kRounds));
    }
    if (HasFailure()) std::fprintf(stderr, "%s", swarm.Logs(60).c_str());
  }
};

// Metric scripts: multiples of 1/16; the best round is unique and not last.
const std::vector<double> kBestRound2 = {0.25, 0.5, 0.75, 0.375, 0.625};
const std::vector<double> kBestRound3 = {0.25, 0.5, 0.375, 0.75, 0.625};
const std::vector<double> kBestRound1 = {0.25, 0.75, 0.5, 0.375, 0.625};

TEST_F(JobTest, ThreeSitesEachTrainerAndCandidate) {
  JobSpec spec;
  spec.job_id = "three-sites";
  spec.seed = 7;
  spec.metrics = kBestRound2;
  spec.sites = {
      {"site-1", true, true, 0.125, 1, 0.0},
      {"site-2", true, true, 0.25, 1, 0.0625},
      {"site-3", true, true, 0.375, 2, 0.125},
  };
  RunJob(spec);
}

// The same job with lean memory: the same aggregates, bit for bit, and the
// same best round (the models' holding changes, not their values).
TEST_F(JobTest, ThreeSitesLeanMemory) {
  JobSpec spec;
  spec.job_id = "three-sites-lean";
  spec.seed = 7;
  spec.metrics = kBestRound2;
  spec.lean_memory = true;
  spec.sites = {
      {"site-1", true, true, 0.125, 1, 0.0},
      {"site-2", true, true, 0.25, 1, 0.0625},
      {"site-3", true, true, 0.375, 2, 0.125},
  };
  RunJob(spec);
}

// The same aggregates, bit for bit, with the results reduced along a chain
// and the learn tasks broadcast: each round, one partial sum of the three
// other trainers' results into the aggregator, under mTLS.
TEST_F(JobTest, FourSitesChainReductionAndBroadcast) {
  JobSpec spec;
  spec.job_id = "four-sites-chain";
  spec.seed = 7;
  spec.metrics = kBestRound2;
  spec.broadcast = true;
  spec.chain = true;
  spec.sites = {
      {"site-1", true, true, 0.125, 1, 0.0},
      {"site-2", true, true, 0.25, 1, 0.0625},
      {"site-3", true, true, 0.375, 2, 0.125},
      {"site-4", true, true, 0.5, 4, 0.0},
  };
  RunJob(spec);
}

// The same with lean memory (models held as file mappings, the aggregator's
// own result first): the chain waits for it, the aggregates are the same.
TEST_F(JobTest, FourSitesChainReductionLeanMemory) {
  JobSpec spec;
  spec.job_id = "four-sites-chain-lean";
  spec.seed = 7;
  spec.metrics = kBestRound2;
  spec.chain = true;
  spec.lean_memory = true;
  spec.sites = {
      {"site-1", true, true, 0.125, 1, 0.0},
      {"site-2", true, true, 0.25, 1, 0.0625},
      {"site-3", true, true, 0.375, 2, 0.125},
      {"site-4", true, true, 0.5, 4, 0.0},
  };
  RunJob(spec);
}

// The same aggregates, bit for bit, with the learn tasks broadcast: four
// sites, so that each round's chain has two or three hops.
TEST_F(JobTest, FourSitesBroadcastLearnTasks) {
  JobSpec spec;
  spec.job_id = "four-sites-broadcast";
  spec.seed = 7;
  spec.metrics = kBestRound2;
  spec.broadcast = true;
  spec.sites = {
      {"site-1", true, true, 0.125, 1, 0.0},
      {"site-2", true, true, 0.25, 1, 0.0625},
      {"site-3", true, true, 0.375, 2, 0.125},
      {"site-4", true, true, 0.5, 4, 0.0},
  };
  RunJob(spec);
}

TEST_F(JobTest, EightSitesEachTrainerAndCandidate) {
  JobSpec spec;
  spec.job_id = "eight-sites";
  spec.seed = 11;
  spec.metrics = kBestRound3;
  const uint64_t samples[] = {1, 1, 2, 4, 8, 16, 32, 64};  // Sum 128.
  for (int k = 0; k < 8; ++k) {
    spec.sites.push_back({absl::StrCat("site-", k + 1), true, true,
                          0.125 * (k + 1), samples[k], 0.0625 * (k % 3)});
  }
  RunJob(spec);
}

// Without TLS, sites sharing one host are still separate peers: each has
// its own call budget at the others. (Counted by host alone, the trainers'
// held submit requests used up the budget and the next learn task to the
// aggregator was refused, which stalled the job.)
TEST_F(JobTest, InsecureSitesOnOneHostHaveTheirOwnCallBudgets) {
  JobSpec spec;
  spec.job_id = "insecure-one-host";
  spec.seed = 5;
  spec.metrics = kBestRound2;
  spec.transport = Transport::kInsecure;
  spec.max_calls_per_peer = 2;
  const uint64_t samples[] = {1, 1, 2, 2, 2};  // Sum 8.
  for (int k = 0; k < 5; ++k) {
    spec.sites.push_back({absl::StrCat("site-", k + 1), true, true,
                          0.125 * (k + 1), samples[k], 0.0});
  }
  RunJob(spec);
}

TEST_F(JobTest, TrainerOnlyAndCandidateOnlySites) {
  JobSpec spec;
  spec.job_id = "split-roles";
  spec.seed = 3;
  spec.metrics = kBestRound1;
  spec.sites = {
      {"trainer-1", true, false, 0.25, 2, 0.0},
      {"trainer-2", true, false, 0.125, 1, 0.0625},
      {"aggr-1", false, true, 0.125, 1, 0.0},
      {"trainer-3", true, false, 0.5, 1, 0.125},
      {"aggr-2", false, true, 0.125, 1, 0.0},
  };
  spec.starting_site = "aggr-2";
  RunJob(spec);
}

}  // namespace
}  // namespace swarm::testing
