// Learning quality on non-IID sites: FedAvg against the server optimizers
// (FedAvgM, FedAdam, FedYogi; gatherer/server_optimizer.h) and FedProx
// (the MLP learner's prox_mu), over data seeds, against central training
// (issue 35; docs/server-optimizers.md "Quality").
//
//   quality_bench [--sites 4,8] [--alphas 0.1,0.5] [--seeds 1-5]
//                 [--methods fedavg,fedavgm:beta1=0.5,fedadam,fedprox,
//                            fedprox+fedavgm:beta1=0.5]
//                 [--rounds 20] [--epochs 1] [--lr 0.05]
//                 [--momentum-lr 1] [--adam-lr 0.03] [--yogi-lr 0.03]
//                 [--beta1 0.9] [--beta2 0.99] [--epsilon 0.001]
//                 [--prox-mu 0.01] [--jobs 2] [--no-central]
//                 [--max-train-samples 0] [--data-dir DIR] [--csv FILE]
//
// Everything runs in this process, with no daemon and no network. For every
// (sites, alpha, data seed, method) it simulates a whole swarm job with the
// built-in MLP learner on Fashion-MNIST, the demo's data and settings
// (deploy/local/demo.sh: Dirichlet(alpha) shards from learner/fashion_mnist.h
// with data_seed = the seed, model seed 1, 1 epoch per round, lr 0.05 with
// the learner's default decay, 20 rounds; every other learner param at its
// default). Each round r = 0..rounds-1:
//   - every site validates the round's global model on its validation split
//     and trains from it (MlpLearner::Validate and Train, the daemon's own
//     learner code; with FedProx, learner param prox_mu);
//   - the results go through the project's FedAvg (Aggregator::Create with
//     AGGREGATION_FEDAVG, weighted by sample count);
//   - with a server optimizer, ApplyServerOptimizer(options, global, mean,
//     "") steps the global model (its state travels in the global model, as
//     in the daemon); without one, the mean is the next global model.
// The round's score of its input model is the sample-weighted mean of the
// sites' validation accuracies (the daemon's default score under FedAvg);
// the best-scoring input model is the job's BEST (as in the daemon, the
// last round's output is never scored), and what is reported is BEST's
// accuracy on the 10,000 test images.
//
// Central baseline: one learner on all the training data (nothing held out)
// for rounds x epochs epochs with the same learning-rate schedule (the
// demo's `swarm-mlp train --central`). It depends on no site count, alpha
// or data seed, so it runs once.
//
// Methods (--methods, comma-separated): fedavg, fedavgm (server momentum),
// fedadam, fedyogi, fedprox (FedAvg with prox_mu), and fedprox+fedavgm,
// fedprox+fedadam, fedprox+fedyogi. A method may carry its own settings
// after colons, overriding the flags: lr=, beta1=, beta2=, eps=, mu=, e.g.
// "fedadam:lr=0.03:beta2=0.999" or "fedprox:mu=0.1" (for tuning grids).
// The default methods and server settings are the ones tuned at alpha 0.1
// (docs/server-optimizers.md "Quality"): momentum lr 1 with beta1 0.5, Adam
// lr 0.03, mu 0.01.
//
// Output: one progress line per job on stderr; on stdout, the table of the
// best model's test accuracy per (sites, alpha, method) over the seeds:
// mean, standard deviation, min..max, and the gap of the mean to central in
// points (central minus mean, x100: positive is behind central). --csv
// writes one row per job. Jobs run --jobs at a time (each job sequential,
// so results do not depend on --jobs).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gatherer/aggregator.h"
#include "gatherer/server_optimizer.h"
#include "learner/fashion_mnist.h"
#include "learner/mlp_learner.h"

