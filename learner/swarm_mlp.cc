// swarm-mlp: baselines and evaluation for the built-in MLP learner.
//
//   swarm-mlp evaluate --model FILE [--data-dir D]
//       Test accuracy and loss of a safetensors MLP model.
//   swarm-mlp train (--site-index I --sites N | --central) --epochs E
//       [learner flags] [--out FILE]
//       Trains a local-only model on site I's shard (its training part, the
//       same data that site trains on in a swarm job with the same flags), or
//       with --central (= --site-index all) one model on all the training
//       data, from the seeded initial model, for E epochs; prints its test
//       accuracy.
//   swarm-mlp shard --site-index I --sites N [learner flags] --out FILE
//       Writes site I's training and validation indices into the training
//       set (the same split the learner uses) as two text lines,
//       "train i,j,..." and "validation i,j,...": external trainers (the
//       PyTorch example) train on exactly the MLP's data.
//   swarm-mlp simulate --sites N --rounds R [learner flags] [--out FILE]
//       [--csv FILE] [--jobs J]
//       An offline FedAvg of N sites over R rounds, in one process (for
//       tuning; no networking): each round every site validates the global
//       model, trains `epochs` epochs from it, and the sample-weighted mean
//       becomes the next global model.
//
// Learner flags (the learner params of the same name, with '-' for '_'; the
// defaults are the learner's): --data-dir --sites --partition iid|dirichlet
// --alpha --data-seed --validation-fraction --max-train-samples --hidden
// --lr --lr-decay --momentum --balanced-softmax --batch-size --epochs
// --seed --prox-mu (FedProx; simulate); DP-SGD: --dp-noise-multiplier or --dp-target-epsilon with
// --dp-rounds, --dp-delta --dp-clip-norm --dp-sampling-rate.
//
// Output: progress lines on stderr; results on stdout as one line of
// key=value pairs, e.g.
//   test_accuracy=0.8812 test_loss=0.3351 test_samples=10000
// Exit codes: 0 success; 1 failure (missing or corrupted data, unreadable
// model, I/O); 2 bad usage or invalid options (including a split that cannot
// be satisfied).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "gatherer/server_optimizer.h"
#include "learner/fashion_mnist.h"
#include "learner/mlp.h"
#include "learner/mlp_learner.h"
#include "model/model.h"
#include "privacy/rdp.h"

namespace swarm {
namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  swarm-mlp evaluate --model FILE [--data-dir D]\n"
    "  swarm-mlp train (--site-index I --sites N | --central) --epochs E\n"
    "                  [learner flags] [--out FILE]\n"
    "  swarm-mlp shard --site-index I --sites N [learner flags] --out FILE\n"
    "  swarm-mlp simulate --sites N --rounds R [learner flags] [--out FILE]\n"
    "                  [--csv FILE] [--jobs J]\n"
    "learner flags: --data-dir --partition iid|dirichlet --alpha --data-seed\n"
    "  --validation-fraction --max-train-samples --hidden --lr --lr-decay\n"
    "  --momentum --balanced-softmax true|false --batch-size --epochs --seed\n"
    "  --prox-mu (FedProx's mu, for simulate)\n"
    "--site-index all is --central: all the training data, nothing held out.\n";

// Flags that are learner params.
constexpr const char* kLearnerFlags[] = {
    "data-dir",
    "sites",
    "partition",
    "alpha",
    "data-seed",
    "validation-fraction",
    "max-train-samples",
    "hidden",
    "lr",
    "lr-decay",
    "momentum",
    "balanced-softmax",
    "batch-size",
    "epochs",
    "seed",
    "prox-mu",
    "dp-noise-multiplier",
    "dp-target-epsilon",
    "dp-rounds",
    "dp-delta",
    "dp-clip-norm",
    "dp-sampling-rate",
};

enum ExitCode { kOk = 0, kFailed = 1, kUsageError = 2 };

struct Args {
  std::string command;
  std::map<std::string, std::string> values;
  bool central = false;
};

std::string ParamName(absl::string_view flag) {
  return absl::StrReplaceAll(flag, {{"-", "_"}});
}

// Rewrites `learner param "x_y"` in a message as `--x-y`.
std::string FlagMessage(absl::string_view message) {
  std::string out(message);
  for (const char* flag : kLearnerFlags) {
    out = absl::StrReplaceAll(
        out, {{absl::StrCat("learner param \"", ParamName(flag), "\""),
               absl::StrCat("--", flag)}});
  }
  out = absl::StrReplaceAll(out,
                            {{"learner param \"site_index\"", "--site-index"}});
  return out;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "swarm-mlp: %s\n",
               FlagMessage(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? kUsageError
                                                             : kFailed;
}

int Usage(absl::string_view problem) {
  std::fprintf(stderr, "swarm-mlp: %s\n%s", std::string(problem).c_str(),
               kUsage);
  return kUsageError;
}

absl::StatusOr<Args> ParseArgs(int argc, char** argv,
                               const std::set<std::string>& allowed) {
  Args args;
  args.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (allowed.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown flag --%s for \"%s\"", name, args.command));
    }
    if (name == "central") {
      if (has_value) {
        return absl::InvalidArgumentError("--central takes no value");
      }
      args.central = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrFormat("flag --%s needs a value", name));
      }
      value = argv[++i];
    }
    if (!args.values.emplace(name, value).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("flag --%s given twice", name));
    }
  }
  return args;
}

