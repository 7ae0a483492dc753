// Every defence against every attack on the same data (design section 11).
//
//   attack_bench [--rounds 10] [--sites 8] [--attackers 2] [--alpha 0.5]
//                [--max_train_samples 0] [--rules all|name,...]
//                [--attacks all|name,...] [--data_dir DIR]
//   attack_bench --timing [--size_mib 64] [--sites 8]
//
// The built-in MLP on Fashion-MNIST, `sites` sites with Dirichlet(alpha)
// shards, of which the last `attackers` attack. For every attack x rule it
// runs a whole job of `rounds` rounds in this process: every site validates
// the global model and trains from it with its real MlpLearner (the attack
// wrapper of learner/attack.h on the attacking sites, configured by the same
// learner params a daemon reads), and the round's results go through the
// real gatherer: an Aggregator made from the job config
// (AggregatorOptions::FromJobConfig, results offloaded to files like the
// daemon's) and a Gatherer scoring the round with the job's score options
// (SetScoreOptions). What it leaves out of a daemon's job: the network, the
// election and the SiteDriver (every round is aggregated here, by the
// bench); the aggregation and the scoring are the daemon's own code.
//
// ALIE and IPM: the attackers need the mean and deviation of the honest
// updates of the round. The bench gives them what the literature assumes:
// it trains the honest sites first, and the attackers' honest learners
// (attack_honest_sites) hand back those very results of the round, so the
// statistics are exactly the honest sites' (an attacker in a daemon computes
// the same by training the honest shards itself; see learner/attack.h).
//
// Printed: per rule and attack, the test accuracy (10,000 test images) of
// the final BEST model (by the robust score) and of the LAST model, and the
// mean aggregation time per round.
//
// --timing: aggregation time of each rule for `sites` F32 results of
// size_mib MiB against FedAvg's, and the peak RSS of the process that
// aggregates (each rule in its own child process; results are files made
// beforehand, added with AddFile).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gatherer/aggregator.h"
#include "gatherer/gatherer.h"
#include "learner/attack.h"
#include "learner/fashion_mnist.h"
#include "learner/mlp_learner.h"

namespace swarm {
namespace {

struct Flags {
  int rounds = 10;
  int sites = 8;
  int attackers = 2;
  double alpha = 0.5;
  uint64_t max_train_samples = 0;
  std::string rules = "all";
  std::string attacks = "all";
  std::string data_dir = kDefaultFashionMnistDir;
  bool timing = false;
  int size_mib = 64;
};

// A defence: the job config fields it sets.
struct Rule {
  std::string name;
  v1::AggregationMethod method;
  int f;
  int bucket;
  double trim = 0;
};

std::vector<Rule> AllRules(int attackers) {
  return {
      {"fedavg", v1::AGGREGATION_FEDAVG, 0, 0},
      {"median", v1::AGGREGATION_MEDIAN, attackers, 0},
      {"trimmed_mean_0.25", v1::AGGREGATION_TRIMMED_MEAN, attackers, 0, 0.25},
      {"multi_krum", v1::AGGREGATION_MULTI_KRUM, attackers, 0},
      // n = 8 allows Bulyan only with f = 1 (n >= 4f + 3).
      {"bulyan_f1", v1::AGGREGATION_BULYAN, 1, 0},
      {"centered_clip", v1::AGGREGATION_CENTERED_CLIPPING, attackers, 0},
      // Buckets of 2: 4 inputs, which n >= 2f + 1 allows for f = 1.
      {"centered_clip_bucket2", v1::AGGREGATION_CENTERED_CLIPPING, 1, 2},
      {"geometric_median", v1::AGGREGATION_GEOMETRIC_MEDIAN, attackers, 0},
  };
}

// An attack: the learner params of the attacking sites.
struct Attack {
  std::string name;
  std::map<std::string, std::string> params;
};

std::vector<Attack> AllAttacks() {
  return {
      {"none", {}},
      // The attacker: a flipped, scaled update claiming 5x samples.
      {"sign_flip_x4_claims_x5",
       {{"attack", "sign_flip"},
        {"attack_scale", "4"},
        {"attack_samples", "5"}}},
      {"scaling_x10", {{"attack", "scaling"}, {"attack_scale", "10"}}},
      {"noise_1", {{"attack", "noise"}, {"attack_noise", "1"}}},
      {"alie", {{"attack", "alie"}}},
      {"ipm_0.5", {{"attack", "ipm"}, {"attack_scale", "0.5"}}},
      // Lying metrics with a sign-flipped update: the liar reports 1.0 to
      // make the worst round BEST.
      {"sign_flip_lying_metric",
       {{"attack", "sign_flip"}, {"attack_metric", "1.0"}}},
  };
}

std::string SiteName(int i) { return absl::StrCat("site-", i); }

// An honest site's learner for an attacker: returns the result the bench
// already trained for that site this round.
class CachedResult final : public Learner {
 public:
  explicit CachedResult(const TrainOutput* result) : result_(result) {}
  absl::StatusOr<Model> InitialModel() override {
    return absl::UnimplementedError("cached result");
  }
  absl::StatusOr<Metrics> Validate(const Model&, uint32_t) override {
    return absl::UnimplementedError("cached result");
  }
  absl::StatusOr<TrainOutput> Train(const Model&, uint32_t,
                                    const std::atomic<bool>&) override {
    TrainOutput copy;
    copy.sample_count = result_->sample_count;
    copy.kind = result_->kind;
    absl::StatusOr<Model> model = result_->model.Clone();
    if (!model.ok()) return model.status();
    copy.model = std::move(*model);
    return copy;
  }

