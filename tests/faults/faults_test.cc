// Fault tests on a real network (issue 11, item 7): four swarm-client
// daemons, each in its own network namespace behind a veth pair on a bridge
// (netns.h), run short jobs while the test breaks the network or the
// processes: random loss and a bandwidth cap on every link, a partition that
// heals, a cut link, SIGSTOP and SIGCONT, kill -9 and restart of a trainer,
// the round's aggregator killed, a site killed during the final distribution.
//
// Each case asserts that every site ends DONE with byte-identical
// best.safetensors and last.safetensors in its workspace, and prints how
// long the job took and every site's final state.
//
// The job: sites s1..s4, all trainers; s1, s2, s3 are the aggregator
// candidates, s4 is a bystander trainer (never aggregates); s1 starts. Short
// deadlines (round_timeout 20 s, grace 2 s) so a case takes well under a
// minute when the daemons recover as they should.
//
// Without root, or where namespaces or veth pairs cannot be made, every
// case skips and prints why.
#include <signal.h>
#include <stdlib.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "config/election.h"
#include "gtest/gtest.h"
#include "tests/faults/netns.h"
#include "tests/faults/netns_swarm.h"
#include "tests/integration/local_swarm.h"

namespace swarm::testing {
namespace {

// Enters the run's hub namespace before any test (and so before gRPC starts
// a thread), leaves and removes it after the last.
class NetnsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { NetnsLab::Get().Enter(); }
  void TearDown() override { NetnsLab::Get().Leave(); }
};
[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new NetnsEnvironment());

const std::vector<std::string> kSites = {"s1", "s2", "s3", "s4"};
constexpr char kBystander[] = "s4";

struct CaseOptions {
  uint32_t rounds = 3;
  uint64_t model_floats = 65536;  // 256 KiB.
  int train_ms = 2000;
  // Per-site train_ms ("train_ms.<site>").
  std::vector<std::pair<std::string, int>> site_train_ms;
};

bool InState(const Snapshot& snapshot, const std::string& site,
             const std::function<bool(const v1::SiteStatus&)>& predicate) {
  auto it = snapshot.find(site);
  return it != snapshot.end() && it->second.ok() && predicate(*it->second);
}

std::function<bool(const v1::SiteStatus&)> TrainingRound(uint32_t round) {
  return [round](const v1::SiteStatus& s) {
    return s.round() == round && s.state() == v1::SITE_STATE_TRAINING;
  };
}

// The site submitted its result of `round` (rounds are numbered from 0) and
// waits for the next learn task.
std::function<bool(const v1::SiteStatus&)> SubmittedRound(uint32_t round) {
  return [round](const v1::SiteStatus& s) {
    return s.round() == round && s.counters().rounds_trained() >= round + 1 &&
           s.state() != v1::SITE_STATE_TRAINING &&
           s.state() != v1::SITE_STATE_WAITING_FOR_PERMISSION &&
           s.state() != v1::SITE_STATE_SUBMITTING &&
           s.state() != v1::SITE_STATE_DONE;
  };
}

class NetFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string& why = NetnsLab::Get().unavailable();
    if (!why.empty()) {
      std::fprintf(stderr, "[ faults ] skipped: %s\n", why.c_str());
      GTEST_SKIP() << why;
    }
    static int tests = 0;
    const std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    swarm_ = std::make_unique<NetnsSwarm>(name, absl::StrCat("t", ++tests));
    absl::Status network = swarm_->CreateNetwork(kSites);
    ASSERT_TRUE(network.ok()) << network;
  }

  // The job every case runs, with `options`.
  void MakeJob(const CaseOptions& options) {
    job_ = swarm_->BaseJob(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    for (const char* candidate : {"s1", "s2", "s3"}) {
      job_.add_aggregator_candidates(candidate);
    }
    job_.set_starting_site("s1");
    job_.set_num_rounds(options.rounds);
    job_.set_seed(7);
    job_.set_wait_after_min_responses_ms(2000);
    job_.set_round_timeout_ms(20000);
    job_.set_learn_task_ack_timeout_ms(5000);
    job_.set_request_to_submit_interval_ms(500);
    job_.set_request_to_submit_max_wait_ms(30000);
    job_.set_request_to_submit_message_timeout_ms(5000);
    job_.set_final_result_ack_timeout_ms(30000);
    job_.set_chunk_size(65536);
    auto& params = *job_.mutable_learner_params();
    params["size"] = absl::StrCat(options.model_floats);
    params["init_scale"] = "0.03125";
    params["train_ms"] = absl::StrCat(options.train_ms);
    // Round 1's model is the best, so BEST differs from LAST.
    params["metrics"] = "0:0.5,1:0.75,2:0.625,3:0.5625";
    for (const auto& [site, ms] : options.site_train_ms) {
      params[absl::StrCat("train_ms.", site)] = absl::StrCat(ms);
    }
  }

  // Provisions, starts the daemons and the job.
  void Start() {
    absl::Status provisioned = swarm_->WriteJobAndProvision(job_);
    ASSERT_TRUE(provisioned.ok()) << provisioned;
    absl::Status started = swarm_->StartAll();
    ASSERT_TRUE(started.ok()) << started;
    start_time_ = absl::Now();
    CommandResult start =
        swarm_->Swarmctl({"start", "--job", swarm_->job_path()});
    ASSERT_EQ(start.code(), 0) << start.ToString() << swarm_->Logs();
  }

  // The aggregator every site elects for `round`.
  std::string Aggregator(uint32_t round) {
    return ElectionOrder(job_, round).front();
  }

  void WaitSite(const std::string& site,
                const std::function<bool(const v1::SiteStatus&)>& predicate,
                const std::string& what) {
    absl::Status waited = swarm_->WaitFor(
        job_.job_id(),
        [&](const Snapshot& s) { return InState(s, site, predicate); },
        absl::Now() + absl::Seconds(60) * TimeScale(), what);
    ASSERT_TRUE(waited.ok()) << waited << swarm_->Logs();
  }

  // Kill -9 `site`, restart it with the same config and workspace after
  // `down`.
  void KillAndRestart(const std::string& site, absl::Duration down) {
    Note(absl::StrCat("kill -9 ", site));
    swarm_->Kill(site);
    absl::SleepFor(down);
    absl::Status restarted = swarm_->StartSite(site);
    ASSERT_TRUE(restarted.ok()) << restarted;
    Note(absl::StrCat("restarted ", site));
  }

  void Note(const std::string& what) {
    std::fprintf(stderr, "[ faults ] +%.1fs %s\n",
                 absl::ToDoubleSeconds(absl::Now() - start_time_),
                 what.c_str());
  }

  // Waits for the job's end; asserts every site DONE with identical final
  // files. Prints the outcome either way.
  void ExpectJobCompletes() {
    JobOutcome outcome = swarm_->WaitJobEnd(
        job_.job_id(), absl::Now() + absl::Seconds(180) * TimeScale(),
        absl::Seconds(60) * TimeScale());
    const double total = absl::ToDoubleSeconds(absl::Now() - start_time_);
    std::fprintf(stderr, "[ faults ] %s: %s after %.1fs of job\n%s",
                 job_.job_id().c_str(),
                 outcome.all_done
                     ? "every site done"
                     : absl::StrCat("NOT done (", outcome.reason, ")").c_str(),
                 total, outcome.table.c_str());
    ASSERT_TRUE(outcome.all_done)
        << outcome.reason << "\n"
        << outcome.table << swarm_->net().Describe() << swarm_->Logs(40);
    absl::Status files = swarm_->CheckFinalFiles(job_.job_id());
    EXPECT_TRUE(files.ok()) << files;
  }

  std::unique_ptr<NetnsSwarm> swarm_;
  v1::JobConfig job_;
  absl::Time start_time_ = absl::Now();
};

