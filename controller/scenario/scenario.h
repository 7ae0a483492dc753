// A machine-level scenario driver (issue 30, item 6), in the manner of etcd
// raft's rafttest interaction environment: several SiteMachines connected
// by a plain message queue, in virtual time, with no SiteDriver and no
// threads. The harness plays every driver: it carries each Step's effects
// out (a Send becomes the matching events at its target, a reply the
// sender's CallDone), fires timers, trains with a deterministic stand-in
// learner, aggregates with RunAggregationWork and completes writes. Scripts
// (controller/scenario/testdata/*.txt, run by scenario_test.cc) feed it
// commands and compare what it prints; testdata/README.md has the command
// language.
//
// What it models of the transport: a call reaches its target at once and
// its reply comes back at once; a call to a killed site, or across a cut,
// fails at once (UNAVAILABLE); one to a frozen site fails at its deadline
// (DEADLINE_EXCEEDED). Failed calls are retried as SiteDriver does
// (RetryPolicy, jitter fixed at 1) while the machine wants them. A model
// stream is cut into chunks and assembled into the sink its admission names;
// a partial sum passing through a chain hop is summed there and sent on to
// the next hop as a new stream. Not modelled: the pipelined broadcast of
// learn tasks (relay), which lives in the transport.
#ifndef SWARM_CONTROLLER_SCENARIO_SCENARIO_H_
#define SWARM_CONTROLLER_SCENARIO_SCENARIO_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/site_machine.h"
#include "proto/swarm.pb.h"

namespace swarm::scenario {

class Scenario {
 public:
  // `work_dir`: where lean-memory sites keep their files (created).
  explicit Scenario(std::string work_dir);
  ~Scenario();
  Scenario(const Scenario&) = delete;
  Scenario& operator=(const Scenario&) = delete;

  // Runs one command line; returns what it printed (lines joined by '\n',
  // "ok" when it printed nothing), or "error: ..." for a bad command.
  std::string Run(const std::string& line);

 private:
  struct Site;
  struct Call;
  struct Incoming;
  struct Timed;

  // Commands (scenario_commands.cc).
  absl::Status Sites(const std::vector<std::string>& args);
  absl::Status Configure(const std::vector<std::string>& args);
  absl::Status Operator(const std::string& what,
                        const std::vector<std::string>& args);
  absl::Status Advance(const std::string& what,
                       const std::vector<std::string>& args);
  absl::Status Network(const std::string& what,
                       const std::vector<std::string>& args);
  absl::Status HoldPersist(bool hold, const std::vector<std::string>& args);
  absl::Status ShowStatus(const std::vector<std::string>& args);
  absl::Status ShowModels(const std::vector<std::string>& args);
  absl::Status Show(const std::vector<std::string>& args);
  absl::StatusOr<Site*> Find(const std::string& name);
  absl::StatusOr<std::function<bool(const Call&)>> CallMatcher(
      const std::vector<std::string>& args);

  // What is printed (scenario_report.cc).
  void NoteChanges(Site& site);
  void Print(const std::string& category, const std::string& line);

  // The machines' world (scenario.cc).
  void StepSite(Site& site, Event event);
  void Carry(Site& site, Effects effects);
  void CarryOne(Site& site, Effect& effect);
  void Train(Site& site, const effect::StartTraining& train);
  void Persist(Site& site, const effect::Persist& persist);
  void Answer(Site& site, effect::Reply& reply);
  void Deliver(std::shared_ptr<Call> call);
  void DeliverIncoming(Site& target, std::shared_ptr<Call> call);
  void DeliverBody(Site& target, RequestId request, ModelAdmission admission);
  void SendOnward(Site& hop, RequestId request,
                  const ModelAdmission::ChainHop& chain,
                  absl::StatusOr<Model> sum);
  void Finish(std::shared_ptr<Call> call, absl::StatusOr<PeerReply> reply);
  void Failed(std::shared_ptr<Call> call, const absl::Status& status);
  bool Reachable(const std::string& from, const std::string& to) const;
  void At(absl::Time when, const std::string& site, std::string what,
          std::function<void()> run);
  // Runs queued work due by `until` (in time order) until `stop` holds
  // after some step; whether it stopped for `stop`.
  bool RunUntil(absl::Time until, const std::function<bool()>& stop);
  std::string CallLine(const Call& call) const;

  const std::string work_dir_;
  absl::Time now_;
  std::string output_;
  std::set<std::string> shown_;  // Categories printed.
  v1::JobConfig job_;            // As `sites` made it (before configure).
  absl::Duration train_time_ = absl::Seconds(1);
  std::vector<std::string> names_;
  std::map<std::string, std::unique_ptr<Site>> sites_;
  std::set<std::pair<std::string, std::string>> cut_;
  std::map<std::pair<absl::Time, uint64_t>, Timed> queue_;
  // Queued items run in time order, then in the order queued; an item put
  // back at the front (a call held at a breakpoint) gets a lower number.
  uint64_t next_seq_ = uint64_t{1} << 40;
  uint64_t front_seq_ = (uint64_t{1} << 40) - 1;
  // run-until-call: the call to stop before, and whether it came.
  std::function<bool(const Call&)> call_break_;
  bool break_hit_ = false;
  RequestId next_request_ = 1;
};

// Splits a script into cases and runs them (datadriven style): returns the
// script with every case's output replaced by what `scenario` printed.
// `cases` gets (line of the command, command, expected, actual) per case.
struct CaseResult {
  int line = 0;
  std::string command;
  std::string expected;
  std::string actual;
};
std::string RunScript(const std::string& script, Scenario& scenario,
                      std::vector<CaseResult>* cases);

}  // namespace swarm::scenario

#endif  // SWARM_CONTROLLER_SCENARIO_SCENARIO_H_
