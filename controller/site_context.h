// SiteContext: what a role of SiteMachine (design section 9) may use of the
// site it runs in, and nothing more. A role (TrainerRole, ScatterRole,
// AggregatorRole, FinaleRole) owns its own state and decides through its
// methods; it reaches the rest of the site only through this interface:
// the time and the site's name, the job's shared record (JobRun, without
// the other roles' state), the effects it asks for (send, set a timer,
// reply, persist), the site's status, and the few requests one role makes
// of another (a closed round's aggregate is scattered, or the job
// finishes; a takeover opens a round), which SiteMachine routes.
//
// Each Call and Timer names the role that set it (RoleBase stamps it), and
// SiteMachine routes its completion back to that role.
//
// Like the machine, a role never blocks, locks or does I/O.
#ifndef SWARM_CONTROLLER_SITE_CONTEXT_H_
#define SWARM_CONTROLLER_SITE_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/lineage.h"
#include "controller/machine_effects.h"
#include "controller/machine_events.h"
#include "controller/peer_message.h"
#include "controller/replies.h"
#include "google/protobuf/map.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"

namespace swarm {

class JobView;
class Model;

namespace site {

struct JobRun;
struct Scatter;

// The parts of a site, each the owner of its state.
enum class RoleId {
  kSite,        // SiteMachine itself (the operator's events).
  kTrainer,     // TrainerRole: training, asking, submitting, chains.
  kScatter,     // ScatterRole: a round's learn tasks to its sites.
  kAggregator,  // AggregatorRole: the rounds this site gathers.
  kFinale,      // FinaleRole: LAST and BEST.
};

// What an outgoing call is for. Its completion goes back to `role`, which
// tells its calls apart by `purpose`.
struct Call {
  enum class Purpose {
    kTaskToTrainer,
    kTaskToAggregator,
    kAskPermission,
    kSubmit,
    kFinal,
    kShareBest,
    kHandoff,  // A trainer hands its round to an aggregator (failover).
    // The newer round's task to a trainer that handed over a round this
    // site is past (its scatter was lost with its aggregator).
    kCatchUp,
    // Chain reduction: the chain's first trainer streams its result to
    // the second (the answer comes once the aggregator took the sum).
    kChainSubmit,
  };
  RoleId role = RoleId::kSite;
  Purpose purpose = Purpose::kTaskToTrainer;
  std::string target;
  uint32_t round = 0;
  uint64_t broadcast = 0;  // kFinal, kShareBest: which broadcast or ask.
  bool probe = false;      // kAskPermission: a liveness probe.
  // kTaskToTrainer sent as a broadcast: the sites the stream goes along,
  // `target` first.
  std::vector<std::string> chain;
};

// What a timer is for; its firing goes back to `role`.
struct Timer {
  enum class Purpose {
    kRoundDeadline,
    kHeldPermission,
    kAskAgain,
    // Drop the expected trainers not heard from for two failover
    // timeouts (down, frozen, or silent after a handoff); look again.
    kComeForward,
    // A scatter's first acknowledgement came a failover timeout ago: go
    // on without the trainers still silent.
    kScatterGrace,
    // A LAST broadcast's first acknowledgement came a failover timeout
    // ago: BEST goes to the sites that acknowledged, the rest follow.
    kFinalGrace,
    // A trainer configured start_timeout ago that never got a learn task
    // leaves the job (the start never came).
    kStartDeadline,
    // LAST came final_result_ack_timeout ago and BEST never followed.
    kBestDeadline,
  };
  RoleId role = RoleId::kSite;
  Purpose purpose = Purpose::kRoundDeadline;
  uint32_t round = 0;
  RequestId request = 0;
  uint64_t training = 0;
  uint64_t broadcast = 0;
};

class SiteContext {
 public:
  virtual ~SiteContext() = default;

  // --- The site, the time, the job ---
  virtual const std::string& self() const = 0;
  virtual absl::Time now() const = 0;
  // The job's shared record (the record, counters, the global and best
  // models, the finals). REQUIRES for job(): a job is configured.
  virtual JobRun& run() const = 0;
  // Whether the job runs here (started, not ended).
  virtual bool Active() const = 0;
  virtual bool IsTrainer(absl::string_view site) const = 0;

  // --- Effects (carried out by the caller of SiteMachine::Step) ---
  virtual void Emit(Effect effect) = 0;
  // REQUIRES: `call.role` names the role that wants its completion.
  virtual CallId Send(const std::string& to, PeerMessage message, Call call,
                      bool retry, absl::Time retry_until) = 0;
  // REQUIRES: `timer.role` names the role that wants it.
  virtual TimerId SetTimer(absl::Time when, Timer timer) = 0;
  virtual void Reply(RequestId request, v1::Reply reply) = 0;
  virtual PersistId NextPersist() = 0;
  // The state file (0 without a job); with `notify` its end comes back.
  virtual PersistId PersistState(bool notify = false) = 0;
  // The job's offload files go first, then the state file.
  virtual PersistId PersistClearOffloadAndState(bool notify = false) = 0;

