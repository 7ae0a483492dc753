#include "controller/admission.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace swarm {
namespace {

absl::Status AdmitLearnTask(const JobView& job, const SiteRecord& site,
                            const v1::ModelHeader& header) {
  if (IsTerminal(site.state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job is ", v1::SiteState_Name(site.state)));
  }
  // A repeat of the task this site accepted (its acknowledgement was lost)
  // is received again and acknowledged again.
  const bool repeat = site.last_task_round.has_value() &&
                      header.round() == *site.last_task_round &&
                      header.aggregator() == site.round_aggregator;
  if (site.last_task_round.has_value() &&
      header.round() <= *site.last_task_round && !repeat) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site ", site.self, " already has the learn task of round ",
        *site.last_task_round));
  }
  const uint32_t round = header.round();
  if (!job.HasRound(round)) {
    return absl::InvalidArgumentError(
        absl::StrCat("round ", round, " is outside the job's rounds ",
                     job.first_round(), "..", job.last_round()));
  }
  const std::string elected = job.AggregatorOf(round);
  if (elected.empty() || header.aggregator() != elected) {
    return absl::PermissionDeniedError(absl::StrCat(
        "learn task names ", header.aggregator(), " as aggregator of round ",
        round, "; the election chose ", elected.empty() ? "nobody" : elected));
  }
  const std::string scatterer = job.ScattererOf(round);
  if (header.sender() != scatterer) {
    return absl::PermissionDeniedError(absl::StrCat(
        "learn task of round ", round, " must come from ", scatterer,
        round > job.first_round()
            ? absl::StrCat(" (the aggregator of round ", round - 1, ")")
            : std::string(" (the starting site)"),
        ", not from ", header.sender()));
  }
  if (header.aggregator() != site.self && !job.IsTrainer(site.self)) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", site.self,
                     " is neither a trainer nor the round's aggregator"));
  }
  return absl::OkStatus();
}

// Final models come only from senders this site knows itself: LAST from the
// last round's aggregator as this site elects it; BEST from that aggregator
// or from the best model's holder as this site's own record names it.
absl::StatusOr<Admitted> AdmitFinal(const JobView& job, const SiteRecord& site,
                                    const v1::ModelHeader& header) {
  const bool best_kind = header.kind() == v1::MODEL_KIND_BEST;
  const std::string last_aggregator = job.LastRoundAggregator();
  const bool from_aggregator = header.sender() == last_aggregator;
  const bool from_holder =
      best_kind && site.best.present() && header.sender() == site.best.site();
  if (!from_aggregator && !from_holder) {
    const std::string holder =
        best_kind && site.best.present()
            ? absl::StrCat(" or from the best model's holder ",
                           site.best.site(), " (this site's record)")
            : std::string();
    return absl::PermissionDeniedError(
        absl::StrCat(v1::ModelKind_Name(header.kind()), " from ",
                     header.sender(), " refused: ", best_kind ? "BEST" : "LAST",
                     " comes only from the last round's aggregator ",
                     last_aggregator, holder));
  }
  if (from_holder && !from_aggregator && header.round() != site.best.round()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "BEST of round ", header.round(), " from ", header.sender(),
        " refused: this site's record names the model of round ",
        site.best.round()));
  }
  if (!site.started) {
    return absl::FailedPreconditionError("the job has not started here");
  }
  if (site.state == v1::SITE_STATE_DONE) {
    // An identical re-send (its acknowledgement was lost) is acknowledged
    // without writing; anything else is refused.
    auto it = site.final_rounds.find(header.kind());
    if (it != site.final_rounds.end() && it->second == header.round()) {
      Admitted admitted;
      admitted.receive_body = false;
      admitted.message =
          absl::StrCat(v1::ModelKind_Name(header.kind()), " of round ",
                       header.round(), " already stored");
      return admitted;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job.id(), " is done here; ", v1::ModelKind_Name(header.kind()),
        " of round ", header.round(), " refused"));
  }
  if (IsTerminal(site.state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job is ", v1::SiteState_Name(site.state)));
  }
  return Admitted();
}

}  // namespace

bool IsTerminal(v1::SiteState state) {
  return state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
         state == v1::SITE_STATE_ABORTED;
}

absl::Status CheckJobId(const JobView* job, absl::string_view self,
                        absl::string_view job_id) {
  if (job == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", self, " has no job configured"));
  }
  if (job_id != job->id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site ", self, " runs job \"", job->id(), "\", not \"", job_id, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<Admitted> AdmitStream(const JobView* job, const SiteRecord& site,
                                     const v1::ModelHeader& header) {
  if (absl::Status same = CheckJobId(job, site.self, header.job_id());
      !same.ok()) {
    return same;
  }
  if (job->Site(header.sender()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "sender \"", header.sender(), "\" is not a site of job ", job->id()));
  }
  switch (header.kind()) {
    case v1::MODEL_KIND_LEARN_TASK:
      if (absl::Status ok = AdmitLearnTask(*job, site, header); !ok.ok()) {
        return ok;
      }
      return Admitted();
    case v1::MODEL_KIND_RESULT:
      if (!job->IsTrainer(header.sender())) {
        return absl::PermissionDeniedError(
            absl::StrCat("sender ", header.sender(),
                         " is not a trainer of job ", job->id()));
      }
      return Admitted();
    case v1::MODEL_KIND_BEST:
    case v1::MODEL_KIND_LAST:
      return AdmitFinal(*job, site, header);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("a stream of kind ", v1::ModelKind_Name(header.kind()),
                       " cannot be sent to a site"));
  }
}

}  // namespace swarm
