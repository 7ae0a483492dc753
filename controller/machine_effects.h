// The outputs of a SiteMachine (controller/site_machine.h): one struct per
// kind of effect its caller carries out. A new kind goes into the Effect
// variant below; SiteDriver's Carry and the scenario driver fail to compile
// until they handle it (common/overloaded.h).
#ifndef SWARM_CONTROLLER_MACHINE_EFFECTS_H_
#define SWARM_CONTROLLER_MACHINE_EFFECTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/aggregation_round.h"
#include "controller/machine_events.h"
#include "controller/peer_message.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {

// ---------------------------------------------------------------------------
// Effects

namespace effect {
// Send `message` to `to`. Retry retryable failures (transport errors,
// deadlines) per the retry policy while `retry` and the machine still
// wants the call (SiteMachine::WantsCall), at least until `retry_until`.
struct Send {
  CallId call = 0;
  v1::SiteInfo to;
  PeerMessage message;
  bool retry = true;
  absl::Time retry_until = absl::InfinitePast();
};
// The answer to incoming call `request`.
struct Reply {
  RequestId request = 0;
  std::variant<v1::Reply, v1::SubmitPermissionReply,
               absl::StatusOr<ModelAdmission>>
      answer;
};
// Validate `global` and train on it for `round`; report kTrainingDone.
struct StartTraining {
  uint32_t round = 0;
  std::shared_ptr<const Model> global;
  // Return a weight difference against `global` when the learner gives
  // full weights.
  bool weight_diff = false;
  // The job run that asked (copy it into kTrainingDone): a training of a
  // job that is gone is dropped when it ends.
  uint64_t job_run = 0;
};
// Stop the training under way (its kTrainingDone may then never come).
struct CancelTraining {};
// The job's first model; report kInitialModel. From the learner's initial
// weights, or, with `kept_round` (a job whose start_round is above 0), the
// global model of that round this site kept (keep_round_models) in an
// earlier run of the job: a start_round without its model is refused.
struct LoadInitialModel {
  std::optional<uint32_t> kept_round;
  // Set: a model of lean_min_bytes or more is written to lean_path, mapped
  // and unlinked, so that it is held as a file mapping, not memory.
  std::string lean_path;
  uint64_t lean_min_bytes = 0;
};
// Aggregate the closed round (costly: outside any lock); report
// kAggregationDone.
struct RunAggregation {
  uint32_t round = 0;
  std::shared_ptr<AggregationRound> closed;
  // The base is the new best: digest it too (before aggregating, so that
  // no result is held while the base is read; outside the step, since it
  // reads a whole model).
  bool digest_base = false;
  uint64_t job_run = 0;  // Copied into kAggregationDone.
};
// Fold a received result into its round's aggregate (a pass over the
// model: outside any lock, on the worker that runs RunAggregation, in the
// order given); report kResultAdded with `job`'s status. The answer to
// `request` waits for it.
struct AddResult {
  RequestId request = 0;
  uint32_t round = 0;
  v1::ModelHeader header;
  AggregationRound::AddJob job;
  uint64_t job_run = 0;
};
// Let `held` go on the aggregation worker, after the work queued before it:
// a dropped round's aggregator removes its offload files as it goes, which
// is I/O the step must not do.
struct Release {
  std::shared_ptr<void> held;
};
struct SetTimer {
  TimerId timer = 0;
  absl::Time when;
};
// Write to the site's store, in the order given. With `notify`, and on
// failure, report kPersistDone.
struct Persist {
  // kBestModel: the global model of `round` this site scored best, kept as
  // held-best.safetensors so that a restart does not lose it.
  // kSetAsideRound: the kept model of `round` (keep_round_models) is of a
  // chain that lost; it is renamed with `tag`, so that no two sites
  // disagree on what round `round`'s model was.
  enum class What {
    kState,
    kGlobal,
    kFinal,
    kClearOffload,
    kBestModel,
    kSetAsideRound
  };
  What what = What::kState;
  PersistId persist = 0;
  bool notify = false;
  std::string job_id;
  v1::JobState state;  // kState.
  uint32_t round = 0;  // kGlobal: the round the model is the input of.
  bool keep_round = false;
  // kGlobal (lean memory): map the written file back and report it in
  // kPersistDone, so that the site holds the model as a file mapping.
  bool map_back = false;
  v1::ModelKind kind = v1::MODEL_KIND_UNSPECIFIED;  // kFinal.
  std::shared_ptr<const Model> model;
  std::map<std::string, std::string> metadata;
  std::string tag;  // kSetAsideRound.
};
// A job was configured: the transport may connect ahead.
struct PrepareTransport {
  v1::JobConfig job;
};
// What Status() shows changed (wake held Status calls).
struct StatusChanged {};
}  // namespace effect

// The work of a RunAggregation, for its carrier (outside any lock): the
// base's digest if asked, then the aggregate.
event::AggregationDone RunAggregationWork(const effect::RunAggregation& run);

using Effect = std::variant<effect::Send, effect::Reply, effect::StartTraining,
                            effect::CancelTraining, effect::LoadInitialModel,
                            effect::RunAggregation, effect::AddResult,
                            effect::Release, effect::SetTimer, effect::Persist,
                            effect::PrepareTransport, effect::StatusChanged>;
using Effects = std::vector<Effect>;

}  // namespace swarm

#endif  // SWARM_CONTROLLER_MACHINE_EFFECTS_H_