namespace swarm {
namespace {

constexpr char kUsage[] =
    "usage: quality_bench [--sites 4,8] [--alphas 0.1,0.5] [--seeds 1-5]\n"
    "  [--methods fedavg,fedavgm:beta1=0.5,fedadam,fedprox,\n"
    "             fedprox+fedavgm:beta1=0.5]\n"
    "  [--rounds 20] [--epochs 1] [--lr 0.05]\n"
    "  [--momentum-lr 1] [--adam-lr 0.03] [--yogi-lr 0.03] [--beta1 0.9]\n"
    "  [--beta2 0.99] [--epsilon 0.001] [--prox-mu 0.01] [--jobs 2]\n"
    "  [--no-central] [--max-train-samples 0] [--data-dir DIR] [--csv FILE]\n"
    "methods: fedavg fedavgm fedadam fedyogi fedprox fedprox+fedavgm\n"
    "  fedprox+fedadam fedprox+fedyogi, each optionally with :lr=X :beta1=X\n"
    "  :beta2=X :eps=X :mu=X (e.g. fedadam:lr=0.03)\n";

struct Flags {
  std::vector<uint32_t> sites = {4, 8};
  std::vector<double> alphas = {0.1, 0.5};
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  std::string methods =
      "fedavg,fedavgm:beta1=0.5,fedadam,fedprox,fedprox+fedavgm:beta1=0.5";
  uint32_t rounds = 20;
  uint32_t epochs = 1;
  std::string lr = "0.05";
  double momentum_lr = 1.0;
  double adam_lr = 0.03;
  double yogi_lr = 0.03;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double epsilon = 1e-3;
  double prox_mu = 0.01;
  uint32_t jobs = 2;
  bool central = true;
  uint64_t max_train_samples = 0;
  std::string data_dir = kDefaultFashionMnistDir;
  std::string csv;
};

// One method: a server optimizer, FedProx's mu, or both.
struct Method {
  std::string label;  // As given, e.g. "fedadam:lr=0.03".
  ServerOptimizerOptions server;
  double prox_mu = 0;
};

struct Shared {
  Flags flags;
  std::shared_ptr<const ImageDataset> train;
  ImageDataset test;
};

struct Job {
  uint32_t sites = 0;
  double alpha = 0;
  uint64_t seed = 0;
  size_t method = 0;  // Index into the methods.
};

struct Outcome {
  double best_test = 0;
  double best_validation = 0;
  uint32_t best_round = 0;
  double last_test = 0;  // The last round's output (never scored).
  double seconds = 0;
};

int Usage(const std::string& why) {
  std::fprintf(stderr, "quality_bench: %s\n%s", why.c_str(), kUsage);
  return 2;
}

bool ParseDoubleList(absl::string_view text, std::vector<double>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    double v;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part), &v) ||
        !(v > 0) || !std::isfinite(v)) {
      return false;
    }
    out->push_back(v);
  }
  return !out->empty();
}

// "1-5", "1,3,7" or a mix ("1-3,9").
bool ParseSeeds(absl::string_view text, std::vector<uint64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> range = absl::StrSplit(part, '-');
    uint64_t lo, hi;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &lo)) {
      out->push_back(lo);
    } else if (range.size() == 2 && absl::SimpleAtoi(range[0], &lo) &&
               absl::SimpleAtoi(range[1], &hi) && lo <= hi &&
               hi - lo < 1000) {
      for (uint64_t s = lo; s <= hi; ++s) out->push_back(s);
    } else {
      return false;
    }
  }
  return !out->empty();
}

bool ParseSites(absl::string_view text, std::vector<uint32_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    uint32_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v) || v < 1 ||
        v > 64) {
      return false;
    }
    out->push_back(v);
  }
  return !out->empty();
}

absl::StatusOr<Method> ParseMethod(absl::string_view spec,
                                   const Flags& flags) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  Method m;
  m.label = std::string(spec);
  const std::string& name = parts[0];
  absl::string_view server = name;
  if (absl::ConsumePrefix(&server, "fedprox")) {
    m.prox_mu = flags.prox_mu;
    if (!server.empty() && !absl::ConsumePrefix(&server, "+")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown method \"", name, "\""));
    }
  }
  if (server.empty() || server == "fedavg") {
    m.server.kind = v1::SERVER_OPTIMIZER_NONE;
  } else if (server == "fedavgm") {
    m.server.kind = v1::SERVER_OPTIMIZER_MOMENTUM;
    m.server.learning_rate = flags.momentum_lr;
  } else if (server == "fedadam") {
    m.server.kind = v1::SERVER_OPTIMIZER_ADAM;
    m.server.learning_rate = flags.adam_lr;
  } else if (server == "fedyogi") {
    m.server.kind = v1::SERVER_OPTIMIZER_YOGI;
    m.server.learning_rate = flags.yogi_lr;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown method \"", name, "\""));
  }
  m.server.beta1 = flags.beta1;
  m.server.beta2 = flags.beta2;
  m.server.epsilon = flags.epsilon;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::vector<std::string> kv = absl::StrSplit(parts[i], '=');
    double v;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("method \"", spec, "\": bad setting \"", parts[i],
                       "\" (lr=X, beta1=X, beta2=X, eps=X, mu=X)"));
    }
    if (kv[0] == "lr") {
      m.server.learning_rate = v;
    } else if (kv[0] == "beta1") {
      m.server.beta1 = v;
    } else if (kv[0] == "beta2") {
      m.server.beta2 = v;
    } else if (kv[0] == "eps") {
      m.server.epsilon = v;
    } else if (kv[0] == "mu") {
      m.prox_mu = v;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("method \"", spec, "\": unknown setting \"", kv[0],
                       "\" (lr, beta1, beta2, eps, mu)"));
    }
  }
  if (m.prox_mu < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("method \"", spec, "\": mu must be >= 0"));
  }
  return m;
}

