// SiteDriver: the calls it takes (operator and peer), each one event fed to
// the machine, answered by the machine's Reply effect.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "controller/replies.h"
#include "controller/site_driver.h"

namespace swarm {

// ---------------------------------------------------------------------------
// Operator calls

v1::Reply SiteDriver::Configure(const v1::ConfigureRequest& request) {
  v1::JobConfig job = WithDefaults(request.job());
  absl::MutexLock configuring(&configure_mu_);
  {
    absl::MutexLock lock(&mu_);
    bool already = false;
    std::optional<v1::Reply> early = machine_.CheckConfigure(job, &already);
    if (early.has_value()) return *early;
  }
  // The job's learner_params override the site's; a bad one refuses the job.
  absl::Status learner = learner_->ConfigureJob(job);
  if (!learner.ok()) {
    return MakeReply(v1::OUTCOME_BAD_REQUEST,
                     absl::StrCat("learner_params: ", learner.message()));
  }
  absl::Status saved = store_->SaveJobConfig(job);
  if (!saved.ok()) {
    return MakeReply(v1::OUTCOME_REJECTED,
                     absl::StrCat("cannot store the job: ", saved.message()));
  }
  const RequestId id = NewRequest();
  std::string offload_dir = store_->OffloadDir(job.job_id());
  if (!offload_dir.empty() && job.lean_memory_min_model_bytes() > 0) {
    // Lean memory: a freed block of a model this large is given back, not
    // kept idle for the next one (it would count against the site's memory
    // while most of its models are file mappings).
    SetHeapStorageRecycleLimit(job.lean_memory_min_model_bytes() - 1);
  }
  return Ask(event::Configure{id, std::move(job), std::move(offload_dir)}, id);
}

absl::StatusOr<std::string> SiteDriver::RecoverJob() {
  absl::StatusOr<std::optional<StoredJob>> stored = store_->LoadUnfinishedJob();
  if (!stored.ok()) return stored.status();
  if (!stored->has_value()) return std::string();
  StoredJob& job = **stored;
  absl::MutexLock configuring(&configure_mu_);
  absl::Status learner = learner_->ConfigureJob(job.job);
  if (!learner.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.job.job_id(), " in the workspace: its ",
                     "learner_params: ", learner.message()));
  }
  std::string id = job.job.job_id();
  std::string offload_dir = store_->OffloadDir(id);
  // The best model's copy, when this site holds it (kept on disk when it
  // became the best).
  std::shared_ptr<const Model> best_model;
  const v1::BestRecord& best = job.state.best();
  if (best.present() && best.site() == options_.site) {
    absl::StatusOr<std::shared_ptr<const Model>> kept =
        store_->LoadHeldBest(id);
    if (kept.ok()) {
      auto round = (*kept)->metadata().find("round");
      if (round == (*kept)->metadata().end() ||
          round->second != absl::StrCat(best.round())) {
        kept = absl::DataLossError(absl::StrCat(
            "held-best.safetensors is not round ", best.round(), "'s model"));
      }
    }
    if (kept.ok()) {
      best_model = *std::move(kept);
    } else {
      SWARM_LOG_WARNING(
          "job %s: the best model of round %d is not in the workspace (%s); "
          "BEST cannot come from this site",
          id, best.round(), kept.status().message());
    }
  }
  Feed(event::Recover{WithDefaults(job.job), std::move(job.state),
                      std::move(job.global), std::move(best_model),
                      std::move(offload_dir)});
  return id;
}

v1::Reply SiteDriver::Start(const v1::StartRequest& request,
                            absl::Time deadline) {
  const RequestId id = NewRequest();
  return AskAndWait(event::Start{id, request}, id, deadline);
}

void SiteDriver::Start(const v1::StartRequest& request,
                       std::function<void(v1::Reply)> done) {
  const RequestId id = NewRequest();
  AskLater(event::Start{id, request}, id, std::move(done));
}

v1::Reply SiteDriver::Abort(const v1::AbortRequest& request) {
  const RequestId id = NewRequest();
  return Ask(event::Abort{id, request}, id);
}

