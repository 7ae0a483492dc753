// SwarmController: construction, shared helpers, operator calls and incoming
// model streams. The roles live beside it: swarm_controller_trainer.cc
// (scatter, training, submission), swarm_controller_aggregator.cc (the rounds
// this site aggregates) and swarm_controller_finale.cc (BEST and LAST).
#include "controller/swarm_controller.h"

#include <algorithm>
#include <functional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "config/job_config.h"
#include "controller/admission.h"
#include "controller/aggregation_round.h"
#include "controller/replies.h"
#include "controller/retry_policy.h"
#include "model/tensor_sink.h"

namespace swarm {

std::string SwarmController::FormatMetric(const v1::BestRecord& best) {
  return best.present() ? absl::StrCat(best.metric()) : "none";
}

SwarmController::SwarmController(ControllerOptions options,
                                 PeerTransport* transport, Learner* learner,
                                 ModelStore* store, TaskRunner* runner)
    : options_(std::move(options)),
      transport_(transport),
      learner_(learner),
      store_(store),
      runner_(runner),
      jitter_(static_cast<std::minstd_rand::result_type>(
          options_.jitter_seed != 0 ? options_.jitter_seed
                                    : std::random_device{}())) {
  absl::MutexLock lock(&mu_);
  record_.self = options_.site;
}

SwarmController::~SwarmController() {
  absl::MutexLock lock(&mu_);
  if (training_ != nullptr) training_->cancel = true;
}

// ---------------------------------------------------------------------------
// Helpers

absl::Status SwarmController::CheckJob(absl::string_view job_id) const {
  return CheckJobId(job_.get(), options_.site, job_id);
}

bool SwarmController::IsTrainer(absl::string_view site) const {
  return job_ != nullptr && job_->IsTrainer(site);
}

const v1::SiteInfo* SwarmController::Site(absl::string_view name) const {
  return job_ != nullptr ? job_->Site(name) : nullptr;
}

bool SwarmController::Active() const {
  return job_ != nullptr && record_.started && !IsTerminal(record_.state);
}

void SwarmController::Bump() {
  StatusChanged();
  ++permission_version_;
  WakeAll(permission_waiters_);
}

void SwarmController::StatusChanged() {
  ++status_version_;
  WakeAll(status_waiters_);
}

void SwarmController::WakeAll(std::vector<std::function<void()>>& waiters) {
  for (std::function<void()>& waiter : waiters) {
    runner_->Post(std::move(waiter));
  }
  waiters.clear();
}

void SwarmController::WakeOnChange(uint64_t version, uint64_t known_version,
                                   std::vector<std::function<void()>>& waiters,
                                   absl::Time deadline,
                                   std::function<void()> wake) {
  if (version != known_version) {
    runner_->Post(std::move(wake));
    return;
  }
  runner_->PostAt(deadline, wake);
  waiters.push_back(std::move(wake));
}

void SwarmController::WhenPermissionChanges(uint64_t known_version,
                                            absl::Time deadline,
                                            std::function<void()> wake) {
  absl::MutexLock lock(&mu_);
  WakeOnChange(permission_version_, known_version, permission_waiters_,
               deadline, std::move(wake));
}

void SwarmController::WhenStatusChanges(uint64_t known_version,
                                        absl::Time deadline,
                                        std::function<void()> wake) {
  absl::MutexLock lock(&mu_);
  WakeOnChange(status_version_, known_version, status_waiters_, deadline,
               std::move(wake));
}

void SwarmController::SetState(v1::SiteState state) {
  if (IsTerminal(record_.state) && state != v1::SITE_STATE_CONFIGURED) return;
  if (record_.state != state) {
    record_.state = state;
    Bump();
  }
}

void SwarmController::ReportError(absl::string_view what,
                                  const absl::Status& status) {
  last_error_ = absl::StrCat(what, ": ", status.message());
  last_error_time_ = runner_->Now();
  SWARM_LOG_WARNING("%s", last_error_);
  Bump();
}

void SwarmController::DropRounds() {
  // What they counted stays in the site's counters; nothing of theirs is
  // in flight any more.
  for (const auto& [number, open] : rounds_) {
    RoundCounters counted = open->round->counters();
    counted.in_flight = 0;
    closed_rounds_.Add(counted);
  }
  rounds_.clear();
}

void SwarmController::Fail(absl::string_view what, const absl::Status& status) {
  ReportError(what, status);
  if (training_ != nullptr) training_->cancel = true;
  DropRounds();
  SetState(v1::SITE_STATE_FAILED);
  PersistState();
}

void SwarmController::PersistState() {
  if (job_ == nullptr) return;
  v1::JobState state;
  state.set_job_id(job_->id());
  state.set_last_completed_round(
      record_.last_task_round.has_value()
          ? static_cast<int64_t>(*record_.last_task_round)
          : -1);
  *state.mutable_best() = record_.best;
  state.set_state(record_.state);
  state.set_updated_time_ms(absl::ToUnixMillis(runner_->Now()));
  bool posted;
  {
    absl::MutexLock lock(&pending_state_mu_);
    posted = pending_state_.has_value();  // A write is posted already.
    pending_state_ = std::move(state);
  }
  // The write (an fsync) happens on the runner, outside mu_: a slow disk
  // never holds up the site's calls.
  if (!posted) runner_->Post([this] { WritePendingState(); });
}

void SwarmController::WritePendingState() {
  // Each snapshot is the whole state, so writing only the newest loses
  // nothing. The snapshot is taken with write_mu_ held, so writes happen in
  // the order the snapshots were taken.
  absl::MutexLock write(&write_mu_);
  v1::JobState state;
  {
    absl::MutexLock lock(&pending_state_mu_);
    if (!pending_state_.has_value()) return;
    state = std::move(*pending_state_);
    pending_state_.reset();
  }
  absl::Status saved = store_->SaveState(state);
  if (!saved.ok()) {
    absl::MutexLock lock(&mu_);
    ReportError("saving state", saved);
  }
}

v1::ModelHeader SwarmController::BaseHeader(v1::ModelKind kind,
                                            uint32_t round) const {
  v1::ModelHeader header;
  header.set_kind(kind);
  header.set_job_id(job_->id());
  header.set_round(round);
  header.set_sender(options_.site);
  header.set_digest_algorithm(job_->config().digest_algorithm());
  // The transport chunks every stream it sends at header.chunk_size.
  header.set_chunk_size(job_->config().chunk_size());
  return header;
}

void SwarmController::CallWithRetry(std::string what,
                                    std::function<absl::Status()> call,
                                    std::function<void(absl::Status)> done,
                                    CallRetryBudget budget, int attempt) {
  absl::Status status = call();
  if (status.ok() || !RetryPolicy::Retryable(status)) {
    done(status);
    return;
  }
  double unit;
  {
    absl::MutexLock lock(&jitter_mu_);
    unit = std::uniform_real_distribution<double>(0.0, 1.0)(jitter_);
  }
  const std::optional<absl::Duration> delay = options_.retry.NextDelay(
      status, attempt, unit, runner_->Now(), budget.until);
  if (!delay.has_value()) {
    done(status);
    return;
  }
  SWARM_LOG_INFO("%s failed (%s); retry %d in %s", what, status.ToString(),
                 attempt, absl::FormatDuration(*delay));
  runner_->PostAfter(*delay, [this, what = std::move(what),
                              call = std::move(call), done = std::move(done),
                              budget = std::move(budget), attempt]() mutable {
    if (budget.still_wanted && !budget.still_wanted()) {
      done(absl::CancelledError(absl::StrCat(what, ": no longer wanted")));
      return;
    }
    CallWithRetry(std::move(what), std::move(call), std::move(done),
                  std::move(budget), attempt + 1);
  });
}

// ---------------------------------------------------------------------------
// Operator calls

v1::Reply SwarmController::Configure(const v1::ConfigureRequest& request) {
  v1::JobConfig job = WithDefaults(request.job());
  absl::Status valid = ValidateJobConfig(job);
  if (!valid.ok()) {
    return MakeReply(v1::OUTCOME_BAD_REQUEST,
                     absl::StrCat("invalid job config: ", valid.message()));
  }
  if (FindSite(job, options_.site) == nullptr) {
    return MakeReply(v1::OUTCOME_BAD_REQUEST,
                     absl::StrCat("site ", options_.site,
                                  " is not a site of job ", job.job_id()));
  }
  {
    // A running job keeps its learner: refuse before touching it.
    absl::MutexLock lock(&mu_);
    if (job_ != nullptr && record_.started && !IsTerminal(record_.state) &&
        job_->config().SerializeAsString() != job.SerializeAsString()) {
      return MakeReply(
          v1::OUTCOME_REJECTED,
          absl::StrCat("site ", options_.site, " is running job ", job_->id()));
    }
  }
  // The job's learner_params override the site's; a bad one refuses the job.
  absl::Status learner =
      learner_->ConfigureForJob(std::map<std::string, std::string>(
          job.learner_params().begin(), job.learner_params().end()));
  if (!learner.ok()) {
    return MakeReply(v1::OUTCOME_BAD_REQUEST,
                     absl::StrCat("learner_params: ", learner.message()));
  }
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && record_.started && !IsTerminal(record_.state)) {
    if (job_->id() == job.job_id() &&
        job_->config().SerializeAsString() == job.SerializeAsString()) {
      return MakeReply(v1::OUTCOME_OK, "already configured with this job");
    }
    return MakeReply(
        v1::OUTCOME_REJECTED,
        absl::StrCat("site ", options_.site, " is running job ", job_->id()));
  }
  absl::Status saved = store_->SaveJobConfig(job);
  if (!saved.ok()) {
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("cannot store the job: ", saved.message()));
  }
  store_->ClearOffload(job.job_id()).IgnoreError();
  if (training_ != nullptr) training_->cancel = true;
  training_.reset();
  rounds_.clear();
  finals_.clear();
  best_model_.reset();
  current_global_.reset();
  counters_ = v1::SiteCounters();
  closed_rounds_ = RoundCounters();
  metrics_.clear();
  last_error_.clear();
  last_error_time_ = absl::InfinitePast();
  job_ = std::make_shared<const JobView>(std::move(job));
  record_ = SiteRecord();
  record_.self = options_.site;
  record_.state = v1::SITE_STATE_CONFIGURED;
  Bump();
  PersistState();
  transport_->PrepareForJob(job_->config());
  SWARM_LOG_INFO("configured for job %s (%d sites, %d rounds)", job_->id(),
                 job_->config().sites_size(), job_->config().num_rounds());
  return MakeReply(v1::OUTCOME_OK, "configured");
}

