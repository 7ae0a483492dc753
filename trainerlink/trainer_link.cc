#include "trainerlink/trainer_link.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "privacy/accountant.h"
#include "trainerlink/model_files.h"

namespace swarm::trainerlink {
namespace {

// How often a waiting Learner call looks at its cancel flag (the interface
// hands over a bare atomic with nothing to wait on).
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);
// Longest a NextTask call is held.
constexpr absl::Duration kMaxTaskWait = absl::Seconds(1);
// Outcomes kept for late calls about finished tasks.
constexpr size_t kFinishedKept = 32;

std::string NewSessionId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

std::string TaskName(const v1::TrainerTask& task) {
  if (task.kind() == v1::TRAINER_TASK_INITIAL_MODEL) {
    return absl::StrCat("task ", task.task_id(), " (initial model)");
  }
  return absl::StrCat("task ", task.task_id(), " (round ", task.round(), ")");
}

}  // namespace

TrainerLink::TrainerLink(LinkOptions options) : options_(std::move(options)) {
  lease_thread_ = std::thread([this] { WatchLeases(); });
}

TrainerLink::~TrainerLink() {
  Shutdown();
  lease_thread_.join();
}

void TrainerLink::SetJobView(std::function<JobView()> view) {
  absl::MutexLock lock(&view_mu_);
  job_view_ = std::move(view);
}

JobView TrainerLink::View() {
  std::function<JobView()> view;
  {
    absl::MutexLock lock(&view_mu_);
    view = job_view_;
  }
  return view ? view() : JobView();
}

void TrainerLink::SetParams(std::map<std::string, std::string> params) {
  absl::MutexLock lock(&mu_);
  params_ = std::move(params);
}

void TrainerLink::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  shutdown_ = true;
  if (task_ != nullptr && task_->state != TaskState::kFinished) {
    Finish(task_.get(), absl::UnavailableError("the site is shutting down"));
  }
}

// ---------------------------------------------------------------------------
// Sessions and leases

absl::StatusOr<TrainerLink::Session*> TrainerLink::FindSession(
    const std::string& id) {
  if (shutdown_) return absl::UnavailableError("the site is shutting down");
  if (!session_.has_value() || session_->id != id) {
    return absl::NotFoundError(
        "unknown trainer session (it expired or was replaced): attach again");
  }
  session_->lease_until = absl::Now() + options_.lease;
  return &*session_;
}

void TrainerLink::DropSession(const std::string& reason) {
  if (!session_.has_value()) return;
  const std::string who =
      absl::StrCat(session_->name, " (pid ", session_->pid, ")");
  if (task_ != nullptr && task_->state == TaskState::kRunning &&
      task_->session == session_->id) {
    Finish(task_.get(), absl::UnavailableError(
                            absl::StrCat("trainer ", who, " ", reason,
                                         " during ", TaskName(task_->proto))));
  }
  SWARM_LOG_WARNING("trainer %s dropped: %s", who, reason);
  session_.reset();
  ++session_changes_;
}

void TrainerLink::TrainerExited(int64_t pid, const std::string& how) {
  absl::MutexLock lock(&mu_);
  if (session_.has_value() && session_->pid == pid) {
    DropSession(absl::StrCat("process ", how));
  }
}

bool TrainerLink::WaitingForTrainerLocked() const {
  return !shutdown_ && !session_.has_value() && task_ != nullptr &&
         task_->state != TaskState::kFinished;
}

std::string TrainerLink::WaitingFor() {
  absl::MutexLock lock(&mu_);
  return WaitingForTrainerLocked() ? "waiting for trainer" : "";
}

void TrainerLink::SetWaitingListener(std::function<void()> changed) {
  absl::MutexLock lock(&listener_mu_);
  waiting_listener_ = std::move(changed);
}

