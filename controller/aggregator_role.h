// AggregatorRole: the rounds this site gathers (design section 3, steps 4
// to 7): each an AggregationRound with what the machine keeps beside it
// (RoundState); permission requests, held while the answer is RETRY, and
// chain reduction's launch (aggregator_role_chain.cc); the close of each
// round, its aggregation (on the aggregation worker, outside the step) and
// what follows it: the next round's scatter or the job's finish, which it
// asks of the site (SiteContext).
//
// Owns the gathered rounds, the rounds being aggregated, the held requests
// and the lean aggregates waiting for their write.
#ifndef SWARM_CONTROLLER_AGGREGATOR_ROLE_H_
#define SWARM_CONTROLLER_AGGREGATOR_ROLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/aggregation_round.h"
#include "controller/lineage.h"
#include "controller/site_context.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm::site {

// A round this site gathers, all in one place: its rules and aggregate
// (AggregationRound, which owns the results), and what the machine keeps
// beside them: its attempt and chain, when each trainer was last heard from
// (a probe, a request, a result; InfiniteFuture while it holds a slot), its
// deadline timer. Trainers probe their aggregator every half failover
// timeout, so one silent for two failover timeouts is down or frozen.
struct RoundState {
  std::unique_ptr<AggregationRound> round;  // Never null.
  // When the round's deadline timer is armed for (InfinitePast: none).
  absl::Time armed = absl::InfinitePast();
  uint32_t attempt = 0;
  Lineage lineage;
  bool handoff = false;
  absl::Time opened;
  std::map<std::string, absl::Time> heard;
  // Chain reduction: trainers put into a chain whose partial sum has not
  // come yet (they are not asked to join another).
  std::set<std::string> chained;
  // The round is over but results are still being added: it closes once
  // the last add ends (CloseRound).
  bool close_when_added = false;
  // Trainers that reported they stopped training for the job for good
  // (their privacy budget spent: ModelHeader.trainer_stopped).
  std::set<std::string> stopped;
};
// A permission request held until a slot frees, the round opens, or `until`.
struct Held {
  v1::SubmitPermissionRequest ask;
  absl::Time until;
};
// A round closed and being aggregated, with its verdict.
struct Closing {
  v1::BestRecord best;
  std::optional<double> input_score;
  uint32_t attempt = 0;
  Lineage lineage;
  std::string stop_reason;  // Set: finish after this round (early stop).
};
// Writes with map_back: a lean aggregate waiting for its write and
// mapping before it goes on (ScatterRound or FinishJob), so that whatever
// would hold the model in memory beside its file (the next round's base,
// the sends, this site's own training) holds the mapping instead.
struct AfterGlobal {
  uint32_t round = 0;
  Closing closing;
  std::shared_ptr<const Model> model;  // The aggregate in memory.
};

class AggregatorRole : public RoleBase {
 public:
  explicit AggregatorRole(SiteContext* site)
      : RoleBase(site, RoleId::kAggregator) {}

  // --- Events routed here ---
  void OnTimerFired(TimerId id, const Timer& timer);
  void OnPermissionAsked(event::PermissionAsked& e);
  void OnRequestCancelled(event::RequestCancelled& e);
  // REQUIRES (these two): of the current job.
  void OnAggregationDone(event::AggregationDone& e);
  void OnResultAdded(event::ResultAdded& e);
  // A write of a lean aggregate ended: on with the round after it. Returns
  // whether the write was one of these.
  bool OnPersistDone(const event::PersistDone& e);

  // --- Results ---
  absl::StatusOr<ModelAdmission> AdmitResult(const v1::ModelHeader& header,
                                             absl::Time now);
  // A result's body arrived: its answer now, or nullopt when it is being
  // added (the answer follows its kResultAdded).
  std::optional<v1::Reply> OnResult(
      RequestId request, const v1::ModelHeader& header,
      const absl::StatusOr<std::shared_ptr<const Model>>& model);

  // --- For the site ---
  void OpenRound(const v1::ModelHeader& header,
                 std::shared_ptr<const Model> base);
  void Heard(uint32_t round, const std::string& trainer, absl::Time when);
  bool Gathers(uint32_t round) const { return rounds_.count(round) > 0; }
  bool GathersAny() const { return !rounds_.empty(); }
  // Answers the held requests whose answer changed.
  void AnswerHeldRequests();
  // The job ended here: every held request is answered `ended`, every
  // gathered round dropped.
  void EndAll(const v1::Reply& ended);
  // This site follows another chain now: its gathered and aggregating
  // rounds go; returns how many.
  uint64_t DropAll();
  size_t held_requests() const { return held_.size(); }
  // The gathered rounds' counters, added to `counters`.
  void AddCounters(RoundCounters* counters) const;

 private:
  // Whether `sender`'s call for `asked_round`, on chain `lineage`, is on the
  // chain of `round` gathered here (then `sender` was heard from); the
  // REJECTED / RETRY reply otherwise.
  std::optional<v1::SubmitPermissionReply> CheckChain(
      uint32_t round, uint32_t asked_round, const std::string& sender,
      const google::protobuf::RepeatedPtrField<v1::RoundAttempt>& lineage);
  void DropSilentTrainers(uint32_t round);
  void OnRoundReport(uint32_t round, const RoundReport& report);
  AggregationRound* GatheringRound(uint32_t round);
  // The round `round` this site gathers, or null.
  RoundState* Gathered(uint32_t round);
  void DropRounds();
  void CloseRound(uint32_t round);
  // Scatters the next round of `round`'s aggregate, or finishes the job.
  void GoOnAfter(uint32_t round, const Closing& closing,
                 std::shared_ptr<const Model> next);
  // How the result of `header` ended in round `round`: the reply.
  v1::Reply EndResult(uint32_t round, const v1::ModelHeader& header,
                      const AggregationRound::ResultEnd& end);
  // The answer to `ask` now (a RETRY may be held and asked again).
  v1::SubmitPermissionReply DecidePermission(
      const v1::SubmitPermissionRequest& ask);
  // The answer to `ask` for a round this site does not gather.
  v1::SubmitPermissionReply NotGatheredHere(
      const v1::SubmitPermissionRequest& ask) const;

  // Chain reduction, aggregator side (aggregator_role_chain.cc): whether
  // `ask` waits for a chain.
  bool ChainAsk(const v1::SubmitPermissionRequest& ask,
                AggregationRound& target);
  // Answers the held requests of `round` that wait for a chain together
  // with one, once every idle trainer asks (or, with `now_or_never`, with
  // those that do).
  void MaybeLaunchChain(uint32_t round, bool now_or_never);

  // The rounds this site gathers, then (closed) aggregates.
  std::map<uint32_t, RoundState> rounds_;
  std::map<uint32_t, Closing> aggregating_;
  std::map<RequestId, Held> held_;
  std::map<PersistId, AfterGlobal> after_global_;
};

}  // namespace swarm::site

#endif  // SWARM_CONTROLLER_AGGREGATOR_ROLE_H_
