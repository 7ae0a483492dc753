// The state of one job at one site (design section 9), as SiteMachine keeps
// it: JobRun, created at configure (or recovery) and destroyed whole when
// the next job replaces it, and in it Work, everything under way (calls,
// timers, rounds, the training, broadcasts), replaced whole when the job
// ends here. No field is reset one by one: a completion of something a run
// no longer holds finds nothing and is dropped.
//
// JobRun's own fields are the job's shared record: the roles (Work's
// TrainerRole, ScatterRole, AggregatorRole and FinaleRole) read and change
// them through SiteContext::run(); each role's own state is private to it.
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
#include "controller/aggregator_role.h"
#include "controller/finale_role.h"
#include "controller/job_view.h"
#include "controller/lineage.h"
#include "controller/machine_events.h"
#include "controller/scatter_role.h"
#include "controller/site_context.h"
#include "controller/trainer_role.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm::site {

// The operator's Start (or resume), answered once the first round's
// aggregator acknowledged its learn task (or the start failed): the
// reply lists the trainers the round's task did not reach.
struct PendingStart {
  RequestId request = 0;
  uint32_t round = 0;
};
// Final models being written, and the requests waiting for them.
struct PendingFinal {
  RequestId request = 0;
  v1::ModelHeader header;
  std::shared_ptr<const Model> model;
};

// What is under way in a job at this site: every call, timer, round,
// training and broadcast in flight, in the role that owns it, and the calls
// and timers by id (each names its role). Created with the job, replaced
// whole when the job ends here (EndActivity): a completion of something it
// no longer holds finds nothing and is dropped.
struct Work {
  explicit Work(SiteContext* site)
      : trainer(site), scatter(site), aggregator(site), finale(site) {}
  std::map<CallId, Call> calls;
  std::map<TimerId, Timer> timers;
  std::optional<PendingStart> pending_start;
  TrainerRole trainer;
  ScatterRole scatter;
  AggregatorRole aggregator;
  FinaleRole finale;
};

// Everything of one job at this site (design section 9): created at
// configure (or recovery), destroyed whole when the next job replaces it.
// No field is reset one by one. What status shows of an ended job stays
// until then; what was under way (`work`) goes when the job ends here.
struct JobRun {
  explicit JobRun(SiteContext* site) : work(site) {}
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
