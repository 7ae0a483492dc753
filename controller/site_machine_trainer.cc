// SiteMachine, trainer side (design section 3, steps 1 to 5): the scatter of
// each round's learn tasks, training, asking the aggregator for permission
// and submitting the result.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "controller/replies.h"
#include "controller/retry_policy.h"
#include "controller/site_machine.h"

namespace swarm {

namespace {

// How a call answered by a Reply ended, as a status.
absl::Status ReplyStatus(const event::CallDone& e) {
  if (!e.reply.ok()) return e.reply.status();
  return StatusFromReply(e.reply->reply);
}

}  // namespace

void SiteMachine::ScatterRound(uint32_t round,
                               std::shared_ptr<const Model> global,
                               v1::BestRecord best) {
  if (!Active()) return;
  const std::vector<std::string> order = job_->ElectionOrder(round);
  if (order.empty()) {
    return Fail("election",
                absl::FailedPreconditionError("no aggregator candidate"));
  }
  Scatter scatter;
  scatter.header = BaseHeader(v1::MODEL_KIND_LEARN_TASK, round);
  scatter.header.set_aggregator(order[0]);
  for (size_t i = 1; i < order.size(); ++i) {
    scatter.header.add_backup_aggregators(order[i]);
  }
  *scatter.header.mutable_best() = best;
  scatter.global = std::move(global);
  SWARM_LOG_INFO("round %d: scattering to %d trainers, aggregator %s", round,
                 static_cast<int>(job_->trainers().size()), order[0]);
  // Phase 1: every trainer but the aggregator; their acknowledgements form
  // the round's expected set. Phase 2: the aggregator, with that set.
  for (const std::string& trainer : job_->trainers()) {
    if (trainer != order[0]) scatter.waiting.insert(trainer);
  }
  if (scatter.waiting.empty()) return SendTaskToAggregator(scatter);
  for (const std::string& target : scatter.waiting) {
    PeerMessage message;
    message.kind = CallKind::kLearnTask;
    message.header = scatter.header;
    message.model = scatter.global;
    message.timeout = job_->learn_task_ack_timeout();
    Call call;
    call.purpose = Call::Purpose::kTaskToTrainer;
    call.round = round;
    Send(target, std::move(message), call);
  }
  scatters_[round] = std::move(scatter);
}

void SiteMachine::OnTaskToTrainerDone(const Call& call,
                                      const event::CallDone& e) {
  const absl::Status status = ReplyStatus(e);
  if (!status.ok()) {
    ReportError(
        absl::StrCat("round ", call.round, ": learn task to ", call.target,
                     " not acknowledged; not waiting for it"),
        status);
  }
  auto it = scatters_.find(call.round);
  if (it == scatters_.end()) return;
  Scatter& scatter = it->second;
  scatter.waiting.erase(call.target);
  if (status.ok()) scatter.acked.push_back(call.target);
  if (!scatter.waiting.empty()) return;
  Scatter done = std::move(scatter);
  scatters_.erase(it);
  SendTaskToAggregator(done);
}

void SiteMachine::SendTaskToAggregator(const Scatter& scatter) {
  if (!Active()) return;
  const std::string& aggregator = scatter.header.aggregator();
  std::vector<std::string> expected = scatter.acked;
  if (IsTrainer(aggregator)) expected.push_back(aggregator);
  std::sort(expected.begin(), expected.end());
  PeerMessage message;
  message.kind = CallKind::kLearnTask;
  message.header = scatter.header;
  for (const std::string& name : expected) {
    message.header.add_expected_trainers(name);
  }
  message.model = scatter.global;
  message.timeout = job_->learn_task_ack_timeout();
  Call call;
  call.purpose = Call::Purpose::kTaskToAggregator;
  call.round = scatter.header.round();
  // Without this task the round cannot happen, and the trainers, which
  // already hold theirs, wait for it up to request_to_submit_max_wait: so
  // keep trying that long (an aggregator back from a restart or a network
  // cut then runs the round), as long as this job runs here.
  Send(aggregator, std::move(message), call, /*retry=*/true,
       now_ + job_->request_to_submit_max_wait());
}

void SiteMachine::OnTaskToAggregatorDone(const Call& call,
                                         const event::CallDone& e) {
  const absl::Status status = ReplyStatus(e);
  if (status.ok() || !Active()) return;
  if (status.code() == absl::StatusCode::kFailedPrecondition &&
      e.maybe_delivered) {
    // An earlier attempt did arrive and the aggregator has moved on (it
    // holds this round's task or a later one, or has finished): the round
    // went ahead. Not a reason to fail the job.
    SWARM_LOG_INFO("round %d: aggregator %s already had its learn task (%s)",
                   call.round, call.target, status.message());
    return;
  }
  if (call.target == options_.site) {
    return Fail(absl::StrCat("round ", call.round, ": own learn task"), status);
  }
  // Failover to a backup aggregator is the resilience issue's; for now the
  // job cannot continue without this round's aggregator.
  Fail(absl::StrCat("round ", call.round, ": aggregator ", call.target,
                    " unreachable"),
       status);
}

v1::Reply SiteMachine::AcceptLearnTask(const v1::ModelHeader& header,
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
  PermissionMayChange();
  if (aggregate) OpenRound(header, model);
  if (train) {
    if (training_.has_value()) out_.push_back(effect::CancelTraining{});
    training_.emplace();
    training_->id = next_training_++;
    training_->round = header.round();
    training_->global = model;
    training_->aggregator = header.aggregator();
    SetState(v1::SITE_STATE_TRAINING);
    out_.push_back(effect::StartTraining{header.round(), model,
                                         job_->config().send_weight_diff()});
  } else if (aggregate) {
    SetState(v1::SITE_STATE_GATHERING);
  }
  SWARM_LOG_INFO("round %d: learn task from %s (aggregator %s%s)",
                 header.round(), header.sender(), header.aggregator(),
                 aggregate ? ", that is me" : "");
  return MakeReply(v1::OUTCOME_OK, "learn task accepted");
}

void SiteMachine::OnTrainingDone(event::TrainingDone& e) {
  if (!training_.has_value() || training_->round != e.round ||
      training_->trained || !Active()) {
    return;
  }
  Training& task = *training_;
  task.trained = true;
  v1::ModelHeader& header = task.result_header;
  header = BaseHeader(v1::MODEL_KIND_RESULT, task.round);
  header.set_aggregator(task.aggregator);
  if (e.metrics.ok()) {
    for (const auto& [name, value] : *e.metrics) {
      (*header.mutable_metrics())[name] = value;
    }
    metrics_ = *e.metrics;
  }
  absl::StatusOr<TrainOutput>& output = e.output;
  if (e.metrics.ok() && output.ok()) {
    header.set_sample_count(output->sample_count);
    header.set_payload_kind(output->kind);
    counters_.set_rounds_trained(counters_.rounds_trained() + 1);
    task.result = std::make_shared<const Model>(std::move(output->model));
  } else {
    const absl::Status failed =
        e.metrics.ok() ? output.status() : e.metrics.status();
    ReportError(absl::StrCat("round ", task.round, ": training"), failed);
    header.set_failed(true);
    header.set_failure(std::string(failed.message()));
  }
  task.asking_since = now_;
  SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  AskToSubmit();
}

void SiteMachine::AskToSubmit() {
  if (!training_.has_value() || !Active()) return;
  PeerMessage message;
  message.kind = CallKind::kRequestToSubmit;
  message.permission.set_job_id(job_->id());
  message.permission.set_sender(options_.site);
  message.permission.set_round(training_->round);
  message.timeout = job_->request_to_submit_message_timeout();
  Call call;
  call.purpose = Call::Purpose::kAskPermission;
  call.round = training_->round;
  Send(training_->aggregator, std::move(message), call, /*retry=*/false);
}

void SiteMachine::OnPermissionReply(const Call& call,
                                    const event::CallDone& e) {
  if (!training_.has_value() || training_->round != call.round || !Active()) {
    return;
  }
  Training& task = *training_;
  if (e.reply.ok() && e.reply->permission.outcome() == v1::OUTCOME_OK) {
    SetState(v1::SITE_STATE_SUBMITTING);
    PeerMessage message;
    message.kind = CallKind::kSubmitResult;
    message.header = task.result_header;
    message.model = task.result;
    Call submit;
    submit.purpose = Call::Purpose::kSubmit;
    submit.round = task.round;
    Send(task.aggregator, std::move(message), submit, /*retry=*/false);
    return;
  }
  absl::Duration wait = job_->request_to_submit_interval();
  const absl::Time give_up =
      task.asking_since + job_->request_to_submit_max_wait();
  if (e.reply.ok()) {
    const v1::SubmitPermissionReply& reply = e.reply->permission;
    if (reply.outcome() != v1::OUTCOME_RETRY) {
      ReportError(absl::StrCat("round ", task.round, ": aggregator ",
                               task.aggregator, " refused the submission"),
                  absl::FailedPreconditionError(reply.message()));
      training_.reset();
      SetState(v1::SITE_STATE_IDLE);
      return;
    }
    wait = absl::Milliseconds(reply.retry_after_ms());
  } else {
    ReportError(absl::StrCat("round ", task.round, ": asking to submit to ",
                             task.aggregator),
                e.reply.status());
  }
  if (now_ + wait > give_up) {
    if (!e.reply.ok()) {
      // The aggregator stayed unreachable for request_to_submit_max_wait.
      // Without failover nothing will come for this job: fail visibly
      // rather than wait idle forever.
      return Fail(
          absl::StrCat("round ", task.round, ": aggregator ", task.aggregator,
                       " unreachable for request_to_submit_max_wait"),
          e.reply.status());
    }
    ReportError(
        absl::StrCat("round ", task.round, ": gave up asking ", task.aggregator,
                     " to submit"),
        absl::DeadlineExceededError("request_to_submit_max_wait passed"));
    training_.reset();
    SetState(v1::SITE_STATE_IDLE);
    return;
  }
  if (wait <= absl::ZeroDuration()) return AskToSubmit();
  Timer timer;
  timer.purpose = Timer::Purpose::kAskAgain;
  timer.training = task.id;
  SetTimer(now_ + wait, timer);
}

void SiteMachine::OnSubmitDone(const Call& call, const event::CallDone& e) {
  if (!training_.has_value() || training_->round != call.round) return;
  const absl::Status status = ReplyStatus(e);
  if (status.ok()) {
    SWARM_LOG_INFO("round %d: result submitted to %s", call.round, call.target);
    training_.reset();
    SetState(rounds_.empty() ? v1::SITE_STATE_IDLE : v1::SITE_STATE_GATHERING);
    return;
  }
  ReportError(
      absl::StrCat("round ", call.round, ": submitting to ", call.target),
      status);
  const bool again =
      (!e.reply.ok() && RetryPolicy::Retryable(e.reply.status())) ||
      (e.reply.ok() && e.reply->reply.outcome() == v1::OUTCOME_RETRY);
  if (again && Active()) {
    // The permission was released with the failed upload: ask again.
    SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
    Timer timer;
    timer.purpose = Timer::Purpose::kAskAgain;
    timer.training = training_->id;
    SetTimer(now_ + job_->request_to_submit_interval(), timer);
    return;
  }
  training_.reset();
  SetState(v1::SITE_STATE_IDLE);
}

}  // namespace swarm
