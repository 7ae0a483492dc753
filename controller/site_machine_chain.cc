// SiteMachine, chain reduction of results (JobConfig.reduce_results_in_chain,
// FedAvg only). The aggregator holds the trainers' requests to submit until
// every trainer still to submit asks (or the oldest request's hold runs
// out), then answers them together: the first is told to stream its result,
// as a partial sum, to the second; the others that a partial sum will pass
// through them. Each adds its own weighted result to every chunk as it
// arrives and passes the sum on (PartialSumSink), the aggregator last, which
// adds the sum as the results of all its contributors at once.
//
// Nothing accepted is lost: a trainer keeps its result until the round's
// outcome, as with a direct submission. When the sum through it does not
// reach the aggregator (a hop down, a refusal), or none came through it in
// time, it asks again for an ordinary slot (`direct`) and submits its
// result itself. The aggregator takes any number of partial sums and
// direct results, as long as no trainer is in two.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/replies.h"
#include "controller/site_machine.h"
#include "streaming/partial_sum_sink.h"

namespace swarm {

// --- Aggregator side -------------------------------------------------------

// Not while the aggregator, lean, adds its own result first: the sum
// would arrive beside its training's models (OwnResultFirst).
bool SiteMachine::ChainAsk(const v1::SubmitPermissionRequest& ask,
                           AggregationRound& target) {
  return run_->job->config().reduce_results_in_chain() && !ask.direct() &&
         !ask.probe() && ask.sender() != options_.site &&
         ask.round() == target.round() && !OwnResultFirst(target.round()) &&
         target.CanJoinChain(ask.sender(), ask.round(), now_) &&
         CheckPartialSumLayout(target.base().specs()).ok();
}

void SiteMachine::MaybeLaunchChain(uint32_t round, bool now_or_never) {
  AggregationRound* target = GatheringRound(round);
  if (target == nullptr || target->round() != round) return;
  std::vector<RequestId> waiting;  // In arrival order.
  std::set<std::string> asking;
  for (const auto& [request, held] : run_->work.held) {
    if (held.ask.round() == round && ChainAsk(held.ask, *target)) {
      waiting.push_back(request);
      asking.insert(held.ask.sender());
    }
  }
  if (waiting.empty()) return;
  const std::set<std::string>& chained = Gathered(round)->chained;
  if (!now_or_never) {
    for (const std::string& trainer : target->IdleTrainers()) {
      if (trainer != options_.site && asking.count(trainer) == 0 &&
          chained.count(trainer) == 0) {
        return;  // It may still ask: wait for it, within the hold.
      }
    }
  }
  if (waiting.size() == 1) {
    // A chain of one is a direct submission.
    auto held = run_->work.held.find(waiting.front());
    held->second.ask.set_direct(true);
    v1::SubmitPermissionReply reply = DecidePermission(held->second.ask);
    if (reply.outcome() == v1::OUTCOME_RETRY) return;  // Held on, as direct.
    out_.push_back(effect::Reply{held->first, std::move(reply)});
    run_->work.held.erase(held);
    return;
  }
  std::vector<std::string> members;
  for (RequestId request : waiting)
    members.push_back(run_->work.held[request].ask.sender());
  for (size_t i = 0; i < waiting.size(); ++i) {
    v1::SubmitPermissionReply reply;
    reply.set_outcome(v1::OUTCOME_OK);
    if (i == 0) {
      for (size_t j = 1; j < members.size(); ++j) {
        reply.add_reduce_to(members[j]);
      }
      reply.add_reduce_to(options_.site);
      reply.set_message(absl::StrCat(
          "round ", round, ": start the reduction chain to ", members[1]));
    } else {
      // The sum's header reaches the i-th member as soon as each hop
      // before it starts passing the sum on (its body follows frame by
      // frame): a failover timeout per hop before it bounds the wait.
      reply.set_reduce_member(true);
      reply.set_reduce_wait_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(
          run_->job->failover_timeout() * static_cast<int64_t>(i + 1))));
      reply.set_message(absl::StrCat("round ", round,
                                     ": the reduction chain from ", members[0],
                                     " passes through you"));
    }
    Gathered(round)->chained.insert(members[i]);
    Heard(round, members[i], now_);
    out_.push_back(effect::Reply{waiting[i], std::move(reply)});
    run_->work.held.erase(waiting[i]);
  }
  SWARM_LOG_INFO("round %d: reduction chain %s -> %s", round,
                 absl::StrJoin(members, " -> "), options_.site);
  Changed();
}

// --- Trainer side ----------------------------------------------------------

v1::Contribution SiteMachine::OwnContribution(const Training& task) const {
  v1::Contribution mine;
  mine.set_site(options_.site);
  mine.set_sample_count(task.result_header.sample_count());
  *mine.mutable_metrics() = task.result_header.metrics();
  mine.set_payload_kind(task.result_header.payload_kind());
  return mine;
}

