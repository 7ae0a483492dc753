#include "controller/swarm_controller.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "controller/election.h"
#include "controller/job_config.h"
#include "streaming/tensor_sink.h"

namespace swarm {
namespace {

// The longest wait between two attempts of a call (before jitter).
constexpr absl::Duration kMaxBackoff = absl::Seconds(5);

v1::Reply MakeReply(v1::Outcome outcome, std::string message) {
  v1::Reply reply;
  reply.set_outcome(outcome);
  reply.set_message(std::move(message));
  return reply;
}

v1::Reply ReplyFromStatus(const absl::Status& status) {
  if (status.ok()) return MakeReply(v1::OUTCOME_OK, "");
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
      return MakeReply(v1::OUTCOME_BAD_REQUEST, std::string(status.message()));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      return MakeReply(v1::OUTCOME_RETRY, std::string(status.message()));
    case absl::StatusCode::kCancelled:
      return MakeReply(v1::OUTCOME_ABORTED, std::string(status.message()));
    default:
      return MakeReply(v1::OUTCOME_REJECTED, std::string(status.message()));
  }
}

// A reply that is not OK as a status, for callers that treat both alike.
absl::Status StatusFromReply(const absl::StatusOr<v1::Reply>& reply) {
  if (!reply.ok()) return reply.status();
  if (reply->outcome() == v1::OUTCOME_OK) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(v1::Outcome_Name(reply->outcome()), ": ", reply->message()));
}

bool Retryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

bool Terminal(v1::SiteState state) {
  return state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
         state == v1::SITE_STATE_ABORTED;
}

std::string FormatMetric(const v1::BestRecord& best) {
  return best.present() ? absl::StrCat(best.metric()) : "none";
}

// `trained` -= `global`, tensor by tensor (F32 and F64 tensors only; the
// model is left as it was if any tensor has another dtype or it is not
// writable).
absl::Status ToWeightDiff(const Model& global, Model* trained) {
  if (!trained->SameLayout(global) || !trained->writable()) {
    return absl::FailedPreconditionError(
        "the result cannot be turned into a diff");
  }
  for (size_t i = 0; i < global.num_tensors(); ++i) {
    const DType dtype = global.spec(i).dtype;
    if (dtype != v1::DTYPE_F32 && dtype != v1::DTYPE_F64) {
      return absl::UnimplementedError(
          absl::StrCat("weight diffs of ", DTypeName(dtype), " tensors (\"",
                       global.spec(i).name, "\")"));
    }
  }
  for (size_t i = 0; i < global.num_tensors(); ++i) {
    absl::string_view base = global.tensor_data(i);
    absl::Span<char> out = trained->mutable_tensor_data(i);
    if (global.spec(i).dtype == v1::DTYPE_F32) {
      for (size_t k = 0; k < base.size(); k += 4) {
        float a, b;
        std::memcpy(&a, out.data() + k, 4);
        std::memcpy(&b, base.data() + k, 4);
        a -= b;
        std::memcpy(out.data() + k, &a, 4);
      }
    } else {
      for (size_t k = 0; k < base.size(); k += 8) {
        double a, b;
        std::memcpy(&a, out.data() + k, 8);
        std::memcpy(&b, base.data() + k, 8);
        a -= b;
        std::memcpy(out.data() + k, &a, 8);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

// One round this site aggregates.
struct SwarmController::AggregatorRound {
  uint32_t round = 0;
  std::shared_ptr<const Model> base;
  std::unique_ptr<Gatherer> gatherer;
  std::unique_ptr<Aggregator> aggregator;
  bool finishing = false;
};

// This site's training for one round, from the learn task to the submission.
struct SwarmController::TrainingTask {
  uint32_t round = 0;
  std::shared_ptr<const Model> global;
  std::string aggregator;
  std::atomic<bool> cancel{false};
  absl::Time asking_since;
  v1::ModelHeader result_header;
  std::shared_ptr<const Model> result;
};

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
                                    : std::random_device{}())) {}

SwarmController::~SwarmController() {
  absl::MutexLock lock(&mu_);
  if (training_ != nullptr) training_->cancel = true;
}

// ---------------------------------------------------------------------------
// Helpers

absl::Status SwarmController::CheckJob(absl::string_view job_id) const {
  if (!job_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", options_.site, " has no job configured"));
  }
  if (job_id != job_->job_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", options_.site, " runs job \"", job_->job_id(),
                     "\", not \"", job_id, "\""));
  }
  return absl::OkStatus();
}

bool SwarmController::IsTrainer(absl::string_view site) const {
  return job_.has_value() && swarm::IsTrainer(*job_, site);
}

bool SwarmController::IsCandidate(absl::string_view site) const {
  return job_.has_value() && swarm::IsCandidate(*job_, site);
}

const v1::SiteInfo* SwarmController::Site(absl::string_view name) const {
  return job_.has_value() ? FindSite(*job_, name) : nullptr;
}

bool SwarmController::Active() const {
  return job_.has_value() && started_ && !Terminal(state_);
}

void SwarmController::Bump() {
  ++status_version_;
  ++permission_version_;
  for (std::function<void()>& waiter : permission_waiters_) {
    runner_->Post(std::move(waiter));
  }
  permission_waiters_.clear();
}

