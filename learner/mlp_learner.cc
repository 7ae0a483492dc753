#include "learner/mlp_learner.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "learner/learner_params.h"
#include "learner/random.h"
#include "privacy/rdp.h"

namespace swarm {
namespace {

constexpr const char* kKnownKeys[] = {
    "data_dir",
    "sites",
    "site_index",
    "partition",
    "alpha",
    "data_seed",
    "validation_fraction",
    "max_train_samples",
    "hidden",
    "lr",
    "lr_decay",
    "momentum",
    "balanced_softmax",
    "batch_size",
    "epochs",
    "seed",
    "prox_mu",
    "dp_noise_multiplier",
    "dp_target_epsilon",
    "dp_rounds",
    "dp_delta",
    "dp_clip_norm",
    "dp_sampling_rate",
};

// Stream purpose of the per-round minibatch order ("TRAN").
constexpr uint64_t kStreamTrain = 0x5452414e;

using Param = swarm::LearnerParam;
constexpr auto& Lookup = swarm::LookupLearnerParam;
constexpr auto& BadParam = swarm::BadLearnerParam;

absl::StatusOr<double> ParseDouble(const Param& param, double min, double max,
                                   bool min_inclusive, bool max_inclusive) {
  double value;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(param.value), &value) ||
      !std::isfinite(value)) {
    return BadParam(param, "is not a finite number");
  }
  const bool low = min_inclusive ? value < min : value <= min;
  const bool high = max_inclusive ? value > max : value >= max;
  if (low || high) {
    return BadParam(param, absl::StrFormat("is not in %s%g, %g%s",
                                           min_inclusive ? "[" : "(", min, max,
                                           max_inclusive ? "]" : ")"));
  }
  return value;
}

std::string SizesString(const std::vector<uint32_t>& sizes) {
  return absl::StrFormat("[%s]", absl::StrJoin(sizes, ", "));
}

// "true"/"1" or "false"/"0" (case-insensitive).
absl::StatusOr<bool> ParseBool(const Param& param) {
  const std::string value =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(param.value));
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  return BadParam(param, "is not true or false");
}

// data_dir, sites and site_index.
absl::Status ParseSiteOptions(absl::string_view site,
                              const std::map<std::string, std::string>& params,
                              MlpLearnerOptions& o) {
  if (auto p = Lookup(params, "data_dir", site)) {
    if (absl::StripAsciiWhitespace(p->value).empty()) {
      return BadParam(*p, "is empty");
    }
    o.data_dir = p->value;
  }
  if (auto p = Lookup(params, "sites", site)) {
    SWARM_ASSIGN_OR_RETURN(uint64_t v, ParseUintParam(*p, 1, 1u << 20));
    o.sites = static_cast<uint32_t>(v);
  }
  std::optional<Param> index = Lookup(params, "site_index", site);
  if (index) {
    SWARM_ASSIGN_OR_RETURN(
        uint64_t v,
        ParseUintParam(*index, 0, std::numeric_limits<uint32_t>::max()));
    if (v >= o.sites) {
      return BadParam(*index,
                      absl::StrFormat("is out of range for %d sites (0..%d)",
                                      o.sites, o.sites - 1));
    }
    o.site_index = static_cast<uint32_t>(v);
  } else if (o.sites > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "learner param \"site_index\" (or \"site_index.%s\") is required when "
        "sites is %d",
        site, o.sites));
  }
  return absl::OkStatus();
}

// The data split: partition, alpha, data_seed, validation_fraction and
// max_train_samples.
absl::Status ParseSplitOptions(absl::string_view site,
                               const std::map<std::string, std::string>& params,
                               MlpLearnerOptions& o) {
  if (auto p = Lookup(params, "partition", site)) {
    absl::StatusOr<PartitionKind> kind = ParsePartitionKind(p->value);
    if (!kind.ok()) return BadParam(*p, "is not \"iid\" or \"dirichlet\"");
    o.partition = *kind;
  }
  if (auto p = Lookup(params, "alpha", site)) {
    double value;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(p->value), &value) ||
        !std::isfinite(value)) {
      return BadParam(*p, "is not a finite number");
    }
    if (!(value > 0)) return BadParam(*p, "must be > 0");
    o.alpha = value;
  }
  if (auto p = Lookup(params, "data_seed", site)) {
    SWARM_ASSIGN_OR_RETURN(
        o.data_seed,
        ParseUintParam(*p, 0, std::numeric_limits<uint64_t>::max()));
  }
  if (auto p = Lookup(params, "validation_fraction", site)) {
    SWARM_ASSIGN_OR_RETURN(o.validation_fraction,
                           ParseDouble(*p, 0, 0.9, true, true));
  }
  if (auto p = Lookup(params, "max_train_samples", site)) {
    SWARM_ASSIGN_OR_RETURN(
        o.max_train_samples,
        ParseUintParam(*p, 0, std::numeric_limits<uint32_t>::max()));
  }
  return absl::OkStatus();
}