// What a method's settings are, for the progress lines and the table.
std::string Describe(const Method& m) {
  std::string out;
  if (m.server.kind != v1::SERVER_OPTIMIZER_NONE) {
    out = absl::StrFormat("%s lr=%g beta1=%g",
                          ServerOptimizerName(m.server.kind),
                          m.server.learning_rate, m.server.beta1);
    if (m.server.kind != v1::SERVER_OPTIMIZER_MOMENTUM) {
      absl::StrAppendFormat(&out, " beta2=%g eps=%g", m.server.beta2,
                            m.server.epsilon);
    }
  }
  if (m.prox_mu > 0) {
    absl::StrAppendFormat(&out, "%sprox_mu=%g", out.empty() ? "" : " ",
                          m.prox_mu);
  }
  return out.empty() ? "plain FedAvg" : out;
}

std::map<std::string, std::string> LearnerParams(const Flags& flags,
                                                 uint32_t sites, double alpha,
                                                 uint64_t seed, double mu,
                                                 uint32_t index) {
  // The demo's learner params (deploy/local/demo.sh), data_seed varied.
  std::map<std::string, std::string> params = {
      {"sites", absl::StrCat(sites)},
      {"site_index", absl::StrCat(index)},
      {"partition", "dirichlet"},
      {"alpha", absl::StrCat(alpha)},
      {"data_seed", absl::StrCat(seed)},
      {"seed", "1"},
      {"epochs", absl::StrCat(flags.epochs)},
      {"lr", flags.lr},
      {"max_train_samples", absl::StrCat(flags.max_train_samples)},
      {"data_dir", flags.data_dir},
  };
  if (mu > 0) params["prox_mu"] = absl::StrCat(mu);
  return params;
}