void SwarmController::SetState(v1::SiteState state) {
  if (Terminal(state_) && state != v1::SITE_STATE_CONFIGURED) return;
  if (state_ != state) {
    state_ = state;
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

void SwarmController::Fail(absl::string_view what, const absl::Status& status) {
  ReportError(what, status);
  if (training_ != nullptr) training_->cancel = true;
  rounds_.clear();
  SetState(v1::SITE_STATE_FAILED);
  PersistState();
}

void SwarmController::PersistState() {
  if (!job_.has_value()) return;
  v1::JobState state;
  state.set_job_id(job_->job_id());
  state.set_last_completed_round(last_task_round_.has_value()
                                     ? static_cast<int64_t>(*last_task_round_)
                                     : -1);
  *state.mutable_best() = best_;
  state.set_state(state_);
  state.set_updated_time_ms(absl::ToUnixMillis(runner_->Now()));
  absl::Status saved = store_->SaveState(state);
  if (!saved.ok()) {
    last_error_ = absl::StrCat("saving state: ", saved.message());
    last_error_time_ = runner_->Now();
  }
}

v1::ModelHeader SwarmController::BaseHeader(v1::ModelKind kind,
                                            uint32_t round) const {
  v1::ModelHeader header;
  header.set_kind(kind);
  header.set_job_id(job_->job_id());
  header.set_round(round);
  header.set_sender(options_.site);
  header.set_digest_algorithm(job_->digest_algorithm());
  // The transport chunks every stream it sends at header.chunk_size.
  header.set_chunk_size(job_->chunk_size());
  return header;
}

void SwarmController::CallWithRetry(std::string what,
                                    std::function<absl::Status()> call,
                                    std::function<void(absl::Status)> done,
                                    CallRetryBudget budget, int attempt) {
  absl::Status status = call();
  if (status.ok() || !Retryable(status)) {
    done(status);
    return;
  }
  // Exponential backoff, capped, with jitter in [0.5, 1.5).
  double jitter;
  {
    absl::MutexLock lock(&jitter_mu_);
    jitter = 0.5 + std::uniform_real_distribution<double>(0.0, 1.0)(jitter_);
  }
  const absl::Duration delay =
      std::min(options_.first_backoff * (1 << std::min(attempt - 1, 16)),
               std::max(kMaxBackoff, options_.first_backoff)) *
      jitter;
  if (attempt >= options_.call_attempts &&
      runner_->Now() + delay > budget.until) {
    done(status);
    return;
  }
  SWARM_LOG_INFO("%s failed (%s); retry %d in %s", what, status.ToString(),
                 attempt, absl::FormatDuration(delay));
  runner_->PostAfter(delay, [this, what = std::move(what),
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
    if (job_.has_value() && started_ && !Terminal(state_) &&
        job_->SerializeAsString() != job.SerializeAsString()) {
      return MakeReply(v1::OUTCOME_REJECTED,
                       absl::StrCat("site ", options_.site, " is running job ",
                                    job_->job_id()));
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
  if (job_.has_value() && started_ && !Terminal(state_)) {
    if (job_->job_id() == job.job_id() &&
        job_->SerializeAsString() == job.SerializeAsString()) {
      return MakeReply(v1::OUTCOME_OK, "already configured with this job");
    }
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("site ", options_.site, " is running job ",
                                  job_->job_id()));
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
  final_rounds_.clear();
  best_ = v1::BestRecord();
  best_model_.reset();
  current_global_.reset();
  last_task_round_.reset();
  counters_ = v1::SiteCounters();
  metrics_.clear();
  last_error_.clear();
  last_error_time_ = absl::InfinitePast();
  started_ = false;
  round_ = job.start_round();
  round_aggregator_.clear();
  job_ = std::move(job);
  state_ = v1::SITE_STATE_CONFIGURED;
  Bump();
  PersistState();
  transport_->PrepareForJob(*job_);
  SWARM_LOG_INFO("configured for job %s (%d sites, %d rounds)", job_->job_id(),
                 job_->sites_size(), job_->num_rounds());
  return MakeReply(v1::OUTCOME_OK, "configured");
}

v1::Reply SwarmController::Start(const v1::StartRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status job = CheckJob(request.job_id());
  if (!job.ok()) return ReplyFromStatus(job);
  if (job_->starting_site() != options_.site) {
    return MakeReply(
        v1::OUTCOME_REJECTED,
        absl::StrCat("start goes to the starting site ", job_->starting_site(),
                     ", not ", options_.site));
  }
  if (started_) {
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("job ", job_->job_id(), " already started"));
  }
  started_ = true;
  Bump();
  const uint32_t round = job_->start_round();
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
  SWARM_LOG_INFO("starting job %s at round %d", job_->job_id(), round);
  return MakeReply(v1::OUTCOME_OK, "started");
}

v1::Reply SwarmController::Abort(const v1::AbortRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status job = CheckJob(request.job_id());
  if (!job.ok()) return ReplyFromStatus(job);
  if (Terminal(state_)) {
    return MakeReply(v1::OUTCOME_OK,
                     absl::StrCat("job already ", v1::SiteState_Name(state_)));
  }
  if (training_ != nullptr) training_->cancel = true;
  training_.reset();
  rounds_.clear();  // Aggregators remove their offload files.
  store_->ClearOffload(job_->job_id()).IgnoreError();
  last_error_ =
      absl::StrCat("aborted by ", request.sender(),
                   request.reason().empty() ? "" : ": ", request.reason());
  last_error_time_ = runner_->Now();
  state_ = v1::SITE_STATE_ABORTED;
  Bump();
  PersistState();
  SWARM_LOG_WARNING("job %s aborted (%s)", job_->job_id(), last_error_);
  return MakeReply(v1::OUTCOME_OK, "aborted");
}

v1::StatusReply SwarmController::Status() const {
  absl::MutexLock lock(&mu_);
  v1::StatusReply reply;
  v1::SiteStatus* status = reply.mutable_status();
  status->set_site(options_.site);
  if (job_.has_value()) {
    status->set_job_id(job_->job_id());
    status->mutable_role()->set_trainer(IsTrainer(options_.site));
  }
  status->set_state(state_);
  status->mutable_role()->set_aggregator(round_aggregator_ == options_.site);
  status->set_round(round_);
  status->set_aggregator(round_aggregator_);
  *status->mutable_best() = best_;
  *status->mutable_counters() = counters_;
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
  return job_;
}

// ---------------------------------------------------------------------------
// Scatter and training (trainer side)

void SwarmController::Scatter(uint32_t round,
                              std::shared_ptr<const Model> global,
                              v1::BestRecord best) {
  std::vector<std::string> trainers;
  std::vector<std::string> order;
  v1::ModelHeader header;
  {
    absl::MutexLock lock(&mu_);
    if (!Active()) return;
    order = ElectionOrder(*job_, round);
    if (order.empty()) {
      Fail("election",
           absl::FailedPreconditionError("no aggregator candidate"));
      return;
    }
    trainers.assign(job_->trainers().begin(), job_->trainers().end());
    header = BaseHeader(v1::MODEL_KIND_LEARN_TASK, round);
    header.set_aggregator(order[0]);
    for (size_t i = 1; i < order.size(); ++i)
      header.add_backup_aggregators(order[i]);
    *header.mutable_best() = best;
    SWARM_LOG_INFO("round %d: scattering to %d trainers, aggregator %s", round,
                   static_cast<int>(trainers.size()), order[0]);
  }
  const std::string aggregator = order[0];
  // Phase 1: every trainer but the aggregator; their acknowledgements form
  // the round's expected set. Phase 2: the aggregator, with that set.
  struct Pending {
    absl::Mutex mu;
    int left ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::string> acked ABSL_GUARDED_BY(mu);
  };
  auto pending = std::make_shared<Pending>();
  std::vector<std::string> targets;
  for (const std::string& trainer : trainers) {
    if (trainer != aggregator) targets.push_back(trainer);
  }
  auto phase_two = [this, round, aggregator, header, global, best, pending,
                    trainers]() {
    std::vector<std::string> expected;
    {
      absl::MutexLock lock(&pending->mu);
      expected = pending->acked;
    }
    if (std::find(trainers.begin(), trainers.end(), aggregator) !=
        trainers.end()) {
      expected.push_back(aggregator);
    }
    std::sort(expected.begin(), expected.end());
    v1::ModelHeader to_aggregator = header;
    for (const std::string& name : expected)
      to_aggregator.add_expected_trainers(name);
    SendLearnTaskToAggregator(
        round, aggregator,
        std::vector<std::string>(header.backup_aggregators().begin(),
                                 header.backup_aggregators().end()),
        global, best, expected);
  };
  if (targets.empty()) {
    runner_->Post(phase_two);
    return;
  }
  {
    absl::MutexLock lock(&pending->mu);
    pending->left = static_cast<int>(targets.size());
  }
  for (const std::string& target : targets) {
    runner_->Post([this, target, header, global, pending, phase_two, round]() {
      auto finished = [this, target, pending, phase_two,
                       round](absl::Status status) {
        bool last = false;
        {
          absl::MutexLock lock(&pending->mu);
          if (status.ok()) pending->acked.push_back(target);
          last = --pending->left == 0;
        }
        if (!status.ok()) {
          absl::MutexLock lock(&mu_);
          ReportError(absl::StrCat("round ", round, ": learn task to ", target,
                                   " not acknowledged; not waiting for it"),
                      status);
        }
        if (last) phase_two();
      };
      if (target == options_.site) {
        absl::Status status;
        {
          absl::MutexLock lock(&mu_);
          status = StatusFromReply(AcceptLearnTask(header, global));
        }
        finished(status);
        return;
      }
      const v1::SiteInfo* site = nullptr;
      absl::Duration ack_timeout;
      {
        absl::MutexLock lock(&mu_);
        site = Site(target);
        if (job_.has_value()) {
          ack_timeout = Millis(job_->learn_task_ack_timeout_ms());
        }
      }
      if (site == nullptr) {
        finished(absl::NotFoundError("not a site of the job"));
        return;
      }
      const v1::SiteInfo to = *site;
      CallWithRetry(
          absl::StrCat("learn task to ", target),
          [this, to, header, global, ack_timeout] {
            return StatusFromReply(
                transport_->SendLearnTask(to, header, global, ack_timeout));
          },
          finished);
    });
  }
}

void SwarmController::SendLearnTaskToAggregator(
    uint32_t round, std::string aggregator, std::vector<std::string> backups,
    std::shared_ptr<const Model> global, v1::BestRecord best,
    std::vector<std::string> expected) {
  v1::ModelHeader header;
  const v1::SiteInfo* site = nullptr;
  absl::Duration ack_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (!Active()) return;
    header = BaseHeader(v1::MODEL_KIND_LEARN_TASK, round);
    header.set_aggregator(aggregator);
    for (const std::string& backup : backups)
      header.add_backup_aggregators(backup);
    *header.mutable_best() = best;
    for (const std::string& name : expected) header.add_expected_trainers(name);
    if (aggregator == options_.site) {
      absl::Status status = StatusFromReply(AcceptLearnTask(header, global));
      if (!status.ok())
        Fail(absl::StrCat("round ", round, ": own learn task"), status);
      return;
    }
    site = Site(aggregator);
    if (site == nullptr) {
      Fail("election", absl::NotFoundError(absl::StrCat(
                           "aggregator ", aggregator, " is not a site")));
      return;
    }
    ack_timeout = Millis(job_->learn_task_ack_timeout_ms());
  }
  const v1::SiteInfo to = *site;
  // Whether an earlier attempt may have arrived (its reply was lost).
  auto maybe_delivered = std::make_shared<std::atomic<bool>>(false);
  // Without this task the round cannot happen, and the trainers, which
  // already hold theirs, wait for it up to request_to_submit_max_wait: so
  // keep trying that long (an aggregator back from a restart or a network
  // cut then runs the round), as long as this job runs here.
  CallRetryBudget budget;
  {
    absl::MutexLock lock(&mu_);
    budget.until =
        runner_->Now() + Millis(job_->request_to_submit_max_wait_ms());
    budget.still_wanted = [this, job_id = job_->job_id()] {
      absl::MutexLock lock(&mu_);
      return Active() && job_->job_id() == job_id;
    };
  }
  CallWithRetry(
      absl::StrCat("learn task to aggregator ", aggregator),
      [this, to, header, global, maybe_delivered, round, aggregator,
       ack_timeout] {
        absl::Status status = StatusFromReply(
            transport_->SendLearnTask(to, header, global, ack_timeout));
        if (Retryable(status)) {
          *maybe_delivered = true;
        } else if (status.code() == absl::StatusCode::kFailedPrecondition &&
                   *maybe_delivered) {
          // The earlier attempt did arrive, and the aggregator has moved on
          // (it holds this round's task or a later one, or has finished):
          // the round went ahead. Not a reason to fail the job.
          SWARM_LOG_INFO(
              "round %d: aggregator %s already had its learn task (%s)", round,
              aggregator, status.message());
          return absl::OkStatus();
        }
        return status;
      },
      [this, round, aggregator](absl::Status status) {
        if (status.ok()) return;
        absl::MutexLock lock(&mu_);
        // Aborted, failed or replaced meanwhile: nothing left to report.
        if (status.code() == absl::StatusCode::kCancelled || !Active()) return;
        // Failover to a backup aggregator is future work; for now the job
        // cannot continue without this round's aggregator.
        Fail(absl::StrCat("round ", round, ": aggregator ", aggregator,
                          " unreachable"),
             status);
      },
      std::move(budget));
}

v1::Reply SwarmController::AcceptLearnTask(const v1::ModelHeader& header,
                                           std::shared_ptr<const Model> model) {
  if (Terminal(state_)) {
    return MakeReply(v1::OUTCOME_ABORTED,
                     absl::StrCat("job is ", v1::SiteState_Name(state_)));
  }
  if (last_task_round_.has_value() && header.round() == *last_task_round_ &&
      header.aggregator() == round_aggregator_) {
    // The same task again: the sender retried because our acknowledgement
    // was lost. Acknowledge it again; nothing else changes.
    return MakeReply(v1::OUTCOME_OK,
                     absl::StrCat("learn task of round ", header.round(),
                                  " already accepted"));
  }
  if (last_task_round_.has_value() && header.round() <= *last_task_round_) {
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("site ", options_.site,
                                  " already has the learn task of round ",
                                  *last_task_round_));
  }
  const bool aggregate = header.aggregator() == options_.site;
  const bool train = IsTrainer(options_.site);
  started_ = true;
  last_task_round_ = header.round();
  round_ = header.round();
  round_aggregator_ = header.aggregator();
  best_ = header.best();
  current_global_ = model;
  Bump();
  if (aggregate) OpenRound(header, model);
  if (train) {
    if (training_ != nullptr) training_->cancel = true;
    auto task = std::make_shared<TrainingTask>();
    task->round = header.round();
    task->global = model;
    task->aggregator = header.aggregator();
    training_ = task;
    SetState(v1::SITE_STATE_TRAINING);
    runner_->Post([this, task] { RunTraining(task); });
  } else if (aggregate) {
    SetState(v1::SITE_STATE_GATHERING);
  }
  SWARM_LOG_INFO("round %d: learn task from %s (aggregator %s%s)",
                 header.round(), header.sender(), header.aggregator(),
                 aggregate ? ", that is me" : "");
  return MakeReply(v1::OUTCOME_OK, "learn task accepted");
}

void SwarmController::RunTraining(std::shared_ptr<TrainingTask> task) {
  absl::StatusOr<Metrics> metrics =
      learner_->Validate(*task->global, task->round);
  absl::StatusOr<TrainOutput> output =
      metrics.ok() ? learner_->Train(*task->global, task->round, task->cancel)
                   : absl::StatusOr<TrainOutput>(metrics.status());
  if (task->cancel) return;
  absl::MutexLock lock(&mu_);
  if (training_ != task || !Active()) return;
  v1::ModelHeader& header = task->result_header;
  header = BaseHeader(v1::MODEL_KIND_RESULT, task->round);
  header.set_aggregator(task->aggregator);
  if (metrics.ok()) {
    for (const auto& [name, value] : *metrics)
      (*header.mutable_metrics())[name] = value;
    metrics_ = *metrics;
  }
  if (!output.ok()) {
    ReportError(absl::StrCat("round ", task->round, ": training"),
                output.status());
    header.set_failed(true);
    header.set_failure(std::string(output.status().message()));
  } else {
    if (job_->send_weight_diff() &&
        output->kind == v1::PAYLOAD_KIND_FULL_WEIGHTS) {
      absl::Status diffed = ToWeightDiff(*task->global, &output->model);
      if (diffed.ok()) {
        output->kind = v1::PAYLOAD_KIND_WEIGHT_DIFF;
      } else {
        SWARM_LOG_INFO("round %d: sending full weights: %s", task->round,
                       diffed.message());
      }
    }
    header.set_sample_count(output->sample_count);
    counters_.set_rounds_trained(counters_.rounds_trained() + 1);
    header.set_payload_kind(output->kind);
    task->result = std::make_shared<const Model>(std::move(output->model));
  }
  task->asking_since = runner_->Now();
  SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  runner_->Post([this, task] { AskToSubmit(task); });
}

void SwarmController::AskToSubmit(std::shared_ptr<TrainingTask> task) {
  v1::SubmitPermissionRequest request;
  std::optional<v1::SiteInfo> to;
  absl::Duration timeout;
  absl::Duration interval;
  absl::Time give_up;
  {
    absl::MutexLock lock(&mu_);
    if (training_ != task || !Active() || task->cancel) return;
    request.set_job_id(job_->job_id());
    request.set_sender(options_.site);
    request.set_round(task->round);
    timeout = Millis(job_->request_to_submit_message_timeout_ms());
    interval = Millis(job_->request_to_submit_interval_ms());
    give_up =
        task->asking_since + Millis(job_->request_to_submit_max_wait_ms());
    if (task->aggregator != options_.site) {
      const v1::SiteInfo* site = Site(task->aggregator);
      if (site != nullptr) to = *site;
    }
  }
  absl::StatusOr<v1::SubmitPermissionReply> reply;
  uint64_t version_before = 0;
  if (task->aggregator == options_.site) {
    version_before = permission_version();
    reply = RequestToSubmit(request);
  } else if (to.has_value()) {
    reply = transport_->RequestToSubmit(*to, request, timeout);
  } else {
    reply = absl::NotFoundError("aggregator is not a site of the job");
  }
  if (reply.ok() && reply->outcome() == v1::OUTCOME_OK) {
    {
      absl::MutexLock lock(&mu_);
      if (training_ != task || !Active() || task->cancel) return;
      SetState(v1::SITE_STATE_SUBMITTING);
    }
    // Upload at once on this worker: posting it would cost a thread
    // hand-off per result while the aggregator's slot waits.
    SubmitResult(task);
    return;
  }
  absl::MutexLock lock(&mu_);
  if (training_ != task || !Active() || task->cancel) return;
  absl::Duration wait = interval;
  if (reply.ok()) {
    switch (reply->outcome()) {
      case v1::OUTCOME_RETRY:
        if (task->aggregator == options_.site) {
          // Asking ourselves: ask again the moment something changes (at
          // once if something changed since we asked).
          if (permission_version_ != version_before) {
            runner_->Post([this, task] { AskToSubmit(task); });
          } else {
            permission_waiters_.push_back([this, task] { AskToSubmit(task); });
          }
          return;
        }
        wait = Millis(reply->retry_after_ms());
        break;
      default:
        ReportError(absl::StrCat("round ", task->round, ": aggregator ",
                                 task->aggregator, " refused the submission"),
                    absl::FailedPreconditionError(reply->message()));
        training_.reset();
        SetState(v1::SITE_STATE_IDLE);
        return;
    }
  } else {
    ReportError(absl::StrCat("round ", task->round, ": asking to submit to ",
                             task->aggregator),
                reply.status());
  }
  if (runner_->Now() + wait > give_up) {
    if (!reply.ok()) {
      // The aggregator stayed unreachable for request_to_submit_max_wait.
      // Without failover (future work) nothing will come for this job:
      // fail visibly rather than wait idle forever.
      Fail(
          absl::StrCat("round ", task->round, ": aggregator ", task->aggregator,
                       " unreachable for request_to_submit_max_wait"),
          reply.status());
      return;
    }
    ReportError(
        absl::StrCat("round ", task->round, ": gave up asking ",
                     task->aggregator, " to submit"),
        absl::DeadlineExceededError("request_to_submit_max_wait passed"));
    training_.reset();
    SetState(v1::SITE_STATE_IDLE);
    return;
  }
  if (wait <= absl::ZeroDuration()) {
    runner_->Post([this, task] { AskToSubmit(task); });
  } else {
    runner_->PostAfter(wait, [this, task] { AskToSubmit(task); });
  }
}

void SwarmController::SubmitResult(std::shared_ptr<TrainingTask> task) {
  std::optional<v1::SiteInfo> to;
  {
    absl::MutexLock lock(&mu_);
    if (training_ != task || !Active() || task->cancel) return;
    if (task->aggregator != options_.site) {
      const v1::SiteInfo* site = Site(task->aggregator);
      if (site != nullptr) to = *site;
    }
  }
  absl::StatusOr<v1::Reply> reply;
  if (task->aggregator == options_.site) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<ModelAdmission> admission = AdmitResult(task->result_header);
    if (!admission.ok()) {
      reply = ReplyFromStatus(admission.status());
    } else if (admission->header_only) {
      reply = MakeReply(v1::OUTCOME_OK, "failure noted");
    } else {
      reply = OnResult(task->result_header, task->result);
    }
  } else if (to.has_value()) {
    reply = transport_->SubmitResult(*to, task->result_header, task->result);
  } else {
    reply = absl::NotFoundError("aggregator is not a site of the job");
  }
  absl::MutexLock lock(&mu_);
  if (training_ != task) return;
  absl::Status status = StatusFromReply(reply);
  if (status.ok()) {
    SWARM_LOG_INFO("round %d: result submitted to %s", task->round,
                   task->aggregator);
    training_.reset();
    SetState(rounds_.empty() ? v1::SITE_STATE_IDLE : v1::SITE_STATE_GATHERING);
    return;
  }
  ReportError(
      absl::StrCat("round ", task->round, ": submitting to ", task->aggregator),
      status);
  const bool again = (!reply.ok() && Retryable(reply.status())) ||
                     (reply.ok() && reply->outcome() == v1::OUTCOME_RETRY);
  if (again && Active()) {
    // The permission was released with the failed upload: ask again.
    SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
    runner_->PostAfter(Millis(job_->request_to_submit_interval_ms()),
                       [this, task] { AskToSubmit(task); });
    return;
  }
  training_.reset();
  SetState(v1::SITE_STATE_IDLE);
}

// ---------------------------------------------------------------------------
// Aggregator side

void SwarmController::OpenRound(const v1::ModelHeader& header,
                                std::shared_ptr<const Model> base) {
  auto round = std::make_unique<AggregatorRound>();
  round->round = header.round();
  round->base = base;
  GathererOptions options;
  options.round = header.round();
  options.expected_trainers.assign(header.expected_trainers().begin(),
                                   header.expected_trainers().end());
  options.min_responses_required = job_->min_responses_required();
  options.wait_after_min_responses =
      Millis(job_->wait_after_min_responses_ms());
  options.round_timeout = Millis(job_->round_timeout_ms());
  options.max_concurrent_submissions = job_->max_concurrent_submissions();
  options.best_so_far = header.best();
  options.self = options_.site;
  options.metric_name = job_->metric_name();
  options.open_time = runner_->Now();
  round->gatherer = std::make_unique<Gatherer>(
      std::move(options), MetricComparator(job_->metric_direction()));
  // Results go to disk when the job asks for it, and always for the methods
  // that need every result at the end (median, trimmed mean).
  const bool offload = job_->disk_offload() ||
                       job_->aggregation_method() != v1::AGGREGATION_FEDAVG;
  absl::StatusOr<std::unique_ptr<Aggregator>> aggregator = Aggregator::Create(
      AggregatorOptions::FromJobConfig(
          *job_, offload ? store_->OffloadDir(job_->job_id()) : std::string()),
      base);
  if (!aggregator.ok()) {
    Fail(absl::StrCat("round ", header.round(), ": aggregator"),
         aggregator.status());
    return;
  }
  round->aggregator = std::move(*aggregator);
  const uint32_t number = header.round();
  rounds_[number] = std::move(round);
  Bump();
  CheckRound(number);
}

void SwarmController::ArmRoundTimer(uint32_t round) {
  auto it = rounds_.find(round);
  if (it == rounds_.end()) return;
  const absl::Time deadline = it->second->gatherer->NextDeadline();
  if (deadline == absl::InfiniteFuture()) return;
  runner_->PostAt(deadline, [this, round] {
    absl::MutexLock lock(&mu_);
    CheckRound(round);
  });
}

void SwarmController::CheckRound(uint32_t round) {
  auto it = rounds_.find(round);
  if (it == rounds_.end() || it->second->finishing) return;
  AggregatorRound& state = *it->second;
  const RoundReport report = state.gatherer->CheckDone(runner_->Now());
  if (!report.done) {
    ArmRoundTimer(round);
    return;
  }
  state.finishing = true;
  Bump();
  SWARM_LOG_INFO("round %d closed (%s): %d of %d results%s%s", round,
                 DoneReasonName(report.reason), report.responded,
                 report.expected, report.missing.empty() ? "" : "; missing: ",
                 absl::StrJoin(report.missing, ","));
  if (!report.missing.empty()) {
    ReportError(absl::StrCat("round ", round),
                absl::DeadlineExceededError(absl::StrCat(
                    "no result from ", absl::StrJoin(report.missing, ","))));
  }
  runner_->Post([this, round] { FinishRound(round); });
}

SwarmController::AggregatorRound* SwarmController::GatheringRound(
    uint32_t round) {
  auto it = rounds_.find(round);
  if (it != rounds_.end() && !it->second->finishing) return it->second.get();
  AggregatorRound* latest = nullptr;
  for (auto& [number, open] : rounds_) {
    if (!open->finishing) latest = open.get();
  }
  return latest;
}

absl::StatusOr<ModelAdmission> SwarmController::AdmitResult(
    const v1::ModelHeader& header) {
  // The gatherer of the result's round, or else the latest open one (it
  // answers late and early results by its rules).
  AggregatorRound* target = GatheringRound(header.round());
  if (target == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site ", options_.site, " gathers no round (result for round ",
        header.round(), ")"));
  }
  const ResultDecision decision = target->gatherer->BeginResult(
      header.sender(), header.round(), runner_->Now());
  if (!decision.ok()) {
    counters_.set_results_rejected(counters_.results_rejected() + 1);
    Bump();
    CheckRound(target->round);
    return decision.code == ResultCode::kError
               ? absl::InvalidArgumentError(decision.message)
               : absl::FailedPreconditionError(decision.message);
  }
  counters_.set_submissions_in_flight(counters_.submissions_in_flight() + 1);
  counters_.set_max_submissions_in_flight(
      std::max(counters_.max_submissions_in_flight(),
               counters_.submissions_in_flight()));
  // The upload starts on a slot already taken: a status change only (see
  // RequestToSubmit). A failed result below frees its slot and bumps.
  ++status_version_;
  ModelAdmission admission;
  if (header.failed()) {
    const std::string reason =
        absl::StrCat("trainer failed: ", header.failure());
    target->gatherer->FailResult(header.sender(), reason, runner_->Now());
    // It has no result for this round and sends none: do not wait for it.
    if (header.round() == target->round) {
      target->gatherer->DropTrainer(header.sender(), reason, runner_->Now());
    }
    counters_.set_submissions_in_flight(counters_.submissions_in_flight() - 1);
    Bump();
    CheckRound(target->round);
    admission.header_only = true;
    return admission;
  }
  admission.assembler.limits = options_.limits;
  admission.assembler.limits.max_model_bytes = std::min(
      admission.assembler.limits.max_model_bytes, job_->max_model_bytes());
  admission.assembler.expected_kind = v1::MODEL_KIND_RESULT;
  admission.assembler.expected_specs = target->base->specs();
  absl::StatusOr<std::unique_ptr<TensorSink>> sink =
      target->aggregator->NewResultSink();
  if (!sink.ok()) return sink.status();
  admission.sink = std::move(*sink);
  return admission;
}

