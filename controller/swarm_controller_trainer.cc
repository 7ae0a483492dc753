// SwarmController, trainer side (design section 3, steps 1 to 5): the scatter
// of each round's learn tasks, training, asking the aggregator for permission
// and submitting the result.
#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "controller/admission.h"
#include "controller/aggregation_round.h"
#include "controller/replies.h"
#include "controller/retry_policy.h"
#include "controller/swarm_controller.h"
#include "model/weight_diff.h"

namespace swarm {

namespace {

// The first phase of a scatter: counts the trainers' answers to their learn
// tasks and, once the last has answered, runs `then` with the ones that
// acknowledged (sorted), which form the round's expected set.
class ScatterAcks {
 public:
  ScatterAcks(size_t targets,
              std::function<void(std::vector<std::string>)> then)
      : left_(targets), then_(std::move(then)) {}

  void Answered(const std::string& target, bool acknowledged) {
    std::vector<std::string> acked;
    {
      absl::MutexLock lock(&mu_);
      if (acknowledged) acked_.push_back(target);
      if (--left_ > 0) return;
      acked = acked_;
    }
    then_(std::move(acked));
  }
  // For a scatter with no trainer to wait for.
  void Nobody() { then_({}); }

 private:
  absl::Mutex mu_;
  size_t left_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> acked_ ABSL_GUARDED_BY(mu_);
  const std::function<void(std::vector<std::string>)> then_;
};

}  // namespace

void SwarmController::Scatter(uint32_t round,
                              std::shared_ptr<const Model> global,
                              v1::BestRecord best) {
  std::vector<std::string> trainers;
  v1::ModelHeader header;
  {
    absl::MutexLock lock(&mu_);
    if (!Active()) return;
    const std::vector<std::string> order = job_->ElectionOrder(round);
    if (order.empty()) {
      Fail("election",
           absl::FailedPreconditionError("no aggregator candidate"));
      return;
    }
    trainers = job_->trainers();
    header = BaseHeader(v1::MODEL_KIND_LEARN_TASK, round);
    header.set_aggregator(order[0]);
    for (size_t i = 1; i < order.size(); ++i)
      header.add_backup_aggregators(order[i]);
    *header.mutable_best() = best;
    SWARM_LOG_INFO("round %d: scattering to %d trainers, aggregator %s", round,
                   static_cast<int>(trainers.size()), order[0]);
  }
  const std::string aggregator = header.aggregator();
  const bool aggregator_trains =
      std::find(trainers.begin(), trainers.end(), aggregator) != trainers.end();
  // Phase 1: every trainer but the aggregator; their acknowledgements form
  // the round's expected set. Phase 2: the aggregator, with that set.
  std::vector<std::string> targets;
  for (const std::string& trainer : trainers) {
    if (trainer != aggregator) targets.push_back(trainer);
  }
  auto acks = std::make_shared<ScatterAcks>(
      targets.size(), [this, round, header, global, best,
                       aggregator_trains](std::vector<std::string> expected) {
        if (aggregator_trains) expected.push_back(header.aggregator());
        std::sort(expected.begin(), expected.end());
        SendLearnTaskToAggregator(
            round, header.aggregator(),
            std::vector<std::string>(header.backup_aggregators().begin(),
                                     header.backup_aggregators().end()),
            global, best, expected);
      });
  if (targets.empty()) {
    runner_->Post([acks] { acks->Nobody(); });
    return;
  }
  for (const std::string& target : targets) {
    runner_->Post([this, target, header, global, acks] {
      SendLearnTaskToTrainer(target, header, global,
                             [acks, target](bool acknowledged) {
                               acks->Answered(target, acknowledged);
                             });
    });
  }
}

void SwarmController::SendLearnTaskToTrainer(
    const std::string& target, const v1::ModelHeader& header,
    std::shared_ptr<const Model> global, std::function<void(bool)> answered) {
  auto finished = [this, target, round = header.round(),
                   answered = std::move(answered)](absl::Status status) {
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      ReportError(absl::StrCat("round ", round, ": learn task to ", target,
                               " not acknowledged; not waiting for it"),
                  status);
    }
    answered(status.ok());
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
  std::optional<v1::SiteInfo> to;
  absl::Duration ack_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (const v1::SiteInfo* site = Site(target); site != nullptr) to = *site;
    if (job_ != nullptr) ack_timeout = job_->learn_task_ack_timeout();
  }
  if (!to.has_value()) {
    finished(absl::NotFoundError("not a site of the job"));
    return;
  }
  CallWithRetry(
      absl::StrCat("learn task to ", target),
      [this, to = *to, header, global, ack_timeout] {
        return StatusFromReply(
            transport_->SendLearnTask(to, header, global, ack_timeout));
      },
      finished);
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
    ack_timeout = job_->learn_task_ack_timeout();
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
    budget.until = runner_->Now() + job_->request_to_submit_max_wait();
    budget.still_wanted = [this, job_id = job_->id()] {
      absl::MutexLock lock(&mu_);
      return Active() && job_->id() == job_id;
    };
  }
  CallWithRetry(
      absl::StrCat("learn task to aggregator ", aggregator),
      [this, to, header, global, maybe_delivered, round, aggregator,
       ack_timeout] {
        absl::Status status = StatusFromReply(
            transport_->SendLearnTask(to, header, global, ack_timeout));
        if (RetryPolicy::Retryable(status)) {
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
  if (IsTerminal(record_.state)) {
    return MakeReply(
        v1::OUTCOME_ABORTED,
        absl::StrCat("job is ", v1::SiteState_Name(record_.state)));
  }
  if (record_.last_task_round.has_value() &&
      header.round() == *record_.last_task_round &&
      header.aggregator() == record_.round_aggregator) {
    // The same task again: the sender retried because our acknowledgement
    // was lost. Acknowledge it again; nothing else changes.
    return MakeReply(v1::OUTCOME_OK,
                     absl::StrCat("learn task of round ", header.round(),
                                  " already accepted"));
  }
  if (record_.last_task_round.has_value() &&
      header.round() <= *record_.last_task_round) {
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("site ", options_.site,
                                  " already has the learn task of round ",
                                  *record_.last_task_round));
  }
  const bool aggregate = header.aggregator() == options_.site;
  const bool train = IsTrainer(options_.site);
  record_.started = true;
  record_.last_task_round = header.round();
  record_.round_aggregator = header.aggregator();
  record_.best = header.best();
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
    if (job_->config().send_weight_diff() &&
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
  {
    absl::MutexLock lock(&mu_);
    if (training_ != task || !Active() || task->cancel) return;
    request.set_job_id(job_->id());
    request.set_sender(options_.site);
    request.set_round(task->round);
    timeout = job_->request_to_submit_message_timeout();
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
  OnPermissionRefused(task, reply, version_before);
}

void SwarmController::OnPermissionRefused(
    std::shared_ptr<TrainingTask> task,
    const absl::StatusOr<v1::SubmitPermissionReply>& reply,
    uint64_t version_before) {
  absl::Duration wait = job_->request_to_submit_interval();
  const absl::Time give_up =
      task->asking_since + job_->request_to_submit_max_wait();
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
  const bool again = (!reply.ok() && RetryPolicy::Retryable(reply.status())) ||
                     (reply.ok() && reply->outcome() == v1::OUTCOME_RETRY);
  if (again && Active()) {
    // The permission was released with the failed upload: ask again.
    SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
    runner_->PostAfter(job_->request_to_submit_interval(),
                       [this, task] { AskToSubmit(task); });
    return;
  }
  training_.reset();
  SetState(v1::SITE_STATE_IDLE);
}

}  // namespace swarm
