// Fault tests on a real network (issue 11, item 7): four swarm-client
// daemons, each in its own network namespace behind a veth pair on a bridge
// (netns.h), run short jobs while the test breaks the network, the
// processes or the disks: random loss and a bandwidth cap on every link,
// partitions that heal (of a bystander, of the aggregator from half the
// trainers, and cuts that leave the gathering aggregator only a bridge to
// the others, so that two chains form: issue 30), a cut link, SIGSTOP and
// SIGCONT, kill -9 and restart of a trainer, of the starting site right
// after `swarmctl start`, of an aggregator at each point of its round
// (before its task arrives, while the trainers train, while gathering,
// between aggregation and scatter), a site killed during the final
// distribution, all sites killed and resumed, and a full disk (a small
// tmpfs workspace) at a trainer and at an aggregator that offloads results
// to disk.
//
// Each case asserts that every site ends DONE (or, where the case says so,
// down or FAILED with the path named) with byte-identical best.safetensors
// and last.safetensors on every finishing site; that no .safetensors file in
// any workspace is torn; and that no result is lost (CheckRounds: each
// round's kept aggregate names its trainers through their sample counts).
// It prints how long the job took, every site's final state and failovers,
// each round's contributors and, for kills, the time from the kill to the
// round completing without the killed site.
//
// The job: sites s1..s4, all trainers; s1, s2, s3 are the aggregator
// candidates, s4 is a bystander trainer (never aggregates); s1 starts. Short
// deadlines (round_timeout 20 s, grace 2 s) so a case takes well under a
// minute when the daemons recover as they should.
//
// Without root, or where namespaces or veth pairs cannot be made, every
// case skips and prints why.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "config/election.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "tests/faults/netns_swarm.h"
#include "tests/integration/local_swarm.h"
#include "tests/support/netns.h"

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
  // Aggregators keep every round's global model, for CheckRounds.
  bool keep_round_models = true;
  // broadcast_learn_tasks.
  bool broadcast = false;
  // reduce_results_in_chain.
  bool chain = false;
  // server_optimizer (its defaults: momentum lr 1, beta1 0.5).
  v1::ServerOptimizer server_optimizer = v1::SERVER_OPTIMIZER_NONE;
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
    // Results lost: each site reports 2^i samples (s1 1, s2 2, s3 4, s4 8),
    // so a round's aggregate's total_samples (FedAvg metadata) names the
    // trainers whose results it holds; every aggregator keeps its rounds'
    // global models (rounds/round-NNNNNN.safetensors) for CheckRounds. The
    // test learner's results all add the same delta, so the models do not
    // depend on the weights.
    job_.set_keep_round_models(options.keep_round_models);
    job_.set_broadcast_learn_tasks(options.broadcast);
    job_.set_reduce_results_in_chain(options.chain);
    job_.set_server_optimizer(options.server_optimizer);
    for (size_t i = 0; i < kSites.size(); ++i) {
      params[absl::StrCat("sample_count.", kSites[i])] =
          absl::StrCat(uint64_t{1} << i);
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
  // With `watch`, also notes the time from the kill until some other site
  // is past round `watch` (the round completed: at a backup aggregator, or
  // at the killed site once it is back).
  void KillAndRestart(const std::string& site, absl::Duration down,
                      std::optional<uint32_t> watch = std::nullopt) {
    Note(absl::StrCat("kill -9 ", site));
    swarm_->Kill(site);
    const absl::Time killed = absl::Now();
    const std::string what =
        watch.has_value()
            ? absl::StrCat("kill of ", site, " to round ", *watch, " completed")
            : "";
    bool seen = false;
    if (watch.has_value() &&
        PastRound(*watch, Others({site}), /*all=*/false, killed + down, what)
            .ok()) {
      seen = true;
      Note(absl::StrCat(what, ": ",
                        absl::FormatDuration(absl::Trunc(
                            absl::Now() - killed, absl::Milliseconds(100)))));
    }
    absl::SleepFor(killed + down - absl::Now());
    absl::Status restarted = swarm_->StartSite(site);
    ASSERT_TRUE(restarted.ok()) << restarted;
    Note(absl::StrCat("restarted ", site));
    if (watch.has_value() && !seen) {
      WaitPastRound(*watch, Others({site}), /*all=*/false, what, killed);
    }
  }

  void Note(const std::string& what) {
    std::fprintf(stderr, "[ faults ] +%.1fs %s\n",
                 absl::ToDoubleSeconds(absl::Now() - start_time_),
                 what.c_str());
  }

  // What a case expects of the job's end besides completion.
  struct Expect {
    // Sites that may end down (killed, not restarted) or in any terminal
    // state; they are not required to hold the final files.
    std::set<std::string> lost;
    // Sites that must end FAILED with `failed_text` in their last error or
    // end reason (also not required to hold the final files).
    std::set<std::string> failed;
    std::string failed_text;
    // Sites whose results some rounds may lawfully lack (cut off, frozen,
    // killed): left out of the "in every round's aggregate" check. Lost and
    // failed sites are left out too.
    std::set<std::string> unsteady;
    // Sites whose daemon restarted (their counters start again): left out of
    // the accepted-versus-aggregated check.
    std::set<std::string> restarted;
  };

  // Waits for the job's end; asserts every site DONE (but those `expect`
  // allows to be lost or requires to fail) with identical final files, no
  // torn model file in any workspace, and no result lost (CheckRounds).
  // Prints the outcome, every site's failovers and the rounds' contributors
  // either way.
  // Starts the job and returns (in *aggregator) round 1's aggregator once
  // the trainers have trained round 1 for a second (the (e1) kill point).
  void StartUntilTrainersTrainRoundOne(std::string* aggregator) {
    ASSERT_NO_FATAL_FAILURE(Start());
    *aggregator = Aggregator(1);
    Note(absl::StrCat("round 1 aggregator: ", *aggregator, "; order ",
                      absl::StrJoin(ElectionOrder(job_, 1), ",")));
    ASSERT_NO_FATAL_FAILURE(
        WaitSite(kBystander, TrainingRound(1), "s4 training round 1"));
    absl::SleepFor(absl::Seconds(1));
  }

  void ExpectJobCompletes(const Expect& expect = {}) {
    // No status change for 45 s means stuck: the longest quiet wait in
    // these jobs is a final distribution retrying a dead site (30 s). After
    // an earlier failure of the case, 30 s is enough to show where it is.
    JobOutcome outcome = swarm_->WaitJobEnd(
        job_.job_id(), absl::Now() + absl::Seconds(180) * TimeScale(),
        absl::Seconds(HasFailure() ? 30 : 45) * TimeScale());
    const double total = absl::ToDoubleSeconds(absl::Now() - start_time_);
    const Snapshot last = swarm_->Poll(job_.job_id());
    std::vector<std::string> finishing;
    std::string problem;
    for (const std::string& site : kSites) {
      const auto& status = last.at(site);
      if (expect.failed.count(site) > 0) {
        if (!status.ok() || status->state() != v1::SITE_STATE_FAILED) {
          absl::StrAppend(&problem, site, " did not end failed; ");
        } else if (!absl::StrContains(status->last_error(),
                                      expect.failed_text) &&
                   !absl::StrContains(status->end_reason(),
                                      expect.failed_text)) {
          absl::StrAppend(&problem, site, "'s error does not name \"",
                          expect.failed_text, "\"; ");
        }
        continue;
      }
      if (expect.lost.count(site) > 0) continue;
      finishing.push_back(site);
      if (!status.ok() || status->state() != v1::SITE_STATE_DONE) {
        absl::StrAppend(&problem, site, " is not done; ");
      }
    }
    const bool complete = problem.empty() && outcome.reason != "deadline";
    std::fprintf(
        stderr, "[ faults ] %s: %s after %.1fs of job\n%s",
        job_.job_id().c_str(),
        complete
            ? (outcome.all_done ? "every site done"
                                : "every finishing site done")
            : absl::StrCat("NOT done (", problem, outcome.reason, ")").c_str(),
        total, NetnsSwarm::Table(last).c_str());
    for (const auto& [site, status] : last) {
      if (!status.ok()) continue;
      for (const v1::Failover& f : status->failovers()) {
        std::fprintf(stderr,
                     "[ faults ]   %s: failover round %u %s -> %s (%s)\n",
                     site.c_str(), f.round(), f.from().c_str(), f.to().c_str(),
                     f.reason().c_str());
      }
      if (!status->end_reason().empty()) {
        std::fprintf(stderr, "[ faults ]   %s: end reason: %s\n", site.c_str(),
                     status->end_reason().c_str());
      }
    }
    absl::Status torn = CheckNoTornFiles();
    EXPECT_TRUE(torn.ok()) << torn;
    ASSERT_TRUE(complete) << problem << outcome.reason << "\n"
                          << NetnsSwarm::Table(last) << swarm_->net().Describe()
                          << swarm_->Logs(40);
    absl::Status files = swarm_->CheckFinalFiles(job_.job_id(), finishing);
    EXPECT_TRUE(files.ok()) << files;
    CheckRounds(expect, last);
  }

  // Every .safetensors file in every workspace (temporary files aside)
  // parses as a model.
  absl::Status CheckNoTornFiles() {
    int files = 0;
    for (const std::string& site : kSites) {
      std::error_code error;
      for (auto it = std::filesystem::recursive_directory_iterator(
               swarm_->Workspace(site), error);
           !error && it != std::filesystem::recursive_directory_iterator();
           it.increment(error)) {
        const std::string path = it->path().string();
        if (!it->is_regular_file() || !absl::EndsWith(path, ".safetensors")) {
          continue;
        }
        ++files;
        absl::StatusOr<Model> model = Model::LoadSafetensors(path);
        if (!model.ok()) {
          return absl::DataLossError(absl::StrCat(
              "torn model file ", path, ": ", model.status().message()));
        }
      }
    }
    std::fprintf(stderr, "[ faults ] %d model files, none torn\n", files);
    return absl::OkStatus();
  }

  // Results lost (issue 11: target 0). Reads every kept round model
  // (rounds/round-NNNNNN.safetensors is the aggregate of round NNNNNN-1) in
  // every workspace, and checks:
  // - each aggregate counts each of its results once (num_results is the
  //   number of trainers its total_samples names);
  // - every round has an aggregate; the winning one (the lowest attempt,
  //   design section 6) holds the result of every steady trainer (not
  //   lost, failed or unsteady);
  // - at every site that ran throughout, every result it accepted is in one
  //   of the aggregates it kept (results_accepted equals the sum of their
  //   num_results).
  void CheckRounds(const Expect& expect, const Snapshot& last) {
    if (!job_.keep_round_models()) return;
    struct Aggregate {
      std::string site;
      uint32_t attempt = 0;
      uint64_t mask = 0;
      uint64_t results = 0;
    };
    std::map<uint32_t, std::vector<Aggregate>> rounds;
    std::map<std::string, uint64_t> aggregated;  // Results, per site.
    for (const std::string& site : kSites) {
      const std::string dir =
          absl::StrCat(swarm_->Workspace(site), "/", job_.job_id(), "/rounds");
      for (const std::string& file : ListFiles(dir)) {
        absl::string_view name = file;
        uint32_t number = 0;
        if (!absl::ConsumePrefix(&name, "round-") ||
            !absl::ConsumeSuffix(&name, ".safetensors") ||
            !absl::SimpleAtoi(name, &number) || number == 0) {
          continue;
        }
        absl::StatusOr<Model> model =
            Model::LoadSafetensors(absl::StrCat(dir, "/", file));
        if (!model.ok()) continue;  // CheckNoTornFiles reports it.
        const auto& metadata = model->metadata();
        Aggregate a;
        a.site = site;
        auto get = [&](const char* key, auto* out) {
          auto it = metadata.find(key);
          return it != metadata.end() && absl::SimpleAtoi(it->second, out);
        };
        get("attempt", &a.attempt);
        EXPECT_TRUE(get("total_samples", &a.mask) &&
                    get("num_results", &a.results))
            << site << "'s " << file << " lacks total_samples or num_results";
        EXPECT_EQ(a.results,
                  static_cast<uint64_t>(__builtin_popcountll(a.mask)))
            << site << "'s " << file << ": " << a.results
            << " results but total_samples " << a.mask;
        EXPECT_LT(a.mask, uint64_t{1} << kSites.size())
            << site << "'s " << file;
        aggregated[site] += a.results;
        rounds[number - 1].push_back(a);
      }
    }
    auto names = [](uint64_t mask) {
      std::vector<std::string> out;
      for (size_t i = 0; i < kSites.size(); ++i) {
        if (mask & (uint64_t{1} << i)) out.push_back(kSites[i]);
      }
      return absl::StrJoin(out, " ");
    };
    uint64_t steady = 0;
    for (size_t i = 0; i < kSites.size(); ++i) {
      const std::string& site = kSites[i];
      if (expect.lost.count(site) == 0 && expect.failed.count(site) == 0 &&
          expect.unsteady.count(site) == 0) {
        steady |= uint64_t{1} << i;
      }
    }
    uint64_t missing = 0;
    for (uint32_t round = 0; round < job_.num_rounds(); ++round) {
      auto it = rounds.find(round);
      if (it == rounds.end()) {
        ADD_FAILURE() << "no site kept an aggregate of round " << round;
        continue;
      }
      const Aggregate* winner = nullptr;
      for (const Aggregate& a : it->second) {
        std::fprintf(stderr,
                     "[ faults ] round %u: aggregate at %s (attempt %u): %s\n",
                     round, a.site.c_str(), a.attempt, names(a.mask).c_str());
        if (winner == nullptr || a.attempt < winner->attempt) winner = &a;
      }
      const uint64_t lacking = steady & ~winner->mask;
      missing += __builtin_popcountll(lacking);
      EXPECT_EQ(lacking, 0u) << "round " << round << "'s aggregate at "
                             << winner->site << " (attempt " << winner->attempt
                             << ") lacks the result of " << names(lacking);
    }
    for (const std::string& site : kSites) {
      const auto& status = last.at(site);
      if (!status.ok() || expect.lost.count(site) > 0 ||
          expect.failed.count(site) > 0 || expect.restarted.count(site) > 0) {
        continue;
      }
      const uint64_t accepted = status->counters().results_accepted();
      std::fprintf(stderr,
                   "[ faults ] %s: %llu results accepted, %llu in its "
                   "aggregates, %llu rejected, %llu trainers dropped\n",
                   site.c_str(), static_cast<unsigned long long>(accepted),
                   static_cast<unsigned long long>(aggregated[site]),
                   static_cast<unsigned long long>(
                       status->counters().results_rejected()),
                   static_cast<unsigned long long>(
                       status->counters().trainers_dropped()));
      // A site that took a round over on a chain that then lost (a
      // partition) accepted results no kept aggregate of its own holds:
      // those results were submitted to it only, and the winning chain's
      // aggregator reported their senders missing (checked above).
      const bool took_over = status->counters().rounds_taken_over() > 0 ||
                             status->counters().discarded_aggregates() > 0;
      if (took_over) {
        EXPECT_GE(accepted, aggregated[site]) << site;
      } else {
        EXPECT_EQ(accepted, aggregated[site])
            << site << " accepted " << accepted << " results but its kept "
            << "aggregates hold " << aggregated[site];
      }
    }
    std::fprintf(stderr, "[ faults ] results lost (steady trainers): %llu\n",
                 static_cast<unsigned long long>(missing));
  }

  // Polls until some site of `sites` shows a round above `round` (it has
  // the next round's learn task) or is done; with `all`, until every one
  // does. Returns the time waited (or fails the test).
  // Polls until some site of `sites` shows a round above `round` (it has
  // the next round's learn task) or is done; with `all`, until every one
  // does; DeadlineExceeded at `deadline`.
  absl::Status PastRound(uint32_t round, const std::vector<std::string>& sites,
                         bool all, absl::Time deadline,
                         const std::string& what) {
    auto past = [round](const v1::SiteStatus& s) {
      return s.round() > round || s.state() == v1::SITE_STATE_DONE;
    };
    return swarm_->WaitFor(
        job_.job_id(),
        [&](const Snapshot& snapshot) {
          int n = 0;
          for (const std::string& site : sites) {
            n += InState(snapshot, site, past) ? 1 : 0;
          }
          return all ? n == static_cast<int>(sites.size()) : n > 0;
        },
        deadline, what);
  }

  // PastRound with a 60 s deadline (a failure otherwise); notes and returns
  // the time since `from` (default: now).
  absl::Duration WaitPastRound(uint32_t round,
                               const std::vector<std::string>& sites, bool all,
                               const std::string& what,
                               absl::Time from = absl::InfinitePast()) {
    if (from == absl::InfinitePast()) from = absl::Now();
    absl::Status waited = PastRound(
        round, sites, all, absl::Now() + absl::Seconds(60) * TimeScale(), what);
    EXPECT_TRUE(waited.ok()) << waited << swarm_->Logs();
    const absl::Duration took = absl::Now() - from;
    Note(absl::StrCat(
        what, waited.ok() ? "" : " (NOT reached)", ": ",
        absl::FormatDuration(absl::Trunc(took, absl::Milliseconds(100)))));
    return took;
  }

  std::vector<std::string> Others(const std::set<std::string>& but) {
    std::vector<std::string> out;
    for (const std::string& site : kSites) {
      if (but.count(site) == 0) out.push_back(site);
    }
    return out;
  }

  // A tmpfs of `size` (e.g. "2m") mounted as `site`'s workspace, before the
  // site starts. TearDown unmounts it whatever happened (keeping a copy of
  // its files beside it when the case failed or SWARM_FAULTS_KEEP is set).
  void SmallDiskWorkspace(const std::string& site, const std::string& size) {
    const std::string dir = swarm_->Workspace(site);
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    absl::Status mounted = RunTool({"/bin/mount", "-t", "tmpfs", "-o",
                                    absl::StrCat("size=", size), "tmpfs", dir});
    ASSERT_TRUE(mounted.ok()) << mounted;
    mounts_.push_back(dir);
    Note(absl::StrCat(site, "'s workspace: a ", size, " tmpfs at ", dir));
  }

  // Fills the filesystem of `site`'s workspace to the last byte: writes
  // <workspace>/fill.bin until the kernel says it is full.
  void FillDisk(const std::string& site) {
    const std::string path = swarm_->Workspace(site) + "/fill.bin";
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
    const std::string block(4096, '\0');
    int64_t written = 0;
    int error = 0;
    for (;;) {
      const ssize_t n = write(fd, block.data(), block.size());
      if (n <= 0) {
        error = errno;
        break;
      }
      written += n;
    }
    close(fd);
    EXPECT_EQ(error, ENOSPC) << path << ": " << strerror(error);
    Note(absl::StrCat(site, "'s disk filled (", written / 1024, " KiB more)"));
  }

  void TearDown() override {
    if (mounts_.empty() || swarm_ == nullptr) return;
    for (const std::string& site : kSites) swarm_->Kill(site);
    const bool keep = HasFailure() || getenv("SWARM_FAULTS_KEEP") != nullptr;
    for (const std::string& dir : mounts_) {
      if (keep) RunTool({"/bin/cp", "-a", dir, dir + ".saved"}).IgnoreError();
      absl::Status unmounted = RunTool({"/bin/umount", dir});
      if (!unmounted.ok()) {
        RunTool({"/bin/umount", "-l", dir}).IgnoreError();
        ADD_FAILURE() << "unmounting " << dir << ": " << unmounted;
      }
    }
    mounts_.clear();
  }

  std::vector<std::string> mounts_;
  // The job of the "before its task arrives" cases (4 rounds, 3 s of
  // training) with a seed that elects different aggregators for rounds 1
  // and 2, started; returns once round 1 trains, with round 2's aggregator
  // in `victim`.
  void StartUntilRoundOneTrains(std::string* victim) {
    CaseOptions options;
    options.rounds = 4;
    options.train_ms = 3000;
    MakeJob(options);
    while (Aggregator(1) == Aggregator(2)) job_.set_seed(job_.seed() + 1);
    *victim = Aggregator(2);
    ASSERT_NO_FATAL_FAILURE(Start());
    Note(absl::StrCat("seed ", job_.seed(), "; round 1 aggregator ",
                      Aggregator(1), "; round 2 order ",
                      absl::StrJoin(ElectionOrder(job_, 2), ",")));
    ASSERT_NO_FATAL_FAILURE(
        WaitSite(kBystander, TrainingRound(1), "s4 training round 1"));
  }

  // A cut that leaves a bridge (issue 30): round `round`'s aggregator
  // reaches only `bridge`, and the two other sites (`cut`) reach the bridge
  // and each other but not the aggregator; the bridge reaches everyone.
  struct BridgeCut {
    uint32_t round = 0;
    std::string aggregator;
    std::string bridge;
    std::vector<std::string> cut;
  };

  // The job of the bridge cases, with issue 30's deadlines: 10 rounds,
  // failover timeout 5 s, round timeout 60 s. The seed is picked so that
  // round `round`'s aggregator aggregates no earlier round: its
  // results_accepted then counts round `round`'s results only. The
  // aggregator and the bridge train 1 s, the two others 5 s, so that the
  // aggregator holds its own and the bridge's result for about 4 s before
  // the others' come. The bridge is the bystander (`bystander_bridge`) or
  // the last of the round's election order: either way the round's first
  // backup is on the cut side, where it takes the round over.
  BridgeCut MakeBridgeJob(uint32_t round, bool bystander_bridge) {
    CaseOptions options;
    options.rounds = 10;
    MakeJob(options);
    job_.set_failover_timeout_ms(5000);
    job_.set_round_timeout_ms(60000);
    auto aggregated_before = [&] {
      for (uint32_t earlier = 0; earlier < round; ++earlier) {
        if (Aggregator(earlier) == Aggregator(round)) return true;
      }
      return false;
    };
    while (aggregated_before()) job_.set_seed(job_.seed() + 1);
    const std::vector<std::string> order = ElectionOrder(job_, round);
    BridgeCut sides;
    sides.round = round;
    sides.aggregator = order[0];
    sides.bridge = bystander_bridge ? kBystander : order[2];
    auto& params = *job_.mutable_learner_params();
    for (const std::string& site : kSites) {
      const bool fast = site == sides.aggregator || site == sides.bridge;
      if (!fast) sides.cut.push_back(site);
      params[absl::StrCat("train_ms.", site)] = fast ? "1000" : "5000";
    }
    return sides;
  }

  // Starts the job; once round `sides.round`'s aggregator gathers and
  // holds exactly its own result and the bridge's (the cut sites still
  // train), cuts it from `sides.cut` for `length`, then heals.
  void CutWithABridge(const BridgeCut& sides, absl::Duration length) {
    const uint32_t r = sides.round;
    ASSERT_NO_FATAL_FAILURE(Start());
    std::vector<std::string> earlier;
    for (uint32_t round = 0; round < r; ++round) {
      earlier.push_back(Aggregator(round));
    }
    Note(absl::StrCat("seed ", job_.seed(), "; round ", r, " order ",
                      absl::StrJoin(ElectionOrder(job_, r), ","),
                      "; aggregators of rounds 0-", r - 1, ": ",
                      absl::StrJoin(earlier, ",")));
    Snapshot at_cut;
    absl::Status waited = swarm_->WaitFor(
        job_.job_id(),
        [&](const Snapshot& snapshot) {
          at_cut = snapshot;
          return InState(
              snapshot, sides.aggregator, [r](const v1::SiteStatus& s) {
                return s.round() > r || s.state() == v1::SITE_STATE_DONE ||
                       s.counters().results_accepted() >= 2;
              });
        },
        absl::Now() + absl::Seconds(60 + 10 * r) * TimeScale(),
        absl::StrCat(sides.aggregator, " to hold two results of round ", r));
    ASSERT_TRUE(waited.ok()) << waited << swarm_->Logs();
    absl::Status partitioned =
        swarm_->net().Partition(sides.aggregator, sides.cut);
    ASSERT_TRUE(partitioned.ok()) << partitioned;
    const absl::Time cut_at = absl::Now();
    Note(absl::StrCat("cut: ", sides.aggregator, " (round ", r,
                      "'s aggregator) reaches only ", sides.bridge,
                      " (the bridge) | ", absl::StrJoin(sides.cut, " "),
                      "; for ", absl::FormatDuration(length)));
    const v1::SiteStatus& gathering = *at_cut.at(sides.aggregator);
    Note(absl::StrCat(sides.aggregator,
                      " at the cut: ", gathering.ShortDebugString()));
    ASSERT_TRUE(gathering.round() == r &&
                gathering.counters().results_accepted() == 2)
        << "missed the window: " << sides.aggregator
        << " was not holding exactly two results of round " << r << "\n"
        << NetnsSwarm::Table(at_cut);
    for (const std::string& site : sides.cut) {
      ASSERT_TRUE(InState(at_cut, site,
                          [r](const v1::SiteStatus& s) {
                            return s.counters().rounds_trained() <= r;
                          }))
          << "missed the window: " << site << " had trained round " << r << "\n"
          << NetnsSwarm::Table(at_cut);
    }
    absl::SleepFor(cut_at + length - absl::Now());
    ASSERT_TRUE(swarm_->net().Heal(sides.aggregator).ok());
    Note("healed");
  }

  // After a cut with a bridge: every site must end done (none failed for
  // being on the losing chain) with identical BEST and LAST, no result
  // lost from the winning chain but those the cut lawfully kept out, no
  // two sites holding different models under one kept round's name; and
  // the cut must have split the job in two chains (a cut-off site failed
  // the round over). Prints how often each site switched chains and what
  // it set aside.
  // With `bridge_steady`, the bridge's result must be in every round's
  // winning aggregate.
  void ExpectBridgeCutEnds(const BridgeCut& sides, bool bridge_steady) {
    // The aggregator misses the cut sites' results and they its; the
    // aggregator may also miss the round after the heal if its calls still
    // hang on a connection the cut broke. The bridge reaches everyone: in a
    // cut of one round it trains on the winning chain's task, but a cut
    // over several rounds may bring it the losing chain's task of a round
    // first (from the cut aggregator, which goes on along its own chain):
    // its result then goes with that chain's aggregate, which its
    // aggregator sets aside once it learns it lost (design section 6).
    Expect expect;
    expect.unsteady = {sides.cut.begin(), sides.cut.end()};
    expect.unsteady.insert(sides.aggregator);
    if (!bridge_steady) expect.unsteady.insert(sides.bridge);
    ASSERT_NO_FATAL_FAILURE(ExpectJobCompletes(expect));
    const Snapshot last = swarm_->Poll(job_.job_id());
    bool split = false;
    for (const std::string& site : sides.cut) {
      const auto& status = last.at(site);
      if (!status.ok()) continue;
      for (const v1::Failover& f : status->failovers()) {
        if (f.round() == sides.round && f.from() == sides.aggregator) {
          split = true;
        }
      }
    }
    EXPECT_TRUE(split) << "no cut-off site failed round " << sides.round
                       << " over from " << sides.aggregator
                       << ": the cut did not make two chains";
    for (const std::string& site : kSites) {
      int switched = 0;
      int set_aside = 0;
      for (absl::string_view line :
           absl::StrSplit(swarm_->Log(site, 100000), '\n')) {
        if (absl::StrContains(line, "switching to the chain of")) ++switched;
        if (absl::StrContains(line, "of a chain that lost")) ++set_aside;
      }
      const auto& status = last.at(site);
      Note(absl::StrCat(
          site,
          site == sides.aggregator ? " (aggregator)"
          : site == sides.bridge   ? " (bridge)"
                                   : " (cut off)",
          ": switched chains ", switched, " time(s), set aside ", set_aside,
          " kept round model(s), discarded_aggregates ",
          status.ok() ? status->counters().discarded_aggregates() : 0,
          ", rounds_taken_over ",
          status.ok() ? status->counters().rounds_taken_over() : 0));
    }
    absl::Status agree = CheckKeptRoundsAgree();
    EXPECT_TRUE(agree.ok()) << agree;
  }

  // No two sites hold different bytes under one kept round model's name
  // (rounds/round-NNNNNN.safetensors): a site that learns its chain lost
  // sets its kept models of that chain aside
  // (round-NNNNNN.lost-at-round-R-attempt-A.dropped.safetensors), which
  // this lists.
  absl::Status CheckKeptRoundsAgree() {
    std::map<std::string, std::pair<std::string, std::string>> kept;
    std::string problem;
    int set_aside = 0;
    for (const std::string& site : kSites) {
      const std::string dir =
          absl::StrCat(swarm_->Workspace(site), "/", job_.job_id(), "/rounds");
      for (const std::string& file : ListFiles(dir)) {
        if (absl::EndsWith(file, ".dropped.safetensors")) {
          ++set_aside;
          std::fprintf(stderr, "[ faults ] %s set aside rounds/%s\n",
                       site.c_str(), file.c_str());
          continue;
        }
        if (!absl::EndsWith(file, ".safetensors")) continue;
        std::string bytes = ReadFileOrEmpty(absl::StrCat(dir, "/", file));
        auto [it, inserted] = kept.emplace(file, std::pair(site, ""));
        if (inserted) {
          it->second.second = std::move(bytes);
        } else if (it->second.second != bytes) {
          absl::StrAppend(&problem, site, " and ", it->second.first,
                          " hold different rounds/", file, "; ");
        }
      }
    }
    std::fprintf(stderr,
                 "[ faults ] %zu kept round model names, %d set aside as of "
                 "a losing chain\n",
                 kept.size(), set_aside);
    if (!problem.empty()) return absl::DataLossError(problem);
    return absl::OkStatus();
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
  Expect expect;
  expect.unsteady = {kBystander};
  ExpectJobCompletes(expect);
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
  Expect expect;
  expect.unsteady = {kBystander};
  ExpectJobCompletes(expect);
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
  Expect expect;
  expect.unsteady = {kBystander};
  ExpectJobCompletes(expect);
}

// (b5) Issue 30's case, found on a real network: while round 2's
// aggregator gathers (it holds its own result and one other trainer's,
// the bridge's), a cut leaves it reaching only the bridge, cut from the
// two other sites for 45 s; then the cut heals. Two chains form: the
// cut-off sites fail round 2 over to its first backup (one of them) and go
// on at attempt 1; the aggregator and the bridge go on at attempt 0, which
// wins after the heal. The bridge is a candidate here, so it may aggregate
// a round of either chain. Before the fix, a site of the losing chain
// ended failed ("own learn task ... refused ... the lower, which wins")
// without BEST or LAST: every site must end done with identical BEST and
// LAST, and no two sites may keep different models for one round.
TEST_F(NetFaults, CutWithABridgeWhileTheAggregatorGathers) {
  const BridgeCut sides = MakeBridgeJob(2, /*bystander_bridge=*/false);
  ASSERT_NO_FATAL_FAILURE(CutWithABridge(sides, absl::Seconds(45)));
  ExpectBridgeCutEnds(sides, /*bridge_steady=*/true);
}

// (b6) The same with a longer cut (60 s) from a later round's gathering
// (round 4), the bystander as the bridge, so both backups are on the cut
// side: both chains aggregate and keep several rounds during the cut.
// Before the fix every site ended done, but the losing chain's kept round
// models stayed in rounds/ under the winner's names, so two sites held
// different round-NNNNNN.safetensors; now the losing chain's are set aside
// as .dropped.safetensors once its sites learn they lost.
TEST_F(NetFaults, LongerCutWithABridgeInALaterRound) {
  const BridgeCut sides = MakeBridgeJob(4, /*bystander_bridge=*/true);
  ASSERT_NO_FATAL_FAILURE(CutWithABridge(sides, absl::Seconds(60)));
  ExpectBridgeCutEnds(sides, /*bridge_steady=*/false);
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
  Expect expect;
  expect.unsteady = {kBystander};
  expect.restarted = {kBystander};
  ExpectJobCompletes(expect);
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
  Expect expect;
  expect.unsteady = {kBystander};
  ExpectJobCompletes(expect);
}

// (d2) Learn tasks broadcast along the trainers, and the bystander frozen
// (SIGSTOP) for 20 s once it submitted round 1, so round 2's chain runs into
// it: the site forwarding to it (or the scatterer, if it is the chain's
// head) stops getting frames taken, gives it up after its stall timeout, and
// the scatterer sends the task directly to it and to the sites after it. A
// 32 MiB model, so that the frozen site's socket buffers cannot take the
// whole stream.
TEST_F(NetFaults, BroadcastChainRunsIntoAFrozenTrainer) {
  CaseOptions options;
  options.rounds = 4;
  options.broadcast = true;
  options.model_floats = 8 << 20;
  options.train_ms = 1000;
  options.site_train_ms = {{kBystander, 200}};
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, SubmittedRound(1), "s4 to submit round 1"));
  ASSERT_TRUE(swarm_->Signal(kBystander, SIGSTOP).ok());
  Note("SIGSTOP s4");
  absl::SleepFor(absl::Seconds(20));
  ASSERT_TRUE(swarm_->Signal(kBystander, SIGCONT).ok());
  Note("SIGCONT s4");
  Expect expect;
  expect.unsteady = {kBystander};
  ExpectJobCompletes(expect);
  int broadcasts = 0;
  bool fell_back = false;
  for (const std::string& site : kSites) {
    for (absl::string_view line :
         absl::StrSplit(swarm_->Log(site, 100000), '\n')) {
      if (absl::StrContains(line, "broadcasting the learn task")) ++broadcasts;
      if (absl::StrContains(line, "the broadcast did not reach") &&
          absl::StrContains(line, kBystander)) {
        fell_back = true;
      }
    }
  }
  EXPECT_EQ(broadcasts, 4) << "every round's task is broadcast";
  EXPECT_TRUE(fell_back) << "no fallback to a direct send to s4 logged";
}