v1::Reply SwarmController::Start(const v1::StartRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status job = CheckJob(request.job_id());
  if (!job.ok()) return ReplyFromStatus(job);
  if (job_->config().starting_site() != options_.site) {
    return MakeReply(
        v1::OUTCOME_REJECTED,
        absl::StrCat("start goes to the starting site ",
                     job_->config().starting_site(), ", not ", options_.site));
  }
  if (record_.started) {
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("job ", job_->id(), " already started"));
  }
  record_.started = true;
  Bump();
  const uint32_t round = job_->config().start_round();
  runner_->Post([this, round] {
    absl::StatusOr<Model> initial = learner_->InitialModel();
    if (!initial.ok()) {
      absl::MutexLock lock(&mu_);
      Fail("initial model", initial.status());
      return;
    }
    Scatter(round, std::make_shared<const Model>(std::move(*initial)),
            v1::BestRecord());
  });
  SWARM_LOG_INFO("starting job %s at round %d", job_->id(), round);
  return MakeReply(v1::OUTCOME_OK, "started");
}

v1::Reply SwarmController::Abort(const v1::AbortRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status job = CheckJob(request.job_id());
  if (!job.ok()) return ReplyFromStatus(job);
  if (IsTerminal(record_.state)) {
    return MakeReply(
        v1::OUTCOME_OK,
        absl::StrCat("job already ", v1::SiteState_Name(record_.state)));
  }
  if (training_ != nullptr) training_->cancel = true;
  training_.reset();
  DropRounds();  // Aggregators remove their offload files.
  store_->ClearOffload(job_->id()).IgnoreError();
  last_error_ =
      absl::StrCat("aborted by ", request.sender(),
                   request.reason().empty() ? "" : ": ", request.reason());
  last_error_time_ = runner_->Now();
  record_.state = v1::SITE_STATE_ABORTED;
  Bump();
  PersistState();
  SWARM_LOG_WARNING("job %s aborted (%s)", job_->id(), last_error_);
  return MakeReply(v1::OUTCOME_OK, "aborted");
}