void SiteMachine::StartChain(const v1::SubmitPermissionReply& reply) {
  Training& task = *run_->work.training;
  std::vector<std::string> rest(reply.reduce_to().begin(),
                                reply.reduce_to().end());
  if (task.result == nullptr || task.result_header.failed() ||
      rest.back() != task.aggregator) {
    return LeaveChain(
        "starting the reduction chain",
        absl::FailedPreconditionError(
            task.result == nullptr ? "this site holds no result"
                                   : "the chain does not end at the round's "
                                     "aggregator"));
  }
  task.BecomeChainHead();
  SetState(v1::SITE_STATE_SUBMITTING);
  PeerMessage message;
  message.kind = CallKind::kSubmitResult;
  message.header = task.result_header;
  message.header.set_kind(v1::MODEL_KIND_PARTIAL_SUM);
  *message.header.add_contributions() = OwnContribution(task);
  message.header.set_partial_scale(
      static_cast<double>(task.result_header.sample_count()));
  for (size_t i = 1; i < rest.size(); ++i) {
    message.header.add_relay_to(rest[i]);
  }
  message.model = task.result;
  message.timeout = run_->job->learn_task_ack_timeout();
  // A hop frozen further down stalls every hop above it until its own
  // forwarder gives it up: the first hop waits longest.
  message.relay_stall = RelayStallBudget(run_->job->failover_timeout(),
                                         static_cast<int>(rest.size()));
  Call call;
  call.purpose = Call::Purpose::kChainSubmit;
  call.round = task.round;
  SWARM_LOG_INFO("round %d: starting the reduction chain to %s", task.round,
                 rest.front());
  Send(rest.front(), std::move(message), call, /*retry=*/false);
  // Probed meanwhile, as after any submission: the aggregator hears from
  // this site, and its death moves the round to a backup.
  ScheduleAsk(run_->job->failover_timeout() / 2);
}

void SiteMachine::OnChainSubmitDone(const Call& call,
                                    const event::CallDone& e) {
  if (!run_->work.training.has_value() ||
      run_->work.training->round != call.round ||
      run_->work.training->phase() != Training::Phase::kChainHead ||
      !Active()) {
    return;
  }
  Training& task = *run_->work.training;
  absl::Status status =
      e.reply.ok() ? StatusFromHopReply(e.reply->reply) : e.reply.status();
  if (!status.ok()) {
    return LeaveChain(absl::StrCat("the reduction chain to ", call.target),
                      status);
  }
  SWARM_LOG_INFO("round %d: result in the partial sum %s passed on", call.round,
                 call.target);
  ResultIsIn(task);
}

absl::StatusOr<ModelAdmission> SiteMachine::AdmitPartialHop(
    const v1::ModelHeader& header) {
  auto refuse = [&](std::string why) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", header.round(), ": ", options_.site,
                     " cannot add its result to the partial sum from ",
                     header.sender(), ": ", why));
  };
  if (absl::Status sane = CheckPartialSumHeader(header); !sane.ok()) {
    return sane;
  }
  for (const v1::Contribution& contribution : header.contributions()) {
    if (contribution.site() == options_.site) {
      return absl::InvalidArgumentError(absl::StrCat(
          "contributions: names ", options_.site,
          ", the site it is sent to (a partial sum passes a site once)"));
    }
    if (!run_->job->IsTrainer(contribution.site())) {
      return absl::InvalidArgumentError(
          absl::StrCat("contributions: ", contribution.site(),
                       " is not a trainer of job ", run_->job->id()));
    }
  }
  if (!run_->work.training.has_value() ||
      run_->work.training->round != header.round()) {
    return refuse("it trains no such round");
  }
  Training& task = *run_->work.training;
  if (!task.trained() || task.result == nullptr ||
      task.result_header.failed()) {
    return refuse("it has no result for the round");
  }
  if (!task.CanJoinPartialSum()) {
    return refuse("its result is already on its way");
  }
  if (header.aggregator() != task.aggregator ||
      header.relay_to(header.relay_to_size() - 1) != task.aggregator) {
    return refuse(absl::StrCat("it submits to ", task.aggregator, ", not ",
                               header.aggregator()));
  }
  ModelAdmission admission;
  admission.assembler = AssemblerFor(v1::MODEL_KIND_PARTIAL_SUM);
  admission.assembler.expected_specs = task.result->specs();
  ModelAdmission::ChainHop hop;
  hop.own = task.result;
  hop.own_weight = static_cast<double>(task.result_header.sample_count());
  hop.next = header.relay_to(0);
  hop.onward = header;
  hop.onward.set_sender(options_.site);
  hop.onward.clear_partial_scale();
  hop.onward.mutable_relay_to()->DeleteSubrange(0, 1);
  *hop.onward.add_contributions() = OwnContribution(task);
  // This hop's privacy spend joins the earlier hops' (ModelHeader).
  hop.onward.mutable_privacy_spent()->insert(
      task.result_header.privacy_spent().begin(),
      task.result_header.privacy_spent().end());
  hop.onward.set_sample_count(header.sample_count() +
                              task.result_header.sample_count());
  admission.chain_hop = std::move(hop);
  task.BecomeContributing();
  SetState(v1::SITE_STATE_SUBMITTING);
  if (task.ask_timer == 0) ScheduleAsk(run_->job->failover_timeout() / 2);
  return admission;
}

v1::Reply SiteMachine::OnPartialPassedOn(const v1::ModelHeader& header,
                                         const absl::Status& status) {
  const std::string next =
      header.relay_to_size() > 0 ? header.relay_to(0) : std::string();
  const bool mine =
      run_->work.training.has_value() &&
      run_->work.training->round == header.round() &&
      run_->work.training->phase() == Training::Phase::kContributing;
  if (!status.ok()) {
    if (mine && Active()) {
      LeaveChain(absl::StrCat("passing the partial sum from ", header.sender(),
                              " on to ", next),
                 status);
    }
    return ReplyFromStatus(status);
  }
  if (mine) ResultIsIn(*run_->work.training);
  SWARM_LOG_INFO(
      "round %d: added this site's result to the partial sum "
      "from %s; %s took it",
      header.round(), header.sender(), next);
  return OkReply(absl::StrCat("added to the partial sum and passed on to ",
                              next, ", which took it"));
}

void SiteMachine::LeaveChain(const std::string& what, const absl::Status& why) {
  Training& task = *run_->work.training;
  ReportError(absl::StrCat("round ", task.round, ": ", what,
                           "; submitting this site's result directly"),
              why);
  task.LeaveChain(now_);
  SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  AskToSubmit();
}

}  // namespace swarm