// One simulated swarm job (see the top of the file).
absl::StatusOr<Outcome> RunJob(const Shared& shared, const Job& job,
                               const Method& method) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<MlpLearner>> learners;
  for (uint32_t i = 0; i < job.sites; ++i) {
    absl::StatusOr<MlpLearnerOptions> options = ParseMlpLearnerOptions(
        absl::StrCat("site-", i),
        LearnerParams(shared.flags, job.sites, job.alpha, job.seed,
                      method.prox_mu, i));
    if (!options.ok()) return options.status();
    absl::StatusOr<std::unique_ptr<MlpLearner>> learner =
        MlpLearner::Create(*options, shared.train);
    if (!learner.ok()) return learner.status();
    learners.push_back(*std::move(learner));
  }
  absl::StatusOr<Model> initial = learners[0]->InitialModel();
  if (!initial.ok()) return initial.status();
  // The global model, with the optimizer's state once it has one.
  std::shared_ptr<const Model> global =
      std::make_shared<const Model>(*std::move(initial));
  std::shared_ptr<const Model> best;
  double best_score = -1;
  uint32_t best_round = 0;
  const std::atomic<bool> cancel{false};
  v1::JobConfig config;
  config.set_aggregation_method(v1::AGGREGATION_FEDAVG);
  const AggregatorOptions aggregation =
      AggregatorOptions::FromJobConfig(config, "");
  for (uint32_t round = 0; round < shared.flags.rounds; ++round) {
    // What the trainers get: the model without the optimizer's state.
    auto trainable = std::make_shared<const Model>(TrainableViewOf(*global));
    absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
        Aggregator::Create(aggregation, trainable);
    if (!aggregator.ok()) return aggregator.status();
    double score_sum = 0;
    double weight_sum = 0;
    for (auto& learner : learners) {
      absl::StatusOr<Metrics> metrics = learner->Validate(*trainable, round);
      if (!metrics.ok()) return metrics.status();
      absl::StatusOr<TrainOutput> out =
          learner->Train(*trainable, round, cancel);
      if (!out.ok()) return out.status();
      const double weight = static_cast<double>(out->sample_count);
      score_sum += weight * metrics->at("accuracy");
      weight_sum += weight;
      absl::Status added =
          (*aggregator)
              ->Add(out->model, static_cast<int64_t>(out->sample_count),
                    out->kind);
      if (!added.ok()) return added;
    }
    const double score = score_sum / weight_sum;
    if (score > best_score) {  // Strictly better, as the daemon's record.
      best_score = score;
      best = trainable;
      best_round = round;
    }
    absl::StatusOr<Model> mean = (*aggregator)->Finish();
    if (!mean.ok()) return mean.status();
    if (method.server.kind == v1::SERVER_OPTIMIZER_NONE) {
      global = std::make_shared<const Model>(*std::move(mean));
    } else {
      absl::StatusOr<Model> next =
          ApplyServerOptimizer(method.server, *global, *mean, "");
      if (!next.ok()) return next.status();
      global = std::make_shared<const Model>(*std::move(next));
    }
  }
  Outcome outcome;
  absl::StatusOr<Evaluation> best_eval =
      learners[0]->EvaluateTest(*best, &shared.test);
  if (!best_eval.ok()) return best_eval.status();
  absl::StatusOr<Evaluation> last_eval =
      learners[0]->EvaluateTest(TrainableViewOf(*global), &shared.test);
  if (!last_eval.ok()) return last_eval.status();
  outcome.best_test = best_eval->accuracy;
  outcome.best_validation = best_score;
  outcome.best_round = best_round;
  outcome.last_test = last_eval->accuracy;
  outcome.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return outcome;
}

// The central baseline: all the training data, rounds x epochs epochs.
absl::StatusOr<double> RunCentral(const Shared& shared) {
  std::map<std::string, std::string> params =
      LearnerParams(shared.flags, 1, 0.5, 1, 0, 0);
  params["validation_fraction"] = "0";
  params["epochs"] = absl::StrCat(shared.flags.rounds * shared.flags.epochs);
  absl::StatusOr<MlpLearnerOptions> options =
      ParseMlpLearnerOptions("central", params);
  if (!options.ok()) return options.status();
  absl::StatusOr<std::unique_ptr<MlpLearner>> learner =
      MlpLearner::Create(*options, shared.train);
  if (!learner.ok()) return learner.status();
  absl::StatusOr<Model> initial = (*learner)->InitialModel();
  if (!initial.ok()) return initial.status();
  const std::atomic<bool> cancel{false};
  absl::StatusOr<TrainOutput> out = (*learner)->Train(*initial, 0, cancel);
  if (!out.ok()) return out.status();
  absl::StatusOr<Evaluation> eval =
      (*learner)->EvaluateTest(out->model, &shared.test);
  if (!eval.ok()) return eval.status();
  return eval->accuracy;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    }
    if (arg == "--no-central") {
      f.central = false;
      continue;
    }
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
    }
    const std::string value = argv[++i];
    bool ok = true;
    if (arg == "--sites") {
      ok = ParseSites(value, &f.sites);
    } else if (arg == "--alphas" || arg == "--alpha") {
      ok = ParseDoubleList(value, &f.alphas);
    } else if (arg == "--seeds") {
      ok = ParseSeeds(value, &f.seeds);
    } else if (arg == "--methods") {
      f.methods = value;
    } else if (arg == "--rounds") {
      ok = absl::SimpleAtoi(value, &f.rounds) && f.rounds >= 1;
    } else if (arg == "--epochs") {
      ok = absl::SimpleAtoi(value, &f.epochs) && f.epochs >= 1;
    } else if (arg == "--lr") {
      double v;
      ok = absl::SimpleAtod(value, &v) && v > 0;
      f.lr = value;
    } else if (arg == "--momentum-lr" || arg == "--server-lr-momentum") {
      ok = absl::SimpleAtod(value, &f.momentum_lr);
    } else if (arg == "--adam-lr" || arg == "--server-lr-adam") {
      ok = absl::SimpleAtod(value, &f.adam_lr);
    } else if (arg == "--yogi-lr" || arg == "--server-lr-yogi") {
      ok = absl::SimpleAtod(value, &f.yogi_lr);
    } else if (arg == "--server-lr") {  // Every optimizer's.
      ok = absl::SimpleAtod(value, &f.momentum_lr);
      f.adam_lr = f.yogi_lr = f.momentum_lr;
    } else if (arg == "--beta1") {
      ok = absl::SimpleAtod(value, &f.beta1);
    } else if (arg == "--beta2") {
      ok = absl::SimpleAtod(value, &f.beta2);
    } else if (arg == "--epsilon") {
      ok = absl::SimpleAtod(value, &f.epsilon);
    } else if (arg == "--prox-mu") {
      ok = absl::SimpleAtod(value, &f.prox_mu) && f.prox_mu >= 0;
    } else if (arg == "--jobs") {
      ok = absl::SimpleAtoi(value, &f.jobs) && f.jobs >= 1;
    } else if (arg == "--max-train-samples") {
      ok = absl::SimpleAtoi(value, &f.max_train_samples);
    } else if (arg == "--data-dir") {
      f.data_dir = value;
    } else if (arg == "--csv") {
      f.csv = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value for ", arg, ": \"", value, "\""));
    }
  }
  return f;
}