// (d4) Chain reduction (issue 13): a trainer on round 1's chain is frozen
// (SIGSTOP, 20 s) while the partial sum is to pass through it; its link is
// capped at 100 Mbit/s so that the 32 MiB sum takes seconds through it. Its
// forwarder gives it up after the stall timeout, the trainers before it
// submit directly, those after it wait out the chain and do the same, and
// it submits its own once thawed: no steady trainer's result is lost.
TEST_F(NetFaults, ReductionChainRunsIntoAFrozenTrainer) {
  CaseOptions options;
  options.rounds = 4;
  options.chain = true;
  options.model_floats = 8 << 20;
  options.train_ms = 1000;
  MakeJob(options);
  const std::string frozen = Aggregator(1) == "s2" ? "s3" : "s2";
  absl::Status capped = swarm_->net().CapBandwidth(frozen, "100mbit");
  ASSERT_TRUE(capped.ok()) << capped;
  ASSERT_NO_FATAL_FAILURE(Start());
  Note(absl::StrCat("round 1 aggregator: ", Aggregator(1), "; freezing ",
                    frozen));
  ASSERT_NO_FATAL_FAILURE(WaitSite(
      frozen,
      [](const v1::SiteStatus& s) {
        return s.round() == 1 && s.state() == v1::SITE_STATE_SUBMITTING;
      },
      "the frozen site on round 1's chain"));
  ASSERT_TRUE(swarm_->Signal(frozen, SIGSTOP).ok());
  Note(absl::StrCat("SIGSTOP ", frozen));
  absl::SleepFor(absl::Seconds(20));
  ASSERT_TRUE(swarm_->Signal(frozen, SIGCONT).ok());
  Note(absl::StrCat("SIGCONT ", frozen));
  Expect expect;
  expect.unsteady = {frozen};
  ExpectJobCompletes(expect);
  int chains = 0;
  bool fell_back = false;
  for (const std::string& site : kSites) {
    for (absl::string_view line :
         absl::StrSplit(swarm_->Log(site, 100000), '\n')) {
      if (absl::StrContains(line, ": reduction chain ")) ++chains;
      if (absl::StrContains(line, "submitting this site's result directly")) {
        fell_back = true;
      }
    }
  }
  EXPECT_GE(chains, 4) << "every round's results are reduced in a chain";
  EXPECT_TRUE(fell_back) << "no trainer went back to a direct submission";
}