v1::Reply SwarmController::OnResult(
    const v1::ModelHeader& header,
    absl::StatusOr<std::shared_ptr<const Model>> model) {
  counters_.set_submissions_in_flight(counters_.submissions_in_flight() > 0
                                          ? counters_.submissions_in_flight() -
                                                1
                                          : 0);
  Bump();
  AggregatorRound* target = GatheringRound(header.round());
  if (target == nullptr || target->gatherer->closed()) {
    counters_.set_results_rejected(counters_.results_rejected() + 1);
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("round ", header.round(),
                                  " closed before the result was complete"));
  }
  const absl::Time now = runner_->Now();
  absl::Status added =
      model.ok() ? target->aggregator->Add(
                       **model, static_cast<int64_t>(header.sample_count()),
                       header.payload_kind())
                 : model.status();
  if (!added.ok()) {
    target->gatherer->FailResult(header.sender(), added.message(), now);
    counters_.set_results_rejected(counters_.results_rejected() + 1);
    ReportError(absl::StrCat("round ", header.round(), ": result from ",
                             header.sender(), " refused"),
                added);
    CheckRound(target->round);
    return ReplyFromStatus(added);
  }
  const ResultDecision decision = target->gatherer->CompleteResult(
      header.sender(), header.sample_count(), header.metrics(), now);
  if (decision.ok()) {
    counters_.set_results_accepted(counters_.results_accepted() + 1);
  } else {
    counters_.set_results_rejected(counters_.results_rejected() + 1);
  }
  SWARM_LOG_INFO("round %d: result from %s %s", header.round(), header.sender(),
                 ResultCodeName(decision.code));
  CheckRound(target->round);
  return MakeReply(decision.outcome(), decision.message);
}

