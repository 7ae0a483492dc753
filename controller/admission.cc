#include "controller/admission.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace swarm {
namespace {

// Whether `header` may come to `site` at all: a round of the job, the
// aggregator the election chose, from the site that scatters the round (or
// a trainer handing it over), to a trainer or the round's aggregator.
absl::Status CheckLearnTaskSender(const JobView& job, const SiteRecord& site,
                                  const v1::ModelHeader& header,
                                  const Lineage& lineage) {
  const uint32_t round = header.round();
  if (!job.HasRound(round)) {
    return absl::InvalidArgumentError(
        absl::StrCat("round ", round, " is outside the job's rounds ",
                     job.first_round(), "..", job.last_round()));
  }
  const std::string elected = job.AggregatorAt(round, header.attempt());
  if (elected.empty() || header.aggregator() != elected) {
    return absl::PermissionDeniedError(absl::StrCat(
        "learn task names ", header.aggregator(), " as aggregator of round ",
        round, " at attempt ", header.attempt(), "; the election chose ",
        elected.empty() ? "nobody" : elected));
  }
  if (header.handoff()) {
    // A trainer of the round hands it over: it holds the round's model.
    if (!job.IsTrainer(header.sender())) {
      return absl::PermissionDeniedError(
          absl::StrCat("a handoff of round ", round, " must come from a ",
                       "trainer; ", header.sender(), " is not one"));
    }
  } else if (!header.resume()) {
    const std::string scatterer =
        job.ScattererOf(round, AttemptOf(lineage, round - 1));
    if (header.sender() != scatterer) {
      return absl::PermissionDeniedError(absl::StrCat(
          "learn task of round ", round, " must come from ", scatterer,
          round > job.first_round()
              ? absl::StrCat(" (the aggregator of round ", round - 1, ")")
              : std::string(" (the starting site)"),
          ", not from ", header.sender()));
    }
  }
  if (header.aggregator() != site.self && !job.IsTrainer(site.self)) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", site.self,
                     " is neither a trainer nor the round's aggregator"));
  }
  return absl::OkStatus();
}

// A learn task of the round `site` holds already: a repeat, a takeover by
// this site, or a note of another attempt (no body is received).
Admitted HeldRoundVerdict(const SiteRecord& site,
                          const v1::ModelHeader& header) {
  const uint32_t round = header.round();
  Admitted admitted;
  admitted.receive_body = false;
  if (header.attempt() == site.attempt &&
      header.aggregator() == site.round_aggregator) {
    admitted.task = TaskVerdict::kRepeat;
    admitted.message =
        absl::StrCat("learn task of round ", round, " already accepted");
  } else if (header.attempt() > site.attempt &&
             header.aggregator() == site.self) {
    admitted.task = TaskVerdict::kTakeOver;
    admitted.message = absl::StrCat("taking over round ", round, " at attempt ",
                                    header.attempt());
  } else {
    admitted.task = TaskVerdict::kNoted;
    admitted.message = absl::StrCat("round ", round, " at attempt ",
                                    header.attempt(), " noted");
  }
  return admitted;
}

absl::StatusOr<Admitted> AdmitLearnTask(const JobView& job,
                                        const SiteRecord& site,
                                        const v1::ModelHeader& header) {
  const Lineage lineage = LineageFromProto(header.lineage());
  // A site done on a chain that lost goes on with the winner's rounds.
  const bool reopen =
      site.state == v1::SITE_STATE_DONE && site.final_lineage.has_value() &&
      CompareChains(lineage, *site.final_lineage, header.round()) < 0;
  if (IsTerminal(site.state) && !reopen) return JobEndedHere(site);
  const uint32_t round = header.round();
  if (absl::Status sender = CheckLearnTaskSender(job, site, header, lineage);
      !sender.ok()) {
    return sender;
  }
  Admitted admitted;
  if (reopen) {
    admitted.task = TaskVerdict::kSwitch;
    return admitted;
  }
  if (!site.last_task_round.has_value()) return admitted;
  const uint32_t held = *site.last_task_round;
  uint32_t differs = 0;
  const int chains =
      CompareChains(lineage, site.lineage, std::min(round, held), &differs);
  if (chains > 0) {
    return LosingChainRefusal(absl::StrCat("learn task of round ", round),
                              lineage, differs, site);
  }
  if (chains < 0) {
    admitted.task = TaskVerdict::kSwitch;
    return admitted;
  }
  if (round < held) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site ", site.self, " already has the learn task of round ", held));
  }
  if (round > held) return admitted;
  if (site.recovered) return admitted;  // Its round again, after a restart.
  if (header.resume()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume of round ", round, " refused: site ", site.self,
                     " did not restart; it holds that round's task"));
  }
  return HeldRoundVerdict(site, header);
}