std::set<std::string> LearnerFlagSet() {
  return std::set<std::string>(std::begin(kLearnerFlags),
                               std::end(kLearnerFlags));
}

// The learner params the flags give (for the site "site-<index>").
std::map<std::string, std::string> LearnerParams(const Args& args) {
  std::map<std::string, std::string> params;
  for (const auto& [name, value] : args.values) {
    if (LearnerFlagSet().count(name) > 0) params[ParamName(name)] = value;
  }
  return params;
}

std::string Optional(const Args& args, const std::string& name) {
  auto it = args.values.find(name);
  return it == args.values.end() ? "" : it->second;
}

void PrintEpoch(absl::string_view who, const EpochReport& report) {
  std::fprintf(stderr,
               "%s epoch %u/%u: training loss %.4f, lr %.4g, %llu samples, "
               "%.2f s\n",
               std::string(who).c_str(), report.epoch, report.epochs,
               report.mean_loss, report.learning_rate,
               static_cast<unsigned long long>(report.samples), report.seconds);
  std::fflush(stderr);
}

absl::Status Save(const Model& model, const std::string& path,
                  std::map<std::string, std::string> metadata) {
  absl::Status status = model.SaveSafetensors(path, metadata);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrFormat("cannot write %s: %s",
                                                       path, status.message()));
  }
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return absl::OkStatus();
}

// `model` without the tensors named kServerOptimizerPrefix* (a view over
// the same storage); `model` itself when it has none.
absl::StatusOr<Model> WithoutServerOptimizerState(Model model) {
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> offsets;
  for (size_t i = 0; i < model.num_tensors(); ++i) {
    if (absl::StartsWith(model.spec(i).name, kServerOptimizerPrefix)) continue;
    specs.push_back(model.spec(i));
    offsets.push_back(static_cast<uint64_t>(model.tensor_data(i).data() -
                                            model.storage()->data()));
  }
  if (specs.size() == model.num_tensors()) return model;
  return Model::FromStorage(std::move(specs), std::move(offsets),
                            model.storage());
}

