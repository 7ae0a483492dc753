// An in-process network of SwarmControllers for simulations (design section
// 2): every site's outgoing PeerTransport calls go straight into the target
// site's controller, through the same steps the gRPC adapters take (a model
// stream is cut by a Chunker and rebuilt by an Assembler into the sink the
// target's AdmitModel asks for), and the network can drop, delay, duplicate
// and lose messages, and isolate and recover sites.
//
// Two modes:
//
// - Virtual time (FakeNetwork(ManualRunner*)): every controller runs on the
//   one ManualRunner, so the whole swarm is a single deterministic event
//   queue on the test's thread. A call without delay is handled at once, on
//   the caller's stack. PeerTransport calls are synchronous, so a delayed
//   message cannot simply sit in a queue while the caller goes on: the
//   caller is blocked, as a gRPC client is. So a delayed call posts its
//   delivery as a task at the arrival time (a model stream: the header at
//   start + latency, where the target admits it, and the body at
//   + transfer, where the target assembles it), and the caller then runs
//   the runner's queue, one task at a time in time order, until its
//   delivery has finished. Meanwhile every other site's tasks run exactly
//   at their virtual times, as other threads would, and deliveries happen
//   exactly on time. The one liberty: these waits nest, so a caller whose
//   wait began earlier resumes only after a call begun inside its wait has
//   returned (stack order); its message was still delivered on time, only
//   the caller's next step can be late. Replies travel back instantly.
//   Everything is deterministic: the same test gives the same log, virtual
//   times included.
//
// - Real threads (FakeNetwork()): each site has its own ThreadPoolRunner;
//   calls are made concurrently from the sites' workers, a delay blocks the
//   calling worker (a slow link), and a RETRY permission answer is held
//   until the target's permission version changes, as PeerService does.
//   Used to let ThreadSanitizer look at the controller's locking.
//
// Faults are judged when a call starts (the observer runs first, so it can
// change them for that very call); isolation is checked again when a delayed
// message arrives and between a stream's header and its body.
#ifndef SWARM_CONTROLLER_FAKE_NETWORK_H_
#define SWARM_CONTROLLER_FAKE_NETWORK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/peer_transport.h"
#include "controller/swarm_controller.h"
#include "controller/task_runner.h"

namespace swarm {

// The calls of PeerTransport.
enum class CallKind {
  kLearnTask,
  kRequestToSubmit,
  kSubmitResult,
  kShareBest,
  kFinalResult,
};
absl::string_view CallKindName(CallKind kind);

// What happens to a matching call.
enum class Fault {
  // Not delivered; the caller gets Unavailable at once.
  kDrop,
  // Delivered, but the reply is lost: the caller gets DeadlineExceeded.
  kDropReply,
  // Acknowledged (OUTCOME_OK) but never delivered: a peer that acknowledged
  // a message and then lost it (e.g. it crashed right after replying). For
  // calls answered by a Reply; a RequestToSubmit is dropped instead.
  kLoseAfterAck,
  // Delivered twice, back to back; the caller gets the first reply.
  kDuplicate,
};
absl::string_view FaultName(Fault fault);

// Which calls a fault or a delay applies to. Unset / empty fields match any.
struct CallMatcher {
  std::optional<CallKind> kind;
  std::string from;
  std::string to;
  // The header's round (model streams), the request's round
  // (RequestToSubmit) or the best record's round (ShareBest).
  std::optional<uint32_t> round;
};

// One call, as the network saw it.
struct CallRecord {
  CallKind kind = CallKind::kLearnTask;
  std::string from;
  std::string to;
  uint32_t round = 0;
  // Learn task and result: the header's aggregator.
  std::string aggregator;
  // Model streams: the header's kind (learn task, result, BEST, LAST) and
  // whether it is a failed result.
  v1::ModelKind model_kind = v1::MODEL_KIND_UNSPECIFIED;
  bool failed_result = false;
  absl::Time start;
  absl::Time end;
  // "", or the fault applied ("isolated", "drop", "drop_reply", ...).
  std::string fault;
  // Times the target handled it (0, 1 or 2).
  int deliveries = 0;
  // "OK", an outcome name ("OUTCOME_RETRY", ...) or the failed status.
  std::string result;
};

class FakeNetwork {
 public:
  // Virtual time: every registered controller must run on `runner`, and
  // the network must only be used from the thread that runs it.
  explicit FakeNetwork(ManualRunner* runner);
  // Real threads and the real clock.
  FakeNetwork();
  ~FakeNetwork();
  FakeNetwork(const FakeNetwork&) = delete;
  FakeNetwork& operator=(const FakeNetwork&) = delete;

  // Registers site `name`, reached at `controller` (which must outlive every
  // call into it; see Shutdown).
  void AddSite(const std::string& name, SwarmController* controller);
  // The transport site `name` calls out through; owned by the network.
  PeerTransport* TransportFor(const std::string& name);

