// ScatterRole: the scatter of a round's learn tasks (design section 3,
// steps 1 and 2), by the site that holds the round's model: the starting
// site for the first round, then each round's aggregator for the next.
// Phase 1 sends the task to every trainer but the aggregator (directly, or
// as one broadcast stream along them); their acknowledgements, or a
// failover timeout's grace after the first, make the round's expected set.
// Phase 2 sends the aggregator its task with that set, failing over to the
// round's next backup when it cannot be delivered.
//
// Owns the scatters under way and the aggregator tasks not yet
// acknowledged; reaches the rest of the site through SiteContext.
#ifndef SWARM_CONTROLLER_SCATTER_ROLE_H_
#define SWARM_CONTROLLER_SCATTER_ROLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/fan_out.h"
#include "controller/lineage.h"
#include "controller/site_context.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm::site {

// A scatter waiting for the trainers' acknowledgements.
struct Scatter {
  v1::ModelHeader header;  // The trainers' learn task.
  std::shared_ptr<const Model> global;
  // The trainers' answers: missed are those the task did not reach, and
  // why; the grace is for the trainers still silent.
  FanOut answers;
  // Broadcast: the aggregator kept the chain's copy (its task goes
  // without a body).
  bool aggregator_holds_copy = false;
};

class ScatterRole : public RoleBase {
 public:
  explicit ScatterRole(SiteContext* site) : RoleBase(site, RoleId::kScatter) {}

  void OnCallDone(const Call& call, const event::CallDone& e);
  void OnTimerFired(TimerId id, const Timer& timer);

  // Sends round `round`'s learn tasks with model `global`.
  void ScatterRound(uint32_t round, std::shared_ptr<const Model> global,
                    v1::BestRecord best, const Lineage& lineage,
                    bool resume = false);
  // This site follows another chain now: its scatters go (design
  // section 6).
  void DropAll();
  // Every model held that is `old` becomes `mapped`.
  void ReplaceHeldModel(const Model* old,
                        const std::shared_ptr<const Model>& mapped);

 private:
  PeerMessage TaskToTrainer(const Scatter& scatter) const;
  // With broadcast_learn_tasks: the sites the round's learn task streams
  // along, head first (empty: direct sends); marks `scatter`'s header when
  // the aggregator's task follows the stream without a body.
  std::vector<std::string> BroadcastChain(Scatter& scatter) const;
  void SendTaskToTrainer(const Scatter& scatter, const std::string& target);
  void OnTaskToTrainerDone(const Call& call, const event::CallDone& e);
  // The answer of a broadcast's head, for itself and the sites after it.
  void OnChainTaskDone(const Call& call, const event::CallDone& e);
  // How `target` answered round `round`'s learn task.
  // With !may_start_grace its acknowledgement does not start the grace for
  // the trainers still silent (a broadcast's answers, when direct sends
  // follow them).
  void NoteTaskToTrainer(uint32_t round, const std::string& target,
                         const absl::Status& status,
                         bool may_start_grace = true);
  void EndScatterWait(uint32_t round);
  void SendTaskToAggregator(const Scatter& scatter);
  void SendAggregatorTask(uint32_t round);
  void OnTaskToAggregatorDone(const Call& call, const event::CallDone& e);
  // The round's aggregator did not take its learn task (`status`): the task
  // goes to the next backup, or the job fails here when there is none.
  void PassTaskToBackup(const Call& call, const absl::Status& status);
  // Whether learn task `task` (scattered here) is of a chain that lost to
  // the one this site follows now.
  bool ScatterLost(const v1::ModelHeader& task) const;

  std::map<uint32_t, Scatter> scatters_;
  // Learn tasks to aggregators not yet acknowledged (kept for a failover
  // to the round's next backup).
  std::map<uint32_t, Scatter> aggregator_tasks_;
};

}  // namespace swarm::site

#endif  // SWARM_CONTROLLER_SCATTER_ROLE_H_
