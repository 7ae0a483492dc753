// The scenario driver's own types, shared by its source files.
#ifndef SWARM_CONTROLLER_SCENARIO_SCENARIO_INTERNAL_H_
#define SWARM_CONTROLLER_SCENARIO_SCENARIO_INTERNAL_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/scenario/scenario.h"
#include "controller/site_machine.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "streaming/assembler.h"

namespace swarm::scenario {

// Virtual time starts here; printed times are seconds since.
inline const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

struct Scenario::Site {
  std::string name;
  int index = 0;  // 1 for s1.
  std::unique_ptr<SiteMachine> machine;
  bool dead = false;    // Killed: calls to it fail at once.
  bool frozen = false;  // Calls to it hang until their deadline.
  bool hold_persist = false;
  std::vector<event::PersistDone> held;  // Completions held back.
  std::map<RequestId, std::shared_ptr<Incoming>> incoming;
  uint64_t training = 0;  // Generation: a cancelled training's end is dropped.
  // What the harness stored: BEST/LAST and kept rounds (first value).
  std::map<std::string, float> finals;
  std::map<uint32_t, float> kept;
  // What was printed last (NoteChanges).
  std::string job;
  v1::SiteState shown_state = v1::SITE_STATE_IDLE;
  uint32_t round = 0;
  uint32_t attempt = 0;
  int failovers = 0;
  std::string error;
  std::string end;
};

// A call between two sites, or a partial sum a hop sends on (`call` 0,
// ended by `done`).
struct Scenario::Call {
  std::string from;
  std::string to;
  PeerMessage message;
  CallId call = 0;
  bool retry = true;
  absl::Time retry_until = absl::InfinitePast();
  int attempt = 1;
  bool maybe_delivered = false;
  std::function<void(absl::StatusOr<PeerReply>)> done;
};

// A call a site has not answered yet: a peer's, or the operator's (`call`
// null; `what` says which).
struct Scenario::Incoming {
  std::shared_ptr<Call> call;
  std::string what;
  bool header_stage = false;  // A stream whose header awaits its admission.
};

struct Scenario::Timed {
  std::string site;  // Dropped when this site is dead or frozen ("" never).
  std::string what;
  std::function<void()> run;
};

std::string KindName(CallKind kind);
std::string StateName(v1::SiteState state);
std::string OutcomeName(v1::Outcome outcome);
float FirstValue(const Model& model);
// Every site's first model: one F32 tensor "w" of four 1s.
std::shared_ptr<const Model> InitialModel();
// `model` cut into chunks under `header` and assembled into `sink`, as a
// transport and a ModelReceiver would.
absl::StatusOr<Model> AssembleStream(std::shared_ptr<const Model> model,
                                     const v1::ModelHeader& header,
                                     TensorSink* sink,
                                     AssemblerOptions options);

}  // namespace swarm::scenario

#endif  // SWARM_CONTROLLER_SCENARIO_SCENARIO_INTERNAL_H_