// (d5) The same with the chain's last hop frozen (SIGSTOP, 20 s) as soon as
// the aggregator has formed round 1's chain: every trainer's link is
// capped at 100 Mbit/s, so the 32 MiB sum is on its way through it. The hop
// before it gives it up (a write that waits too long), the aggregator gives
// up its stalled stream (no frame for a failover timeout), and everyone on
// the chain submits directly: no steady trainer's result is lost.
TEST_F(NetFaults, ReductionChainLastHopFrozenMidStream) {
  CaseOptions options;
  options.rounds = 3;
  options.chain = true;
  options.model_floats = 8 << 20;
  options.train_ms = 1000;
  MakeJob(options);
  // The fallback costs up to two failover timeouts (the hop before the
  // frozen one gives it up after one per hop from there), then three direct
  // uploads of 32 MiB, one at a time, over 100 Mbit/s links: more than the
  // cases' usual 20 s round.
  job_.set_round_timeout_ms(40000);
  const std::string aggregator = Aggregator(1);
  for (const std::string& site : kSites) {
    if (site == aggregator) continue;
    absl::Status capped = swarm_->net().CapBandwidth(site, "100mbit");
    ASSERT_TRUE(capped.ok()) << capped;
  }
  ASSERT_NO_FATAL_FAILURE(Start());
  // "round 1: reduction chain a -> b -> c -> aggregator" in its log.
  std::string last_hop;
  const absl::Time give_up = absl::Now() + absl::Seconds(90);
  while (last_hop.empty() && absl::Now() < give_up) {
    for (absl::string_view line :
         absl::StrSplit(swarm_->Log(aggregator, 200), '\n')) {
      const size_t at = line.find("round 1: reduction chain ");
      if (at == absl::string_view::npos) continue;
      std::vector<std::string> hops =
          absl::StrSplit(line.substr(at + 25), " -> ");
      if (hops.size() >= 2) last_hop = hops[hops.size() - 2];
    }
    if (last_hop.empty()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_FALSE(last_hop.empty()) << "round 1 formed no chain";
  ASSERT_TRUE(swarm_->Signal(last_hop, SIGSTOP).ok());
  Note(absl::StrCat("round 1 aggregator: ", aggregator, "; SIGSTOP ", last_hop,
                    " (the chain's last hop)"));
  absl::SleepFor(absl::Seconds(20));
  ASSERT_TRUE(swarm_->Signal(last_hop, SIGCONT).ok());
  Note(absl::StrCat("SIGCONT ", last_hop));
  Expect expect;
  expect.unsteady = {last_hop};
  ExpectJobCompletes(expect);
}

// (e1) Round 1's aggregator killed -9 while the trainers train round 1; it
// comes back 5 s later as an ordinary site.
TEST_F(NetFaults, AggregatorKilledWhileTrainersTrain) {
  CaseOptions options;
  options.train_ms = 4000;
  MakeJob(options);
  std::string aggregator;
  ASSERT_NO_FATAL_FAILURE(StartUntilTrainersTrainRoundOne(&aggregator));
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(aggregator, absl::Seconds(5), 1));
  Expect expect;
  expect.unsteady = {aggregator};
  expect.restarted = {aggregator};
  ExpectJobCompletes(expect);
}

// (e1m) The same kill with server momentum (lr 1, beta1 0.5), the
// aggregator left down: round 1 moves to the backup, which steps from the
// momentum carried in round 1's learn task (every trainer kept a copy).
// Every result adds the same delta d = 0.125, so every round's mean update
// is d whoever is in it, and element 0 (0 at round 0) of LAST after three
// rounds is m1 + m2 + m3 with m = beta1 m + d: 0.125 + 0.1875 + 0.21875 =
// 0.53125 exactly. A backup that lost the state would restart m at d
// (0.4375); plain FedAvg gives 0.375. LAST carries no state.
TEST_F(NetFaults, AggregatorKilledWhileTrainersTrainServerMomentum) {
  CaseOptions options;
  options.train_ms = 4000;
  options.server_optimizer = v1::SERVER_OPTIMIZER_MOMENTUM;
  MakeJob(options);
  std::string aggregator;
  ASSERT_NO_FATAL_FAILURE(StartUntilTrainersTrainRoundOne(&aggregator));
  swarm_->Kill(aggregator);
  Note(absl::StrCat("kill -9 ", aggregator, " (round 1's aggregator)"));
  Expect expect;
  expect.lost = {aggregator};
  ExpectJobCompletes(expect);
  for (const std::string& site : Others({aggregator})) {
    const std::string path = absl::StrCat(
        swarm_->Workspace(site), "/", job_.job_id(), "/last.safetensors");
    absl::StatusOr<Model> last = Model::LoadSafetensors(path);
    ASSERT_TRUE(last.ok()) << path << ": " << last.status();
    EXPECT_EQ(last->num_tensors(), 1u) << site << "'s LAST carries state";
    float first = 0;
    ASSERT_GE(last->tensor_data(0).size(), sizeof(first));
    std::memcpy(&first, last->tensor_data(0).data(), sizeof(first));
    EXPECT_EQ(first, 0.53125f)
        << site << "'s LAST: 0.4375 means the backup restarted the momentum, "
        << "0.375 that no optimizer ran";
  }
  Note("LAST element 0 is 0.53125 at every survivor: the momentum crossed "
       "the failover");
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
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(aggregator, absl::Seconds(5), 1));
  Expect expect;
  expect.unsteady = {aggregator};
  expect.restarted = {aggregator};
  ExpectJobCompletes(expect);
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
  Expect expect;
  expect.restarted = {kBystander};
  ExpectJobCompletes(expect);
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
  // The kill comes while round 2 trains, once round 1's aggregator says
  // round 2's global model is on its disk: the scatter does not wait for
  // that write (README "When things fail" says what a kill inside it
  // costs). Keeping round models doubles the write.
  options.keep_round_models = false;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(2), "s4 training round 2"));
  ASSERT_NO_FATAL_FAILURE(WaitSite(
      Aggregator(1),
      [](const v1::SiteStatus& s) { return s.global_round() >= 2; },
      "round 1's aggregator holding round 2's global model on disk"));
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
  Expect expect;
  expect.restarted = {"s1", "s2", "s3", "s4"};
  ExpectJobCompletes(expect);
}

