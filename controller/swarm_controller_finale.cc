// SwarmController, the end of the job (design section 3, step 8): LAST, then
// BEST from this site or from the holder it asks to share.
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

namespace swarm {

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
    job_id = job_->id();
    if (!best.present()) {
      // No round produced a usable metric: the last model is also the best.
      best_model = last;
    } else if (best.site() == options_.site) {
      best_model = best_model_;
    } else {
      const v1::SiteInfo* site = Site(best.site());
      if (site != nullptr) holder = *site;
    }
    for (const v1::SiteInfo& site : job_->config().sites())
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
      if (job_ == nullptr) return;
      timeout = job_->final_result_ack_timeout();
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
    if (request.sender() != job_->LastRoundAggregator()) {
      return MakeReply(v1::OUTCOME_REJECTED,
                       absl::StrCat("only the last round's aggregator ",
                                    job_->LastRoundAggregator(),
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
    if (job_ == nullptr) return;
    header = BaseHeader(kind, round);
    *header.mutable_best() = best;
    auto& metadata = *header.mutable_metadata();
    metadata["job"] = job_->id();
    metadata["round"] = absl::StrCat(round);
    metadata["kind"] = kind == v1::MODEL_KIND_BEST ? "best" : "last";
    metadata["source_site"] = options_.site;
    if (kind == v1::MODEL_KIND_BEST && best.present()) {
      metadata["metric_name"] = job_->config().metric_name();
      metadata["metric"] = absl::StrCat(best.metric());
      metadata["best_site"] = best.site();
    }
    sites.assign(job_->config().sites().begin(), job_->config().sites().end());
    timeout = job_->final_result_ack_timeout();
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
  record_.final_rounds[header.kind()] = header.round();
  // The record is taken only from the last round's aggregator (who closed
  // the last round and so knows the final best); a BEST from the holder
  // carries the record this site already has (AdmitFinal checked it).
  if (header.sender() == job_->LastRoundAggregator() ||
      header.sender() == options_.site) {
    record_.best = header.best();
  }
  Bump();
  SWARM_LOG_INFO("job %s: %s model of round %d received from %s",
                 header.job_id(),
                 header.kind() == v1::MODEL_KIND_BEST ? "BEST" : "LAST",
                 header.round(), header.sender());
  if (finals_.count(v1::MODEL_KIND_BEST) > 0 &&
      finals_.count(v1::MODEL_KIND_LAST) > 0 && !IsTerminal(record_.state)) {
    SetState(v1::SITE_STATE_DONE);
    PersistState();
    SWARM_LOG_INFO("job %s: done (best metric %s)", header.job_id(),
                   FormatMetric(record_.best));
  }
  return MakeReply(v1::OUTCOME_OK, "stored");
}

}  // namespace swarm