// The network and its training: hidden, lr, lr_decay, momentum,
// balanced_softmax, batch_size, epochs, seed and prox_mu.
absl::Status ParseTrainingOptions(
    absl::string_view site, const std::map<std::string, std::string>& params,
    MlpLearnerOptions& o) {
  if (auto p = Lookup(params, "hidden", site)) {
    absl::StatusOr<std::vector<uint32_t>> hidden = ParseHiddenSizes(p->value);
    if (!hidden.ok()) return BadParam(*p, hidden.status().message());
    o.hidden = *std::move(hidden);
  }
  if (auto p = Lookup(params, "lr", site)) {
    SWARM_ASSIGN_OR_RETURN(double v, ParseDouble(*p, 0, 100, false, true));
    o.lr = static_cast<float>(v);
  }
  if (auto p = Lookup(params, "lr_decay", site)) {
    SWARM_ASSIGN_OR_RETURN(double v, ParseDouble(*p, 0, 1, false, true));
    o.lr_decay = static_cast<float>(v);
  }
  if (auto p = Lookup(params, "momentum", site)) {
    SWARM_ASSIGN_OR_RETURN(double v, ParseDouble(*p, 0, 1, true, false));
    o.momentum = static_cast<float>(v);
  }
  if (auto p = Lookup(params, "balanced_softmax", site)) {
    SWARM_ASSIGN_OR_RETURN(o.balanced_softmax, ParseBool(*p));
  }
  if (auto p = Lookup(params, "batch_size", site)) {
    SWARM_ASSIGN_OR_RETURN(uint64_t v, ParseUintParam(*p, 1, 1u << 16));
    o.batch_size = static_cast<uint32_t>(v);
  }
  if (auto p = Lookup(params, "epochs", site)) {
    SWARM_ASSIGN_OR_RETURN(uint64_t v, ParseUintParam(*p, 1, 10000));
    o.epochs = static_cast<uint32_t>(v);
  }
  if (auto p = Lookup(params, "seed", site)) {
    SWARM_ASSIGN_OR_RETURN(
        o.seed, ParseUintParam(*p, 0, std::numeric_limits<uint64_t>::max()));
  }
  if (auto p = Lookup(params, "prox_mu", site)) {
    double value;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(p->value), &value) ||
        !std::isfinite(value) ||
        !std::isfinite(static_cast<float>(value))) {
      return BadParam(*p,
                      "is not a finite number (FedProx's mu: >= 0, 0 is off)");
    }
    if (value < 0) {
      return BadParam(*p, "must be >= 0 (FedProx's mu; 0 is off)");
    }
    o.prox_mu = static_cast<float>(value);
  }
  return absl::OkStatus();
}

