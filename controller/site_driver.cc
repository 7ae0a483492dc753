// SiteDriver: stepping the machine and carrying out its effects (sends with
// retries, the loopback, training, timers, ordered writes). The calls it
// takes from servers and operators are in site_driver_calls.cc.
#include "controller/site_driver.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/overloaded.h"
#include "common/storage_error.h"
#include "config/job_config.h"
#include "controller/admission.h"
#include "controller/replies.h"
#include "gatherer/server_optimizer.h"
#include "model/model.h"
#include "model/weight_diff.h"

namespace swarm {

namespace {

// `model` written to `path`, mapped and unlinked: the same model held as a
// mapping (lean memory). Failing that, `model` itself (memory is no error).
absl::StatusOr<Model> MapFromFile(Model model, const std::string& path) {
  absl::Status written = model.SaveSafetensors(path);
  absl::StatusOr<Model> mapped =
      written.ok() ? Model::LoadSafetensors(path) : written;
  unlink(path.c_str());
  if (!mapped.ok()) {
    SWARM_LOG_WARNING("keeping the initial model in memory: %s",
                      mapped.status().message());
    return model;
  }
  return mapped;
}

absl::string_view PersistName(effect::Persist::What what) {
  switch (what) {
    case effect::Persist::What::kState:
      return "state";
    case effect::Persist::What::kGlobal:
      return "the global model";
    case effect::Persist::What::kBestModel:
      return "the best model's copy";
    case effect::Persist::What::kFinal:
      return "final model";
    case effect::Persist::What::kClearOffload:
      return "offload directory";
    case effect::Persist::What::kSetAsideRound:
      return "a dropped chain's round model";
  }
  return "file";
}

// The kind of `event`, for logs.
const char* EventName(const Event& event) {
  return std::visit(
      Overloaded{
          [](const event::Configure&) { return "Configure"; },
          [](const event::Start&) { return "Start"; },
          [](const event::Abort&) { return "Abort"; },
          [](const event::ModelHeader&) { return "ModelHeader"; },
          [](const event::ModelBody&) { return "ModelBody"; },
          [](const event::PermissionAsked&) { return "PermissionAsked"; },
          [](const event::RequestCancelled&) { return "RequestCancelled"; },
          [](const event::ShareBest&) { return "ShareBest"; },
          [](const event::CallDone&) { return "CallDone"; },
          [](const event::TimerFired&) { return "TimerFired"; },
          [](const event::TrainingDone&) { return "TrainingDone"; },
          [](const event::InitialModel&) { return "InitialModel"; },
          [](const event::AggregationDone&) { return "AggregationDone"; },
          [](const event::ResultAdded&) { return "ResultAdded"; },
          [](const event::PersistDone&) { return "PersistDone"; },
          [](const event::LearnerWaiting&) { return "LearnerWaiting"; },
          [](const event::Recover&) { return "Recover"; },
          Unhandled{},
      },
      event);
}

}  // namespace

SiteDriver::SiteDriver(DriverOptions options, PeerTransport* transport,
                       Learner* learner, ModelStore* store, TaskRunner* runner)
    : options_(std::move(options)),
      transport_(transport),
      learner_(learner),
      store_(store),
      runner_(runner),
      machine_(SiteMachineOptions{options_.site, options_.limits}),
      jitter_(static_cast<std::minstd_rand::result_type>(
          options_.jitter_seed != 0 ? options_.jitter_seed
                                    : std::random_device{}())) {
  // What the learner waits for (an external trainer to attach) shows in
  // status. Set here, with no lock held: the learner may call at once.
  learner_->SetWaitingListener(
      [this] { Feed(event::LearnerWaiting{learner_->WaitingFor()}); });
}

SiteDriver::~SiteDriver() {
  // Returns once no call of the listener runs any more.
  learner_->SetWaitingListener(nullptr);
  absl::MutexLock lock(&mu_);
  if (training_cancel_ != nullptr) *training_cancel_ = true;
}

// ---------------------------------------------------------------------------
// Stepping

RequestId SiteDriver::NewRequest() {
  absl::MutexLock lock(&mu_);
  return next_request_++;
}

void SiteDriver::Feed(Event event, RequestId request, Answer answer) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time held_since = absl::Now();
    const char* stepped = EventName(event);
    if (answer != nullptr) answers_[request] = std::move(answer);
    effects = machine_.Step(std::move(event), runner_->Now());
    // Writes are queued in step order while the lock is held; they run
    // outside it (DrainWrites).
    bool queued = false;
    {
      absl::MutexLock write(&write_mu_);
      for (Effect& effect : effects) {
        auto* persist = std::get_if<effect::Persist>(&effect);
        if (persist == nullptr) continue;
        // Each state snapshot is the whole state: a newer one replaces an
        // older one still waiting right before it.
        if (persist->what == effect::Persist::What::kState &&
            !persist->notify && !writes_.empty() &&
            writes_.back().what == effect::Persist::What::kState &&
            !writes_.back().notify) {
          writes_.back() = std::move(*persist);
        } else {
          writes_.push_back(std::move(*persist));
        }
        queued = true;
      }
      queued = queued && !draining_;
      if (queued) draining_ = true;
    }
    if (queued) runner_->Post([this] { DrainWrites(); });
    if (QueueAggregationWork(effects)) {
      runner_->Post([this] { DrainAggregationWork(); });
    }
    const absl::Duration held = absl::Now() - held_since;
    if (held > longest_hold_) {
      longest_hold_ = held;
      longest_hold_event_ = stepped;
    }
  }
  Carry(effects);
}