// Final models come only from senders this site knows itself: LAST from the
// aggregator of the job's final round (as this site elects it, at the
// header's attempt); BEST from that aggregator or from the best model's
// holder as this site's own record names it. A final round before the job's
// last must be an early stop that the header's best record justifies.
absl::Status CheckFinalRound(const JobView& job, const SiteRecord& site,
                             const v1::ModelHeader& header) {
  const uint32_t final_round = header.final_round();
  if (!job.HasRound(final_round)) {
    return absl::InvalidArgumentError(
        absl::StrCat("final round ", final_round, " is outside the job's ",
                     "rounds ", job.first_round(), "..", job.last_round()));
  }
  if (site.last_task_round.has_value() && final_round < *site.last_task_round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "final models of round ", final_round, " refused: site ", site.self,
        " holds the learn task of round ", *site.last_task_round));
  }
  if (final_round == job.last_round()) return absl::OkStatus();
  if (!EarlyStopReason(job, header.best(), final_round).empty()) {
    return absl::OkStatus();
  }
  // Trainers that stopped at their privacy budget: only the final round's
  // aggregator saw their reports, so its word (the finals' end_reason) is
  // taken, as its aggregate is.
  if (auto reason = header.metadata().find("end_reason");
      reason != header.metadata().end() &&
      absl::StartsWith(reason->second, kTooFewTrainersStop)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "final models of round ", final_round, " refused: the job's last round ",
      "is ", job.last_round(), " and its best record (",
      header.best().present() ? absl::StrCat(header.best().metric()) : "none",
      ") meets no early-stop rule"));
}

absl::StatusOr<Admitted> AdmitFinalOfChain(const JobView& job,
                                           const SiteRecord& site,
                                           const v1::ModelHeader& header);

absl::StatusOr<Admitted> AdmitFinal(const JobView& job, const SiteRecord& site,
                                    const v1::ModelHeader& header) {
  const bool best_kind = header.kind() == v1::MODEL_KIND_BEST;
  const std::string last_aggregator =
      job.AggregatorAt(header.final_round(), header.attempt());
  const bool from_aggregator =
      !last_aggregator.empty() && header.sender() == last_aggregator;
  // BEST comes from the site that scored it, or from another that holds a
  // copy (it trained on that round's model) when the scorer is gone; the
  // latter is checked against the record's digest once received
  // (SiteMachine::OnModelBody).
  const bool from_holder =
      best_kind && site.best.present() &&
      (header.sender() == site.best.site() ||
       (!site.best.digest().empty() && job.Site(header.sender()) != nullptr));
  if (!from_aggregator && !from_holder) {
    const std::string holder =
        best_kind && site.best.present()
            ? absl::StrCat(" or from the best model's holder ",
                           site.best.site(), " (this site's record)")
            : std::string();
    return absl::PermissionDeniedError(absl::StrCat(
        v1::ModelKind_Name(header.kind()), " from ", header.sender(),
        " refused: ", best_kind ? "BEST" : "LAST",
        " comes only from the aggregator of the final round ",
        header.final_round(), " at attempt ", header.attempt(), " (",
        last_aggregator.empty() ? "nobody" : last_aggregator, ")", holder));
  }
  if (from_aggregator) {
    if (absl::Status final_round = CheckFinalRound(job, site, header);
        !final_round.ok()) {
      return final_round;
    }
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
  return AdmitFinalOfChain(job, site, header);
}

// A final model from a sender allowed to send it, to a site in the job:
// refused when of a chain that lost to the one this site follows (or holds
// the finals of); a winning chain's replace them.
absl::StatusOr<Admitted> AdmitFinalOfChain(const JobView& job,
                                           const SiteRecord& site,
                                           const v1::ModelHeader& header) {
  const Lineage chain = LineageFromProto(header.lineage());
  if (site.last_task_round.has_value()) {
    uint32_t differs = 0;
    const uint32_t below =
        std::min(header.final_round() + 1, *site.last_task_round);
    if (CompareChains(chain, site.lineage, below, &differs) > 0) {
      return LosingChainRefusal(v1::ModelKind_Name(header.kind()), chain,
                                differs, site);
    }
  }
  if (site.state == v1::SITE_STATE_DONE && site.final_lineage.has_value()) {
    const int against =
        CompareChains(chain, *site.final_lineage, header.final_round() + 1);
    if (against < 0) return Admitted();  // A winning chain's: replace.
    if (against > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          v1::ModelKind_Name(header.kind()), " refused: site ", site.self,
          " holds the final models of a chain that wins over it"));
    }
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
  if (IsTerminal(site.state)) return JobEndedHere(site);
  return Admitted();
}

}  // namespace

