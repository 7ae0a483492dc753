// AggregatorRole: chain reduction of results (JobConfig.
// reduce_results_in_chain, FedAvg only), the aggregator's side: it holds the
// trainers' requests to submit until every trainer still to submit asks (or
// the oldest request's hold runs out), then answers them together: the first
// is told to stream its result, as a partial sum, to the second; the others
// that a partial sum will pass through them. The trainer's side is in
// trainer_role_chain.cc.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/aggregator_role.h"
#include "controller/job_run.h"
#include "streaming/partial_sum_sink.h"

namespace swarm::site {

// Not while the aggregator, lean, adds its own result first: the sum
// would arrive beside its training's models (OwnResultFirst).
bool AggregatorRole::ChainAsk(const v1::SubmitPermissionRequest& ask,
                              AggregationRound& target) {
  return run().job->config().reduce_results_in_chain() && !ask.direct() &&
         !ask.probe() && ask.sender() != self() &&
         ask.round() == target.round() &&
         !site_->OwnResultFirst(target.round()) &&
         target.CanJoinChain(ask.sender(), ask.round(), now()) &&
         CheckPartialSumLayout(target.base().specs()).ok();
}

void AggregatorRole::MaybeLaunchChain(uint32_t round, bool now_or_never) {
  AggregationRound* target = GatheringRound(round);
  if (target == nullptr || target->round() != round) return;
  std::vector<RequestId> waiting;  // In arrival order.
  std::set<std::string> asking;
  for (const auto& [request, held] : held_) {
    if (held.ask.round() == round && ChainAsk(held.ask, *target)) {
      waiting.push_back(request);
      asking.insert(held.ask.sender());
    }
  }
  if (waiting.empty()) return;
  const std::set<std::string>& chained = Gathered(round)->chained;
  if (!now_or_never) {
    for (const std::string& trainer : target->IdleTrainers()) {
      if (trainer != self() && asking.count(trainer) == 0 &&
          chained.count(trainer) == 0) {
        return;  // It may still ask: wait for it, within the hold.
      }
    }
  }
  if (waiting.size() == 1) {
    // A chain of one is a direct submission.
    auto held = held_.find(waiting.front());
    held->second.ask.set_direct(true);
    v1::SubmitPermissionReply reply = DecidePermission(held->second.ask);
    if (reply.outcome() == v1::OUTCOME_RETRY) return;  // Held on, as direct.
    Emit(effect::Reply{held->first, std::move(reply)});
    held_.erase(held);
    return;
  }
  std::vector<std::string> members;
  for (RequestId request : waiting)
    members.push_back(held_[request].ask.sender());
  for (size_t i = 0; i < waiting.size(); ++i) {
    v1::SubmitPermissionReply reply;
    reply.set_outcome(v1::OUTCOME_OK);
    if (i == 0) {
      for (size_t j = 1; j < members.size(); ++j) {
        reply.add_reduce_to(members[j]);
      }
      reply.add_reduce_to(self());
      reply.set_message(absl::StrCat(
          "round ", round, ": start the reduction chain to ", members[1]));
    } else {
      // The sum's header reaches the i-th member as soon as each hop
      // before it starts passing the sum on (its body follows frame by
      // frame): a failover timeout per hop before it bounds the wait.
      reply.set_reduce_member(true);
      reply.set_reduce_wait_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(
          run().job->failover_timeout() * static_cast<int64_t>(i + 1))));
      reply.set_message(absl::StrCat("round ", round,
                                     ": the reduction chain from ", members[0],
                                     " passes through you"));
    }
    Gathered(round)->chained.insert(members[i]);
    Heard(round, members[i], now());
    Emit(effect::Reply{waiting[i], std::move(reply)});
    held_.erase(waiting[i]);
  }
  SWARM_LOG_INFO("round %d: reduction chain %s -> %s", round,
                 absl::StrJoin(members, " -> "), self());
  site_->Changed();
}

}  // namespace swarm::site
