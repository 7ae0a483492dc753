#include "learner/attack.h"

#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "learner/learner_params.h"

namespace swarm {
namespace {

constexpr const char* kAttackKeys[] = {
    "attack",         "attack_scale",     "attack_noise",
    "attack_z",       "attack_colluders", "attack_honest_sites",
    "attack_samples", "attack_metric",    "attack_metric_name"};

absl::StatusOr<double> ReadDouble(const LearnerParam& param) {
  double value = 0;
  if (!absl::SimpleAtod(param.value, &value) || !std::isfinite(value)) {
    return BadLearnerParam(param, "is not a finite number");
  }
  return value;
}

absl::StatusOr<AttackMode> ReadMode(const LearnerParam& param) {
  const std::string mode = absl::AsciiStrToLower(param.value);
  if (mode == "none" || mode.empty()) return AttackMode::kNone;
  if (mode == "sign_flip") return AttackMode::kSignFlip;
  if (mode == "scaling") return AttackMode::kScaling;
  if (mode == "noise") return AttackMode::kNoise;
  if (mode == "alie") return AttackMode::kAlie;
  if (mode == "ipm") return AttackMode::kIpm;
  return BadLearnerParam(
      param, "is not an attack (none, sign_flip, scaling, noise, alie, ipm)");
}

// The F32 values of tensor `t`.
float* F32(Model& model, size_t t) {
  return reinterpret_cast<float*>(model.mutable_tensor_data(t).data());
}
const float* F32(const Model& model, size_t t) {
  return reinterpret_cast<const float*>(model.tensor_data(t).data());
}
uint64_t Count(const Model& model, size_t t) {
  return model.spec(t).byte_size / sizeof(float);
}

absl::StatusOr<Model> Copy(const Model& model) {
  SWARM_ASSIGN_OR_RETURN(Model copy, Model::Create(model.specs()));
  for (size_t t = 0; t < model.num_tensors(); ++t) {
    std::memcpy(copy.mutable_tensor_data(t).data(), model.tensor_data(t).data(),
                model.spec(t).byte_size);
  }
  return copy;
}

class AttackingLearner final : public Learner {
 public:
  AttackingLearner(std::unique_ptr<Learner> inner, AttackOptions options,
                   std::vector<std::unique_ptr<Learner>> honest)
      : inner_(std::move(inner)),
        options_(std::move(options)),
        honest_(std::move(honest)) {}

  absl::StatusOr<Model> InitialModel() override {
    return inner_->InitialModel();
  }

  absl::StatusOr<Metrics> Validate(const Model& global,
                                   uint32_t round) override {
    SWARM_ASSIGN_OR_RETURN(Metrics metrics, inner_->Validate(global, round));
    if (options_.metric.has_value()) {
      metrics[options_.metric_name] = *options_.metric;
    }
    return metrics;
  }

  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override;

  absl::Status ConfigureForJob(
      const std::map<std::string, std::string>& job_params) override {
    return inner_->ConfigureForJob(job_params);
  }
  std::string WaitingFor() override { return inner_->WaitingFor(); }
  void SetWaitingListener(std::function<void()> changed) override {
    inner_->SetWaitingListener(std::move(changed));
  }

 private:
  // `trained` (full weights) becomes the attacker's full weights.
  absl::Status Poison(const Model& global, uint32_t round, Model& trained);
  // ALIE and IPM: the honest sites' full weights of this round.
  absl::StatusOr<std::vector<Model>> HonestResults(
      const Model& global, uint32_t round, const std::atomic<bool>& cancel);
  absl::Status Collude(const Model& global, const std::vector<Model>& honest,
                       Model& out) const;

