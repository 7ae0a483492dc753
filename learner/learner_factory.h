// Creates a site's Learner from its site config's LearnerConfig.
#ifndef SWARM_LEARNER_LEARNER_FACTORY_H_
#define SWARM_LEARNER_LEARNER_FACTORY_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/map.h"
#include "learner/learner.h"
#include "proto/swarm.pb.h"

namespace swarm {

// config.params with `job_params` merged over them (the job wins).
std::map<std::string, std::string> MergeLearnerParams(
    const v1::LearnerConfig& config,
    const std::map<std::string, std::string>& job_params);

// The same, for a JobConfig's learner_params.
std::map<std::string, std::string> MergeLearnerParams(
    const v1::LearnerConfig& config,
    const google::protobuf::Map<std::string, std::string>& job_params);

// A learner of kind config.kind for `site_name`, with MergeLearnerParams.
// Kinds: "test" (TestLearner), "mlp" (MlpLearner: creating it loads
// Fashion-MNIST and computes the site's shard). Errors are InvalidArgument:
// an empty or unknown kind names it (`learner.kind: unknown learner "foo"
// (known: "test", "mlp")`); a malformed parameter names the parameter. For
// "mlp" also NotFound (dataset missing; names the package to install) and
// DataLoss (corrupted dataset file; names it). Parameters a kind does not
// read are logged as a warning, not refused (a job's params may be meant for
// another kind).
// The daemon's learner: made from the site's LearnerConfig at start-up (so
// a missing dataset shows at once), and made again with a job's
// learner_params merged over the site's when that job is configured.
// Thread-safe: a call in progress keeps using the learner it started with.
class SiteLearner final : public Learner {
 public:
  static absl::StatusOr<std::unique_ptr<SiteLearner>> Create(
      v1::LearnerConfig config, std::string site_name);
  SiteLearner(const SiteLearner&) = delete;
  SiteLearner& operator=(const SiteLearner&) = delete;

  absl::StatusOr<Model> InitialModel() override;
  absl::StatusOr<Metrics> Validate(const Model& global,
                                   uint32_t round) override;
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override;
  absl::Status ConfigureForJob(
      const std::map<std::string, std::string>& job_params) override;

 private:
  SiteLearner(v1::LearnerConfig config, std::string site_name,
              std::shared_ptr<Learner> learner);
  std::shared_ptr<Learner> Current();

  const v1::LearnerConfig config_;
  const std::string site_name_;
  absl::Mutex mu_;
  std::shared_ptr<Learner> learner_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> job_params_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<Learner>> CreateLearner(
    const v1::LearnerConfig& config, absl::string_view site_name,
    const std::map<std::string, std::string>& job_params);

}  // namespace swarm

#endif  // SWARM_LEARNER_LEARNER_FACTORY_H_