int Evaluate(const Args& args) {
  const std::string model_path = Optional(args, "model");
  if (model_path.empty()) return Usage("evaluate needs --model FILE");
  std::string dir = Optional(args, "data-dir");
  if (dir.empty()) dir = kDefaultFashionMnistDir;
  absl::StatusOr<Model> model = Model::LoadSafetensors(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "swarm-mlp: cannot load %s: %s\n", model_path.c_str(),
                 std::string(model.status().message()).c_str());
    return kFailed;
  }
  // A round's global model under a server optimizer carries the
  // optimizer's state (gatherer/server_optimizer.h): evaluate the model.
  model = WithoutServerOptimizerState(*std::move(model));
  absl::StatusOr<Mlp> net = model.ok() ? Mlp::FromModel(*model)
                                       : absl::StatusOr<Mlp>(model.status());
  if (!net.ok()) {
    std::fprintf(stderr, "swarm-mlp: %s is not an MLP model: %s\n",
                 model_path.c_str(),
                 std::string(net.status().message()).c_str());
    return kFailed;
  }
  absl::StatusOr<ImageDataset> test =
      LoadFashionMnist(dir, FashionMnistSplit::kTest);
  if (!test.ok()) return Fail(test.status());
  absl::StatusOr<Evaluation> eval = swarm::Evaluate(*net, *test);
  if (!eval.ok()) {
    std::fprintf(stderr, "swarm-mlp: %s does not fit the test data: %s\n",
                 model_path.c_str(),
                 std::string(eval.status().message()).c_str());
    return kFailed;
  }
  std::printf("test_accuracy=%.4f test_loss=%.4f test_samples=%llu\n",
              eval->accuracy, eval->loss,
              static_cast<unsigned long long>(eval->samples));
  return kOk;
}

