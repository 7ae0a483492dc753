#include "privacy/private_learner.h"

#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace swarm::privacy {

absl::Status ValidatePolicy(const v1::PrivacyPolicy& policy) {
  if (!(policy.max_epsilon() >= 0) || std::isinf(policy.max_epsilon())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "privacy.max_epsilon: must be >= 0 and finite (0: no budget), got ",
        policy.max_epsilon()));
  }
  if (policy.delta() != 0 && !(policy.delta() > 0 && policy.delta() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "privacy.delta: must be in (0, 1) (0: the default 1e-5), got ",
        policy.delta()));
  }
  return absl::OkStatus();
}

std::string LedgerPath(const persist::Workspace& workspace,
                       absl::string_view job_id) {
  return absl::StrCat(workspace.JobDir(job_id), "/privacy.json");
}

namespace {

bool AsksForDp(const std::map<std::string, std::string>& params) {
  for (const auto& [key, value] : params) {
    if (absl::StartsWith(key, "dp_")) return true;
  }
  return false;
}

}  // namespace

PrivateLearner::PrivateLearner(std::unique_ptr<Learner> inner,
                               v1::PrivacyPolicy policy,
                               persist::Workspace workspace, std::string site,
                               std::map<std::string, std::string> site_params)
    : inner_(std::move(inner)),
      policy_(std::move(policy)),
      workspace_(std::move(workspace)),
      site_(std::move(site)),
      site_trains_privately_(AsksForDp(site_params)) {}

double PrivateLearner::delta() const {
  return policy_.delta() > 0 ? policy_.delta() : kDefaultDelta;
}

absl::StatusOr<Model> PrivateLearner::InitialModel() {
  return inner_->InitialModel();
}

absl::StatusOr<Metrics> PrivateLearner::Validate(const Model& global,
                                                 uint32_t round) {
  // The driver validates, then trains: a site out of budget stops here,
  // before an external trainer is handed the task.
  {
    absl::MutexLock lock(&mu_);
    SWARM_RETURN_IF_ERROR(CheckBudget(round));
  }
  return inner_->Validate(global, round);
}

absl::Status PrivateLearner::ConfigureForJob(
    const std::map<std::string, std::string>& job_params) {
  return inner_->ConfigureForJob(job_params);
}

absl::Status PrivateLearner::ConfigureJob(const v1::JobConfig& job) {
  SWARM_RETURN_IF_ERROR(persist::Workspace::ValidateJobId(job.job_id()));
  absl::StatusOr<Accountant> ledger =
      Accountant::Load(LedgerPath(workspace_, job.job_id()));
  if (!ledger.ok()) {
    return absl::Status(
        ledger.status().code(),
        absl::StrCat("the privacy ledger of job ", job.job_id(),
                     " cannot be read (it must not restart from zero): ",
                     ledger.status().message()));
  }
  SWARM_ASSIGN_OR_RETURN(const double epsilon, ledger->Epsilon(delta()));
  std::map<std::string, std::string> params(job.learner_params().begin(),
                                            job.learner_params().end());
  // Only for a learner told to train privately (other learners would warn
  // about parameters they do not know).
  if (site_trains_privately_ || AsksForDp(params)) {
    params.emplace("dp_rounds", absl::StrCat(std::max(job.num_rounds(), 1u)));
    params.emplace("dp_delta", absl::StrFormat("%.17g", delta()));
  }
  v1::JobConfig inner_job = job;
  inner_job.mutable_learner_params()->insert(params.begin(), params.end());
  SWARM_RETURN_IF_ERROR(inner_->ConfigureJob(inner_job));
  absl::MutexLock lock(&mu_);
  job_id_ = job.job_id();
  require_dp_ = job.require_dp();
  ledger_ = *std::move(ledger);
  epsilon_ = epsilon;
  exhausted_ = false;
  if (!ledger_.charges().empty()) {
    SWARM_LOG_INFO(
        "site %s, job %s: privacy spent so far: epsilon %.4f (delta %g) over "
        "%d round(s)",
        site_, job_id_, epsilon_, delta(), ledger_.charges().size());
  }
  return absl::OkStatus();
}

absl::Status PrivateLearner::Exhausted(double epsilon, double next_epsilon) {
  exhausted_ = true;
  const std::string message = absl::StrFormat(
      "privacy budget exhausted: epsilon=%.4f (delta %g) spent, the next "
      "round would make it %.4f > budget %g; site %s stops training for job "
      "%s",
      epsilon, delta(), next_epsilon, policy_.max_epsilon(), site_, job_id_);
  SWARM_LOG_WARNING("%s", message);
  // For good: the site tells the round's aggregator (learner.h).
  return MarkStoppedForJob(absl::FailedPreconditionError(message));
}