// (e0) The aggregator elected for round 2 killed -9 while round 1 trains,
// so that it never receives round 2's learn task: round 1's aggregator,
// scattering round 2, must fail over to round 2's next backup. It stays
// down; the job completes on the other three sites. (The seed is chosen so
// that round 1's aggregator is another site.)
TEST_F(NetFaults, AggregatorKilledBeforeItsTaskArrives) {
  const uint32_t r = 1;
  std::string victim;
  ASSERT_NO_FATAL_FAILURE(StartUntilRoundOneTrains(&victim));
  swarm_->Kill(victim);
  Note(absl::StrCat("kill -9 ", victim, " (round 2's aggregator)"));
  WaitPastRound(r + 1, Others({victim}), /*all=*/false,
                "kill to round 2 completed at the backup");
  Expect expect;
  expect.lost = {victim};
  ExpectJobCompletes(expect);
}

// (e0b) The same, with the killed site restarted (same config and
// workspace) 5 s later: it rejoins as an ordinary site and every site ends
// done.
TEST_F(NetFaults, AggregatorKilledBeforeItsTaskArrivesRestarts) {
  const uint32_t r = 1;
  std::string victim;
  ASSERT_NO_FATAL_FAILURE(StartUntilRoundOneTrains(&victim));
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(victim, absl::Seconds(5), r + 1));
  Expect expect;
  expect.unsteady = {victim};
  expect.restarted = {victim};
  ExpectJobCompletes(expect);
}

