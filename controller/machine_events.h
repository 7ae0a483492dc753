// The inputs of a SiteMachine (controller/site_machine.h): the ids it
// numbers its calls, timers and writes by, what an admitted model stream is
// assembled into, and one struct per kind of event. A new kind of event goes
// into the Event variant below and gets a step function in SiteMachine;
// Step's dispatch fails to compile until it has one (common/overloaded.h).
#ifndef SWARM_CONTROLLER_MACHINE_EVENTS_H_
#define SWARM_CONTROLLER_MACHINE_EVENTS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/peer_message.h"
#include "controller/relay_protocol.h"
#include "learner/learner.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"

namespace swarm {

using RequestId = uint64_t;  // An incoming call, numbered by the caller.
using CallId = uint64_t;     // An outgoing call, numbered by the machine.
using TimerId = uint64_t;
using PersistId = uint64_t;

// What an incoming model stream should be assembled into.
struct ModelAdmission {
  AssemblerOptions assembler;
  // Set for results: the aggregator's sink (validates while receiving).
  std::unique_ptr<TensorSink> sink;
  // No body to receive: a failed result (header.failed()), or a final model
  // this site already stored. The reply is OK with `reply_message`.
  bool header_only = false;
  std::string reply_message = "failure noted";
  // Set for a partial sum passing through this site (chain reduction): the
  // body goes through a PartialSumSink that adds `own` weighted by
  // `own_weight` to every chunk, and the output is streamed to `next` with
  // header `onward` as it comes. The body event's model is then OK (empty)
  // when `next` accepted the onward stream, else why not.
  struct ChainHop {
    std::shared_ptr<const Model> own;
    double own_weight = 0;
    v1::ModelHeader onward;
    std::string next;
  };
  std::optional<ChainHop> chain_hop;
  // The relay protocol's budgets for this stream (controller/
  // relay_protocol.h), decided here: how long the sender of a partial sum
  // may stay silent, and how long the next hop (relay_to[0], or
  // chain_hop->next) may take no frame before it is given up.
  RelayBudgets relay;
};

// ---------------------------------------------------------------------------
// Events

namespace event {
// The operator's configure. REQUIRES: SiteMachine::CheckConfigure passed,
// the learner took the job's parameters and the job config is stored.
struct Configure {
  RequestId request = 0;
  v1::JobConfig job;  // With defaults applied, validated.
  std::string offload_dir;
};
struct Start {
  RequestId request = 0;
  v1::StartRequest start;
};
struct Abort {
  RequestId request = 0;
  v1::AbortRequest abort;
};
// A model stream's header arrived: the reply is a ModelAdmission or why not.
struct ModelHeader {
  RequestId request = 0;
  v1::ModelHeader header;
};
// The body of a stream whose header was admitted (and not header-only):
// the model, or why assembly failed. Made by MakeModelBody.
struct ModelBody {
  RequestId request = 0;
  v1::ModelHeader header;
  absl::StatusOr<std::shared_ptr<const Model>> model;
  // A BEST model's ModelContentDigest (empty for other kinds or no model):
  // a BEST from a site that is neither its scorer nor the final aggregator
  // is taken only if this matches the best record's digest.
  std::string content_digest;
};
// REQUIRES: called outside the machine's lock: for a BEST model it reads
// the whole model to fill `content_digest`.
ModelBody MakeModelBody(RequestId request, v1::ModelHeader header,
                        absl::StatusOr<std::shared_ptr<const Model>> model);
// A trainer asks to submit; a RETRY answer may be held until `hold_until`
// (granted the moment a slot frees or the round opens).
struct PermissionAsked {
  RequestId request = 0;
  v1::SubmitPermissionRequest ask;
  absl::Time hold_until = absl::InfinitePast();
};
// The caller of a held request went away.
struct RequestCancelled {
  RequestId request = 0;
};
struct ShareBest {
  RequestId request = 0;
  v1::ShareBestRequest share;
};
// An outgoing call ended (after the caller's retries). `maybe_delivered`:
// an earlier attempt failed in a way that may have reached the peer.
struct CallDone {
  CallId call = 0;
  absl::StatusOr<PeerReply> reply;
  bool maybe_delivered = false;
};
struct TimerFired {
  TimerId timer = 0;
};
// The learner finished a StartTraining: the validation metrics of the
// incoming model, and the trained result (already a weight difference when
// the effect asked for one and it could be made).
struct TrainingDone {
  uint32_t round = 0;
  absl::StatusOr<Metrics> metrics;
  absl::StatusOr<TrainOutput> output;
  // StartTraining.job_run, copied (0: not checked, for step tests).
  uint64_t job_run = 0;
};
struct InitialModel {
  absl::StatusOr<std::shared_ptr<const Model>> model;
};
struct AggregationDone {
  uint32_t round = 0;
  absl::StatusOr<std::shared_ptr<const Model>> model;
  // RunAggregation.digest_base: the base model's ModelContentDigest.
  std::string base_digest;
  uint64_t job_run = 0;  // RunAggregation.job_run, copied.
};
// An AddResult's job ran: the result is in the aggregate, or why not.
struct ResultAdded {
  RequestId request = 0;
  uint32_t round = 0;
  v1::ModelHeader header;
  absl::Status added;
  uint64_t job_run = 0;  // AddResult.job_run, copied.
};
// A Persist ended. Reported for every Persist with `notify`, and for every
// one that failed (`what` names the file).
struct PersistDone {
  PersistId persist = 0;
  absl::Status status;
  std::string what;
  // Persist.map_back: the written model, mapped from its file (null when
  // that failed: the model stays in memory).
  std::shared_ptr<const Model> mapped;
};
// The daemon restarted: the job this site was in, reloaded from its
// workspace (the accepted config, the state file, the persisted global
// model if any). REQUIRES: the learner took the job's parameters.
struct Recover {
  v1::JobConfig job;
  v1::JobState state;
  std::shared_ptr<const Model> global;  // Of state.global_round(), or null.
  // The best model's copy when this site holds it (state.best()), or null.
  std::shared_ptr<const Model> best_model;
  std::string offload_dir;
};
// What the learner waits for changed (Learner::WaitingFor; "" for nothing):
// shown in status as `waiting_for`.
struct LearnerWaiting {
  std::string what;
};
}  // namespace event

using Event =
    std::variant<event::Configure, event::Start, event::Abort,
                 event::ModelHeader, event::ModelBody, event::PermissionAsked,
                 event::RequestCancelled, event::ShareBest, event::CallDone,
                 event::TimerFired, event::TrainingDone, event::InitialModel,
                 event::AggregationDone, event::ResultAdded, event::PersistDone,
                 event::LearnerWaiting, event::Recover>;


}  // namespace swarm

#endif  // SWARM_CONTROLLER_MACHINE_EVENTS_H_