struct Stats {
  double mean = 0, stddev = 0, min = 0, max = 0;
};

Stats StatsOf(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return s;
}

int Main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return Usage(std::string(flags.status().message()));
  std::vector<Method> methods;
  for (absl::string_view spec : absl::StrSplit(flags->methods, ',')) {
    absl::StatusOr<Method> m = ParseMethod(spec, *flags);
    if (!m.ok()) return Usage(std::string(m.status().message()));
    methods.push_back(*std::move(m));
  }
  Shared shared;
  shared.flags = *flags;
  absl::StatusOr<ImageDataset> train =
      LoadFashionMnist(flags->data_dir, FashionMnistSplit::kTrain);
  absl::StatusOr<ImageDataset> test =
      LoadFashionMnist(flags->data_dir, FashionMnistSplit::kTest);
  if (!train.ok() || !test.ok()) {
    std::fprintf(stderr, "quality_bench: %s\n",
                 std::string((!train.ok() ? train : test).status().message())
                     .c_str());
    return 1;
  }
  shared.train = std::make_shared<const ImageDataset>(*std::move(train));
  shared.test = *std::move(test);

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  std::vector<Job> jobs;
  for (uint32_t sites : flags->sites) {
    for (double alpha : flags->alphas) {
      for (size_t m = 0; m < methods.size(); ++m) {
        for (uint64_t seed : flags->seeds) {
          jobs.push_back(Job{sites, alpha, seed, m});
        }
      }
    }
  }
  std::fprintf(stderr,
               "quality_bench: %zu jobs (%zu site counts x %zu alphas x %zu "
               "methods x %zu seeds), %u rounds x %u epoch(s), %u at a "
               "time%s\n",
               jobs.size(), flags->sites.size(), flags->alphas.size(),
               methods.size(), flags->seeds.size(), flags->rounds,
               flags->epochs, flags->jobs,
               flags->central ? ", plus the central baseline" : "");

  // The central baseline runs as one more job beside the others.
  std::vector<absl::StatusOr<Outcome>> outcomes(jobs.size(),
                                                absl::UnknownError("not run"));
  absl::StatusOr<double> central = absl::UnavailableError("not run");
  std::atomic<size_t> next{0};
  std::mutex print_mu;
  const size_t total = jobs.size() + (flags->central ? 1 : 0);
  auto worker = [&] {
    for (size_t k = next++; k < total; k = next++) {
      if (k == jobs.size()) {
        const double t0 = elapsed();
        central = RunCentral(shared);
        std::lock_guard<std::mutex> lock(print_mu);
        std::fprintf(stderr,
                     "[%7.1fs] central, all data, %u epochs: test %s (%.1f s)\n",
                     elapsed(), flags->rounds * flags->epochs,
                     central.ok() ? absl::StrFormat("%.4f", *central).c_str()
                                  : std::string(central.status().message())
                                        .c_str(),
                     elapsed() - t0);
        continue;
      }
      const Job& job = jobs[k];
      outcomes[k] = RunJob(shared, job, methods[job.method]);
      std::lock_guard<std::mutex> lock(print_mu);
      if (outcomes[k].ok()) {
        const Outcome& o = *outcomes[k];
        std::fprintf(stderr,
                     "[%7.1fs] sites=%u alpha=%g seed=%llu %s (%s): best "
                     "round %u validation %.4f test %.4f; last test %.4f "
                     "(%.1f s)\n",
                     elapsed(), job.sites, job.alpha,
                     static_cast<unsigned long long>(job.seed),
                     methods[job.method].label.c_str(),
                     Describe(methods[job.method]).c_str(), o.best_round,
                     o.best_validation, o.best_test, o.last_test, o.seconds);
      } else {
        std::fprintf(stderr, "[%7.1fs] sites=%u alpha=%g seed=%llu %s: %s\n",
                     elapsed(), job.sites, job.alpha,
                     static_cast<unsigned long long>(job.seed),
                     methods[job.method].label.c_str(),
                     std::string(outcomes[k].status().message()).c_str());
      }
      std::fflush(stderr);
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t j = 0; j < std::min<size_t>(flags->jobs, total); ++j) {
    threads.emplace_back(worker);
  }
  for (std::thread& t : threads) t.join();

  bool failed = false;
  if (!flags->csv.empty()) {
    std::FILE* csv = std::fopen(flags->csv.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "quality_bench: cannot write %s\n",
                   flags->csv.c_str());
      failed = true;
    } else {
      std::fprintf(csv,
                   "sites,alpha,seed,method,settings,best_round,"
                   "best_validation_accuracy,best_test_accuracy,"
                   "last_test_accuracy,seconds\n");
      for (size_t k = 0; k < jobs.size(); ++k) {
        if (!outcomes[k].ok()) continue;
        const Outcome& o = *outcomes[k];
        std::fprintf(csv, "%u,%g,%llu,%s,%s,%u,%.4f,%.4f,%.4f,%.1f\n",
                     jobs[k].sites, jobs[k].alpha,
                     static_cast<unsigned long long>(jobs[k].seed),
                     methods[jobs[k].method].label.c_str(),
                     Describe(methods[jobs[k].method]).c_str(), o.best_round,
                     o.best_validation, o.best_test, o.last_test, o.seconds);
      }
      std::fclose(csv);
    }
  }

  // The table.
  std::printf(
      "Fashion-MNIST, built-in MLP, %u rounds x %u epoch(s), lr %s; best "
      "model (by sample-weighted mean validation accuracy) test accuracy "
      "over data seeds %s\n",
      flags->rounds, flags->epochs, flags->lr.c_str(),
      absl::StrJoin(flags->seeds, ",").c_str());
  if (flags->central && central.ok()) {
    std::printf("central (all data, %u epochs): %.4f\n",
                flags->rounds * flags->epochs, *central);
  } else if (flags->central) {
    std::printf("central: failed: %s\n",
                std::string(central.status().message()).c_str());
    failed = true;
  }
  std::printf("%-5s %-5s %-28s %5s %-7s %-7s %-15s %s\n", "sites", "alpha",
              "method", "seeds", "mean", "std", "min..max", "gap to central");
  for (uint32_t sites : flags->sites) {
    for (double alpha : flags->alphas) {
      for (size_t m = 0; m < methods.size(); ++m) {
        std::vector<double> accs;
        for (size_t k = 0; k < jobs.size(); ++k) {
          if (jobs[k].sites == sites && jobs[k].alpha == alpha &&
              jobs[k].method == m) {
            if (outcomes[k].ok()) {
              accs.push_back(outcomes[k]->best_test);
            } else {
              failed = true;
            }
          }
        }
        const Stats s = StatsOf(accs);
        std::string gap = "-";
        if (flags->central && central.ok() && !accs.empty()) {
          gap = absl::StrFormat("%+.2f pt", 100 * (*central - s.mean));
        }
        std::printf("%-5u %-5g %-28s %5zu %.4f  %.4f  %.4f..%.4f %s\n", sites,
                    alpha, methods[m].label.c_str(), accs.size(), s.mean,
                    s.stddev, s.min, s.max, gap.c_str());
      }
    }
  }
  std::printf("settings:\n");
  for (const Method& m : methods) {
    std::printf("  %-28s %s\n", m.label.c_str(), Describe(m).c_str());
  }
  std::printf("total time %.1f s\n", elapsed());
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Main(argc, argv); }