 private:
  const TrainOutput* result_;
};

struct Outcome {
  double best_accuracy = 0;
  double last_accuracy = 0;
  double aggregate_ms = 0;
};

struct Shared {
  Flags flags;
  std::shared_ptr<const ImageDataset> train;
  ImageDataset test;
  std::string offload_dir;
};

std::map<std::string, std::string> LearnerParams(const Shared& shared,
                                                 const Attack& attack) {
  std::map<std::string, std::string> params = {
      {"sites", absl::StrCat(shared.flags.sites)},
      {"alpha", absl::StrCat(shared.flags.alpha)},
      {"max_train_samples", absl::StrCat(shared.flags.max_train_samples)},
      {"data_dir", shared.flags.data_dir}};
  const int honest = shared.flags.sites - shared.flags.attackers;
  std::vector<std::string> honest_names;
  for (int i = 0; i < shared.flags.sites; ++i) {
    params[absl::StrCat("site_index.", SiteName(i))] = absl::StrCat(i);
    if (i < honest) {
      honest_names.push_back(SiteName(i));
      continue;
    }
    for (const auto& [key, value] : attack.params) {
      params[absl::StrCat(key, ".", SiteName(i))] = value;
    }
    params[absl::StrCat("attack_honest_sites.", SiteName(i))] =
        absl::StrJoin(honest_names, ",");
    params[absl::StrCat("attack_colluders.", SiteName(i))] =
        absl::StrCat(shared.flags.attackers);
  }
  return params;
}

v1::JobConfig JobFor(const Rule& rule) {
  v1::JobConfig config;
  config.set_aggregation_method(rule.method);
  config.set_tolerated_attackers(rule.f);
  config.set_bucket_size(rule.bucket);
  config.set_trim_fraction(rule.trim);
  config.set_seed(1);
  return config;
}

// The sites' learners for one job: site i is an MlpLearner on its shard,
// wrapped by the attack of its params if it has one. `results` is where the
// bench keeps each round's results (the attackers' honest learners read
// the honest ones).
absl::Status MakeLearners(const Shared& shared, const Attack& attack,
                          const std::vector<TrainOutput>& results,
                          std::vector<std::unique_ptr<Learner>>* learners,
                          MlpLearner** evaluator) {
  const std::map<std::string, std::string> params =
      LearnerParams(shared, attack);
  const int honest = shared.flags.sites - shared.flags.attackers;
  for (int i = 0; i < shared.flags.sites; ++i) {
    absl::StatusOr<MlpLearnerOptions> options =
        ParseMlpLearnerOptions(SiteName(i), params);
    if (!options.ok()) return options.status();
    absl::StatusOr<std::unique_ptr<MlpLearner>> mlp =
        MlpLearner::Create(*options, shared.train);
    if (!mlp.ok()) return mlp.status();
    if (i == 0) *evaluator = mlp->get();
    absl::StatusOr<AttackOptions> attacking =
        ParseAttackOptions(SiteName(i), params);
    if (!attacking.ok()) return attacking.status();
    if (!attacking->active()) {
      learners->push_back(std::move(*mlp));
      continue;
    }
    std::vector<std::unique_ptr<Learner>> peers;
    if (attacking->mode == AttackMode::kAlie ||
        attacking->mode == AttackMode::kIpm) {
      for (int j = 0; j < honest; ++j) {
        peers.push_back(std::make_unique<CachedResult>(&results[j]));
      }
    }
    learners->push_back(NewAttackingLearner(
        std::move(*mlp), std::move(*attacking), std::move(peers)));
  }
  return absl::OkStatus();
}

// One round: every site validates `global` and trains from it (honest
// sites first), the results are aggregated. Returns the next global model
// and sets `score` to the round's score of `global`.
absl::StatusOr<std::shared_ptr<const Model>> RunRound(
    const Shared& shared, const v1::JobConfig& job, uint32_t round,
    std::shared_ptr<const Model> global,
    std::vector<std::unique_ptr<Learner>>& learners,
    std::vector<TrainOutput>& results, std::optional<double>* score,
    double* aggregate_ms) {
  const int n = shared.flags.sites;
  GathererOptions options;
  options.round = round;
  for (int i = 0; i < n; ++i) options.expected_trainers.push_back(SiteName(i));
  options.wait_after_min_responses = absl::InfiniteDuration();
  options.round_timeout = absl::InfiniteDuration();
  options.max_concurrent_submissions = static_cast<uint32_t>(n);
  options.self = "bench";
  SetScoreOptions(job, &options);
  Gatherer gatherer(options, MetricComparator(v1::METRIC_HIGHER_IS_BETTER));
  AggregatorOptions aggregation = AggregatorOptions::FromJobConfig(
      job, job.aggregation_method() == v1::AGGREGATION_FEDAVG
               ? std::string()
               : shared.offload_dir);
  aggregation.bucket_seed = job.seed() ^ (round * 0x9e3779b97f4a7c15ull);
  absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
      Aggregator::Create(aggregation, global);
  if (!aggregator.ok()) return aggregator.status();
  std::vector<Metrics> metrics(n);
  const std::atomic<bool> cancel{false};
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<Metrics> validated = learners[i]->Validate(*global, round);
    if (!validated.ok()) return validated.status();
    metrics[i] = *validated;
    absl::StatusOr<TrainOutput> trained =
        learners[i]->Train(*global, round, cancel);
    if (!trained.ok()) return trained.status();
    results[i] = std::move(*trained);
  }
  const absl::Time now = absl::UnixEpoch();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    const std::string name = SiteName(i);
    gatherer.RequestToSubmit(name, round, now);
    gatherer.BeginResult(name, round, now);
    absl::Status added =
        (*aggregator)
            ->Add(results[i].model,
                  static_cast<int64_t>(results[i].sample_count),
                  results[i].kind);
    if (!added.ok()) return added;
    google::protobuf::Map<std::string, double> reported(metrics[i].begin(),
                                                        metrics[i].end());
    gatherer.CompleteResult(name, results[i].sample_count, reported, now);
  }
  absl::StatusOr<Model> next = (*aggregator)->Finish();
  if (!next.ok()) return next.status();
  *aggregate_ms += std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  *score = gatherer.RoundScore();
  return std::make_shared<const Model>(std::move(*next));
}