  std::unique_ptr<Learner> inner_;
  const AttackOptions options_;
  std::vector<std::unique_ptr<Learner>> honest_;
};

// Adds sign * global to the F32 tensors of `model`.
void AddGlobal(const Model& global, double sign, Model& model) {
  for (size_t t = 0; t < model.num_tensors(); ++t) {
    if (model.spec(t).dtype != v1::DTYPE_F32) continue;
    float* x = F32(model, t);
    const float* g = F32(global, t);
    for (uint64_t i = 0; i < Count(model, t); ++i) {
      x[i] = static_cast<float>(x[i] + sign * g[i]);
    }
  }
}

absl::StatusOr<TrainOutput> AttackingLearner::Train(
    const Model& global, uint32_t round, const std::atomic<bool>& cancel) {
  // ALIE and IPM do not need the attacker's own result; it still trains, so
  // that its timing and sample count look like a trainer's.
  SWARM_ASSIGN_OR_RETURN(TrainOutput out, inner_->Train(global, round, cancel));
  if (options_.mode != AttackMode::kNone) {
    // Attacks work on full weights; the result keeps the kind it had.
    const bool diff = out.kind == v1::PAYLOAD_KIND_WEIGHT_DIFF;
    SWARM_ASSIGN_OR_RETURN(Model full, Copy(out.model));
    if (diff) AddGlobal(global, 1, full);
    if (options_.mode == AttackMode::kAlie ||
        options_.mode == AttackMode::kIpm) {
      SWARM_ASSIGN_OR_RETURN(std::vector<Model> honest,
                             HonestResults(global, round, cancel));
      SWARM_RETURN_IF_ERROR(Collude(global, honest, full));
    } else {
      SWARM_RETURN_IF_ERROR(Poison(global, round, full));
    }
    if (diff) AddGlobal(global, -1, full);
    out.model = std::move(full);
  }
  out.sample_count *= options_.sample_multiplier;
  return out;
}

absl::Status AttackingLearner::Poison(const Model& global, uint32_t round,
                                      Model& trained) {
  std::mt19937_64 random(options_.seed * 0x9e3779b97f4a7c15ull + round);
  std::normal_distribution<double> normal(0.0, options_.noise);
  for (size_t t = 0; t < trained.num_tensors(); ++t) {
    if (trained.spec(t).dtype != v1::DTYPE_F32) continue;
    float* x = F32(trained, t);
    const float* g = F32(global, t);
    for (uint64_t i = 0; i < Count(trained, t); ++i) {
      const double update = static_cast<double>(x[i]) - g[i];
      double value = x[i];
      switch (options_.mode) {
        case AttackMode::kSignFlip:
          value = g[i] - options_.scale * update;
          break;
        case AttackMode::kScaling:
          value = g[i] + options_.scale * update;
          break;
        case AttackMode::kNoise:
          value = g[i] + normal(random);
          break;
        default:
          break;
      }
      x[i] = static_cast<float>(value);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Model>> AttackingLearner::HonestResults(
    const Model& global, uint32_t round, const std::atomic<bool>& cancel) {
  std::vector<Model> results;
  for (const std::unique_ptr<Learner>& learner : honest_) {
    SWARM_ASSIGN_OR_RETURN(TrainOutput trained,
                           learner->Train(global, round, cancel));
    SWARM_ASSIGN_OR_RETURN(Model full, Copy(trained.model));
    if (trained.kind == v1::PAYLOAD_KIND_WEIGHT_DIFF) {
      AddGlobal(global, 1, full);
    }
    results.push_back(std::move(full));
  }
  return results;
}

absl::Status AttackingLearner::Collude(const Model& global,
                                       const std::vector<Model>& honest,
                                       Model& out) const {
  const double n = static_cast<double>(honest.size());
  const double z =
      options_.z != 0
          ? options_.z
          : AlieZ(static_cast<int>(honest.size()) + options_.colluders,
                  options_.colluders);
  for (size_t t = 0; t < out.num_tensors(); ++t) {
    if (out.spec(t).dtype != v1::DTYPE_F32) continue;
    float* x = F32(out, t);
    const float* g = F32(global, t);
    for (uint64_t i = 0; i < Count(out, t); ++i) {
      double sum = 0;
      double squares = 0;
      for (const Model& model : honest) {
        const double value = F32(model, t)[i];
        sum += value;
        squares += value * value;
      }
      const double mean = sum / n;
      const double variance = std::max(0.0, squares / n - mean * mean);
      const double value =
          options_.mode == AttackMode::kAlie
              ? mean - z * std::sqrt(variance)
              : g[i] - options_.scale * (mean - static_cast<double>(g[i]));
      x[i] = static_cast<float>(value);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttackOptions> ParseAttackOptions(
    absl::string_view site, const std::map<std::string, std::string>& params) {
  AttackOptions options;
  const auto lookup = [&](absl::string_view key) {
    return LookupLearnerParam(params, key, site);
  };
  if (auto p = lookup("attack")) {
    SWARM_ASSIGN_OR_RETURN(options.mode, ReadMode(*p));
  }
  options.scale = options.mode == AttackMode::kScaling ? 10.0
                  : options.mode == AttackMode::kIpm   ? 0.5
                                                       : 1.0;
  if (auto p = lookup("attack_scale")) {
    SWARM_ASSIGN_OR_RETURN(options.scale, ReadDouble(*p));
  }
  if (auto p = lookup("attack_noise")) {
    SWARM_ASSIGN_OR_RETURN(options.noise, ReadDouble(*p));
    if (options.noise < 0) return BadLearnerParam(*p, "is negative");
  }
  if (auto p = lookup("attack_z")) {
    SWARM_ASSIGN_OR_RETURN(options.z, ReadDouble(*p));
  }
  if (auto p = lookup("attack_colluders")) {
    if (!absl::SimpleAtoi(p->value, &options.colluders) ||
        options.colluders < 1) {
      return BadLearnerParam(*p, "is not a count >= 1");
    }
  }
  if (auto p = lookup("attack_honest_sites")) {
    for (absl::string_view name : absl::StrSplit(p->value, ',')) {
      name = absl::StripAsciiWhitespace(name);
      if (!name.empty()) options.honest_sites.emplace_back(name);
    }
  }
  if (auto p = lookup("attack_samples")) {
    if (!absl::SimpleAtoi(p->value, &options.sample_multiplier) ||
        options.sample_multiplier < 1) {
      return BadLearnerParam(*p, "is not a multiplier >= 1");
    }
  }
  if (auto p = lookup("attack_metric")) {
    SWARM_ASSIGN_OR_RETURN(double metric, ReadDouble(*p));
    options.metric = metric;
  }
  if (auto p = lookup("attack_metric_name")) options.metric_name = p->value;
  if (auto p = lookup("seed")) {
    uint64_t seed = 0;
    if (absl::SimpleAtoi(p->value, &seed)) options.seed = seed;
  }
  if ((options.mode == AttackMode::kAlie || options.mode == AttackMode::kIpm) &&
      options.honest_sites.empty()) {
    return absl::InvalidArgumentError(
        "learner param \"attack_honest_sites\": required by the alie and ipm "
        "attacks (the sites whose updates the attacker computes)");
  }
  return options;
}

bool IsAttackParam(absl::string_view key) {
  for (const char* known : kAttackKeys) {
    if (key == known) return true;
    if (key.size() > std::strlen(known) + 1 && key.rfind(known, 0) == 0 &&
        key[std::strlen(known)] == '.') {
      return true;
    }
  }
  return false;
}

double AlieZ(int n, int f) {
  const int s = n / 2 + 1 - f;
  const double p = static_cast<double>(n - s) / n;
  // Phi^-1(p) by bisection on Phi(x) = erfc(-x / sqrt(2)) / 2.
  double low = -10;
  double high = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (low + high);
    if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) {
      low = mid;
    } else {
      high = mid;
    }
  }
  return 0.5 * (low + high);
}

std::unique_ptr<Learner> NewAttackingLearner(
    std::unique_ptr<Learner> inner, AttackOptions options,
    std::vector<std::unique_ptr<Learner>> honest) {
  return std::make_unique<AttackingLearner>(
      std::move(inner), std::move(options), std::move(honest));
}

}  // namespace swarm