// Differential privacy: the dp_* parameters.
absl::Status ParseDpOptions(absl::string_view site,
                            const std::map<std::string, std::string>& params,
                            MlpDpOptions& o) {
  if (auto p = Lookup(params, "dp_noise_multiplier", site)) {
    SWARM_ASSIGN_OR_RETURN(o.noise_multiplier,
                           ParseDouble(*p, 0, 1e4, false, true));
  }
  if (auto p = Lookup(params, "dp_target_epsilon", site)) {
    SWARM_ASSIGN_OR_RETURN(o.target_epsilon,
                           ParseDouble(*p, 0, 1e4, false, true));
    if (o.noise_multiplier > 0) {
      return BadParam(*p, "excludes dp_noise_multiplier: set one of them");
    }
  }
  if (auto p = Lookup(params, "dp_rounds", site)) {
    SWARM_ASSIGN_OR_RETURN(uint64_t v, ParseUintParam(*p, 1, 1000000));
    o.rounds = static_cast<uint32_t>(v);
  }
  if (auto p = Lookup(params, "dp_delta", site)) {
    SWARM_ASSIGN_OR_RETURN(o.delta, ParseDouble(*p, 0, 0.1, false, false));
  }
  if (auto p = Lookup(params, "dp_clip_norm", site)) {
    SWARM_ASSIGN_OR_RETURN(double v, ParseDouble(*p, 0, 1e6, false, true));
    o.clip_norm = static_cast<float>(v);
  }
  if (auto p = Lookup(params, "dp_sampling_rate", site)) {
    SWARM_ASSIGN_OR_RETURN(o.sampling_rate, ParseDouble(*p, 0, 1, false, true));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MlpLearnerOptions> ParseMlpLearnerOptions(
    absl::string_view site, const std::map<std::string, std::string>& params) {
  MlpLearnerOptions o;
  o.site = std::string(site);
  SWARM_RETURN_IF_ERROR(ParseSiteOptions(site, params, o));
  SWARM_RETURN_IF_ERROR(ParseSplitOptions(site, params, o));
  SWARM_RETURN_IF_ERROR(ParseTrainingOptions(site, params, o));
  SWARM_RETURN_IF_ERROR(ParseDpOptions(site, params, o.dp));
  return o;
}

std::set<std::string> UnknownMlpLearnerParams(
    const std::map<std::string, std::string>& params) {
  return UnknownLearnerParams(params, kKnownKeys);
}

absl::StatusOr<std::unique_ptr<MlpLearner>> MlpLearner::Create(
    MlpLearnerOptions options, std::shared_ptr<const ImageDataset> train_data) {
  if (options.sites < 1 || options.site_index >= options.sites) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mlp learner: site_index %d is out of range for %d sites",
        options.site_index, options.sites));
  }
  if (options.partition == PartitionKind::kDirichlet &&
      (!(options.alpha > 0) || !std::isfinite(options.alpha))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mlp learner: alpha must be > 0 (got %g)", options.alpha));
  }
  if (options.batch_size < 1 || options.epochs < 1 || !(options.lr > 0) ||
      !(options.lr_decay > 0 && options.lr_decay <= 1) ||
      !(options.momentum >= 0 && options.momentum < 1) ||
      !(options.prox_mu >= 0) || !std::isfinite(options.prox_mu)) {
    return absl::InvalidArgumentError(
        "mlp learner: batch_size and epochs must be >= 1, lr > 0, lr_decay "
        "in (0, 1], momentum in [0, 1), prox_mu finite and >= 0");
  }
  if (train_data == nullptr) {
    SWARM_ASSIGN_OR_RETURN(
        ImageDataset loaded,
        LoadFashionMnist(options.data_dir, FashionMnistSplit::kTrain));
    train_data = std::make_shared<const ImageDataset>(std::move(loaded));
  }
  std::vector<uint32_t> sizes;
  sizes.push_back(train_data->pixels_per_image);
  sizes.insert(sizes.end(), options.hidden.begin(), options.hidden.end());
  sizes.push_back(train_data->num_classes);
  // Checks the sizes once, here, rather than at the first round.
  SWARM_RETURN_IF_ERROR(Mlp::Create(sizes, options.seed).status());

  SiteShardOptions shard;
  shard.partition.sites = options.sites;
  shard.partition.kind = options.partition;
  shard.partition.alpha = options.alpha;
  shard.partition.seed = options.data_seed;
  shard.site_index = options.site_index;
  shard.validation_fraction = options.validation_fraction;
  shard.max_samples = options.max_train_samples;
  absl::StatusOr<ShardSplit> split =
      SiteShard(train_data->labels, train_data->num_classes, shard);
  if (!split.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("mlp learner (site %s): data split: %s", options.site,
                        split.status().message()));
  }
  ImageDataset train = train_data->Subset(split->train);
  ImageDataset validation = train_data->Subset(split->validation);
  auto learner = std::unique_ptr<MlpLearner>(
      new MlpLearner(std::move(options), std::move(sizes), std::move(train),
                     std::move(validation)));
  SWARM_LOG_INFO("%s", learner->Describe());
  return learner;
}

MlpLearner::MlpLearner(MlpLearnerOptions options, std::vector<uint32_t> sizes,
                       ImageDataset train, ImageDataset validation)
    : options_(std::move(options)),
      sizes_(std::move(sizes)),
      train_(std::move(train)),
      validation_(std::move(validation)) {}

