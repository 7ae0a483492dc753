// TrainerRole: this site as a trainer (design section 3, steps 1 to 5, and
// section 6): it takes learn tasks, trains, asks the round's aggregator for
// a slot, submits its result (alone or in a reduction chain), probes the
// aggregator until the round's outcome, and fails the round over to a
// backup, hands it over, or takes it over itself.
//
// Owns the round it trains on (Training, one Phase with Become* calls:
// controller/trainer_task.h) and the copy of a broadcast learn task kept
// for this site's own aggregator task. Everything else of the site it
// reaches through SiteContext. trainer_role.cc and trainer_role_chain.cc
// (chain reduction, trainer side).
#ifndef SWARM_CONTROLLER_TRAINER_ROLE_H_
#define SWARM_CONTROLLER_TRAINER_ROLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/admission.h"
#include "controller/site_context.h"
#include "controller/trainer_task.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm::site {

// The round's model as a broadcast brought it to this site, the round's
// aggregator, kept for its own task (header.body_held).
struct HeldTaskCopy {
  v1::ModelHeader header;
  std::shared_ptr<const Model> model;
};

class TrainerRole : public RoleBase {
 public:
  explicit TrainerRole(SiteContext* site) : RoleBase(site, RoleId::kTrainer) {}

  // --- Events routed here ---
  void OnCallDone(const Call& call, const event::CallDone& e);
  void OnTimerFired(TimerId id, const Timer& timer);
  // REQUIRES: the training is of the current job.
  void OnTrainingDone(event::TrainingDone& e);

  // --- Learn tasks ---
  v1::Reply AcceptLearnTask(const v1::ModelHeader& header,
                            std::shared_ptr<const Model> model);
  // The aggregator's task without a body (header.body_held): taken with the
  // broadcast's copy kept here, or refused (the sender then sends the body).
  absl::StatusOr<ModelAdmission> AcceptHeldTask(const v1::ModelHeader& header);
  // A learn task admitted without its body (TaskVerdict kRepeat, kTakeOver,
  // kNoted): what it changes here. An error refuses the task (a takeover
  // declined: DeclineTakeOver).
  absl::Status OnHeldTask(const v1::ModelHeader& header, TaskVerdict verdict);
  // A handoff of a round this site is past: sends the trainer the task of
  // the round this site holds, if it has it.
  void CatchUp(const v1::ModelHeader& stale);

  // --- Chain reduction, as a hop (trainer_role_chain.cc) ---
  absl::StatusOr<ModelAdmission> AdmitPartialHop(const v1::ModelHeader& header);
  v1::Reply OnPartialPassedOn(const v1::ModelHeader& header,
                              const absl::Status& status);

  // --- For the other roles (through SiteContext) ---
  // Whether this site, the aggregator of `round` and a trainer, must add
  // its own result before remote ones (lean memory: its training's models
  // and another result are not held at once).
  bool OwnResultFirst(uint32_t round) const;
  // LAST of `round` arrived: the round trained here is over (its result
  // is not needed for a resubmission; its aggregator is not probed).
  void EndTrainingAtLast(uint32_t round);
  // Whether a round is trained or held here (its training is cancelled
  // when the job ends here).
  bool HasRound() const { return training_.has_value(); }
  // Every model held that is `old` becomes `mapped`.
  void ReplaceHeldModel(const Model* old,
                        const std::shared_ptr<const Model>& mapped);

 private:
  // A learn task of the chain that wins over the one this site followed
  // (TaskVerdict kSwitch): what it did on the losing one goes.
  void SwitchToWinningChain(const v1::ModelHeader& header);
  // Drops what this site did on a chain that lost (design section 6).
  void DropLosingChain(const v1::ModelHeader& winner);
  // An accepted learn task in the site's record (persisted when it tells a
  // restarted daemon something new) and as the current global model.
  void NoteLearnTask(const v1::ModelHeader& header,
                     const std::shared_ptr<const Model>& model);
  // This site trains on the round of learn task `header`.
  void BeginTraining(const v1::ModelHeader& header,
                     std::shared_ptr<const Model> model);
  // Why this site declines to take over round r at attempt a+1 (handoff
  // `header`, TaskVerdict kTakeOver), or OK to take it over: it trains the
  // round for attempt a's aggregator, which answered it within the failover
  // timeout. That aggregator holds the round's task (and maybe this site's
  // result); the lower attempt wins (design section 6), so an aggregate at
  // a+1 would be dropped with the handing trainer's result in it.
  // ALREADY_EXISTS: the trainer goes back to attempt a (FailBack).
  absl::Status DeclineTakeOver(const v1::ModelHeader& header) const;
  // A backup aggregator takes over the round it holds as a trainer.
  void TakeOver(const v1::ModelHeader& header);

  // Asking and submitting.
  void AskToSubmit();
  void ScheduleAsk(absl::Duration wait);
  void AddChain(v1::SubmitPermissionRequest* ask) const;
  void OnPermissionReply(const Call& call, const event::CallDone& e);
  // The aggregator's answer to a request for a slot (not a probe): upload,
  // join a chain, ask again later, or give up.
  void OnSlotReply(Training& task, const v1::SubmitPermissionReply& reply);
  // The aggregator has this site's result (an accepted upload or partial
  // sum, or it says so when asked again): keep it until the round's
  // outcome, probing the aggregator meanwhile.
  void ResultIsIn(Training& task);
  void OnSubmitDone(const Call& call, const event::CallDone& e);

  // Failover (design section 6).
  // The aggregator failed a call (or lacks the task): fail over or hand the
  // task over once the job's bounds say so, else ask again later.
  void OnAggregatorTrouble(const absl::Status& status);
  void FailOver(const std::string& reason);
  void HandOff();
  void OnHandoffDone(const Call& call, const event::CallDone& e);
  // The backup declined the handoff (DeclineTakeOver): back to the
  // aggregator of the attempt before, which holds the round.
  void FailBack(const std::string& reason);

  // Chain reduction, trainer side (trainer_role_chain.cc).
  void StartChain(const v1::SubmitPermissionReply& reply);
  // This site's entry in a partial sum's contributions.
  v1::Contribution OwnContribution(const Training& task) const;
  void OnChainSubmitDone(const Call& call, const event::CallDone& e);
  // The chain did not carry this site's result: ask for a slot of its own.
  void LeaveChain(const std::string& what, const absl::Status& why);

  std::optional<Training> training_;
  std::optional<HeldTaskCopy> held_task_copy_;
};

}  // namespace swarm::site

#endif  // SWARM_CONTROLLER_TRAINER_ROLE_H_
