#include "learner/learner_factory.h"

#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
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

absl::StatusOr<std::unique_ptr<Learner>> CreateLearner(
    const v1::LearnerConfig& config, absl::string_view site_name,
    const std::map<std::string, std::string>& job_params) {
  const std::map<std::string, std::string> params =
      MergeLearnerParams(config, job_params);
  if (config.kind().empty()) {
    return absl::InvalidArgumentError(
        "learner.kind: empty (known: \"test\", \"mlp\")");
  }
  if (config.kind() == "test") {
    SWARM_ASSIGN_OR_RETURN(TestLearnerOptions options,
                           ParseTestLearnerOptions(site_name, params));
    std::set<std::string> unknown = UnknownTestLearnerParams(params);
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
    std::set<std::string> unknown = UnknownMlpLearnerParams(params);
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