absl::StatusOr<Outcome> RunJob(const Shared& shared, const Rule& rule,
                               const Attack& attack) {
  std::vector<TrainOutput> results(shared.flags.sites);
  std::vector<std::unique_ptr<Learner>> learners;
  MlpLearner* evaluator = nullptr;
  absl::Status made =
      MakeLearners(shared, attack, results, &learners, &evaluator);
  if (!made.ok()) return made;
  absl::StatusOr<Model> initial = learners[0]->InitialModel();
  if (!initial.ok()) return initial.status();
  std::shared_ptr<const Model> global =
      std::make_shared<const Model>(std::move(*initial));
  const v1::JobConfig job = JobFor(rule);
  std::optional<double> best_score;
  std::shared_ptr<const Model> best = global;
  Outcome outcome;
  for (int round = 0; round < shared.flags.rounds; ++round) {
    std::optional<double> score;
    absl::StatusOr<std::shared_ptr<const Model>> next =
        RunRound(shared, job, static_cast<uint32_t>(round), global, learners,
                 results, &score, &outcome.aggregate_ms);
    if (!next.ok()) return next.status();
    if (score.has_value() && (!best_score || *score > *best_score)) {
      best_score = score;
      best = global;
    }
    global = *next;
  }
  outcome.aggregate_ms /= shared.flags.rounds;
  absl::StatusOr<Evaluation> best_eval =
      evaluator->EvaluateTest(*best, &shared.test);
  if (!best_eval.ok()) return best_eval.status();
  absl::StatusOr<Evaluation> last_eval =
      evaluator->EvaluateTest(*global, &shared.test);
  if (!last_eval.ok()) return last_eval.status();
  outcome.best_accuracy = best_eval->accuracy;
  outcome.last_accuracy = last_eval->accuracy;
  return outcome;
}

