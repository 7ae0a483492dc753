// TrainerRole: chain reduction of results (JobConfig.reduce_results_in_chain,
// FedAvg only), the trainer's side; the aggregator's is in
// aggregator_role_chain.cc. The aggregator holds the trainers' requests to
// submit until every trainer still to submit asks (or the oldest request's hold
// runs out), then answers them together: the first is told to stream its
// result, as a partial sum, to the second; the others that a partial sum will
// pass through them. Each adds its own weighted result to every chunk as it
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
#include "common/logging.h"
#include "controller/job_run.h"
#include "controller/replies.h"
#include "controller/trainer_role.h"
#include "streaming/partial_sum_sink.h"

namespace swarm::site {

v1::Contribution TrainerRole::OwnContribution(const Training& task) const {
  v1::Contribution mine;
  mine.set_site(self());
  mine.set_sample_count(task.result_header.sample_count());
  *mine.mutable_metrics() = task.result_header.metrics();
  mine.set_payload_kind(task.result_header.payload_kind());
  return mine;
}

void TrainerRole::StartChain(const v1::SubmitPermissionReply& reply) {
  Training& task = *training_;
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
  site_->SetState(v1::SITE_STATE_SUBMITTING);
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
  message.timeout = run().job->learn_task_ack_timeout();
  // A hop frozen further down stalls every hop above it until its own
  // forwarder gives it up: the first hop waits longest.
  message.relay_stall = RelayStallBudget(run().job->failover_timeout(),
                                         static_cast<int>(rest.size()));
  Call call;
  call.purpose = Call::Purpose::kChainSubmit;
  call.round = task.round;
  SWARM_LOG_INFO("round %d: starting the reduction chain to %s", task.round,
                 rest.front());
  Send(rest.front(), std::move(message), call, /*retry=*/false);
  // Probed meanwhile, as after any submission: the aggregator hears from
  // this site, and its death moves the round to a backup.
  ScheduleAsk(run().job->failover_timeout() / 2);
}

void TrainerRole::OnChainSubmitDone(const Call& call,
                                    const event::CallDone& e) {
  if (!training_.has_value() || training_->round != call.round ||
      training_->phase() != Training::Phase::kChainHead || !site_->Active()) {
    return;
  }
  Training& task = *training_;
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

absl::StatusOr<ModelAdmission> TrainerRole::AdmitPartialHop(
    const v1::ModelHeader& header) {
  auto refuse = [&](std::string why) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", header.round(), ": ", self(),
                     " cannot add its result to the partial sum from ",
                     header.sender(), ": ", why));
  };
  if (absl::Status sane = CheckPartialSumHeader(header); !sane.ok()) {
    return sane;
  }
  for (const v1::Contribution& contribution : header.contributions()) {
    if (contribution.site() == self()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "contributions: names ", self(),
          ", the site it is sent to (a partial sum passes a site once)"));
    }
    if (!run().job->IsTrainer(contribution.site())) {
      return absl::InvalidArgumentError(
          absl::StrCat("contributions: ", contribution.site(),
                       " is not a trainer of job ", run().job->id()));
    }
  }
  if (!training_.has_value() || training_->round != header.round()) {
    return refuse("it trains no such round");
  }
  Training& task = *training_;
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
  admission.assembler = site_->AssemblerFor(v1::MODEL_KIND_PARTIAL_SUM);
  admission.assembler.expected_specs = task.result->specs();
  ModelAdmission::ChainHop hop;
  hop.own = task.result;
  hop.own_weight = static_cast<double>(task.result_header.sample_count());
  hop.next = header.relay_to(0);
  hop.onward = header;
  hop.onward.set_sender(self());
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
  site_->SetState(v1::SITE_STATE_SUBMITTING);
  if (task.ask_timer == 0) ScheduleAsk(run().job->failover_timeout() / 2);
  return admission;
}

v1::Reply TrainerRole::OnPartialPassedOn(const v1::ModelHeader& header,
                                         const absl::Status& status) {
  const std::string next =
      header.relay_to_size() > 0 ? header.relay_to(0) : std::string();
  const bool mine = training_.has_value() &&
                    training_->round == header.round() &&
                    training_->phase() == Training::Phase::kContributing;
  if (!status.ok()) {
    if (mine && site_->Active()) {
      LeaveChain(absl::StrCat("passing the partial sum from ", header.sender(),
                              " on to ", next),
                 status);
    }
    return ReplyFromStatus(status);
  }
  if (mine) ResultIsIn(*training_);
  SWARM_LOG_INFO(
      "round %d: added this site's result to the partial sum "
      "from %s; %s took it",
      header.round(), header.sender(), next);
  return OkReply(absl::StrCat("added to the partial sum and passed on to ",
                              next, ", which took it"));
}

void TrainerRole::LeaveChain(const std::string& what, const absl::Status& why) {
  Training& task = *training_;
  site_->ReportError(absl::StrCat("round ", task.round, ": ", what,
                                  "; submitting this site's result directly"),
                     why);
  task.LeaveChain(now());
  site_->SetState(v1::SITE_STATE_WAITING_FOR_PERMISSION);
  AskToSubmit();
}

}  // namespace swarm::site