v1::StatusReply SwarmController::Status() const {
  absl::MutexLock lock(&mu_);
  v1::StatusReply reply;
  v1::SiteStatus* status = reply.mutable_status();
  status->set_site(options_.site);
  if (job_ != nullptr) {
    status->set_job_id(job_->id());
    status->mutable_role()->set_trainer(IsTrainer(options_.site));
  }
  status->set_state(record_.state);
  status->mutable_role()->set_aggregator(record_.round_aggregator ==
                                         options_.site);
  status->set_round(record_.last_task_round.value_or(
      job_ != nullptr ? job_->first_round() : 0));
  status->set_aggregator(record_.round_aggregator);
  *status->mutable_best() = record_.best;
  *status->mutable_counters() = Counters();
  status->set_last_error(last_error_);
  if (last_error_time_ != absl::InfinitePast()) {
    status->set_last_error_time_ms(absl::ToUnixMillis(last_error_time_));
  }
  for (const auto& [name, value] : metrics_) {
    (*status->mutable_metrics())[name] = value;
  }
  reply.set_version(status_version_);
  return reply;
}

v1::StatusReply SwarmController::WaitForStatusChange(
    uint64_t known_version, absl::Time deadline) const {
  {
    absl::MutexLock lock(&mu_);
    auto changed = [this, known_version]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return status_version_ != known_version;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  }
  return Status();
}