bool SiteDriver::QueueAggregationWork(Effects& effects) {
  std::vector<std::function<void()>> tasks;
  for (Effect& effect : effects) {
    if (auto* add = std::get_if<effect::AddResult>(&effect)) {
      tasks.push_back([this, add = std::move(*add)] {
        Feed(event::ResultAdded{add.request, add.round, add.header,
                                add.job.Run(), add.job_run});
      });
    } else if (auto* run = std::get_if<effect::RunAggregation>(&effect)) {
      tasks.push_back(
          [this, run = std::move(*run)] { Feed(RunAggregationWork(run)); });
    } else if (auto* release = std::get_if<effect::Release>(&effect)) {
      tasks.push_back(
          [held = std::move(release->held)]() mutable { held.reset(); });
    }
  }
  if (tasks.empty()) return false;
  absl::MutexLock lock(&aggregation_mu_);
  for (auto& task : tasks) aggregation_work_.push_back(std::move(task));
  if (aggregating_) return false;
  aggregating_ = true;
  return true;
}

// Safe to run outside mu_: each task owns what it reads (the closed round,
// the job's aggregator through its AddJob, the received model), and the
// machine touches none of it until the task's event comes back; the
// aggregator's other users (the result sinks) are thread-safe.
void SiteDriver::DrainAggregationWork() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&aggregation_mu_);
      if (aggregation_work_.empty()) {
        aggregating_ = false;
        return;
      }
      task = std::move(aggregation_work_.front());
      aggregation_work_.pop_front();
    }
    task();
  }
}

absl::StatusOr<std::shared_ptr<const Model>> SiteDriver::LoadKeptRound(
    uint32_t round) {
  std::string job_id;
  {
    absl::MutexLock lock(&mu_);
    if (machine_.job() == nullptr) {
      return absl::FailedPreconditionError("no job configured");
    }
    job_id = machine_.job()->id();
  }
  absl::StatusOr<std::shared_ptr<const Model>> kept =
      store_->LoadRound(job_id, round);
  if (kept.ok()) return kept;
  return absl::FailedPreconditionError(absl::StrCat(
      "start_round ", round, ": site ", options_.site,
      " holds no global model of round ", round, " of job ", job_id, " (",
      kept.status().message(),
      "); a job run with keep_round_models keeps one per round. Start from "
      "round 0, or continue a stopped job with swarmctl resume"));
}

void SiteDriver::AskLater(Event event, RequestId request,
                          std::function<void(v1::Reply)> done) {
  Feed(std::move(event), request, [done = std::move(done)](effect::Reply& r) {
    done(std::get<v1::Reply>(std::move(r.answer)));
  });
}

v1::Reply SiteDriver::AskAndWait(Event event, RequestId request,
                                 absl::Time deadline) {
  struct Waiting {
    absl::Mutex mu;
    std::optional<v1::Reply> reply ABSL_GUARDED_BY(mu);
  };
  auto waiting = std::make_shared<Waiting>();
  AskLater(std::move(event), request, [waiting](v1::Reply answer) {
    absl::MutexLock lock(&waiting->mu);
    waiting->reply = std::move(answer);
  });
  std::optional<v1::Reply> reply;
  {
    absl::MutexLock lock(&waiting->mu);
    auto answered = [&waiting]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(waiting->mu) {
      return waiting->reply.has_value();
    };
    waiting->mu.AwaitWithDeadline(absl::Condition(&answered), deadline);
    reply = std::move(waiting->reply);
  }
  if (reply.has_value()) return *std::move(reply);
  Forget(request);  // A late answer goes nowhere.
  return MakeReply(v1::OUTCOME_RETRY,
                   "the first round's learn tasks were not all out before the "
                   "call's deadline; the start goes on (see swarmctl status)");
}