v1::SubmitPermissionReply SwarmController::RequestToSubmit(
    const v1::SubmitPermissionRequest& request) {
  absl::MutexLock lock(&mu_);
  v1::SubmitPermissionReply reply;
  absl::Status job = CheckJob(request.job_id());
  if (!job.ok()) {
    reply.set_outcome(v1::OUTCOME_REJECTED);
    reply.set_message(std::string(job.message()));
    return reply;
  }
  if (Terminal(state_)) {
    reply.set_outcome(v1::OUTCOME_ABORTED);
    reply.set_message(absl::StrCat("job is ", v1::SiteState_Name(state_)));
    return reply;
  }
  const uint64_t retry_ms = job_->request_to_submit_interval_ms();
  AggregatorRound* target = GatheringRound(request.round());
  if (target == nullptr) {
    const bool ahead =
        !last_task_round_.has_value() || request.round() > *last_task_round_;
    reply.set_outcome(ahead ? v1::OUTCOME_RETRY : v1::OUTCOME_REJECTED);
    reply.set_message(
        ahead ? absl::StrCat("round ", request.round(), " is not open here yet")
              : absl::StrCat("round ", request.round(), " is closed here"));
    if (ahead) reply.set_retry_after_ms(retry_ms);
    return reply;
  }
  const PermissionDecision decision = target->gatherer->RequestToSubmit(
      request.sender(), request.round(), runner_->Now());
  reply.set_outcome(decision.outcome);
  reply.set_message(decision.message);
  if (decision.outcome == v1::OUTCOME_RETRY) reply.set_retry_after_ms(retry_ms);
  if (decision.code == PermissionCode::kGranted) {
    counters_.set_submissions_granted(counters_.submissions_granted() + 1);
    // A status change only: taking a slot turns no other request's RETRY
    // into an answer, so the held requests are not woken (a Bump wakes
    // every one of them).
    ++status_version_;
  }
  CheckRound(target->round);
  return reply;
}