std::optional<v1::JobConfig> SwarmController::job() const {
  absl::MutexLock lock(&mu_);
  if (job_ == nullptr) return std::nullopt;
  return job_->config();
}

// ---------------------------------------------------------------------------
// Incoming model streams

absl::StatusOr<ModelAdmission> SwarmController::AdmitModel(
    const v1::ModelHeader& header) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Admitted> admitted = AdmitStream(job_.get(), record_, header);
  if (!admitted.ok()) return admitted.status();
  ModelAdmission admission;
  if (!admitted->receive_body) {
    admission.header_only = true;
    admission.reply_message = std::move(admitted->message);
    return admission;
  }
  if (header.kind() == v1::MODEL_KIND_RESULT) return AdmitResult(header);
  admission.assembler.limits = options_.limits;
  admission.assembler.limits.max_model_bytes =
      std::min(admission.assembler.limits.max_model_bytes,
               job_->config().max_model_bytes());
  admission.assembler.expected_kind = header.kind();
  if (header.kind() == v1::MODEL_KIND_LEARN_TASK &&
      current_global_ != nullptr) {
    admission.assembler.expected_specs = current_global_->specs();
  }
  return admission;
}

v1::Reply SwarmController::OnModel(const v1::ModelHeader& header,
                                   absl::StatusOr<Model> model) {
  absl::StatusOr<std::shared_ptr<const Model>> shared =
      model.ok() ? absl::StatusOr<std::shared_ptr<const Model>>(
                       std::make_shared<const Model>(std::move(*model)))
                 : absl::StatusOr<std::shared_ptr<const Model>>(model.status());
  if (header.kind() == v1::MODEL_KIND_BEST ||
      header.kind() == v1::MODEL_KIND_LAST) {
    if (!shared.ok()) return ReplyFromStatus(shared.status());
    // Written before taking the lock: a large model takes a while.
    absl::Status saved = store_->SaveFinal(header.job_id(), header.kind(),
                                           **shared, (*shared)->metadata());
    absl::MutexLock lock(&mu_);
    if (!saved.ok()) {
      ReportError(absl::StrCat("saving ", v1::ModelKind_Name(header.kind())),
                  saved);
      return ReplyFromStatus(saved);
    }
    absl::Status job = CheckJob(header.job_id());
    if (!job.ok()) return ReplyFromStatus(job);
    return AcceptFinal(header, *shared);
  }
  absl::MutexLock lock(&mu_);
  absl::Status job = CheckJob(header.job_id());
  if (!job.ok()) return ReplyFromStatus(job);
  switch (header.kind()) {
    case v1::MODEL_KIND_LEARN_TASK:
      if (!shared.ok()) return ReplyFromStatus(shared.status());
      return AcceptLearnTask(header, *shared);
    case v1::MODEL_KIND_RESULT:
      return OnResult(header, std::move(shared));
    default:
      return MakeReply(v1::OUTCOME_BAD_REQUEST, "unexpected model kind");
  }
}

absl::StatusOr<std::shared_ptr<const Model>> SwarmController::ModelForFetch(
    const v1::FetchModelRequest& request) const {
  v1::ModelKind kind = v1::MODEL_KIND_UNSPECIFIED;
  {
    absl::MutexLock lock(&mu_);
    SWARM_RETURN_IF_ERROR(CheckJob(request.job_id()));
    switch (request.which()) {
      case v1::MODEL_SELECTOR_BEST:
        kind = v1::MODEL_KIND_BEST;
        break;
      case v1::MODEL_SELECTOR_LAST:
        kind = v1::MODEL_KIND_LAST;
        break;
      case v1::MODEL_SELECTOR_CURRENT:
        if (current_global_ == nullptr) {
          return absl::NotFoundError("no global model yet");
        }
        return current_global_;
      case v1::MODEL_SELECTOR_ROUND:
        break;
      default:
        return absl::InvalidArgumentError("unknown model selector");
    }
    if (request.which() == v1::MODEL_SELECTOR_ROUND) {
      return store_->LoadRound(request.job_id(), request.round());
    }
    auto it = finals_.find(kind);
    if (it != finals_.end()) return it->second;
  }
  return store_->LoadFinal(request.job_id(), kind);
}

}  // namespace swarm