v1::Reply SiteDriver::Ask(Event event, RequestId request) {
  std::optional<v1::Reply> reply;
  Feed(std::move(event), request, [&reply](effect::Reply& r) {
    reply = std::get<v1::Reply>(std::move(r.answer));
  });
  Forget(request);
  // Operator calls are answered in the step that takes them.
  if (!reply.has_value()) {
    return MakeReply(v1::OUTCOME_REJECTED, "no answer from the site");
  }
  return *std::move(reply);
}

void SiteDriver::Carry(Effects& effects) {
  // One handler per kind of effect: an Effect alternative without one fails
  // to compile here (common/overloaded.h).
  for (Effect& effect : effects) {
    std::visit(
        Overloaded{
            [this](effect::Send& send) { CarrySend(send); },
            [this](effect::Reply& reply) { CarryReply(reply); },
            [this](effect::StartTraining& start) { StartTraining(start); },
            [this](effect::CancelTraining&) {
              absl::MutexLock lock(&mu_);
              if (training_cancel_ != nullptr) *training_cancel_ = true;
              training_cancel_.reset();
            },
            [this](effect::LoadInitialModel& load) { CarryLoad(load); },
            [](effect::RunAggregation&) {
              // Queued in Feed for the aggregation worker.
            },
            [](effect::AddResult&) {},  // Queued in Feed, likewise.
            [](effect::Release&) {},    // Queued in Feed, likewise.
            [this](effect::SetTimer& timer) {
              runner_->PostAt(timer.when, [this, id = timer.timer] {
                Feed(event::TimerFired{id});
              });
            },
            [](effect::Persist&) {
              // Queued in Feed, under the lock, in the order given.
            },
            [this](effect::PrepareTransport& prepare) {
              transport_->PrepareForJob(prepare.job);
            },
            [this](effect::StatusChanged&) { CarryStatusChanged(); },
            Unhandled{},
        },
        effect);
  }
}

void SiteDriver::CarryReply(effect::Reply& reply) {
  Answer answer;
  {
    absl::MutexLock lock(&mu_);
    auto it = answers_.find(reply.request);
    if (it == answers_.end()) return;
    answer = std::move(it->second);
    answers_.erase(it);
  }
  answer(reply);
}

void SiteDriver::CarryLoad(effect::LoadInitialModel& effect) {
  runner_->Post([this, load = std::move(effect)] {
    event::InitialModel done;
    if (load.kept_round.has_value()) {
      done.model = LoadKeptRound(*load.kept_round);
      Feed(std::move(done));
      return;
    }
    absl::StatusOr<Model> initial = learner_->InitialModel();
    if (initial.ok() && !load.lean_path.empty() &&
        initial->total_bytes() >= load.lean_min_bytes) {
      initial = MapFromFile(std::move(*initial), load.lean_path);
    }
    if (initial.ok()) {
      done.model = std::make_shared<const Model>(std::move(*initial));
    } else {
      done.model = initial.status();
    }
    Feed(std::move(done));
  });
}

void SiteDriver::CarryStatusChanged() {
  std::vector<std::function<void()>> waiters;
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    waiters.swap(status_waiters_);
    ended = IsTerminal(machine_.record().state);
    if (ended && longest_hold_ > absl::ZeroDuration()) {
      SWARM_LOG_INFO(
          "job ended here; longest hold of the site's lock: %.3f ms "
          "(stepping %s)",
          absl::ToDoubleMilliseconds(longest_hold_), longest_hold_event_);
      longest_hold_ = absl::ZeroDuration();
    }
  }
  // The job's model buffers kept for reuse are given back once it ends.
  if (ended) ReleaseIdleHeapStorage();
  for (auto& waiter : waiters) runner_->Post(std::move(waiter));
}

// ---------------------------------------------------------------------------
// Outgoing calls