absl::Status PrivateLearner::CheckBudget(uint32_t round) {
  if (policy_.max_epsilon() <= 0) return absl::OkStatus();
  if (epsilon_ >= policy_.max_epsilon()) {
    return Exhausted(epsilon_, epsilon_);
  }
  if (ledger_.charges().empty()) return absl::OkStatus();
  // The next round is assumed to cost what the last one did.
  SWARM_ASSIGN_OR_RETURN(
      const double next,
      ledger_.EpsilonWith(ledger_.charges().back().cost, delta()));
  if (next > policy_.max_epsilon()) return Exhausted(epsilon_, next);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PrivateLearner::PendingCharge>>
PrivateLearner::PrepareCharge(uint32_t round, const TrainOutput& output) {
  if (!output.privacy.has_value()) {
    if (!require_dp_) return std::nullopt;
    return absl::FailedPreconditionError(absl::StrFormat(
        "job %s requires differential privacy but the trainer reported no "
        "privacy cost for round %d (DP-SGD's sampling rate, noise multiplier "
        "and steps): the result is refused",
        job_id_, round));
  }
  const v1::PrivacyCost& cost = *output.privacy;
  if (absl::Status valid = ValidateCost(cost); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("round ", round, ": the result's ", valid.message()));
  }
  SWARM_ASSIGN_OR_RETURN(const double next, ledger_.EpsilonWith(cost, delta()));
  if (policy_.max_epsilon() > 0 && next > policy_.max_epsilon()) {
    return Exhausted(epsilon_, next);
  }
  PendingCharge pending{job_id_, ledger_, next};
  SWARM_RETURN_IF_ERROR(pending.ledger.Add(round, cost));
  return pending;
}

absl::StatusOr<TrainOutput> PrivateLearner::Train(
    const Model& global, uint32_t round, const std::atomic<bool>& cancel) {
  {
    absl::MutexLock lock(&mu_);
    SWARM_RETURN_IF_ERROR(CheckBudget(round));
  }
  absl::StatusOr<TrainOutput> output = inner_->Train(global, round, cancel);
  if (!output.ok()) return output;
  std::optional<PendingCharge> pending;
  {
    absl::MutexLock lock(&mu_);
    SWARM_ASSIGN_OR_RETURN(pending, PrepareCharge(round, *output));
  }
  if (!pending.has_value()) {
    absl::MutexLock lock(&mu_);
    output->spent = SpentLocked();
    return output;
  }
  // The ledger's write and fsync without the lock (status readers do not
  // wait for it); only this training thread charges. The result leaves only
  // once its cost is on disk.
  SWARM_RETURN_IF_ERROR(workspace_.EnsureJobDirs(pending->job));
  SWARM_RETURN_IF_ERROR(
      pending->ledger.Save(LedgerPath(workspace_, pending->job)));
  absl::MutexLock lock(&mu_);
  if (job_id_ == pending->job) {
    ledger_ = std::move(pending->ledger);
    epsilon_ = pending->epsilon;
  }
  output->spent = SpentLocked();
  const v1::PrivacyCost& cost = *output->privacy;
  SWARM_LOG_INFO(
      "site %s, job %s: round %d charged (q=%.4g, sigma=%.4g, %d steps): "
      "epsilon %.4f (delta %g)%s",
      site_, pending->job, round, cost.sampling_rate(), cost.noise_multiplier(),
      cost.steps(), pending->epsilon, delta(),
      policy_.max_epsilon() > 0
          ? absl::StrFormat(" of budget %g", policy_.max_epsilon())
          : std::string());
  return output;
}

std::string PrivateLearner::WaitingFor() { return inner_->WaitingFor(); }

void PrivateLearner::SetWaitingListener(std::function<void()> changed) {
  inner_->SetWaitingListener(std::move(changed));
}

std::optional<v1::PrivacySpent> PrivateLearner::Spent() const {
  absl::MutexLock lock(&mu_);
  return SpentLocked();
}

std::optional<v1::PrivacySpent> PrivateLearner::SpentLocked() const {
  if (job_id_.empty() || (ledger_.charges().empty() &&
                          policy_.max_epsilon() <= 0 && !require_dp_)) {
    return std::nullopt;
  }
  v1::PrivacySpent spent;
  spent.set_epsilon(epsilon_);
  spent.set_delta(delta());
  spent.set_max_epsilon(policy_.max_epsilon());
  spent.set_rounds(static_cast<uint32_t>(ledger_.charges().size()));
  spent.set_steps(ledger_.steps());
  spent.set_budget_exhausted(exhausted_);
  return spent;
}

void PrivateLearner::AddToStatus(v1::SiteStatus* status) {
  std::optional<v1::PrivacySpent> spent = Spent();
  if (!spent.has_value()) return;
  {
    absl::MutexLock lock(&mu_);
    if (status->job_id() != job_id_) return;
  }
  *status->mutable_privacy() = *std::move(spent);
}

}  // namespace swarm::privacy
