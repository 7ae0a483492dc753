// The Learner interface: how a site's controller validates and trains a
// global model (design section 2: training comes through a small interface).
//
// Implementations: TestLearner (test_learner.h, deterministic, for tests and
// benchmarks) and MlpLearner (mlp_learner.h, the built-in Fashion-MNIST MLP).
// Create one with CreateLearner, or a SiteLearner that follows each job's
// learner_params (learner_factory.h).
#ifndef SWARM_LEARNER_LEARNER_H_
#define SWARM_LEARNER_LEARNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {

// What training produced for one round.
struct TrainOutput {
  // Full weights, or weights minus the round's global model (see `kind`);
  // same layout as the global model.
  Model model;
  // Training samples behind `model` (the FedAvg weight).
  uint64_t sample_count = 0;
  v1::PayloadKind kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
  // The privacy cost of this training (DP-SGD's sampling rate, noise
  // multiplier and steps) when it was differentially private; the site's
  // accountant charges it before the result leaves (docs/privacy.md).
  std::optional<v1::PrivacyCost> privacy;
  // The site's privacy spend on the job once this result was charged (set by
  // the site's accountant, privacy/private_learner.h): it travels with the
  // result to the aggregator and on into the final models' metadata.
  std::optional<v1::PrivacySpent> spent;
};

// A learner that will not train again in the current job (e.g. its site's
// privacy budget is spent) fails Validate or Train with a status carrying
// this payload (StoppedForJob): the site tells the round's aggregator, which
// ends the job early when too few trainers remain.
inline constexpr char kStoppedForJobPayload[] = "swarm.learner/stopped_for_job";

// `status` with the stopped-for-job mark.
inline absl::Status MarkStoppedForJob(absl::Status status) {
  status.SetPayload(kStoppedForJobPayload, absl::Cord("1"));
  return status;
}

// Whether `status` carries the stopped-for-job mark.
inline bool StoppedForJob(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kStoppedForJobPayload).has_value();
}

// Metric name -> value, e.g. {"accuracy": 0.91, "loss": 0.27}.
using Metrics = std::map<std::string, double>;

// Called from a worker thread, never concurrently on one instance.
class Learner {
 public:
  virtual ~Learner() = default;

  // The first round's global model (used by the starting site).
  virtual absl::StatusOr<Model> InitialModel() = 0;

  // Metrics of `global` on this site's validation data (e.g. "accuracy",
  // "loss").
  virtual absl::StatusOr<Metrics> Validate(const Model& global,
                                           uint32_t round) = 0;

  // Trains from `global`. Returns Cancelled promptly once `cancel` is true.
  virtual absl::StatusOr<TrainOutput> Train(
      const Model& global, uint32_t round, const std::atomic<bool>& cancel) = 0;
  // A job is being configured: its learner_params override the site's. An
  // error refuses the job (the message names the parameter). Default: the
  // learner has nothing to change.
  virtual absl::Status ConfigureForJob(
      const std::map<std::string, std::string>& job_params) {
    return absl::OkStatus();
  }

  // A job is being configured (or recovered from the workspace): the whole
  // config, for learners that need more than its params (the privacy
  // accountant needs the job id). Default: ConfigureForJob(learner_params).
  virtual absl::Status ConfigureJob(const v1::JobConfig& job) {
    return ConfigureForJob(std::map<std::string, std::string>(
        job.learner_params().begin(), job.learner_params().end()));
  }
  // Adds what the learner reports to the site's status (the privacy spent).
  // May be called from any thread. Default: nothing.
  virtual void AddToStatus(v1::SiteStatus* status) {}

  // What the learner waits for right now, for the site's status, or "": e.g.
  // "waiting for trainer" while an external trainer has a task to take and
  // none is attached. May be called from any thread. Default: "".
  virtual std::string WaitingFor() { return ""; }
  // `changed` runs (on a thread of the learner's, holding none of its
  // locks) after WaitingFor() changed; null stops it. Returns once no
  // earlier listener runs any more. Default: WaitingFor() never changes.
  virtual void SetWaitingListener(std::function<void()> changed) {}
};

}  // namespace swarm

#endif  // SWARM_LEARNER_LEARNER_H_