std::string MlpLearner::Describe() const {
  std::string split =
      options_.partition == PartitionKind::kDirichlet
          ? absl::StrFormat("dirichlet alpha=%g", options_.alpha)
          : std::string("iid");
  return absl::StrFormat(
      "mlp learner (site %s): shard %d of %d (%s, data_seed %d): %d training "
      "and %d validation samples, per class [%s]; network %s%s",
      options_.site, options_.site_index, options_.sites, split,
      options_.data_seed, train_.size(), validation_.size(),
      absl::StrJoin(train_.ClassCounts(), " "), SizesString(sizes_),
      options_.prox_mu > 0
          ? absl::StrFormat("; FedProx mu=%g", options_.prox_mu)
          : std::string());
}

absl::StatusOr<Model> MlpLearner::InitialModel() {
  SWARM_ASSIGN_OR_RETURN(Mlp net, Mlp::Create(sizes_, options_.seed));
  return net.ToModel();
}

absl::StatusOr<Mlp> MlpLearner::Load(const Model& model,
                                     absl::string_view what) const {
  absl::StatusOr<Mlp> net = Mlp::FromModel(model);
  if (!net.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("mlp learner (site %s): %s: %s", options_.site, what,
                        net.status().message()));
  }
  if (net->sizes() != sizes_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mlp learner (site %s): %s is an MLP %s but this site is configured "
        "for %s (learner param \"hidden\")",
        options_.site, what, SizesString(net->sizes()), SizesString(sizes_)));
  }
  return net;
}

absl::StatusOr<Metrics> MlpLearner::Validate(const Model& global,
                                             uint32_t round) {
  if (validation_.size() == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "mlp learner (site %s): no validation data (validation_fraction 0)",
        options_.site));
  }
  SWARM_ASSIGN_OR_RETURN(
      Mlp net, Load(global, absl::StrFormat("round %d: global model", round)));
  SWARM_ASSIGN_OR_RETURN(Evaluation eval, Evaluate(net, validation_));
  return Metrics{{"accuracy", eval.accuracy}, {"loss", eval.loss}};
}

