// Training: this site's part, as a trainer, in one round, from the learn
// task to the round's outcome (the next learn task, or the final models).
// The result is kept after submission: if the aggregator dies it goes to
// the round's backup (design section 6).
//
// Where the result is stands in one Phase, changed only by the Become*
// calls below (after etcd raft's tracker/progress.go: one State, one
// Become* per state, each saying which states it comes from). The machine
// (TrainerRole: trainer_role.cc, trainer_role_chain.cc) decides when; this type
// keeps the phase and what belongs to it consistent.
//
//   kTraining --BecomeAsking--> kAsking --BecomeUploading--> kUploading
//   kAsking --BecomeChainHead / BecomeChainMember--> kChainHead/kChainMember
//   kChainMember --BecomeContributing--> kContributing
//   kUploading, kChainHead, kContributing, kAsking --BecomeSubmitted-->
//     kSubmitted
//   kUploading --UploadEnded--> kAsking
//   kChainHead, kChainMember, kContributing --LeaveChain--> kAsking (direct)
//   kSubmitted --ResultLost--> kAsking (the aggregator lacks it)
//   any but kTraining --AskAfresh--> kAsking (a failover)
//   kSubmitted --FollowAggregator--> kAsking (another attempt's aggregator)
//
// Orthogonal to the phase: `handing_off` (a handoff of the round to the
// aggregator is under way; asks wait for its answer).
#ifndef SWARM_CONTROLLER_TRAINER_TASK_H_
#define SWARM_CONTROLLER_TRAINER_TASK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "controller/machine_events.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm::site {

struct Training {
  enum class Phase {
    kTraining,      // The learner trains on the round's model.
    kAsking,        // Trained (or failed): asking the aggregator for a slot.
    kUploading,     // A slot was granted: the upload is under way.
    kChainHead,     // Streaming its result, as a partial sum, down a chain.
    kChainMember,   // A partial sum is to pass through it (until
                    // `chain_until`), collecting its result.
    kContributing,  // A partial sum passes through it now.
    kSubmitted,     // The aggregator has the result: kept, and probed.
  };
  static const char* PhaseName(Phase phase);

  Phase phase() const { return phase_; }
  bool trained() const { return phase_ != Phase::kTraining; }
  bool submitted() const { return phase_ == Phase::kSubmitted; }
  // In a reduction chain (head, member or contributing).
  bool InChain() const {
    return phase_ == Phase::kChainHead || phase_ == Phase::kChainMember ||
           phase_ == Phase::kContributing;
  }
  // Whether this site's asks are liveness probes of the aggregator (while
  // it trains, once its result is in, or while a chain carries it) rather
  // than requests for a slot.
  bool Probing() const {
    return phase_ != Phase::kAsking && phase_ != Phase::kUploading;
  }
  // A partial sum may pass through this site (it adds its result to it).
  bool CanJoinPartialSum() const {
    return phase_ == Phase::kAsking || phase_ == Phase::kChainMember;
  }
  // Since when it asks (the first ask after training, or after leaving a
  // chain): request_to_submit_max_wait counts from here.
  absl::Time asking_since() const { return asking_since_; }
  // kChainMember: until when a partial sum may come.
  absl::Time chain_until() const { return chain_until_; }
  // Asks for an ordinary slot (a chain did not carry its result).
  bool direct() const { return direct_; }

  // --- Transitions (REQUIRES: the phases named; others are not changed) ---
  // kTraining -> kAsking: the learner ended (a result, or a failure).
  void BecomeAsking(absl::Time now);
  // kAsking -> kUploading.
  void BecomeUploading();
  // kAsking -> kChainHead.
  void BecomeChainHead();
  // kAsking -> kChainMember, a partial sum expected until `until`.
  void BecomeChainMember(absl::Time until);
  // kAsking or kChainMember -> kContributing.
  void BecomeContributing();
  // The aggregator has the result (an upload or a partial sum it took, or
  // it says so when asked): -> kSubmitted, and it was heard from now.
  void BecomeSubmitted(absl::Time now);
  // kUploading -> kAsking: the upload ended without the result in.
  void UploadEnded();
  // A chain phase -> kAsking for an ordinary slot, asking from `now`.
  void LeaveChain(absl::Time now);
  // kSubmitted -> kAsking: the aggregator lacks the round (it restarted,
  // or another attempt holds it): the result goes again.
  void ResultLost();
  // Any phase after kTraining -> kAsking, not direct: what was on its way
  // to the aggregator is over (a failover gives up on it; its answer, if
  // one comes, is ignored).
  void AskAfresh();
  // Follows the round to `aggregator` at `attempt` (a failover to a backup,
  // or back to the attempt before): the task and the result name it, it
  // has not been heard from, and a result it was told is in is not
  // (kSubmitted -> kAsking).
  void FollowAggregator(const std::string& aggregator, uint32_t attempt);

  uint64_t id = 0;
  uint32_t round = 0;
  std::shared_ptr<const Model> global;
  v1::ModelHeader task;  // The learn task (attempt, chain, best record).
  std::string aggregator;
  uint32_t attempt = 0;
  v1::ModelHeader result_header;
  std::shared_ptr<const Model> result;
  // The aggregator's trouble: failed calls in a row and since when, and
  // since when it has answered that it lacks the round's task.
  int failures = 0;
  absl::Time failing_since = absl::InfiniteFuture();
  absl::Time lacking_since = absl::InfiniteFuture();
  bool handing_off = false;
  // When the aggregator (at `attempt`) last answered that it holds the
  // round: a probe or a permission request answered, the result taken.
  // A handoff of the round to this site at the next attempt is declined
  // while that is recent (DeclineTakeOver).
  absl::Time confirmed = absl::InfinitePast();
  TimerId ask_timer = 0;  // The one kAskAgain timer that counts.

 private:
  Phase phase_ = Phase::kTraining;
  absl::Time asking_since_ = absl::InfinitePast();
  absl::Time chain_until_ = absl::InfiniteFuture();
  bool direct_ = false;
};

}  // namespace swarm::site

#endif  // SWARM_CONTROLLER_TRAINER_TASK_H_
