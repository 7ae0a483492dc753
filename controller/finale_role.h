// FinaleRole: the end of the job (design section 3, step 8): LAST to every
// site, then BEST from this site or from a holder it asks to share it; at
// every site, the final models received (stored, then answered).
//
// Owns the final broadcasts under way and the asks for BEST; the finals
// received are the job's record (JobRun).
#ifndef SWARM_CONTROLLER_FINALE_ROLE_H_
#define SWARM_CONTROLLER_FINALE_ROLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/fan_out.h"
#include "controller/site_context.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm::site {

// A final-model broadcast: LAST, then BEST (or asking its holder).
// Each target's call retries for final_result_ack_timeout (a site back
// from a restart then gets it). BEST follows LAST per site: to the sites
// that acknowledged LAST once all did or a failover timeout after the
// first, and to each later one as it acknowledges.
struct Broadcast {
  v1::ModelKind kind = v1::MODEL_KIND_UNSPECIFIED;
  // The sites' answers; once the grace ended, BEST went out to the
  // acknowledged ones.
  FanOut answers;
  // After LAST: what to do for BEST.
  bool then_best = false;
  std::shared_ptr<const Model> best_model;
  v1::BestRecord best;
  uint32_t last_round = 0;
};
// Asking holders in turn to share BEST (SendBest).
struct BestAsk {
  v1::ShareBestRequest request;
  std::vector<std::string> holders;
  size_t next = 0;
  absl::Status first_error;
};

class FinaleRole : public RoleBase {
 public:
  explicit FinaleRole(SiteContext* site) : RoleBase(site, RoleId::kFinale) {}

  void OnCallDone(const Call& call, const event::CallDone& e);
  void OnTimerFired(TimerId id, const Timer& timer);
  void OnShareBest(event::ShareBest& e);

  void FinishJob(uint32_t last_round, std::shared_ptr<const Model> last,
                 v1::BestRecord best, const std::string& reason);
  // A final model, written: kept, and the answer to its sender.
  v1::Reply AcceptFinal(const v1::ModelHeader& header,
                        std::shared_ptr<const Model> model);
  // Every model held that is `old` becomes `mapped`.
  void ReplaceHeldModel(const Model* old,
                        const std::shared_ptr<const Model>& mapped);

 private:
  // To `targets` (every site when empty).
  void BroadcastFinal(v1::ModelKind kind, std::shared_ptr<const Model> model,
                      uint32_t round, v1::BestRecord best, Broadcast then,
                      std::vector<std::string> targets = {});
  void OnFinalDone(const Call& call, const event::CallDone& e);
  // BEST to `targets`, after their LAST (from here, or via the holder).
  void SendBest(const Broadcast& done, std::vector<std::string> targets);
  void OnFinalGrace(uint64_t broadcast);
  void OnBestDeadline(uint32_t last_round);
  void AskNextHolder(uint64_t ask);
  void OnShareBestDone(const Call& call, const event::CallDone& e);

  std::map<uint64_t, Broadcast> broadcasts_;
  std::map<uint64_t, BestAsk> best_asks_;
};

}  // namespace swarm::site

#endif  // SWARM_CONTROLLER_FINALE_ROLE_H_