void TrainerLink::WatchLeases() {
  mu_.Lock();
  while (!shutdown_) {
    const absl::Time until =
        session_.has_value() ? session_->lease_until : absl::InfiniteFuture();
    const uint64_t changes = session_changes_;
    auto changed = [this, changes]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return shutdown_ || session_changes_ != changes ||
             WaitingForTrainerLocked() != told_waiting_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), until);
    if (shutdown_) break;
    if (session_.has_value() && session_->lease_until <= absl::Now()) {
      DropSession(absl::StrCat("stopped answering: no call for ",
                               absl::FormatDuration(options_.lease),
                               " (its lease)"));
    }
    if (WaitingForTrainerLocked() != told_waiting_) {
      told_waiting_ = !told_waiting_;
      // The listener may take the daemon's locks (and ask WaitingFor()):
      // it runs without the link's lock.
      mu_.Unlock();
      {
        absl::MutexLock listening(&listener_mu_);
        if (waiting_listener_) waiting_listener_();
      }
      mu_.Lock();
    }
  }
  mu_.Unlock();
}

absl::StatusOr<v1::AttachReply> TrainerLink::Attach(
    const v1::AttachRequest& request) {
  if (request.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer link protocol version mismatch: the trainer speaks version ",
        request.protocol_version(), ", site ", options_.site,
        "'s daemon speaks version ", kProtocolVersion));
  }
  const JobView view = View();
  if (!request.job_id().empty() && !view.job_id.empty() &&
      request.job_id() != view.job_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this trainer link serves site ", options_.site, "'s job \"",
        view.job_id, "\", not job \"", request.job_id(), "\""));
  }
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the site is shutting down");
  const absl::Time now = absl::Now();
  if (session_.has_value() && session_->lease_until <= now) {
    DropSession(absl::StrCat("stopped answering: no call for ",
                             absl::FormatDuration(options_.lease),
                             " (its lease)"));
  }
  if (session_.has_value()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "site ", options_.site, " already has a trainer attached: ",
        session_->name, " (pid ", session_->pid, ", since ",
        absl::FormatTime("%H:%M:%S", session_->attached, absl::LocalTimeZone()),
        "); one trainer at a time"));
  }
  Session session;
  session.id = NewSessionId();
  session.name =
      request.trainer_name().empty() ? "trainer" : request.trainer_name();
  session.pid = request.pid();
  session.job = request.job_id();
  session.attached = now;
  session.lease_until = now + options_.lease;
  session_ = session;
  ++session_changes_;
  warned_waiting_ = false;
  SWARM_LOG_INFO("trainer %s (pid %d) attached (lease %s)", session.name,
                 session.pid, absl::FormatDuration(options_.lease));
  v1::AttachReply reply;
  reply.set_session_id(session.id);
  reply.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  reply.set_site(options_.site);
  reply.set_protocol_version(kProtocolVersion);
  reply.set_job_id(view.job_id);
  return reply;
}

absl::StatusOr<v1::HeartbeatReply> TrainerLink::Heartbeat(
    const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindSession(request.session_id());
  if (!session.ok()) return session.status();
  v1::HeartbeatReply reply;
  for (uint64_t id : (*session)->cancelled) reply.add_cancelled_task_ids(id);
  (*session)->cancelled.clear();
  return reply;
}

absl::Status TrainerLink::Detach(const v1::DetachRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindSession(request.session_id());
  if (!session.ok()) return session.status();
  DropSession("detached");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Tasks, trainer side

absl::StatusOr<v1::NextTaskReply> TrainerLink::NextTask(
    const v1::NextTaskRequest& request) {
  const JobView view = View();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> found = FindSession(request.session_id());
  if (!found.ok()) return found.status();
  v1::NextTaskReply reply;
  auto job_end = [&](Session* session) {
    v1::TrainerTask* end = reply.mutable_task();
    end->set_kind(v1::TRAINER_TASK_JOB_END);
    end->set_job_id(session->job);
    end->set_site(options_.site);
    session->job.clear();
  };
  const std::string id = request.session_id();
  const uint64_t changes = session_changes_;
  auto ready = [this, changes]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || session_changes_ != changes ||
           (task_ != nullptr && task_->state == TaskState::kQueued);
  };
  // Capped so that the end of a job (which the link learns by asking
  // View) reaches an idle trainer within about a second.
  const absl::Duration wait = std::min({absl::Milliseconds(request.wait_ms()),
                                        options_.lease / 2, kMaxTaskWait});
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  found = FindSession(id);
  if (!found.ok()) return found.status();
  Session* session = *found;
  if (task_ != nullptr && task_->state == TaskState::kQueued) {
    if (!session->job.empty() && session->job != task_->proto.job_id()) {
      job_end(session);  // The next call gets the new job's task.
      return reply;
    }
    task_->state = TaskState::kRunning;
    task_->session = session->id;
    session->job = task_->proto.job_id();
    *reply.mutable_task() = task_->proto;
    SWARM_LOG_INFO("%s handed to trainer %s", TaskName(task_->proto),
                   session->name);
    return reply;
  }
  if (!session->job.empty() && (view.job_id != session->job || view.ended)) {
    job_end(session);
  }
  return reply;
}

