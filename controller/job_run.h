// The state of one job at one site (design section 9), as SiteMachine keeps
// it: JobRun, created at configure (or recovery) and destroyed whole when
// the next job replaces it, and in it Work, everything under way (calls,
// timers, rounds, the training, broadcasts), replaced whole when the job
// ends here. No field is reset one by one: a completion of something a run
// no longer holds finds nothing and is dropped.
//
// Plain data: the machine (site_machine*.cc) reads and changes it; the
// trainer's round (Training) changes phase only through its Become* calls
// (controller/trainer_task.h).
#ifndef SWARM_CONTROLLER_JOB_RUN_H_
#define SWARM_CONTROLLER_JOB_RUN_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/admission.h"
#include "controller/aggregation_round.h"
#include "controller/fan_out.h"
#include "controller/job_view.h"
#include "controller/lineage.h"
#include "controller/machine_events.h"
#include "controller/trainer_task.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm::site {

// What an outgoing call is for.
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
  Purpose purpose = Purpose::kTaskToTrainer;
  std::string target;
  uint32_t round = 0;
  uint64_t broadcast = 0;  // kFinal: which broadcast.
  bool probe = false;      // kAskPermission: a liveness probe.
  // kTaskToTrainer sent as a broadcast: the sites the stream goes along,
  // `target` first.
  std::vector<std::string> chain;
};
// What a timer is for.
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
  Purpose purpose = Purpose::kRoundDeadline;
  uint32_t round = 0;
  RequestId request = 0;
  uint64_t training = 0;
  uint64_t broadcast = 0;
};
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
// The operator's Start (or resume), answered once the first round's
// aggregator acknowledged its learn task (or the start failed): the
// reply lists the trainers the round's task did not reach.
struct PendingStart {
  RequestId request = 0;
  uint32_t round = 0;
};
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
struct Held {
  v1::SubmitPermissionRequest ask;
  absl::Time until;
};
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
// Rounds closed and being aggregated, with their verdict.
struct Closing {
  v1::BestRecord best;
  std::optional<double> input_score;
  uint32_t attempt = 0;
  Lineage lineage;
  std::string stop_reason;  // Set: finish after this round (early stop).
};
// Scatters the next round of `round`'s aggregate, or finishes the job.
// The round's model as a broadcast brought it to this site, the round's
// aggregator, kept for its own task (header.body_held).
struct HeldTaskCopy {
  v1::ModelHeader header;
  std::shared_ptr<const Model> model;
};
// Asking holders in turn to share BEST (SendBest).
struct BestAsk {
  v1::ShareBestRequest request;
  std::vector<std::string> holders;
  size_t next = 0;
  absl::Status first_error;
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
// Final models being written, and the requests waiting for them.
struct PendingFinal {
  RequestId request = 0;
  v1::ModelHeader header;
  std::shared_ptr<const Model> model;
};

// What is under way in a job at this site: every call, timer, round,
// training and broadcast in flight. Created with the job, replaced whole
// when the job ends here (EndActivity): a completion of something it no
// longer holds finds nothing and is dropped.
struct Work {
  std::optional<Training> training;
  // The rounds this site gathers, then (closed) aggregates.
  std::map<uint32_t, RoundState> rounds;
  std::map<uint32_t, Closing> aggregating;
  std::map<CallId, Call> calls;
  std::map<TimerId, Timer> timers;
  std::map<uint32_t, Scatter> scatters;
  // Learn tasks to aggregators not yet acknowledged (kept for a failover
  // to the round's next backup).
  std::map<uint32_t, Scatter> aggregator_tasks;
  std::optional<PendingStart> pending_start;
  std::map<uint64_t, BestAsk> best_asks;
  std::map<RequestId, Held> held;
  std::map<uint64_t, Broadcast> broadcasts;
  std::map<PersistId, AfterGlobal> after_global;
  std::optional<HeldTaskCopy> held_task_copy;
};

// Everything of one job at this site (design section 9): created at
// configure (or recovery), destroyed whole when the next job replaces it.
// No field is reset one by one. What status shows of an ended job stays
// until then; what was under way (`work`) goes when the job ends here.
struct JobRun {
  uint64_t id = 0;                     // Numbered by the machine, from 1.
  std::shared_ptr<const JobView> job;  // Null: no job yet.
  std::string offload_dir;
  // The first ids this run numbered: a completion with a lower id is of
  // an earlier job (dropped and counted in stale_completions).
  CallId first_call = 0;
  TimerId first_timer = 0;
  PersistId first_persist = 0;
  uint64_t next_lean_file = 1;
  uint64_t next_training = 1;
  uint64_t next_broadcast = 1;
  uint64_t next_best_ask = 1;
  SiteRecord record;
  // The best model when this site holds it: scored best here as an
  // aggregator (record.best.site() is this site), or the input of the
  // round it trained on that scored best (KeepBestCopy).
  std::shared_ptr<const Model> best_model;
  uint32_t best_model_round = 0;
  std::shared_ptr<const Model> current_global;
  uint32_t current_global_round = 0;  // The round it is the input of.
  // The learn task of that round as this site accepted it (for CatchUp).
  std::optional<v1::ModelHeader> current_task;
  std::map<v1::ModelKind, std::shared_ptr<const Model>> finals;
  v1::SiteCounters counters;
  RoundCounters closed_rounds;
  std::map<std::string, double> metrics;
  std::string last_error;
  absl::Time last_error_time = absl::InfinitePast();
  std::deque<v1::Failover> failovers;
  std::string end_reason;
  // The final round and attempt of the finals this site sends or
  // received, and their chain (including the final round).
  uint32_t final_round = 0;
  uint32_t final_attempt = 0;
  Lineage final_chain;
  // The global model in the store (global.safetensors): its round and
  // chain.
  int64_t persisted_global_round = -1;
  Lineage persisted_global_lineage;
  // The same once on disk (the state file naming it written): what status
  // shows as global_round. The state writes that will make it so.
  int64_t durable_global_round = -1;
  std::map<PersistId, int64_t> durable_writes;
  bool reloaded = false;  // This daemon reloaded its job on start.
  // The round models this site kept (keep_round_models), by the round
  // they are the input of, with their chain.
  std::map<uint32_t, Lineage> kept_rounds;
  std::map<PersistId, PendingFinal> pending_finals;
  // Differential privacy: every trainer's spend as this site last heard
  // of it (results it gathered, learn tasks and finals it received), the
  // latest report per site; carried on in the learn tasks it scatters and
  // into the final models (ModelHeader.privacy_spent).
  std::map<std::string, v1::PrivacySpent> privacy_spent;
  Work work;
};

}  // namespace swarm::site

#endif  // SWARM_CONTROLLER_JOB_RUN_H_