std::string EarlyStopReason(const JobView& job, const v1::BestRecord& best,
                            uint32_t round) {
  const v1::JobConfig& config = job.config();
  if (round >= job.last_round() || !best.present()) return "";
  if (config.has_stop_at_metric()) {
    const bool higher = config.metric_direction() != v1::METRIC_LOWER_IS_BETTER;
    const double target = config.stop_at_metric();
    if (higher ? best.metric() >= target : best.metric() <= target) {
      return absl::StrCat("early stop: best ", config.metric_name(), " ",
                          best.metric(), " (round ", best.round(),
                          ") reached stop_at_metric ", target);
    }
  }
  const uint32_t patience = config.stop_patience_rounds();
  if (patience > 0 && round >= best.round() + patience) {
    return absl::StrCat("early stop: no better ", config.metric_name(),
                        " than ", best.metric(), " (round ", best.round(),
                        ") for ", round - best.round(), " rounds ",
                        "(stop_patience_rounds ", patience, ")");
  }
  return "";
}

std::string TooFewTrainersReason(const JobView& job, uint32_t round,
                                 int trainers,
                                 const std::set<std::string>& stopped) {
  if (round >= job.last_round() || stopped.empty()) return "";
  // WithDefaults sets it (every trainer when the job does not say).
  const uint32_t configured = job.config().min_responses_required();
  const int minimum = configured > 0 ? static_cast<int>(configured) : trainers;
  const int remaining = trainers - static_cast<int>(stopped.size());
  if (remaining >= minimum) return "";
  return absl::StrCat(kTooFewTrainersStop, " after round ", round, ": ",
                      absl::StrJoin(stopped, ","),
                      " stopped training at their privacy budget; ",
                      std::max(remaining, 0), " of ", trainers,
                      " trainer(s) left, fewer than min_responses_required ",
                      minimum);
}

bool IsTerminal(v1::SiteState state) {
  return state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
         state == v1::SITE_STATE_ABORTED;
}

absl::Status JobEndedHere(const SiteRecord& site) {
  const std::string why = absl::StrCat(
      "job is ", v1::SiteState_Name(site.state), " at ", site.self);
  if (site.state == v1::SITE_STATE_DONE) {
    return absl::FailedPreconditionError(why);
  }
  return absl::CancelledError(why);
}

namespace {
// The words every LosingChainRefusal carries (IsLosingChainRefusal looks
// for them).
constexpr char kLosingChainWords[] = " refused: its chain aggregated round ";
}  // namespace

absl::Status LosingChainRefusal(absl::string_view what, const Lineage& chain,
                                uint32_t differs, const SiteRecord& site) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, kLosingChainWords, differs, " at attempt ",
      AttemptOf(chain, differs), "; site ", site.self, " follows attempt ",
      AttemptOf(site.lineage, differs), ", the lower, which wins"));
}

bool IsLosingChainRefusal(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         absl::StrContains(status.message(), kLosingChainWords);
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
      return AdmitLearnTask(*job, site, header);
    case v1::MODEL_KIND_RESULT:
      if (!job->IsTrainer(header.sender())) {
        return absl::PermissionDeniedError(
            absl::StrCat("sender ", header.sender(),
                         " is not a trainer of job ", job->id()));
      }
      return Admitted();
    case v1::MODEL_KIND_PARTIAL_SUM:
      if (!job->config().reduce_results_in_chain()) {
        return absl::FailedPreconditionError(
            absl::StrCat("a partial sum, but job ", job->id(),
                         " does not reduce results in a chain "
                         "(reduce_results_in_chain)"));
      }
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