absl::StatusOr<TrainerLink::Task*> TrainerLink::HeldTask(const Session& session,
                                                         uint64_t task_id) {
  if (task_ != nullptr && task_->proto.task_id() == task_id) {
    if (task_->session != session.id) {
      return absl::FailedPreconditionError(absl::StrCat(
          TaskName(task_->proto), " is not held by this trainer session"));
    }
    if (task_->state == TaskState::kRunning) return task_.get();
  }
  auto it = finished_.find(task_id);
  if (it == finished_.end()) {
    return absl::NotFoundError(absl::StrCat("no task ", task_id));
  }
  if (it->second.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", task_id, " is already finished"));
  }
  return absl::Status(it->second.code(),
                      absl::StrCat("task ", task_id, " is no longer open: ",
                                   it->second.message()));
}

absl::Status TrainerLink::ReportValidation(
    const v1::ValidationRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindSession(request.session_id());
  if (!session.ok()) return session.status();
  absl::StatusOr<Task*> task = HeldTask(**session, request.task_id());
  if (!task.ok()) return task.status();
  Metrics metrics(request.metrics().begin(), request.metrics().end());
  (*task)->validation = std::move(metrics);
  return absl::OkStatus();
}

void TrainerLink::SetRequireDp(bool require_dp) {
  absl::MutexLock lock(&mu_);
  require_dp_ = require_dp;
}

absl::Status TrainerLink::CheckPrivacyReport(
    const Task& task, const v1::SubmitResultRequest& request) {
  if (task.proto.kind() != v1::TRAINER_TASK_TRAIN) return absl::OkStatus();
  if (!request.has_privacy()) {
    if (!task.proto.require_dp()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "result of ", TaskName(task.proto),
        ": the job requires differential privacy and the result reports no "
        "privacy cost (SubmitResultRequest.privacy: sampling_rate, "
        "noise_multiplier, steps; the SDK's task.submit(..., privacy=...))"));
  }
  if (absl::Status valid = privacy::ValidateCost(request.privacy());
      !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "result of ", TaskName(task.proto), ": ", valid.message()));
  }
  return absl::OkStatus();
}

absl::Status TrainerLink::SubmitResult(const v1::SubmitResultRequest& request) {
  std::string path;
  std::vector<TensorSpec> expected;
  bool initial = false;
  std::shared_ptr<Task> held;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = FindSession(request.session_id());
    if (!session.ok()) return session.status();
    absl::StatusOr<Task*> task = HeldTask(**session, request.task_id());
    if (!task.ok()) return task.status();
    if ((*task)->submitting) {
      return absl::FailedPreconditionError(absl::StrCat(
          TaskName((*task)->proto), ": a result is already being submitted"));
    }
    if (!request.failure().empty()) {
      Finish(*task, absl::AbortedError(absl::StrCat(
                        "trainer reported a failure: ", request.failure())));
      return absl::OkStatus();
    }
    initial = (*task)->proto.kind() == v1::TRAINER_TASK_INITIAL_MODEL;
    if (absl::Status privacy = CheckPrivacyReport(**task, request);
        !privacy.ok()) {
      Finish(*task, privacy);
      return privacy;
    }
    if (!initial && request.sample_count() == 0) {
      const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
          "result of ", TaskName((*task)->proto),
          ": sample_count is 0 (it must be the number of training samples, "
          "> 0)"));
      Finish(*task, bad);
      return bad;
    }
    (*task)->submitting = true;
    path = (*task)->proto.result_path();
    expected = (*task)->expected;
    held = task_;
  }
  // Mapping and checking a large result must not hold up heartbeats.
  absl::StatusOr<Model> result =
      LoadResultFile(path, initial ? nullptr : &expected);
  absl::MutexLock lock(&mu_);
  held->submitting = false;
  if (held->state == TaskState::kFinished) {
    return absl::Status(held->outcome.ok() ? absl::StatusCode::kCancelled
                                           : held->outcome.code(),
                        absl::StrCat(TaskName(held->proto),
                                     " ended while its result was checked: ",
                                     held->outcome.message()));
  }
  if (!result.ok()) {
    const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
        "result of ", TaskName(held->proto), ": ", result.status().message()));
    Finish(held.get(), bad);
    return bad;
  }
  held->result = std::move(*result);
  held->sample_count = request.sample_count();
  held->payload_kind = request.payload_kind();
  if (request.has_privacy()) held->privacy = request.privacy();
  Finish(held.get(), absl::OkStatus());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Tasks, daemon side

