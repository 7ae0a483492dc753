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

}  // namespace swarm