void SwarmController::WaitForPermissionChange(uint64_t known_version,
                                              absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, known_version]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return permission_version_ != known_version;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
}

uint64_t SwarmController::permission_version() const {
  absl::MutexLock lock(&mu_);
  return permission_version_;
}

void SwarmController::FinishRound(uint32_t number) {
  std::unique_ptr<AggregatorRound> round;
  v1::BestRecord best;
  bool won = false;
  std::optional<double> input_score;
  {
    absl::MutexLock lock(&mu_);
    auto it = rounds_.find(number);
    if (it == rounds_.end() || !Active()) return;
    round = std::move(it->second);
    rounds_.erase(it);
    best = round->gatherer->BestAfterRound();
    input_score = round->gatherer->RoundScore();
    won = round->gatherer->ScoreBeatsBest();
    if (won) {
      best_model_ = round->base;
      best_model_round_ = number;
    }
    best_ = best;
    counters_.set_rounds_completed(counters_.rounds_completed() + 1);
    SetState(v1::SITE_STATE_AGGREGATING);
    SWARM_LOG_INFO(
        "round %d: aggregating %d results; best metric %s (round %d, %s)%s",
        number, static_cast<int>(round->aggregator->num_added()),
        FormatMetric(best), best.round(), best.site(),
        won ? " - new best" : "");
  }
  std::shared_ptr<const Model> next;
  if (round->aggregator->num_added() == 0) {
    next = round->base;  // Nothing arrived: the global model carries over.
  } else {
    absl::StatusOr<Model> aggregated = round->aggregator->Finish();
    if (!aggregated.ok()) {
      absl::MutexLock lock(&mu_);
      Fail(absl::StrCat("round ", number, ": aggregation"),
           aggregated.status());
      return;
    }
    next = std::make_shared<const Model>(std::move(*aggregated));
  }
  round.reset();
  std::string job_id;
  bool more = false;
  bool keep_round = false;
  {
    absl::MutexLock lock(&mu_);
    if (!Active()) return;
    job_id = job_->job_id();
    keep_round = job_->keep_round_models();
    more = number + 1 < job_->start_round() + job_->num_rounds();
    store_->ClearOffload(job_id).IgnoreError();
    PersistState();
  }
  std::map<std::string, std::string> metadata = next->metadata();
  metadata["job"] = job_id;
  metadata["round"] = absl::StrCat(number + 1);
  metadata["aggregator"] = options_.site;
  // The trainers' mean validation metric of this round's input model.
  if (input_score.has_value()) {
    metadata["input_score"] = absl::StrCat(*input_score);
  }
  absl::Status saved =
      store_->SaveGlobal(job_id, number + 1, *next, metadata, keep_round);
  if (!saved.ok()) {
    absl::MutexLock lock(&mu_);
    ReportError("saving the global model", saved);
  }
  if (more) {
    Scatter(number + 1, next, best);
  } else {
    FinishJob(number, next, best);
  }
}

