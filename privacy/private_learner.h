// The site's privacy accountant around its learner (docs/privacy.md).
//
// PrivateLearner wraps the daemon's learner. For the job being configured it
// loads the job's ledger (<workspace>/<job>/privacy.json, accountant.h), so a
// restart or a resume continues the count. Each round's training result
// passes through it before it leaves the site:
//   - before training, a site with a budget (PrivacyPolicy.max_epsilon)
//     that has spent it, or whose next round at the last round's cost would
//     exceed it, does not train: FailedPrecondition "privacy budget
//     exhausted: ...", which the site reports as its round's failure;
//   - after training, the result's PrivacyCost (TrainOutput.privacy) is
//     charged and the ledger replaced atomically before the result is
//     returned; a cost that would take the site past its budget withholds
//     the result (nothing released, nothing charged);
//   - a job with require_dp refuses a result that reports no cost;
//   - a budget refusal is marked StoppedForJob (learner.h), and each
//     result carries the spend after its charge (TrainOutput.spent).
// ε is reported for the site's δ (PrivacyPolicy.delta, default 1e-5) in the
// site status (AddToStatus) and by Spent().
#ifndef SWARM_PRIVACY_PRIVATE_LEARNER_H_
#define SWARM_PRIVACY_PRIVATE_LEARNER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "learner/learner.h"
#include "persist/workspace.h"
#include "privacy/accountant.h"
#include "proto/swarm.pb.h"

namespace swarm::privacy {

inline constexpr double kDefaultDelta = 1e-5;

// OK when `policy` is valid: max_epsilon >= 0 and finite, delta 0 (the
// default) or in (0, 1). InvalidArgument naming the field otherwise.
absl::Status ValidatePolicy(const v1::PrivacyPolicy& policy);

// <workspace>/<job>/privacy.json.
std::string LedgerPath(const persist::Workspace& workspace,
                       absl::string_view job_id);

class PrivateLearner final : public Learner {
 public:
  // `inner` does the training; `policy` must be valid. `site_params` are
  // the site's own learner params (the job's are merged over them).
  PrivateLearner(std::unique_ptr<Learner> inner, v1::PrivacyPolicy policy,
                 persist::Workspace workspace, std::string site,
                 std::map<std::string, std::string> site_params = {});

  absl::StatusOr<Model> InitialModel() override;
  absl::StatusOr<Metrics> Validate(const Model& global,
                                   uint32_t round) override;
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override;
  absl::Status ConfigureForJob(
      const std::map<std::string, std::string>& job_params) override;
  // Loads the job's ledger (DataLoss refuses the job: a corrupt ledger must
  // not restart the count), then configures the inner learner with the
  // job's params plus dp_rounds (num_rounds) and dp_delta (the site's δ)
  // unless the job sets them.
  absl::Status ConfigureJob(const v1::JobConfig& job) override;
  std::string WaitingFor() override;
  void SetWaitingListener(std::function<void()> changed) override;
  void AddToStatus(v1::SiteStatus* status) override;

  // What the accountant holds for the current job (empty before any).
  std::optional<v1::PrivacySpent> Spent() const;
  Learner* inner() const { return inner_.get(); }

 private:
  // REQUIRES: mu_. FailedPrecondition when the budget does not allow
  // another round.
  absl::Status CheckBudget(uint32_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A charge checked and composed, to be written before it counts.
  struct PendingCharge {
    std::string job;
    Accountant ledger;  // With the charge.
    double epsilon = 0;
  };
  // REQUIRES: mu_. The ledger with `output`'s cost for `round` added
  // (nullopt: the output reports none and the job does not require it), or
  // why the result must not leave.
  absl::StatusOr<std::optional<PendingCharge>> PrepareCharge(
      uint32_t round, const TrainOutput& output)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exhausted(double epsilon, double next_epsilon)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double delta() const;
  // REQUIRES: mu_. Spent().
  std::optional<v1::PrivacySpent> SpentLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Learner> inner_;
  const v1::PrivacyPolicy policy_;
  const persist::Workspace workspace_;
  const std::string site_;
  // Whether the site's own learner params ask for DP-SGD (dp_*).
  const bool site_trains_privately_;
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  bool require_dp_ ABSL_GUARDED_BY(mu_) = false;
  Accountant ledger_ ABSL_GUARDED_BY(mu_);
  double epsilon_ ABSL_GUARDED_BY(mu_) = 0;
  bool exhausted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace swarm::privacy

#endif  // SWARM_PRIVACY_PRIVATE_LEARNER_H_