// (e3) Round 1's aggregator killed -9 after it aggregated round 1, while
// its scatter of round 2 has reached some trainers but not all. The window:
// the bystander's link is capped at 1 Mbit/s and the model is 512 KiB, so
// its copy of every model takes about 4 s while the others get theirs in
// well under a second; the aggregator is killed as soon as a fast trainer
// shows round 2, before s4 has it. The trainers with round 2's task go on;
// s4 (which still holds round 1's outcome open) must get round 2 through
// the failover of round 1 (design section 6). The aggregator stays down.
TEST_F(NetFaults, AggregatorKilledBetweenAggregationAndScatter) {
  absl::Status capped = swarm_->net().CapBandwidth(kBystander, "1mbit");
  ASSERT_TRUE(capped.ok()) << capped;
  CaseOptions options;
  options.rounds = 3;
  options.model_floats = 131072;  // 512 KiB.
  options.train_ms = 1000;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint32_t r = 1;
  const std::string aggregator = Aggregator(r);
  Note(absl::StrCat(
      "round 1 order ", absl::StrJoin(ElectionOrder(job_, r), ","),
      "; round 2 order ", absl::StrJoin(ElectionOrder(job_, r + 1), ",")));
  const std::vector<std::string> fast = Others({aggregator, kBystander});
  auto has_next = [r](const v1::SiteStatus& s) {
    return s.round() > r || s.state() == v1::SITE_STATE_DONE;
  };
  absl::Status waited = swarm_->WaitFor(
      job_.job_id(),
      [&](const Snapshot& snapshot) {
        for (const std::string& site : fast) {
          if (InState(snapshot, site, has_next)) return true;
        }
        return false;
      },
      absl::Now() + absl::Seconds(120) * TimeScale(),
      "a fast trainer to get round 2's learn task");
  ASSERT_TRUE(waited.ok()) << waited << swarm_->Logs();
  // The scatter does not wait for the aggregator's copy of round 1's
  // aggregate (rounds/round-000002); killed before that write lands, no
  // site keeps round 1's aggregate and CheckRounds cannot see what it
  // held. The kill comes once the write is on disk: s4's copy of the model
  // takes about 4 s, the write milliseconds, so the window stays open.
  const std::string kept = absl::StrCat(swarm_->Workspace(aggregator), "/",
                                        job_.job_id(),
                                        "/rounds/round-000002.safetensors");
  const absl::Time kept_by = absl::Now() + absl::Seconds(10) * TimeScale();
  while (!FileExists(kept) && absl::Now() < kept_by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(FileExists(kept)) << "round 1's aggregator never wrote " << kept;
  absl::StatusOr<v1::SiteStatus> slow =
      swarm_->Status(kBystander, job_.job_id(), absl::Seconds(2));
  swarm_->Kill(aggregator);
  Note(absl::StrCat(
      "kill -9 ", aggregator,
      " (round 1's aggregator) while "
      "it scatters round 2; s4 then: ",
      slow.ok() ? slow->ShortDebugString() : slow.status().ToString()));
  ASSERT_TRUE(slow.ok() && !has_next(*slow))
      << "missed the window: s4 already had round 2's learn task";
  WaitPastRound(r, Others({aggregator}), /*all=*/true,
                "kill to every survivor in round 2");
  Expect expect;
  expect.lost = {aggregator};
  ExpectJobCompletes(expect);
}

// (e4) The same kill point, with the window made at the aggregator: its
// own link is capped at 2 Mbit/s with a 512 KiB model, so its scatter of
// round 2 (three copies side by side) takes about 6 s. It is killed as soon
// as it has round 2's learn task itself (it aggregated round 1 and began
// the scatter) while no other site has it: no trainer gets round 2's task
// from it, so round 1 must move whole to its first backup, from the
// results the trainers kept. The aggregator stays down.
TEST_F(NetFaults, AggregatorKilledWhileItsScatterIsUnderWay) {
  CaseOptions options;
  options.rounds = 3;
  options.model_floats = 131072;  // 512 KiB.
  options.train_ms = 1000;
  MakeJob(options);
  const uint32_t r = 1;
  const std::string aggregator = Aggregator(r);
  absl::Status capped = swarm_->net().CapBandwidth(aggregator, "2mbit");
  ASSERT_TRUE(capped.ok()) << capped;
  ASSERT_NO_FATAL_FAILURE(Start());
  Note(absl::StrCat(
      "round 1 order ", absl::StrJoin(ElectionOrder(job_, r), ","),
      "; round 2 order ", absl::StrJoin(ElectionOrder(job_, r + 1), ",")));
  const std::vector<std::string> others = Others({aggregator});
  auto has_next = [r](const v1::SiteStatus& s) {
    return s.round() > r || s.state() == v1::SITE_STATE_DONE;
  };
  absl::Status waited = swarm_->WaitFor(
      job_.job_id(),
      [&](const Snapshot& snapshot) {
        return InState(snapshot, aggregator, has_next);
      },
      absl::Now() + absl::Seconds(120) * TimeScale(),
      "round 1's aggregator to begin round 2's scatter");
  ASSERT_TRUE(waited.ok()) << waited << swarm_->Logs();
  Snapshot before;
  for (const std::string& site : others) {
    before.emplace(site, swarm_->Status(site, job_.job_id(), absl::Seconds(1)));
  }
  swarm_->Kill(aggregator);
  const absl::Time killed = absl::Now();
  Note(absl::StrCat("kill -9 ", aggregator,
                    " (round 1's aggregator) as its scatter of round 2 began"));
  for (const std::string& site : others) {
    ASSERT_FALSE(InState(before, site, has_next))
        << "missed the window: " << site
        << " already had round 2's learn task\n"
        << NetnsSwarm::Table(before);
  }
  WaitPastRound(r, others, /*all=*/false,
                "kill to round 1 completed at the backup", killed);
  Expect expect;
  expect.lost = {aggregator};
  ExpectJobCompletes(expect);
}

// (b4) Round 1's aggregator cut off from half the trainers (its first
// backup and the bystander) for 20 s from the moment round 1 trains, then
// healed. The cut-off trainers fail over to the backup, which may then
// aggregate round 1 as well as the aggregator (with the trainer it still
// reaches): the lower attempt must win everywhere, and every finishing site
// end with the same best and last models (no split brain).
TEST_F(NetFaults, PartitionIsolatingAggregatorFromHalfTheTrainers) {
  CaseOptions options;
  options.rounds = 4;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint32_t r = 1;
  const std::vector<std::string> order = ElectionOrder(job_, r);
  const std::string aggregator = order[0];
  const std::vector<std::string> cut = {order[1], kBystander};
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(r), "s4 training round 1"));
  absl::Status partitioned = swarm_->net().Partition(aggregator, cut);
  ASSERT_TRUE(partitioned.ok()) << partitioned;
  Note(absl::StrCat("partition: ", aggregator, " (round 1's aggregator) | ",
                    absl::StrJoin(cut, " "), "; round 1 order ",
                    absl::StrJoin(order, ",")));
  absl::SleepFor(absl::Seconds(20));
  ASSERT_TRUE(swarm_->net().Heal(aggregator).ok());
  Note("healed");
  // Each side of the partition may lawfully miss rounds of the other (and
  // the aggregator the round after the heal, if its calls still hang on a
  // connection the partition broke): only the third trainer is steady.
  Expect expect;
  expect.unsteady = {cut.begin(), cut.end()};
  expect.unsteady.insert(aggregator);
  ExpectJobCompletes(expect);
}