// ---------------------------------------------------------------------------
// End of the job

void SwarmController::FinishJob(uint32_t last_round,
                                std::shared_ptr<const Model> last,
                                v1::BestRecord best) {
  std::shared_ptr<const Model> best_model;
  std::optional<v1::SiteInfo> holder;
  std::vector<std::string> targets;
  std::string job_id;
  {
    absl::MutexLock lock(&mu_);
    if (!Active()) return;
    SetState(v1::SITE_STATE_DISTRIBUTING);
    job_id = job_->job_id();
    if (!best.present()) {
      // No round produced a usable metric: the last model is also the best.
      best_model = last;
    } else if (best.site() == options_.site) {
      best_model = best_model_;
    } else {
      const v1::SiteInfo* site = Site(best.site());
      if (site != nullptr) holder = *site;
    }
    for (const v1::SiteInfo& site : job_->sites())
      targets.push_back(site.name());
    SWARM_LOG_INFO("job %s: finishing; best %s from %s (round %d)", job_id,
                   FormatMetric(best), best.present() ? best.site() : "-",
                   best.round());
  }
  // LAST first: it carries the final best record from this site, the one
  // every site trusts for it, so that a BEST from another holder is then
  // accepted on the strength of each site's own record (AdmitFinal).
  auto send_best = [this, best_model, holder, best, last_round, targets,
                    job_id](absl::Status status) {
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      ReportError("distributing LAST", status);
    }
    auto report = [this](absl::Status s) {
      if (s.ok()) return;
      absl::MutexLock lock(&mu_);
      ReportError("distributing BEST", s);
    };
    if (best_model != nullptr) {
      Broadcast(v1::MODEL_KIND_BEST, best_model,
                best.present() ? best.round() : last_round, best, report);
      return;
    }
    if (!holder.has_value()) {
      report(absl::NotFoundError(
          absl::StrCat("best holder ", best.site(), " is not a site")));
      return;
    }
    v1::ShareBestRequest request;
    request.set_job_id(job_id);
    request.set_sender(options_.site);
    *request.mutable_best() = best;
    for (const std::string& target : targets) request.add_targets(target);
    const v1::SiteInfo to = *holder;
    absl::Duration timeout;
    {
      absl::MutexLock lock(&mu_);
      if (!job_.has_value()) return;
      timeout = Millis(job_->final_result_ack_timeout_ms());
    }
    CallWithRetry(
        absl::StrCat("asking ", to.name(), " to share the best model"),
        [this, to, request, timeout] {
          return StatusFromReply(transport_->ShareBest(to, request, timeout));
        },
        report);
  };
  Broadcast(v1::MODEL_KIND_LAST, last, last_round, best, send_best);
}