int Train(const Args& args) {
  std::map<std::string, std::string> params = LearnerParams(args);
  const std::string index = Optional(args, "site-index");
  const bool central = args.central || index == "all";
  if (!central && index.empty()) {
    return Usage("train needs --site-index I (with --sites N) or --central");
  }
  if (args.central && !index.empty() && index != "all") {
    return Usage("--central and --site-index exclude each other");
  }
  if (args.values.count("epochs") == 0) return Usage("train needs --epochs E");
  std::string site;
  if (central) {
    params["sites"] = "1";
    params["site_index"] = "0";
    params["validation_fraction"] = "0";
    site = "central";
  } else {
    params["site_index"] = index;
    site = absl::StrCat("site-", index);
  }
  absl::StatusOr<MlpLearnerOptions> options =
      ParseMlpLearnerOptions(site, params);
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<std::unique_ptr<MlpLearner>> learner =
      MlpLearner::Create(*options);
  if (!learner.ok()) return Fail(learner.status());
  const std::string who =
      central
          ? std::string("central")
          : absl::StrFormat("site %u/%u", options->site_index, options->sites);
  (*learner)->set_epoch_callback(
      [&](const EpochReport& report) { PrintEpoch(who, report); });
  absl::StatusOr<Model> initial = (*learner)->InitialModel();
  if (!initial.ok()) return Fail(initial.status());
  std::atomic<bool> cancel{false};
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TrainOutput> trained = (*learner)->Train(*initial, 0, cancel);
  if (!trained.ok()) return Fail(trained.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  absl::StatusOr<Evaluation> eval = (*learner)->EvaluateTest(trained->model);
  if (!eval.ok()) return Fail(eval.status());
  const std::string out = Optional(args, "out");
  if (!out.empty()) {
    absl::Status saved = Save(
        trained->model, out,
        {{"swarm.learner", "mlp"},
         {"swarm.baseline", central ? "central" : "local"},
         {"swarm.epochs", absl::StrCat(options->epochs)},
         {"swarm.test_accuracy", absl::StrFormat("%.4f", eval->accuracy)}});
    if (!saved.ok()) return Fail(saved);
  }
  // DP-SGD: the ε the training spent, for the learner's δ.
  std::string privacy;
  if (trained->privacy.has_value()) {
    const v1::PrivacyCost& cost = *trained->privacy;
    absl::StatusOr<double> epsilon =
        privacy::DpSgdEpsilon(cost.sampling_rate(), cost.noise_multiplier(),
                              cost.steps(), options->dp.delta);
    if (!epsilon.ok()) return Fail(epsilon.status());
    privacy = absl::StrFormat(
        " epsilon=%.4f delta=%g noise_multiplier=%.4f dp_steps=%llu", *epsilon,
        options->dp.delta, cost.noise_multiplier(),
        static_cast<unsigned long long>(cost.steps()));
  }
  std::printf(
      "mode=%s site_index=%s sites=%u epochs=%u train_samples=%llu "
      "train_seconds=%.2f test_accuracy=%.4f test_loss=%.4f%s\n",
      central ? "central" : "local", central ? "all" : index.c_str(),
      options->sites, options->epochs,
      static_cast<unsigned long long>((*learner)->train_data().size()), seconds,
      eval->accuracy, eval->loss, privacy.c_str());
  return kOk;
}

int Shard(const Args& args) {
  std::map<std::string, std::string> params = LearnerParams(args);
  const std::string index = Optional(args, "site-index");
  const std::string out = Optional(args, "out");
  if (index.empty() || out.empty()) {
    return Usage("shard needs --site-index I (with --sites N) and --out FILE");
  }
  params["site_index"] = index;
  absl::StatusOr<MlpLearnerOptions> options =
      ParseMlpLearnerOptions(absl::StrCat("site-", index), params);
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<ImageDataset> train =
      LoadFashionMnist(options->data_dir, FashionMnistSplit::kTrain);
  if (!train.ok()) return Fail(train.status());
  SiteShardOptions shard;
  shard.partition.sites = options->sites;
  shard.partition.kind = options->partition;
  shard.partition.alpha = options->alpha;
  shard.partition.seed = options->data_seed;
  shard.site_index = options->site_index;
  shard.validation_fraction = options->validation_fraction;
  shard.max_samples = options->max_train_samples;
  absl::StatusOr<ShardSplit> split =
      SiteShard(train->labels, train->num_classes, shard);
  if (!split.ok()) return Fail(split.status());
  std::string text =
      absl::StrCat("train ", absl::StrJoin(split->train, ","), "\nvalidation ",
                   absl::StrJoin(split->validation, ","), "\n");
  FILE* file = std::fopen(out.c_str(), "w");
  if (file == nullptr ||
      std::fwrite(text.data(), 1, text.size(), file) != text.size() ||
      std::fclose(file) != 0) {
    std::fprintf(stderr, "swarm-mlp: cannot write %s: %s\n", out.c_str(),
                 std::strerror(errno));
    return kFailed;
  }
  std::printf("site_index=%s train_samples=%zu validation_samples=%zu\n",
              index.c_str(), split->train.size(), split->validation.size());
  return kOk;
}

// The sample-weighted mean of `models` (same layout) into `out`.
absl::Status FedAvg(const std::vector<TrainOutput>& results, Model* out) {
  double total = 0;
  for (const TrainOutput& r : results)
    total += static_cast<double>(r.sample_count);
  for (size_t t = 0; t < out->num_tensors(); ++t) {
    const size_t n = out->spec(t).byte_size / sizeof(float);
    std::vector<double> sum(n, 0.0);
    for (const TrainOutput& r : results) {
      if (!r.model.SameLayout(*out)) {
        return absl::InternalError("results disagree in layout");
      }
      const double w = static_cast<double>(r.sample_count) / total;
      const char* bytes = r.model.tensor_data(t).data();
      for (size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, bytes + i * sizeof(float), sizeof(float));
        sum[i] += w * v;
      }
    }
    char* dst = out->mutable_tensor_data(t).data();
    for (size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(sum[i]);
      std::memcpy(dst + i * sizeof(float), &v, sizeof(float));
    }
  }
  return absl::OkStatus();
}

using SiteLearners = std::vector<std::unique_ptr<MlpLearner>>;

// Reads --rounds and --jobs (default: the hardware threads) and checks that
// --sites is given; kOk or the usage error's exit code.
int ParseSimulateFlags(const Args& args,
                       const std::map<std::string, std::string>& params,
                       uint32_t* rounds, uint32_t* jobs) {
  if (!absl::SimpleAtoi(Optional(args, "rounds"), rounds) || *rounds < 1) {
    return Usage("simulate needs --rounds R (R >= 1)");
  }
  *jobs = std::max(1u, std::thread::hardware_concurrency());
  if (args.values.count("jobs") > 0 &&
      (!absl::SimpleAtoi(args.values.at("jobs"), jobs) || *jobs < 1)) {
    return Usage("--jobs must be a positive integer");
  }
  if (params.count("sites") == 0) return Usage("simulate needs --sites N");
  return kOk;
}