  // --- Status ---
  virtual void ReportError(absl::string_view what,
                           const absl::Status& status) = 0;
  // The site leaves the job (everything under way ends: the calling role's
  // state too; the caller returns at once).
  virtual void Fail(absl::string_view what, const absl::Status& status) = 0;
  // Fail, and the reply that tells the caller this site failed.
  virtual v1::Reply FailAndAbort(const std::string& what,
                                 const absl::Status& status) = 0;
  virtual void SetState(v1::SiteState state) = 0;
  // IDLE, or GATHERING while this site gathers a round.
  virtual void SetIdleOrGathering() = 0;
  virtual void Changed() = 0;
  virtual void PermissionMayChange() = 0;

  // --- Models and headers ---
  virtual v1::ModelHeader BaseHeader(v1::ModelKind kind,
                                     uint32_t round) const = 0;
  virtual AssemblerOptions AssemblerFor(v1::ModelKind kind) const = 0;
  // Whether a model of `bytes` is held the lean way.
  virtual bool LeanFor(uint64_t bytes) const = 0;
  // A fresh path in the job's folder for a model held as a file mapping.
  virtual std::string LeanPath(absl::string_view what) = 0;
  // Every model the site holds that is `old` becomes `mapped`.
  virtual void ReplaceHeldModel(const Model* old,
                                std::shared_ptr<const Model> mapped) = 0;

  // --- The job's shared record ---
  virtual void NotePrivacy(
      const google::protobuf::Map<std::string, v1::PrivacySpent>& spent) = 0;
  virtual void NoteFailover(uint32_t round, const std::string& from,
                            const std::string& to,
                            const std::string& reason) = 0;
  // Sets aside the kept round models of a chain that loses to `winner`
  // over the rounds before `known`.
  virtual void SetAsideLostRounds(const Lineage& winner, uint32_t known) = 0;
  // At a learn task carrying `best`: keeps or drops the best model's copy.
  virtual void KeepBestCopy(const v1::BestRecord& best) = 0;
  // The operator's pending start of `round` (if any) is answered.
  virtual void AnswerStart(uint32_t round, const Scatter* scatter,
                           const absl::Status& failure = absl::OkStatus()) = 0;

  // --- Requests of one role to another (SiteMachine routes them) ---
  // ScatterRole: the learn tasks of `round`.
  virtual void ScatterRound(uint32_t round, std::shared_ptr<const Model> global,
                            v1::BestRecord best, const Lineage& lineage,
                            bool resume = false) = 0;
  // FinaleRole: LAST then BEST.
  virtual void FinishJob(uint32_t last_round, std::shared_ptr<const Model> last,
                         v1::BestRecord best, const std::string& reason) = 0;
  // AggregatorRole: this site gathers the round of learn task `header`.
  virtual void OpenRound(const v1::ModelHeader& header,
                         std::shared_ptr<const Model> base) = 0;
  // AggregatorRole: `trainer` was heard from in `round`, if gathered here.
  virtual void Heard(uint32_t round, const std::string& trainer,
                     absl::Time when) = 0;
  virtual bool Gathers(uint32_t round) const = 0;
  // AggregatorRole and ScatterRole: what this site did as an aggregator
  // and scatterer on a chain that lost goes; returns how many rounds it
  // gathered or aggregated.
  virtual uint64_t DropLosingWork() = 0;
  // TrainerRole: whether this site, the aggregator of `round` and a
  // trainer, must add its own result before remote ones (lean memory).
  virtual bool OwnResultFirst(uint32_t round) const = 0;
  // TrainerRole: LAST of `round` arrived; the round trained here is over.
  virtual void EndTrainingAtLast(uint32_t round) = 0;
};

// How a call answered by a Reply ended, as a status.
inline absl::Status ReplyStatus(const event::CallDone& e) {
  if (!e.reply.ok()) return e.reply.status();
  return StatusFromReply(e.reply->reply);
}

// What every role shares: the site, and its own calls and timers stamped
// with its name.
class RoleBase {
 public:
  RoleBase(SiteContext* site, RoleId role) : site_(site), role_(role) {}
  RoleBase(RoleBase&&) = default;
  RoleBase& operator=(RoleBase&&) = default;

 protected:
  absl::Time now() const { return site_->now(); }
  const std::string& self() const { return site_->self(); }
  JobRun& run() const { return site_->run(); }
  void Emit(Effect effect) { site_->Emit(std::move(effect)); }
  CallId Send(const std::string& to, PeerMessage message, Call call,
              bool retry = true,
              absl::Time retry_until = absl::InfinitePast()) {
    call.role = role_;
    return site_->Send(to, std::move(message), std::move(call), retry,
                       retry_until);
  }
  TimerId SetTimer(absl::Time when, Timer timer) {
    timer.role = role_;
    return site_->SetTimer(when, timer);
  }

  SiteContext* site_;

 private:
  RoleId role_;
};

}  // namespace site
}  // namespace swarm

#endif  // SWARM_CONTROLLER_SITE_CONTEXT_H_