// (g1) The starting site killed -9 the moment `swarmctl start` returned 0
// (which it does once round 0's learn tasks were delivered); it stays down.
// The others complete the job without it.
TEST_F(NetFaults, StartingSiteKilledRightAfterStart) {
  CaseOptions options;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  swarm_->Kill("s1");
  Note(absl::StrCat("kill -9 s1 (starting site; round 0 order ",
                    absl::StrJoin(ElectionOrder(job_, 0), ","), ")"));
  WaitPastRound(0, Others({"s1"}), /*all=*/false, "kill to round 0 completed");
  Expect expect;
  expect.lost = {"s1"};
  ExpectJobCompletes(expect);
}

// (g2) The same, with s1 restarted (same config and workspace) 5 s later:
// it rejoins and every site ends done.
TEST_F(NetFaults, StartingSiteKilledRightAfterStartRestarts) {
  CaseOptions options;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  Note(absl::StrCat("round 0 order ",
                    absl::StrJoin(ElectionOrder(job_, 0), ",")));
  ASSERT_NO_FATAL_FAILURE(KillAndRestart("s1", absl::Seconds(5), 0));
  Expect expect;
  expect.unsteady = {"s1"};
  expect.restarted = {"s1"};
  ExpectJobCompletes(expect);
}

// (h1) A full disk at a trainer: the bystander's workspace is a 2 MiB
// tmpfs, filled to the last byte while it trains round 1. Its next write
// fails (at the latest the final models): it must end failed with an
// error naming the path, the others finish without it, and no model file
// anywhere is torn.
TEST_F(NetFaults, FullDiskAtTrainer) {
  ASSERT_NO_FATAL_FAILURE(SmallDiskWorkspace(kBystander, "2m"));
  CaseOptions options;
  MakeJob(options);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(1), "s4 training round 1"));
  ASSERT_NO_FATAL_FAILURE(FillDisk(kBystander));
  Expect expect;
  expect.failed = {kBystander};
  expect.failed_text = swarm_->Workspace(kBystander);
  ExpectJobCompletes(expect);
}