v1::StatusReply SiteDriver::Status() const {
  v1::StatusReply reply;
  {
    absl::MutexLock lock(&mu_);
    reply = machine_.Status();
  }
  learner_->AddToStatus(reply.mutable_status());
  return reply;
}

v1::StatusReply SiteDriver::WaitForStatusChange(
    uint64_t known_version, absl::Time deadline, uint64_t after_change,
    std::vector<StateChange>* changes) const {
  v1::StatusReply reply;
  {
    absl::MutexLock lock(&mu_);
    auto changed = [this, known_version]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return machine_.status_version() != known_version;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
    if (changes != nullptr) {
      *changes = machine_.StateChangesAfter(after_change);
    }
    reply = machine_.Status();
  }
  // Outside the lock: the learner's part may wait for its own lock.
  learner_->AddToStatus(reply.mutable_status());
  return reply;
}

void SiteDriver::WhenStatusChanges(uint64_t known_version, absl::Time deadline,
                                   std::function<void()> wake) {
  absl::MutexLock lock(&mu_);
  if (machine_.status_version() != known_version) {
    runner_->Post(std::move(wake));
    return;
  }
  runner_->PostAt(deadline, wake);
  status_waiters_.push_back(std::move(wake));
}

std::optional<v1::JobConfig> SiteDriver::job() const {
  absl::MutexLock lock(&mu_);
  if (machine_.job() == nullptr) return std::nullopt;
  return machine_.job()->config();
}

// ---------------------------------------------------------------------------
// Peer calls

absl::StatusOr<ModelAdmission> SiteDriver::AdmitModel(
    const v1::ModelHeader& header) {
  const RequestId id = NewRequest();
  absl::StatusOr<ModelAdmission> admission =
      absl::InternalError("no admission from the site");
  Feed(event::ModelHeader{id, header}, id, [&admission](effect::Reply& r) {
    admission = std::get<absl::StatusOr<ModelAdmission>>(std::move(r.answer));
  });
  Forget(id);  // Answered in the step (the answer refers to this frame).
  return admission;
}

void SiteDriver::OnModel(const v1::ModelHeader& header,
                         absl::StatusOr<Model> model, ReplyDone done) {
  absl::StatusOr<std::shared_ptr<const Model>> shared =
      model.ok() ? absl::StatusOr<std::shared_ptr<const Model>>(
                       std::make_shared<const Model>(std::move(*model)))
                 : model.status();
  // Before Feed takes the lock: a BEST's digest reads the whole model.
  event::ModelBody body =
      event::MakeModelBody(NewRequest(), header, std::move(shared));
  const RequestId id = body.request;
  Feed(std::move(body), id, [done = std::move(done)](effect::Reply& r) {
    done(std::get<v1::Reply>(std::move(r.answer)));
  });
}

RequestId SiteDriver::RequestToSubmit(
    const v1::SubmitPermissionRequest& request, absl::Time hold_until,
    PermissionDone done) {
  const RequestId id = NewRequest();
  Feed(event::PermissionAsked{id, request, hold_until}, id,
       [done = std::move(done)](effect::Reply& r) {
         done(std::get<v1::SubmitPermissionReply>(std::move(r.answer)));
       });
  return id;
}

void SiteDriver::CancelRequest(RequestId request) {
  Feed(event::RequestCancelled{request});
  absl::MutexLock lock(&mu_);
  answers_.erase(request);
}

v1::Reply SiteDriver::ShareBest(const v1::ShareBestRequest& request) {
  const RequestId id = NewRequest();
  return Ask(event::ShareBest{id, request}, id);
}

absl::StatusOr<std::shared_ptr<const Model>> SiteDriver::ModelForFetch(
    const v1::FetchModelRequest& request) const {
  absl::StatusOr<FetchSource> source;
  {
    absl::MutexLock lock(&mu_);
    source = machine_.ModelForFetch(request);
  }
  if (!source.ok()) return source.status();
  if (source->model != nullptr) return source->model;
  if (source->round.has_value()) {
    return store_->LoadRound(request.job_id(), *source->round);
  }
  return store_->LoadFinal(request.job_id(), source->final_kind);
}

}  // namespace swarm