// (a) 5% random loss into every site and a 10 Mbit/s cap on every link, for
// a whole 4-site, 3-round job with a 1 MiB model.
TEST_F(NetFaults, LossAndBandwidthCapOnEveryLink) {
  for (const std::string& site : kSites) {
    ASSERT_TRUE(swarm_->net().AddLoss(site, 5).ok());
    absl::Status capped = swarm_->net().CapBandwidth(site, "10mbit");
    ASSERT_TRUE(capped.ok()) << capped;
  }
  CaseOptions options;
  options.model_floats = 262144;  // 1 MiB: about 0.85 s per copy at 10 Mbit/s.
  options.train_ms = 500;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ExpectJobCompletes();
  for (const std::string& site : kSites) {
    absl::StatusOr<int64_t> drops = swarm_->net().LossDrops(site);
    ASSERT_TRUE(drops.ok()) << drops.status();
    std::fprintf(stderr,
                 "[ faults ] %s: %lld packets dropped by the loss rule\n",
                 site.c_str(), static_cast<long long>(*drops));
    EXPECT_GT(*drops, 0) << "the loss rule at " << site << " dropped nothing";
  }
}

// (b) The bystander trainer cut off from every other site for 20 s, from
// the moment it submitted round 1's result (it trains fast, so it then
// waits for round 2's learn task while the others still train); then the
// partition heals. The test's own address stays reachable.
TEST_F(NetFaults, PartitionIsolatingBystanderHeals) {
  CaseOptions options;
  options.rounds = 4;
  options.site_train_ms = {{kBystander, 200}};
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, SubmittedRound(1), "s4 to submit round 1"));
  ASSERT_TRUE(swarm_->net().Partition(kBystander, {"s1", "s2", "s3"}).ok());
  Note("partition: s4 | s1 s2 s3");
  absl::SleepFor(absl::Seconds(20));
  ASSERT_TRUE(swarm_->net().Heal(kBystander).ok());
  Note("healed");
  ExpectJobCompletes();
}