// One learner per site ("site-<s>", s = 0..sites-1), all on the one
// `train` set.
absl::StatusOr<SiteLearners> CreateSiteLearners(
    std::map<std::string, std::string> params,
    std::shared_ptr<const ImageDataset> train) {
  params["site_index"] = "0";
  SWARM_ASSIGN_OR_RETURN(MlpLearnerOptions first,
                         ParseMlpLearnerOptions("site-0", params));
  SiteLearners learners;
  for (uint32_t s = 0; s < first.sites; ++s) {
    params["site_index"] = absl::StrCat(s);
    SWARM_ASSIGN_OR_RETURN(
        MlpLearnerOptions options,
        ParseMlpLearnerOptions(absl::StrCat("site-", s), params));
    SWARM_ASSIGN_OR_RETURN(std::unique_ptr<MlpLearner> learner,
                           MlpLearner::Create(options, train));
    learners.push_back(std::move(learner));
  }
  return learners;
}

// The mean over the sites of their validation accuracy of `global`.
absl::StatusOr<double> MeanValidationAccuracy(const SiteLearners& learners,
                                              const Model& global,
                                              uint32_t round) {
  double validation = 0;
  for (auto& learner : learners) {
    SWARM_ASSIGN_OR_RETURN(Metrics metrics, learner->Validate(global, round));
    validation += metrics.at("accuracy");
  }
  return validation / static_cast<double>(learners.size());
}