  // Every call to or from `site` fails with Unavailable until Recover.
  void Isolate(const std::string& site);
  void Recover(const std::string& site);
  bool IsIsolated(const std::string& site) const;

  // Applies `fault` to the next `count` matching calls (count < 0: to every
  // one). Rules are tried in the order added; the first that matches wins.
  void AddFault(CallMatcher match, Fault fault, int count = -1);
  void ClearFaults();
  // Matching calls arrive `latency` after they are made; a model stream's
  // body then takes `transfer` more (the target has admitted the header and
  // holds the stream open meanwhile). The first matching delay wins.
  void AddDelay(CallMatcher match, absl::Duration latency,
                absl::Duration transfer = absl::ZeroDuration());
  // Whether a RETRY answer to RequestToSubmit is held until the target's
  // permission version changes or the call's deadline nears, like
  // PeerService does. On by default with real threads, off in virtual time
  // (the trainer then retries after retry_after_ms).
  void set_hold_permission_retries(bool hold);
  // Chunk size for model streams (default: the header's, else 4 KiB).
  void set_chunk_size(uint64_t bytes);

  // Called at the start of every call, before faults are judged, outside
  // the network's lock (it may change faults or isolate sites).
  void SetObserver(std::function<void(const CallRecord&)> observer);

  // Every finished call, in finishing order.
  std::vector<CallRecord> Log() const;
  // Calls under way (started, not yet returned).
  int calls_in_flight() const;

  // Real threads: from now on every call fails at once (Unavailable); waits
  // for the calls under way to return. Call before destroying the sites'
  // runners, so no worker of one site is inside another site's controller.
  void Shutdown();

  absl::Time Now() const;

 private:
  class SiteTransport;
  struct Plan {
    std::optional<Fault> fault;
    std::string fault_name;
    absl::Duration latency = absl::ZeroDuration();
    absl::Duration transfer = absl::ZeroDuration();
  };
  struct FaultRule {
    CallMatcher match;
    Fault fault;
    int remaining;
  };
  struct DelayRule {
    CallMatcher match;
    absl::Duration latency;
    absl::Duration transfer;
  };

  struct Stream;

  // Starts a call: the observer, then the plan (consuming counted faults).
  Plan Begin(CallRecord& record);
  void End(CallRecord& record, const absl::Status& status,
           absl::string_view result);
  SwarmController* Target(const std::string& name) const;
  bool Reachable(const CallRecord& record) const;
  // Runs `step` at `when`: at once when due; else, in virtual time, as a
  // task posted at `when`, and with real threads after sleeping until then.
  void At(absl::Time when, std::function<void()> step);
  // Blocks the caller until `done()`: in virtual time by running the
  // runner's queue (a posted step sets what `done` looks at).
  void Await(const std::function<bool()>& done);
  // Virtual time: runs the queue until `until` or `done()`.
  void WaitUntil(absl::Time until, const std::function<bool()>& done);

  absl::StatusOr<v1::Reply> StreamCall(CallKind kind, const std::string& from,
                                       const v1::SiteInfo& to,
                                       const v1::ModelHeader& header,
                                       std::shared_ptr<const Model> model);
  // A model stream's two halves at the target, as PeerService handles
  // them: the header (AdmitModel; may settle the reply already), then the
  // chunks and trailer into the admitted sink, and OnModel.
  void OpenStream(Stream& stream, SwarmController* target);
  void FinishStream(Stream& stream);
  absl::StatusOr<v1::SubmitPermissionReply> PermissionCall(
      const std::string& from, const v1::SiteInfo& to,
      const v1::SubmitPermissionRequest& request, absl::Duration timeout);
  v1::SubmitPermissionReply DeliverPermission(
      SwarmController* target, const v1::SubmitPermissionRequest& request,
      absl::Time deadline);
  absl::StatusOr<v1::Reply> ShareBestCall(const std::string& from,
                                          const v1::SiteInfo& to,
                                          const v1::ShareBestRequest& request);

  ManualRunner* const manual_;  // Null with real threads.

  mutable absl::Mutex mu_;
  std::map<std::string, SwarmController*> sites_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<SiteTransport>> transports_
      ABSL_GUARDED_BY(mu_);
  std::set<std::string> isolated_ ABSL_GUARDED_BY(mu_);
  std::vector<FaultRule> faults_ ABSL_GUARDED_BY(mu_);
  std::vector<DelayRule> delays_ ABSL_GUARDED_BY(mu_);
  bool hold_retries_ ABSL_GUARDED_BY(mu_);
  uint64_t chunk_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const CallRecord&)> observer_ ABSL_GUARDED_BY(mu_);
  std::vector<CallRecord> log_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_FAKE_NETWORK_H_