void TrainerLink::Finish(Task* task, absl::Status outcome) {
  if (task->state == TaskState::kFinished) return;
  if (!outcome.ok() && task->state == TaskState::kRunning &&
      session_.has_value() && session_->id == task->session &&
      outcome.code() == absl::StatusCode::kCancelled) {
    session_->cancelled.push_back(task->proto.task_id());
  }
  task->state = TaskState::kFinished;
  task->outcome = outcome;
  finished_[task->proto.task_id()] = outcome;
  while (finished_.size() > kFinishedKept) finished_.erase(finished_.begin());
  if (!outcome.ok()) {
    SWARM_LOG_WARNING("%s failed: %s", TaskName(task->proto),
                      outcome.message());
  }
}

void TrainerLink::Retire(const std::shared_ptr<Task>& task) {
  if (!task->proto.model_path().empty()) {
    unlink(task->proto.model_path().c_str());
  }
  unlink(task->proto.result_path().c_str());
}

absl::StatusOr<std::shared_ptr<TrainerLink::Task>> TrainerLink::Publish(
    v1::TrainerTaskKind kind, const Model* global, uint32_t round,
    bool want_validation) {
  const JobView view = View();
  auto task = std::make_shared<Task>();
  std::shared_ptr<Task> superseded;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the site is shutting down");
    task->proto.set_task_id(next_task_id_++);
    task->proto.set_require_dp(require_dp_);
    if (task_ != nullptr && task_->state != TaskState::kFinished) {
      Finish(task_.get(), absl::CancelledError(absl::StrCat(
                              "superseded by ", TaskName(task->proto),
                              " of round ", round)));
    }
    superseded = std::move(task_);
  }
  if (superseded != nullptr) Retire(superseded);
  v1::TrainerTask& proto = task->proto;
  const std::string prefix =
      absl::StrCat(options_.dir, "/task-", proto.task_id());
  proto.set_kind(kind);
  proto.set_job_id(view.job_id);
  proto.set_round(round);
  proto.set_site(options_.site);
  proto.set_result_path(prefix + ".result.safetensors");
  proto.set_want_validation(want_validation);
  proto.set_result_kind(v1::PAYLOAD_KIND_FULL_WEIGHTS);
  if (!view.metric_name.empty()) proto.add_metric_names(view.metric_name);
  task->deadline = absl::Now() + options_.task_timeout;
  proto.set_deadline_unix_ms(absl::ToUnixMillis(task->deadline));
  if (global != nullptr) {
    task->global = global;
    task->expected = global->specs();
    proto.set_model_path(prefix + ".model.safetensors");
    for (const v1::TensorInfo& info : global->TensorTable()) {
      *proto.add_tensors() = info;
    }
    absl::Status written = WriteHandoffFile(*global, proto.model_path());
    if (!written.ok()) {
      return absl::Status(written.code(),
                          absl::StrCat("writing the model for the trainer: ",
                                       written.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  if (shutdown_) {
    Retire(task);
    return absl::UnavailableError("the site is shutting down");
  }
  for (const auto& [key, value] : params_)
    (*proto.mutable_params())[key] = value;
  if (task_ != nullptr && task_->state != TaskState::kFinished) {
    // Another call published meanwhile (a superseded round's late call).
    Finish(task_.get(), absl::CancelledError(
                            absl::StrCat("superseded by ", TaskName(proto))));
  }
  task_ = task;
  if (!session_.has_value() && !warned_waiting_) {
    warned_waiting_ = true;
    SWARM_LOG_INFO("%s: waiting for a trainer to attach (%s)", TaskName(proto),
                   options_.waiting_hint);
  }
  return task;
}

absl::Status TrainerLink::Wait(const std::shared_ptr<Task>& task,
                               bool until_validation,
                               const std::atomic<bool>* cancel) {
  Task* t = task.get();
  auto ready = [this, t, until_validation]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || t->state == TaskState::kFinished ||
           (until_validation && t->validation.has_value());
  };
  absl::MutexLock lock(&mu_);
  while (!ready()) {
    if (cancel != nullptr && cancel->load()) {
      Finish(t, absl::CancelledError("the round moved on"));
      break;
    }
    const absl::Time now = absl::Now();
    if (now >= t->deadline) {
      Finish(t, absl::DeadlineExceededError(absl::StrCat(
                    "no result from the trainer within ",
                    absl::FormatDuration(options_.task_timeout),
                    " (trainer.task_timeout_ms)",
                    session_.has_value() ? "" : "; no trainer is attached")));
      break;
    }
    absl::Time until = t->deadline;
    if (cancel != nullptr) until = std::min(until, now + kCancelPoll);
    mu_.AwaitWithDeadline(absl::Condition(&ready), until);
  }
  if (t->state != TaskState::kFinished && shutdown_) {
    Finish(t, absl::UnavailableError("the site is shutting down"));
  }
  return t->state == TaskState::kFinished ? t->outcome : absl::OkStatus();
}

absl::StatusOr<Model> TrainerLink::InitialModel() {
  absl::StatusOr<std::shared_ptr<Task>> task =
      Publish(v1::TRAINER_TASK_INITIAL_MODEL, nullptr, 0, false);
  if (!task.ok()) return task.status();
  absl::Status status = Wait(*task, false, nullptr);
  Retire(*task);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("initial model: ", status.message()));
  }
  absl::MutexLock lock(&mu_);
  return std::move(*(*task)->result);
}