// Every site trains from `global`, `jobs` at a time; their FedAvg replaces
// `global`.
absl::Status TrainRound(const SiteLearners& learners, uint32_t jobs,
                        uint32_t round, const std::atomic<bool>& cancel,
                        Model* global) {
  std::vector<absl::StatusOr<TrainOutput>> results(learners.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (uint32_t j = 0; j < std::min<size_t>(jobs, learners.size()); ++j) {
    workers.emplace_back([&] {
      for (size_t s = next++; s < learners.size(); s = next++) {
        results[s] = learners[s]->Train(*global, round, cancel);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  std::vector<TrainOutput> outputs;
  for (auto& result : results) {
    if (!result.ok()) return result.status();
    outputs.push_back(*std::move(result));
  }
  return FedAvg(outputs, global);
}

// The round with the best mean validation accuracy so far.
struct BestRound {
  double validation = -1;
  double test = 0;
  uint32_t round = 0;

  void Update(uint32_t at_round, double validation_accuracy,
              double test_accuracy) {
    if (validation_accuracy > validation) {
      validation = validation_accuracy;
      test = test_accuracy;
      round = at_round;
    }
  }
};

// Progress on stderr and, if `csv` is open, its row for the global model
// after `round` rounds.
void ReportRound(uint32_t round, double validation, const Evaluation& eval,
                 double elapsed, std::FILE* csv) {
  std::fprintf(stderr,
               "round %u: mean validation accuracy %.4f, test accuracy "
               "%.4f, test loss %.4f (%.1f s)\n",
               round, validation, eval.accuracy, eval.loss, elapsed);
  std::fflush(stderr);
  if (csv != nullptr) {
    std::fprintf(csv, "%u,%.4f,%.4f,%.4f\n", round, validation, eval.accuracy,
                 eval.loss);
  }
}

// Runs `rounds` FedAvg rounds on `global`, reporting every global model
// (row r: the model after r rounds; 0: the initial model) and printing the
// summary after the last. kOk or the failure's exit code.
int RunRounds(const SiteLearners& learners, const ImageDataset& test,
              uint32_t rounds, uint32_t jobs, std::FILE* csv, Model* global) {
  std::atomic<bool> cancel{false};
  BestRound best;
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t round = 0; round <= rounds; ++round) {
    absl::StatusOr<double> validation =
        MeanValidationAccuracy(learners, *global, round);
    if (!validation.ok()) return Fail(validation.status());
    absl::StatusOr<Evaluation> eval = learners[0]->EvaluateTest(*global, &test);
    if (!eval.ok()) return Fail(eval.status());
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    ReportRound(round, *validation, *eval, elapsed, csv);
    best.Update(round, *validation, eval->accuracy);
    if (round == rounds) {
      std::printf(
          "rounds=%u sites=%zu final_test_accuracy=%.4f final_test_loss=%.4f "
          "best_round=%u best_validation_accuracy=%.4f "
          "best_test_accuracy=%.4f seconds=%.1f\n",
          rounds, learners.size(), eval->accuracy, eval->loss, best.round,
          best.validation, best.test, elapsed);
      break;
    }
    absl::Status trained = TrainRound(learners, jobs, round, cancel, global);
    if (!trained.ok()) return Fail(trained);
  }
  return kOk;
}

int Simulate(const Args& args) {
  const std::map<std::string, std::string> params = LearnerParams(args);
  uint32_t rounds = 0;
  uint32_t jobs = 0;
  if (int code = ParseSimulateFlags(args, params, &rounds, &jobs);
      code != kOk) {
    return code;
  }
  std::string dir = Optional(args, "data-dir");
  if (dir.empty()) dir = kDefaultFashionMnistDir;
  absl::StatusOr<ImageDataset> train =
      LoadFashionMnist(dir, FashionMnistSplit::kTrain);
  if (!train.ok()) return Fail(train.status());
  absl::StatusOr<ImageDataset> test =
      LoadFashionMnist(dir, FashionMnistSplit::kTest);
  if (!test.ok()) return Fail(test.status());
  absl::StatusOr<SiteLearners> learners = CreateSiteLearners(
      params, std::make_shared<const ImageDataset>(*std::move(train)));
  if (!learners.ok()) return Fail(learners.status());

  std::FILE* csv = nullptr;
  const std::string csv_path = Optional(args, "csv");
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "swarm-mlp: cannot write %s\n", csv_path.c_str());
      return kFailed;
    }
    std::fprintf(csv,
                 "round,mean_validation_accuracy,test_accuracy,test_loss\n");
  }
  absl::StatusOr<Model> global = (*learners)[0]->InitialModel();
  if (!global.ok()) return Fail(global.status());
  if (int code = RunRounds(*learners, *test, rounds, jobs, csv, &*global);
      code != kOk) {
    return code;
  }
  if (csv != nullptr) std::fclose(csv);
  const std::string out = Optional(args, "out");
  if (!out.empty()) {
    absl::Status saved = Save(
        *global, out,
        {{"swarm.learner", "mlp"}, {"swarm.rounds", absl::StrCat(rounds)}});
    if (!saved.ok()) return Fail(saved);
  }
  return kOk;
}

int Main(int argc, char** argv) {
  if (argc < 2) return Usage("missing command");
  const std::string command = argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    std::printf("%s", kUsage);
    return kOk;
  }
  std::set<std::string> allowed;
  int (*run)(const Args&) = nullptr;
  if (command == "evaluate") {
    allowed = {"model", "data-dir"};
    run = &Evaluate;
  } else if (command == "train") {
    allowed = LearnerFlagSet();
    allowed.insert({"site-index", "central", "out"});
    run = &Train;
  } else if (command == "shard") {
    allowed = LearnerFlagSet();
    allowed.insert({"site-index", "out"});
    run = &Shard;
  } else if (command == "simulate") {
    allowed = LearnerFlagSet();
    allowed.insert({"rounds", "out", "csv", "jobs"});
    run = &Simulate;
  } else {
    return Usage(absl::StrFormat("unknown command \"%s\"", command));
  }
  absl::StatusOr<Args> args = ParseArgs(argc, argv, allowed);
  if (!args.ok()) return Usage(args.status().message());
  return run(*args);
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Main(argc, argv); }