// --timing: one rule in a child process; returns {ms, peak RSS bytes}.
std::pair<double, uint64_t> TimeRule(const Rule& rule,
                                     std::shared_ptr<const Model> base,
                                     const std::vector<std::string>& files,
                                     const std::string& offload) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {-1, 0};
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    const auto start = std::chrono::steady_clock::now();
    AggregatorOptions options =
        AggregatorOptions::FromJobConfig(JobFor(rule), offload);
    double ms = -1;
    absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
        Aggregator::Create(options, base);
    bool ok = aggregator.ok();
    for (size_t k = 0; ok && k < files.size(); ++k) {
      ok = (*aggregator)
               ->AddFile(files[k], 1000, v1::PAYLOAD_KIND_FULL_WEIGHTS)
               .ok();
    }
    if (ok) ok = (*aggregator)->Finish().ok();
    if (ok) {
      ms = std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - start)
               .count();
    }
    (void)!write(pipe_fds[1], &ms, sizeof(ms));
    _exit(ok ? 0 : 1);
  }
  close(pipe_fds[1]);
  double ms = -1;
  (void)!read(pipe_fds[0], &ms, sizeof(ms));
  close(pipe_fds[0]);
  int status = 0;
  struct rusage usage;
  wait4(child, &status, 0, &usage);
  return {ms, static_cast<uint64_t>(usage.ru_maxrss) * 1024};
}

int RunTiming(const Flags& flags, const std::string& dir) {
  const uint64_t elements = (uint64_t{flags.size_mib} << 20) / sizeof(float);
  absl::StatusOr<TensorSpec> spec =
      MakeTensorSpec("w", v1::DTYPE_F32, {elements});
  absl::StatusOr<Model> base = Model::Create({*spec});
  if (!spec.ok() || !base.ok()) return 1;
  std::mt19937 random(1);
  std::normal_distribution<float> normal(0, 1);
  float* values = reinterpret_cast<float*>(base->mutable_tensor_data(0).data());
  for (uint64_t i = 0; i < elements; ++i) values[i] = normal(random);
  std::vector<std::string> files;
  for (int k = 0; k < flags.sites; ++k) {
    absl::StatusOr<Model> result = base->Clone();
    float* x = reinterpret_cast<float*>(result->mutable_tensor_data(0).data());
    for (uint64_t i = 0; i < elements; i += 7) x[i] += 0.01f * normal(random);
    files.push_back(absl::StrCat(dir, "/timing-", k, ".safetensors"));
    if (!result->SaveSafetensors(files.back()).ok()) return 1;
  }
  auto shared_base = std::make_shared<const Model>(std::move(*base));
  std::printf(
      "aggregation of %d F32 results of %d MiB (AddFile, one child "
      "process per rule)\n",
      flags.sites, flags.size_mib);
  std::printf("%-24s %10s %10s %14s %10s\n", "rule", "ms", "x fedavg",
              "peak RSS MiB", "x model");
  double fedavg_ms = 0;
  for (const Rule& rule : AllRules(flags.attackers)) {
    const auto [ms, peak] =
        TimeRule(rule, shared_base, files, absl::StrCat(dir, "/offload"));
    if (rule.method == v1::AGGREGATION_FEDAVG) fedavg_ms = ms;
    std::printf("%-24s %10.0f %10.2f %14.0f %10.2f\n", rule.name.c_str(), ms,
                fedavg_ms > 0 ? ms / fedavg_ms : 0, peak / 1048576.0,
                static_cast<double>(peak) / (uint64_t{flags.size_mib} << 20));
    std::fflush(stdout);
  }
  for (const std::string& file : files) std::remove(file.c_str());
  return 0;
}

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      return i + 1 < argc ? argv[++i] : std::string();
    };
    bool ok = true;
    if (arg == "--rounds") {
      ok = absl::SimpleAtoi(value(), &flags->rounds) && flags->rounds > 0;
    } else if (arg == "--sites") {
      ok = absl::SimpleAtoi(value(), &flags->sites) && flags->sites > 1;
    } else if (arg == "--attackers") {
      ok =
          absl::SimpleAtoi(value(), &flags->attackers) && flags->attackers >= 0;
    } else if (arg == "--alpha") {
      ok = absl::SimpleAtod(value(), &flags->alpha) && flags->alpha > 0;
    } else if (arg == "--max_train_samples") {
      ok = absl::SimpleAtoi(value(), &flags->max_train_samples);
    } else if (arg == "--rules") {
      flags->rules = value();
    } else if (arg == "--attacks") {
      flags->attacks = value();
    } else if (arg == "--data_dir") {
      flags->data_dir = value();
    } else if (arg == "--timing") {
      flags->timing = true;
    } else if (arg == "--size_mib") {
      ok = absl::SimpleAtoi(value(), &flags->size_mib) && flags->size_mib > 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "attack_bench: bad argument %s\n", arg.c_str());
      return false;
    }
  }
  return flags->attackers < flags->sites;
}

