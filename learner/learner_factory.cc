#include "learner/learner_factory.h"

#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "learner/attack.h"
#include "learner/mlp_learner.h"
#include "learner/test_learner.h"

namespace swarm {

std::map<std::string, std::string> MergeLearnerParams(
    const v1::LearnerConfig& config,
    const std::map<std::string, std::string>& job_params) {
  std::map<std::string, std::string> merged(config.params().begin(),
                                            config.params().end());
  for (const auto& [key, value] : job_params) merged[key] = value;
  return merged;
}

std::map<std::string, std::string> MergeLearnerParams(
    const v1::LearnerConfig& config,
    const google::protobuf::Map<std::string, std::string>& job_params) {
  return MergeLearnerParams(config, std::map<std::string, std::string>(
                                        job_params.begin(), job_params.end()));
}

namespace {

// Keys a learner kind does not read, less the attack keys (attack.h).
std::set<std::string> WithoutAttackParams(std::set<std::string> unknown) {
  for (auto it = unknown.begin(); it != unknown.end();) {
    it = IsAttackParam(*it) ? unknown.erase(it) : std::next(it);
  }
  return unknown;
}

// The learner of kind config.kind for `site_name`, without any attack.
absl::StatusOr<std::unique_ptr<Learner>> CreatePlainLearner(
    const v1::LearnerConfig& config, absl::string_view site_name,
    const std::map<std::string, std::string>& params) {
  if (config.kind().empty()) {
    return absl::InvalidArgumentError(
        "learner.kind: empty (known: \"test\", \"mlp\")");
  }
  if (config.kind() == "test") {
    SWARM_ASSIGN_OR_RETURN(TestLearnerOptions options,
                           ParseTestLearnerOptions(site_name, params));
    std::set<std::string> unknown =
        WithoutAttackParams(UnknownTestLearnerParams(params));
    if (!unknown.empty()) {
      SWARM_LOG_WARNING("test learner ignores learner params: %s",
                        absl::StrJoin(unknown, ", "));
    }
    SWARM_ASSIGN_OR_RETURN(std::unique_ptr<TestLearner> learner,
                           TestLearner::Create(std::move(options)));
    return std::unique_ptr<Learner>(std::move(learner));
  }
  if (config.kind() == "mlp") {
    SWARM_ASSIGN_OR_RETURN(MlpLearnerOptions options,
                           ParseMlpLearnerOptions(site_name, params));
    std::set<std::string> unknown =
        WithoutAttackParams(UnknownMlpLearnerParams(params));
    if (!unknown.empty()) {
      SWARM_LOG_WARNING("mlp learner ignores learner params: %s",
                        absl::StrJoin(unknown, ", "));
    }
    SWARM_ASSIGN_OR_RETURN(std::unique_ptr<MlpLearner> learner,
                           MlpLearner::Create(std::move(options)));
    return std::unique_ptr<Learner>(std::move(learner));
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("learner.kind: unknown learner \"%s\" (known: \"test\", "
                      "\"mlp\")",
                      config.kind()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Learner>> CreateLearner(
    const v1::LearnerConfig& config, absl::string_view site_name,
    const std::map<std::string, std::string>& job_params) {
  const std::map<std::string, std::string> params =
      MergeLearnerParams(config, job_params);
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<Learner> learner,
                         CreatePlainLearner(config, site_name, params));
  SWARM_ASSIGN_OR_RETURN(AttackOptions attack,
                         ParseAttackOptions(site_name, params));
  if (!attack.active()) return learner;
  // ALIE and IPM: the honest sites' learners, from the same params (see
  // attack.h for why this is what the attacker is assumed to know).
  std::vector<std::unique_ptr<Learner>> honest;
  if (attack.mode == AttackMode::kAlie || attack.mode == AttackMode::kIpm) {
    for (const std::string& name : attack.honest_sites) {
      SWARM_ASSIGN_OR_RETURN(std::unique_ptr<Learner> peer,
                             CreatePlainLearner(config, name, params));
      honest.push_back(std::move(peer));
    }
  }
  SWARM_LOG_WARNING("site %s's learner attacks (learner param \"attack\")",
                    site_name);
  return NewAttackingLearner(std::move(learner), std::move(attack),
                             std::move(honest));
}

absl::StatusOr<std::unique_ptr<SiteLearner>> SiteLearner::Create(
    v1::LearnerConfig config, std::string site_name) {
  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(config, site_name, {});
  if (!learner.ok()) return learner.status();
  return std::unique_ptr<SiteLearner>(new SiteLearner(
      std::move(config), std::move(site_name), std::move(*learner)));
}

SiteLearner::SiteLearner(v1::LearnerConfig config, std::string site_name,
                         std::shared_ptr<Learner> learner)
    : config_(std::move(config)),
      site_name_(std::move(site_name)),
      learner_(std::move(learner)) {}

std::shared_ptr<Learner> SiteLearner::Current() {
  absl::MutexLock lock(&mu_);
  return learner_;
}

absl::StatusOr<Model> SiteLearner::InitialModel() {
  return Current()->InitialModel();
}

absl::StatusOr<Metrics> SiteLearner::Validate(const Model& global,
                                              uint32_t round) {
  return Current()->Validate(global, round);
}

absl::StatusOr<TrainOutput> SiteLearner::Train(
    const Model& global, uint32_t round, const std::atomic<bool>& cancel) {
  return Current()->Train(global, round, cancel);
}

absl::Status SiteLearner::ConfigureForJob(
    const std::map<std::string, std::string>& job_params) {
  {
    absl::MutexLock lock(&mu_);
    if (job_params == job_params_) return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(config_, site_name_, job_params);
  if (!learner.ok()) return learner.status();
  absl::MutexLock lock(&mu_);
  learner_ = std::move(*learner);
  job_params_ = job_params;
  return absl::OkStatus();
}

}  // namespace swarm