void SiteDriver::CarrySend(effect::Send& send) {
  auto shared = std::make_shared<effect::Send>(std::move(send));
  if (shared->to.name() == options_.site) {
    runner_->Post([this, shared] { Loopback(shared); });
    return;
  }
  if (shared->to.address().empty()) {
    CallDone(shared->call,
             absl::NotFoundError(
                 absl::StrCat(shared->to.name(), " is not a site of the job")));
    return;
  }
  Attempt(std::move(shared), 1, false);
}

void SiteDriver::Attempt(std::shared_ptr<effect::Send> send, int attempt,
                         bool maybe_delivered) {
  transport_->Send(
      send->to, send->message,
      [this, send, attempt,
       maybe_delivered](absl::StatusOr<PeerReply> reply) mutable {
        // A file-backed model (lean memory) gives back the pages the send
        // read; another send still reading reads them again from the file.
        if (send->message.model != nullptr) {
          send->message.model->storage()->ReleaseResidentPages();
        }
        const absl::Status status = reply.status();
        if (status.ok() || !send->retry || !RetryPolicy::Retryable(status)) {
          CallDone(send->call, std::move(reply), maybe_delivered);
          return;
        }
        const std::optional<absl::Duration> delay = options_.retry.NextDelay(
            status, attempt, JitterUnit(), runner_->Now(), send->retry_until);
        if (!delay.has_value()) {
          CallDone(send->call, std::move(reply), true);
          return;
        }
        SWARM_LOG_INFO("%s to %s failed (%s); retry %d in %s",
                       CallKindName(send->message.kind), send->to.name(),
                       status.ToString(), attempt,
                       absl::FormatDuration(*delay));
        runner_->PostAfter(*delay, [this, send, attempt] {
          bool wanted;
          {
            absl::MutexLock lock(&mu_);
            wanted = machine_.WantsCall(send->call);
          }
          if (!wanted) return;  // The machine forgot it: nobody waits.
          Attempt(send, attempt + 1, true);
        });
      });
}

void SiteDriver::CallDone(CallId call, absl::StatusOr<PeerReply> reply,
                          bool maybe_delivered) {
  Feed(event::CallDone{call, std::move(reply), maybe_delivered});
}

void SiteDriver::Loopback(std::shared_ptr<effect::Send> send) {
  const CallId call = send->call;
  PeerMessage& message = send->message;
  auto done_reply = [this, call](v1::Reply reply) {
    PeerReply peer;
    peer.reply = std::move(reply);
    CallDone(call, std::move(peer));
  };
  switch (message.kind) {
    case CallKind::kRequestToSubmit: {
      const absl::Time hold = runner_->Now() + message.timeout - kHoldMargin;
      RequestToSubmit(message.permission, hold,
                      [this, call](v1::SubmitPermissionReply reply) {
                        PeerReply peer;
                        peer.permission = std::move(reply);
                        CallDone(call, std::move(peer));
                      });
      return;
    }
    case CallKind::kShareBest:
      done_reply(ShareBest(message.share_best));
      return;
    case CallKind::kLearnTask:
    case CallKind::kSubmitResult:
    case CallKind::kFinalResult:
      break;  // A model stream: below.
  }
  // A model stream: the header's admission, then the model as it is (it
  // is in memory already; there is nothing to assemble).
  absl::StatusOr<ModelAdmission> admission = AdmitModel(message.header);
  if (!admission.ok()) {
    CallDone(call, admission.status());
    return;
  }
  if (admission->header_only) {
    done_reply(OkReply(std::move(admission->reply_message)));
    return;
  }
  const RequestId request = NewRequest();
  // Moved, not shared: the reply (and what it lets go on, such as the next
  // trainer's upload) comes while this call still runs, and the model must
  // not outlive the step that took it (a site's own result, added and let
  // go of before another result is let in).
  absl::StatusOr<std::shared_ptr<const Model>> model = std::move(message.model);
  if (*model == nullptr) {
    model = absl::InvalidArgumentError("no model in the message");
  }
  // Before Feed takes the lock: a BEST's digest reads the whole model.
  event::ModelBody body =
      event::MakeModelBody(request, message.header, std::move(model));
  Feed(std::move(body), request, [done_reply](effect::Reply& r) {
    done_reply(std::get<v1::Reply>(std::move(r.answer)));
  });
}

void SiteDriver::Forget(RequestId request) {
  absl::MutexLock lock(&mu_);
  answers_.erase(request);
}

double SiteDriver::JitterUnit() {
  absl::MutexLock lock(&jitter_mu_);
  return std::uniform_real_distribution<double>(0.0, 1.0)(jitter_);
}