absl::StatusOr<Metrics> TrainerLink::Validate(const Model& global,
                                              uint32_t round) {
  absl::StatusOr<std::shared_ptr<Task>> task =
      Publish(v1::TRAINER_TASK_TRAIN, &global, round, true);
  if (!task.ok()) return task.status();
  absl::Status status = Wait(*task, true, nullptr);
  if (!status.ok()) {
    Retire(*task);
    return status;
  }
  absl::MutexLock lock(&mu_);
  return (*task)->validation.value_or(Metrics());
}

absl::StatusOr<TrainOutput> TrainerLink::Train(
    const Model& global, uint32_t round, const std::atomic<bool>& cancel) {
  std::shared_ptr<Task> task;
  {
    absl::MutexLock lock(&mu_);
    if (task_ != nullptr && task_->global == &global &&
        task_->proto.round() == round &&
        task_->proto.kind() == v1::TRAINER_TASK_TRAIN) {
      task = task_;  // Validate published it.
    }
  }
  if (task == nullptr) {
    absl::StatusOr<std::shared_ptr<Task>> published =
        Publish(v1::TRAINER_TASK_TRAIN, &global, round, false);
    if (!published.ok()) return published.status();
    task = std::move(*published);
  }
  absl::Status status = Wait(task, false, &cancel);
  Retire(task);
  if (!status.ok()) return status;
  absl::MutexLock lock(&mu_);
  TrainOutput output;
  output.model = std::move(*task->result);
  output.sample_count = task->sample_count;
  output.kind = task->payload_kind;
  output.privacy = task->privacy;
  return output;
}

}  // namespace swarm::trainerlink