v1::Reply SwarmController::ShareBest(const v1::ShareBestRequest& request) {
  std::shared_ptr<const Model> model;
  {
    absl::MutexLock lock(&mu_);
    absl::Status job = CheckJob(request.job_id());
    if (!job.ok()) return ReplyFromStatus(job);
    if (request.sender() != LastRoundAggregator()) {
      return MakeReply(v1::OUTCOME_REJECTED,
                       absl::StrCat("only the last round's aggregator ",
                                    LastRoundAggregator(),
                                    " may ask to share the best model, not ",
                                    request.sender()));
    }
    if (best_model_ == nullptr || best_model_round_ != request.best().round()) {
      return MakeReply(v1::OUTCOME_REJECTED,
                       absl::StrCat("site ", options_.site,
                                    " does not hold the best model of round ",
                                    request.best().round()));
    }
    model = best_model_;
  }
  // The holder distributes BEST itself; the reply does not wait for it.
  runner_->Post([this, model, best = request.best()] {
    Broadcast(v1::MODEL_KIND_BEST, model, best.round(), best,
              [this](absl::Status s) {
                if (s.ok()) return;
                absl::MutexLock lock(&mu_);
                ReportError("distributing BEST", s);
              });
  });
  return MakeReply(v1::OUTCOME_OK, "sharing the best model");
}