absl::StatusOr<TrainOutput> MlpLearner::Train(const Model& global,
                                              uint32_t round,
                                              const std::atomic<bool>& cancel) {
  if (cancel.load(std::memory_order_acquire)) {
    return absl::CancelledError(
        absl::StrFormat("mlp learner (site %s): training of round %d cancelled",
                        options_.site, round));
  }
  SWARM_ASSIGN_OR_RETURN(
      Mlp net, Load(global, absl::StrFormat("round %d: global model", round)));
  // FedProx's anchor: the global model the round starts from.
  std::vector<MlpLayer> anchor;
  if (options_.prox_mu > 0) anchor = net.layers();
  if (options_.dp.enabled())
    return TrainPrivatelyOutput(global, net, anchor, round, cancel);
  SgdOptions sgd;
  sgd.learning_rate = options_.lr;
  sgd.lr_decay = options_.lr_decay;
  sgd.first_epoch = uint64_t{round} * options_.epochs;
  sgd.momentum = options_.momentum;
  sgd.balanced_softmax = options_.balanced_softmax;
  sgd.batch_size = options_.batch_size;
  sgd.epochs = options_.epochs;
  sgd.shuffle_seed = PortableRng::ForStream(options_.seed, kStreamTrain, round,
                                            options_.site_index)
                         .Next();
  if (options_.prox_mu > 0) {
    sgd.prox_mu = options_.prox_mu;
    sgd.prox_anchor = &anchor;
  }
  const auto start = std::chrono::steady_clock::now();
  double last_loss = 0;
  absl::Status trained =
      TrainSgd(net, train_, {}, sgd, &cancel, [&](const EpochReport& report) {
        last_loss = report.mean_loss;
        if (epoch_callback_) epoch_callback_(report);
      });
  if (!trained.ok()) {
    return absl::Status(
        trained.code(),
        absl::StrFormat("mlp learner (site %s): round %d: %s", options_.site,
                        round, trained.message()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  SWARM_LOG_INFO(
      "mlp learner (site %s): round %d: %d epoch(s) on %d samples in %.2f s, "
      "training loss %.4f",
      options_.site, round, options_.epochs, train_.size(), seconds, last_loss);

  TrainOutput out;
  SWARM_ASSIGN_OR_RETURN(out.model, global.Clone());
  SWARM_RETURN_IF_ERROR(net.WriteTo(&out.model));
  out.model.metadata().clear();  // The controller writes its own.
  out.sample_count = train_.size();
  out.kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
  if (cancel.load(std::memory_order_acquire)) {
    return absl::CancelledError(
        absl::StrFormat("mlp learner (site %s): training of round %d cancelled",
                        options_.site, round));
  }
  return out;
}

absl::StatusOr<DpSgdOptions> MlpLearner::DpSettings() {
  const MlpDpOptions& o = options_.dp;
  DpSgdOptions dp;
  dp.clip_norm = o.clip_norm;
  dp.sampling_rate =
      o.sampling_rate > 0
          ? o.sampling_rate
          : std::min(1.0, static_cast<double>(options_.batch_size) /
                              static_cast<double>(
                                  std::max<size_t>(train_.size(), 1)));
  dp.steps = DpSgdSteps(options_.epochs, dp.sampling_rate);
  if (o.noise_multiplier > 0) {
    dp.noise_multiplier = o.noise_multiplier;
    return dp;
  }
  if (dp_sigma_ == 0) {
    if (o.rounds == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "mlp learner (site %s): learner param \"dp_target_epsilon\" needs "
          "\"dp_rounds\", the rounds planned",
          options_.site));
    }
    SWARM_ASSIGN_OR_RETURN(dp_sigma_, privacy::NoiseMultiplierForEpsilon(
                                          dp.sampling_rate, dp.steps * o.rounds,
                                          o.target_epsilon, o.delta));
    SWARM_LOG_INFO(
        "mlp learner (site %s): DP-SGD noise multiplier %.4g for epsilon %g "
        "(delta %g) over %d rounds of %d steps at q=%.4g",
        options_.site, dp_sigma_, o.target_epsilon, o.delta, o.rounds, dp.steps,
        dp.sampling_rate);
  }
  dp.noise_multiplier = dp_sigma_;
  return dp;
}

absl::StatusOr<TrainOutput> MlpLearner::TrainPrivatelyOutput(
    const Model& global, Mlp& net, const std::vector<MlpLayer>& anchor,
    uint32_t round, const std::atomic<bool>& cancel) {
  SWARM_ASSIGN_OR_RETURN(DpSgdOptions dp, DpSettings());
  SgdOptions sgd;
  sgd.learning_rate = options_.lr;
  sgd.lr_decay = options_.lr_decay;
  sgd.first_epoch = uint64_t{round} * options_.epochs;
  sgd.momentum = options_.momentum;
  sgd.balanced_softmax = false;
  if (options_.prox_mu > 0) {  // After clipping and noise (dp_sgd.h).
    sgd.prox_mu = options_.prox_mu;
    sgd.prox_anchor = &anchor;
  }
  absl::StatusOr<DpSgdReport> report =
      TrainDpSgd(net, train_, {}, sgd, dp, &cancel);
  if (!report.ok()) {
    return absl::Status(
        report.status().code(),
        absl::StrFormat("mlp learner (site %s): round %d: %s", options_.site,
                        round, report.status().message()));
  }
  SWARM_LOG_INFO(
      "mlp learner (site %s): round %d: DP-SGD %d steps (q=%.4g, sigma=%.4g, "
      "clip %g) on %d samples in %.2f s, loss %.4f, %.0f%% clipped",
      options_.site, round, report->steps, dp.sampling_rate,
      dp.noise_multiplier, dp.clip_norm, train_.size(), report->seconds,
      report->mean_loss, 100 * report->clipped_fraction);
  TrainOutput out;
  SWARM_ASSIGN_OR_RETURN(out.model, global.Clone());
  SWARM_RETURN_IF_ERROR(net.WriteTo(&out.model));
  out.model.metadata().clear();
  out.sample_count = train_.size();
  out.kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
  v1::PrivacyCost cost;
  cost.set_sampling_rate(dp.sampling_rate);
  cost.set_noise_multiplier(dp.noise_multiplier);
  cost.set_steps(dp.steps);
  out.privacy = cost;
  if (cancel.load(std::memory_order_acquire)) {
    return absl::CancelledError(
        absl::StrFormat("mlp learner (site %s): training of round %d cancelled",
                        options_.site, round));
  }
  return out;
}

absl::StatusOr<Evaluation> MlpLearner::EvaluateTest(
    const Model& model, const ImageDataset* test_data) {
  if (test_data == nullptr) {
    if (test_ == nullptr) {
      SWARM_ASSIGN_OR_RETURN(
          ImageDataset loaded,
          LoadFashionMnist(options_.data_dir, FashionMnistSplit::kTest));
      test_ = std::make_unique<ImageDataset>(std::move(loaded));
    }
    test_data = test_.get();
  }
  SWARM_ASSIGN_OR_RETURN(Mlp net, Load(model, "model"));
  return Evaluate(net, *test_data);
}

}  // namespace swarm