// (h2) A full offload disk at an aggregator: the job offloads results to
// disk, and round 1's aggregator's workspace (a 4 MiB tmpfs) is filled while
// round 1 trains, so receiving the results of round 1 fails there. Each
// result is refused for good (not RETRY), that site ends failed naming the
// path, the trainers fail over to round 1's backup and the job completes
// on the other sites.
TEST_F(NetFaults, FullOffloadDiskAtAggregator) {
  CaseOptions options;
  MakeJob(options);
  job_.set_disk_offload(true);
  const uint32_t r = 1;
  const std::string aggregator = Aggregator(r);
  ASSERT_NO_FATAL_FAILURE(SmallDiskWorkspace(aggregator, "4m"));
  ASSERT_NO_FATAL_FAILURE(Start());
  Note(absl::StrCat("round 1 order ",
                    absl::StrJoin(ElectionOrder(job_, r), ",")));
  ASSERT_NO_FATAL_FAILURE(
      WaitSite(kBystander, TrainingRound(r), "s4 training round 1"));
  ASSERT_NO_FATAL_FAILURE(FillDisk(aggregator));
  WaitPastRound(r, Others({aggregator}), /*all=*/false,
                "disk full to round 1 completed elsewhere");
  Expect expect;
  expect.failed = {aggregator};
  expect.failed_text = swarm_->Workspace(aggregator);
  ExpectJobCompletes(expect);
}

}  // namespace swarm::testing