bool Selected(const std::string& list, const std::string& name) {
  if (list == "all") return true;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    if (item == name) return true;
  }
  return false;
}

int Main(int argc, char** argv) {
  Shared shared;
  if (!ParseFlags(argc, argv, &shared.flags)) return 2;
  const Flags& flags = shared.flags;
  char tmpl[] = "/tmp/attack_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  shared.offload_dir = tmpl;
  if (flags.timing) {
    const int code = RunTiming(flags, shared.offload_dir);
    std::filesystem::remove_all(shared.offload_dir);
    return code;
  }
  absl::StatusOr<ImageDataset> train =
      LoadFashionMnist(flags.data_dir, FashionMnistSplit::kTrain);
  absl::StatusOr<ImageDataset> test =
      LoadFashionMnist(flags.data_dir, FashionMnistSplit::kTest);
  if (!train.ok() || !test.ok()) {
    std::fprintf(
        stderr, "attack_bench: %s\n",
        (!train.ok() ? train.status() : test.status()).ToString().c_str());
    return 1;
  }
  shared.train = std::make_shared<const ImageDataset>(std::move(*train));
  shared.test = std::move(*test);
  std::printf(
      "MLP on Fashion-MNIST, %d sites, Dirichlet alpha %g, %d attackers "
      "(the last sites), %d rounds; in-process jobs; test accuracy of the "
      "BEST / LAST model\n",
      flags.sites, flags.alpha, flags.attackers, flags.rounds);
  std::printf("%-24s %-24s %8s %8s %10s\n", "rule", "attack", "best", "last",
              "agg ms");
  for (const Attack& attack : AllAttacks()) {
    if (!Selected(flags.attacks, attack.name)) continue;
    for (const Rule& rule : AllRules(flags.attackers)) {
      if (!Selected(flags.rules, rule.name)) continue;
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Outcome> outcome = RunJob(shared, rule, attack);
      const double seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
      if (!outcome.ok()) {
        std::printf("%-24s %-24s error: %s\n", rule.name.c_str(),
                    attack.name.c_str(), outcome.status().ToString().c_str());
        continue;
      }
      std::printf("%-24s %-24s %8.4f %8.4f %10.1f  (%.0f s)\n",
                  rule.name.c_str(), attack.name.c_str(),
                  outcome->best_accuracy, outcome->last_accuracy,
                  outcome->aggregate_ms, seconds);
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(shared.offload_dir);
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Main(argc, argv); }