// ---------------------------------------------------------------------------
// Training and writes

void SiteDriver::StartTraining(effect::StartTraining& start) {
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  {
    absl::MutexLock lock(&mu_);
    if (training_cancel_ != nullptr) *training_cancel_ = true;
    training_cancel_ = cancel;
  }
  // The learner sees the model's tensors, never the server optimizer's
  // state the learn task carries (a view: no copy).
  runner_->Post([this, cancel, round = start.round,
                 global = TrainableView(start.global),
                 diff = start.weight_diff, job_run = start.job_run] {
    event::TrainingDone done;
    done.round = round;
    done.job_run = job_run;
    done.metrics = learner_->Validate(*global, round);
    done.output = done.metrics.ok()
                      ? learner_->Train(*global, round, *cancel)
                      : absl::StatusOr<TrainOutput>(done.metrics.status());
    if (*cancel) return;
    if (diff && done.output.ok() &&
        done.output->kind == v1::PAYLOAD_KIND_FULL_WEIGHTS) {
      absl::Status diffed = ToWeightDiff(*global, &done.output->model);
      if (diffed.ok()) {
        done.output->kind = v1::PAYLOAD_KIND_WEIGHT_DIFF;
      } else {
        SWARM_LOG_INFO("round %d: sending full weights: %s", round,
                       diffed.message());
      }
    }
    // The round's input is not read again soon: a file-backed one (lean
    // memory) gives its pages back; they return from the file if needed.
    global->storage()->ReleaseResidentPages();
    Feed(std::move(done));
  });
}

void SiteDriver::DrainWrites() {
  while (true) {
    effect::Persist persist;
    {
      absl::MutexLock write(&write_mu_);
      if (writes_.empty()) {
        draining_ = false;
        return;
      }
      persist = std::move(writes_.front());
      writes_.pop_front();
    }
    Write(persist);
  }
}

size_t SiteDriver::FinishWrites(absl::Time deadline) {
  absl::MutexLock write(&write_mu_);
  // The drainer clears draining_ only once the queue is empty, after its
  // last write returned: idle means on disk (or failed and reported).
  write_mu_.AwaitWithDeadline(absl::Condition(this, &SiteDriver::WritesIdle),
                              deadline);
  return writes_.size() + (draining_ && writes_.empty() ? 1 : 0);
}

void SiteDriver::Write(effect::Persist& persist) {
  absl::Status status;
  switch (persist.what) {
    case effect::Persist::What::kState:
      status = store_->SaveState(persist.state);
      break;
    case effect::Persist::What::kGlobal:
      status = store_->SaveGlobal(persist.job_id, persist.round, *persist.model,
                                  persist.metadata, persist.keep_round);
      break;
    case effect::Persist::What::kFinal:
      status = store_->SaveFinal(persist.job_id, persist.kind, *persist.model,
                                 persist.metadata);
      break;
    case effect::Persist::What::kBestModel:
      status = store_->SaveHeldBest(persist.job_id, *persist.model,
                                    persist.metadata);
      break;
    case effect::Persist::What::kClearOffload:
      store_->ClearOffload(persist.job_id).IgnoreError();
      break;
    case effect::Persist::What::kSetAsideRound:
      status =
          store_->SetAsideRound(persist.job_id, persist.round, persist.tag);
      break;
  }
  // Whatever the store failed to write is this site's disk's failure.
  status = AsStorageError(std::move(status));
  std::shared_ptr<const Model> mapped;
  if (persist.map_back && status.ok()) {
    absl::StatusOr<Model> loaded = store_->MapGlobal(persist.job_id);
    if (loaded.ok() && loaded->SameLayout(*persist.model)) {
      // The same values; the metadata the machine knows (not the file's).
      loaded->metadata() = persist.model->metadata();
      mapped = std::make_shared<const Model>(std::move(*loaded));
    } else {
      SWARM_LOG_WARNING("round %d: keeping the global model in memory: %s",
                        persist.round,
                        loaded.ok() ? "the file's layout differs"
                                    : loaded.status().message());
    }
  }
  // What was written is not read again soon: a file-backed model gives its
  // pages back (memory does nothing).
  if (persist.model != nullptr) {
    persist.model->storage()->ReleaseResidentPages();
  }
  if (persist.notify || !status.ok() || persist.map_back) {
    Feed(event::PersistDone{persist.persist, status,
                            std::string(PersistName(persist.what)),
                            std::move(mapped)});
  }
}

}  // namespace swarm