// (b3) The bystander's link cut (its veth end in the hub down) for 10 s
// once it submitted round 1's result, then up again.
TEST_F(NetFaults, BystanderLinkCutAndRestored) {
  CaseOptions options;
  options.rounds = 4;
  options.site_train_ms = {{kBystander, 200}};
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, SubmittedRound(1), "s4 to submit round 1"));
  ASSERT_TRUE(swarm_->net().SetLink(kBystander, false).ok());
  Note("s4's link down");
  absl::SleepFor(absl::Seconds(10));
  ASSERT_TRUE(swarm_->net().SetLink(kBystander, true).ok());
  Note("s4's link up");
  ExpectJobCompletes();
}

// (b2) The same partition, but the other sites must not be held back by
// it: the round after the partition began is scattered without s4 (its
// learn task is not acknowledged within learn_task_ack_timeout, 5 s) and
// closes without it, so some site reaches round 3 within 15 s of the
// partition, well before it heals.
TEST_F(NetFaults, PartitionDoesNotHoldOthersBack) {
  CaseOptions options;
  options.rounds = 4;
  options.site_train_ms = {{kBystander, 200}};
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, SubmittedRound(1), "s4 to submit round 1"));
  ASSERT_TRUE(swarm_->net().Partition(kBystander, {"s1", "s2", "s3"}).ok());
  Note("partition: s4 | s1 s2 s3");
  const absl::Time partitioned = absl::Now();
  absl::Status progressed = swarm_->WaitFor(
      job_.job_id(),
      [](const Snapshot& snapshot) {
        for (const char* site : {"s1", "s2", "s3"}) {
          if (InState(snapshot, site, [](const v1::SiteStatus& s) {
                return s.round() >= 3 || s.state() == v1::SITE_STATE_DONE;
              })) {
            return true;
          }
        }
        return false;
      },
      partitioned + absl::Seconds(15) * TimeScale(),
      "s1-s3 to reach round 3 while s4 is cut off");
  Note(progressed.ok() ? "s1-s3 reached round 3" : "s1-s3 held back");
  EXPECT_TRUE(progressed.ok()) << progressed;
  absl::SleepFor(partitioned + absl::Seconds(20) - absl::Now());
  ASSERT_TRUE(swarm_->net().Heal(kBystander).ok());
  Note("healed");
  ExpectJobCompletes();
}

// (c) The bystander trainer killed -9 while it trains round 1, restarted
// with the same config and workspace 5 s later: it must rejoin.
TEST_F(NetFaults, KilledTrainerRestartsAndRejoins) {
  CaseOptions options;
  options.train_ms = 4000;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(1), "s4 training round 1"));
  absl::SleepFor(absl::Seconds(1));
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(kBystander, absl::Seconds(5)));
  ExpectJobCompletes();
}

// (d) The bystander trainer frozen (SIGSTOP) while it trains round 1, for
// 25 s (beyond round_timeout, 20 s), then SIGCONT.
TEST_F(NetFaults, FrozenTrainerBeyondRoundTimeout) {
  CaseOptions options;
  options.train_ms = 3000;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(1), "s4 training round 1"));
  ASSERT_TRUE(swarm_->Signal(kBystander, SIGSTOP).ok());
  Note("SIGSTOP s4");
  absl::SleepFor(absl::Seconds(25));
  ASSERT_TRUE(swarm_->Signal(kBystander, SIGCONT).ok());
  Note("SIGCONT s4");
  ExpectJobCompletes();
}

// (e1) Round 1's aggregator killed -9 while the trainers train round 1; it
// comes back 5 s later as an ordinary site.
TEST_F(NetFaults, AggregatorKilledWhileTrainersTrain) {
  CaseOptions options;
  options.train_ms = 4000;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string aggregator = Aggregator(1);
  Note(absl::StrCat("round 1 aggregator: ", aggregator, "; order ",
                    absl::StrJoin(ElectionOrder(job_, 1), ",")));
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(1), "s4 training round 1"));
  absl::SleepFor(absl::Seconds(1));
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(aggregator, absl::Seconds(5)));
  ExpectJobCompletes();
}