void SwarmController::Broadcast(v1::ModelKind kind,
                                std::shared_ptr<const Model> model,
                                uint32_t round, v1::BestRecord best,
                                std::function<void(absl::Status)> done) {
  v1::ModelHeader header;
  std::vector<v1::SiteInfo> sites;
  absl::Duration timeout;
  {
    absl::MutexLock lock(&mu_);
    if (job_ == std::nullopt) return;
    header = BaseHeader(kind, round);
    *header.mutable_best() = best;
    auto& metadata = *header.mutable_metadata();
    metadata["job"] = job_->job_id();
    metadata["round"] = absl::StrCat(round);
    metadata["kind"] = kind == v1::MODEL_KIND_BEST ? "best" : "last";
    metadata["source_site"] = options_.site;
    if (kind == v1::MODEL_KIND_BEST && best.present()) {
      metadata["metric_name"] = job_->metric_name();
      metadata["metric"] = absl::StrCat(best.metric());
      metadata["best_site"] = best.site();
    }
    sites.assign(job_->sites().begin(), job_->sites().end());
    timeout = Millis(job_->final_result_ack_timeout_ms());
  }
  struct Pending {
    absl::Mutex mu;
    int left ABSL_GUARDED_BY(mu) = 0;
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  auto pending = std::make_shared<Pending>();
  {
    absl::MutexLock lock(&pending->mu);
    pending->left = static_cast<int>(sites.size());
  }
  auto finished = [pending, done](const std::string& site,
                                  absl::Status status) {
    bool last = false;
    absl::Status result;
    {
      absl::MutexLock lock(&pending->mu);
      if (!status.ok() && pending->first_error.ok()) {
        pending->first_error = absl::Status(
            status.code(), absl::StrCat(site, ": ", status.message()));
      }
      last = --pending->left == 0;
      result = pending->first_error;
    }
    if (last) done(result);
  };
  for (const v1::SiteInfo& site : sites) {
    runner_->Post([this, site, header, model, timeout, finished] {
      if (site.name() == options_.site) {
        absl::Status status =
            store_->SaveFinal(header.job_id(), header.kind(), *model,
                              ModelMetadataFromHeader(header));
        if (status.ok()) {
          absl::MutexLock lock(&mu_);
          status = StatusFromReply(AcceptFinal(header, model));
        }
        finished(site.name(), status);
        return;
      }
      CallWithRetry(
          absl::StrCat(v1::ModelKind_Name(header.kind()), " to ", site.name()),
          [this, site, header, model, timeout] {
            return StatusFromReply(
                transport_->SendFinalResult(site, header, model, timeout));
          },
          [finished, name = site.name()](absl::Status status) {
            finished(name, status);
          });
    });
  }
}

v1::Reply SwarmController::AcceptFinal(const v1::ModelHeader& header,
                                       std::shared_ptr<const Model> model) {
  finals_[header.kind()] = model;
  final_rounds_[header.kind()] = header.round();
  // The record is taken only from the last round's aggregator (who closed
  // the last round and so knows the final best); a BEST from the holder
  // carries the record this site already has (AdmitFinal checked it).
  if (header.sender() == LastRoundAggregator() || header.sender() == options_.site) {
    best_ = header.best();
  }
  Bump();
  SWARM_LOG_INFO("job %s: %s model of round %d received from %s",
                 header.job_id(),
                 header.kind() == v1::MODEL_KIND_BEST ? "BEST" : "LAST",
                 header.round(), header.sender());
  if (finals_.count(v1::MODEL_KIND_BEST) > 0 &&
      finals_.count(v1::MODEL_KIND_LAST) > 0 && !Terminal(state_)) {
    SetState(v1::SITE_STATE_DONE);
    PersistState();
    SWARM_LOG_INFO("job %s: done (best metric %s)", header.job_id(),
                   FormatMetric(best_));
  }
  return MakeReply(v1::OUTCOME_OK, "stored");
}

// ---------------------------------------------------------------------------
// Incoming model streams

std::string SwarmController::LastRoundAggregator() const {
  const std::vector<std::string> order =
      ElectionOrder(*job_, job_->start_round() + job_->num_rounds() - 1);
  return order.empty() ? "" : order[0];
}

absl::Status SwarmController::CheckLearnTaskSender(
    const v1::ModelHeader& header) const {
  const uint32_t round = header.round();
  if (round < job_->start_round() ||
      round >= job_->start_round() + job_->num_rounds()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", round, " is outside the job's rounds ", job_->start_round(),
        "..", job_->start_round() + job_->num_rounds() - 1));
  }
  const std::vector<std::string> order = ElectionOrder(*job_, round);
  if (order.empty() || header.aggregator() != order[0]) {
    return absl::PermissionDeniedError(absl::StrCat(
        "learn task names ", header.aggregator(), " as aggregator of round ",
        round, "; the election chose ", order.empty() ? "nobody" : order[0]));
  }
  std::string scatterer = job_->starting_site();
  if (round > job_->start_round()) {
    const std::vector<std::string> previous = ElectionOrder(*job_, round - 1);
    scatterer = previous.empty() ? "" : previous[0];
  }
  if (header.sender() != scatterer) {
    return absl::PermissionDeniedError(absl::StrCat(
        "learn task of round ", round, " must come from ", scatterer,
        round > job_->start_round() ? " (the aggregator of round "
                                    : " (the starting site",
        round > job_->start_round() ? absl::StrCat(round - 1, ")") : ")",
        ", not from ", header.sender()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelAdmission> SwarmController::AdmitModel(
    const v1::ModelHeader& header) {
  absl::MutexLock lock(&mu_);
  SWARM_RETURN_IF_ERROR(CheckJob(header.job_id()));
  if (Site(header.sender()) == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("sender \"", header.sender(), "\" is not a site of job ",
                     job_->job_id()));
  }
  ModelAdmission admission;
  admission.assembler.limits = options_.limits;
  admission.assembler.limits.max_model_bytes = std::min(
      admission.assembler.limits.max_model_bytes, job_->max_model_bytes());
  admission.assembler.expected_kind = header.kind();
  switch (header.kind()) {
    case v1::MODEL_KIND_LEARN_TASK:
      if (Terminal(state_)) {
        return absl::FailedPreconditionError(
            absl::StrCat("job is ", v1::SiteState_Name(state_)));
      }
      // A repeat of the task this site accepted (its acknowledgement was
      // lost) is received again and acknowledged again (AcceptLearnTask).
      if (last_task_round_.has_value() && header.round() <= *last_task_round_ &&
          !(header.round() == *last_task_round_ &&
            header.aggregator() == round_aggregator_)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "site ", options_.site, " already has the learn task of round ",
            *last_task_round_));
      }
      SWARM_RETURN_IF_ERROR(CheckLearnTaskSender(header));
      if (header.aggregator() != options_.site && !IsTrainer(options_.site)) {
        return absl::FailedPreconditionError(
            absl::StrCat("site ", options_.site,
                         " is neither a trainer nor the round's aggregator"));
      }
      if (current_global_ != nullptr) {
        admission.assembler.expected_specs = current_global_->specs();
      }
      return admission;
    case v1::MODEL_KIND_RESULT:
      if (!IsTrainer(header.sender())) {
        return absl::PermissionDeniedError(
            absl::StrCat("sender ", header.sender(),
                         " is not a trainer of job ", job_->job_id()));
      }
      return AdmitResult(header);
    case v1::MODEL_KIND_BEST:
    case v1::MODEL_KIND_LAST: {
      if (!started_) {
        return absl::FailedPreconditionError("the job has not started here");
      }
      return AdmitFinal(header);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("a stream of kind ", v1::ModelKind_Name(header.kind()),
                       " cannot be sent to a site"));
  }
}

absl::StatusOr<ModelAdmission> SwarmController::AdmitFinal(
    const v1::ModelHeader& header) {
  // Final models are accepted only from senders this site knows itself,
  // never from what a header claims (design section 6): LAST from the last
  // round's aggregator as this site elects it; BEST from that aggregator or
  // from the best model's holder as this site's own record names it (the
  // record came with the learn tasks and with the aggregator's LAST, which
  // it sends first).
  const std::string last_aggregator = LastRoundAggregator();
  const bool from_aggregator = header.sender() == last_aggregator;
  const bool from_holder = header.kind() == v1::MODEL_KIND_BEST &&
                           best_.present() && header.sender() == best_.site();
  if (!from_aggregator && !from_holder) {
    const std::string holder =
        best_.present() ? absl::StrCat(" or from the best model's holder ",
                                       best_.site(), " (this site's record)")
                        : std::string();
    return absl::PermissionDeniedError(absl::StrCat(
        v1::ModelKind_Name(header.kind()), " from ", header.sender(),
        " refused: ",
        header.kind() == v1::MODEL_KIND_LAST ? "LAST" : "BEST",
        " comes only from the last round's aggregator ", last_aggregator,
        header.kind() == v1::MODEL_KIND_BEST ? holder : std::string()));
  }
  if (from_holder && !from_aggregator &&
      header.round() != best_.round()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "BEST of round ", header.round(), " from ", header.sender(),
        " refused: this site's record names the model of round ",
        best_.round()));
  }
  if (!started_) {
    return absl::FailedPreconditionError("the job has not started here");
  }
  ModelAdmission admission;
  if (state_ == v1::SITE_STATE_DONE) {
    // An identical re-send (its acknowledgement was lost) is acknowledged
    // without writing; anything else is refused.
    auto it = final_rounds_.find(header.kind());
    if (it != final_rounds_.end() && it->second == header.round()) {
      admission.header_only = true;
      admission.reply_message = absl::StrCat(
          v1::ModelKind_Name(header.kind()), " of round ", header.round(),
          " already stored");
      return admission;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_->job_id(), " is done here; ",
                     v1::ModelKind_Name(header.kind()), " of round ",
                     header.round(), " refused"));
  }
  if (Terminal(state_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job is ", v1::SiteState_Name(state_)));
  }
  admission.assembler.limits = options_.limits;
  admission.assembler.limits.max_model_bytes = std::min(
      admission.assembler.limits.max_model_bytes, job_->max_model_bytes());
  admission.assembler.expected_kind = header.kind();
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