// (e2) Round 1's aggregator killed -9 while gathering: after the fast
// bystander's result reached it, before the slow trainers' did. It comes
// back 5 s later as an ordinary site.
TEST_F(NetFaults, AggregatorKilledWhileGathering) {
  CaseOptions options;
  options.train_ms = 5000;
  options.site_train_ms = {{kBystander, 200}};
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string aggregator = Aggregator(1);
  Note(absl::StrCat("round 1 aggregator: ", aggregator));
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, SubmittedRound(1), "s4 to submit round 1"));
  absl::StatusOr<v1::SiteStatus> gathering =
      swarm_->Status(aggregator, job_.job_id(), absl::Seconds(2));
  if (gathering.ok()) {
    Note(absl::StrCat("aggregator ", aggregator,
                      " before the kill: ", gathering->ShortDebugString()));
  }
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(aggregator, absl::Seconds(5)));
  ExpectJobCompletes();
}

// (f) The bystander killed -9 during the final distribution, restarted 5 s
// later: it must end with both files. It trains slowest, so the last round
// closes the moment its result arrives and the aggregator sends LAST (then
// BEST) at once; with its link capped at 10 Mbit/s and a 2 MiB model, each
// copy to it takes about 1.7 s. It is killed as soon as it has submitted its
// last result (or the aggregator is seen distributing), before its
// last.safetensors exists.
TEST_F(NetFaults, SiteKilledDuringFinalDistribution) {
  absl::Status capped = swarm_->net().CapBandwidth(kBystander, "10mbit");
  ASSERT_TRUE(capped.ok()) << capped;
  CaseOptions options;
  options.model_floats = 524288;
  options.train_ms = 500;
  options.site_train_ms = {{kBystander, 1500}};
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint32_t last = job_.num_rounds() - 1;
  const std::string aggregator = Aggregator(last);
  Note(absl::StrCat("last round's aggregator: ", aggregator));
  const auto submitted_last = SubmittedRound(last);
  absl::Status waited = swarm_->WaitFor(
      job_.job_id(),
      [&](const Snapshot& snapshot) {
        return InState(snapshot, kBystander, submitted_last) ||
               InState(snapshot, aggregator, [&](const v1::SiteStatus& s) {
                 return s.round() == last &&
                        s.state() == v1::SITE_STATE_DISTRIBUTING;
               });
      },
      absl::Now() + absl::Seconds(90) * TimeScale(),
      "s4 to submit the last round or the aggregator to distribute");
  ASSERT_TRUE(waited.ok()) << waited << swarm_->Logs();
  const std::string last_file = absl::StrCat(
      swarm_->Workspace(kBystander), "/", job_.job_id(), "/last.safetensors");
  swarm_->Kill(kBystander);
  Note("kill -9 s4");
  ASSERT_FALSE(FileExists(last_file))
      << "missed the window: s4 already had its LAST when killed";
  absl::SleepFor(absl::Seconds(5));
  absl::Status restarted = swarm_->StartSite(kBystander);
  ASSERT_TRUE(restarted.ok()) << restarted;
  Note("restarted s4");
  ExpectJobCompletes();
}

}  // namespace
// All four sites killed -9 while round 2 trains (a power cut), restarted
// with their configs and workspaces: each reloads the job. A resume with a
// different config is refused, naming the difference; `swarmctl resume`
// with the job's own config continues from the latest persisted global
// model (round 2's, at round 1's aggregator), losing at most round 2.
TEST_F(NetFaults, AllSitesKilledThenResumed) {
  CaseOptions options;
  options.rounds = 4;
  options.train_ms = 3000;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(2), "s4 training round 2"));
  for (const std::string& site : kSites) swarm_->Kill(site);
  Note("kill -9 every site");
  for (const std::string& site : kSites) {
    absl::Status restarted = swarm_->StartSite(site);
    ASSERT_TRUE(restarted.ok()) << restarted;
  }
  Note("restarted every site");
  for (const std::string& site : kSites) {
    ASSERT_NO_FATAL_FAILURE(WaitSite(
        site,
        [&](const v1::SiteStatus& status) {
          return status.rejoined() && status.job_id() == job_.job_id();
        },
        site + " reloaded its job"));
  }
  v1::JobConfig other = job_;
  other.set_num_rounds(options.rounds + 1);
  absl::StatusOr<std::string> other_path =
      swarm_->WriteJobFile(other, "other-job.json");
  ASSERT_TRUE(other_path.ok()) << other_path.status();
  CommandResult refused = swarm_->Swarmctl({"resume", "--job", *other_path});
  EXPECT_EQ(refused.code(), 1) << refused.ToString();
  EXPECT_NE(refused.ToString().find("num_rounds"), std::string::npos)
      << refused.ToString();
  CommandResult resumed =
      swarm_->Swarmctl({"resume", "--job", swarm_->job_path()});
  ASSERT_EQ(resumed.code(), 0) << resumed.ToString() << swarm_->Logs();
  EXPECT_NE(resumed.ToString().find("resumed at round 2"), std::string::npos)
      << resumed.ToString();
  Note("swarmctl resume");
  ExpectJobCompletes();
}

}  // namespace swarm::testing
