// An in-process network of SiteDrivers for simulations (design section 2),
// in the manner of etcd raft's test `network`: a queue of messages in
// flight. A site's Send becomes a delivery posted at its arrival time; the
// target handles it through the same steps the gRPC adapters take (a model
// stream is cut by a Chunker and rebuilt by an Assembler into the sink the
// target's admission names; a permission request may be held by the target
// until a slot frees); the reply is posted back to the caller. Nothing
// blocks and nothing waits inside another wait.
//
// Between send and reply the network can drop, lose the reply, lose the
// message after acknowledging it, duplicate, delay (latency, and transfer
// time for a stream's body), and cut sites off (isolate) and back (recover).
//
// Two modes:
// - Virtual time (FakeNetwork(ManualRunner*)): every site runs on the one
//   ManualRunner and so does the network: the whole swarm is one
//   deterministic event queue on the test's thread (the same seed gives the
//   same log, times included).
// - Real threads (FakeNetwork()): deliveries and replies run on the
//   network's own thread pool, the sites' work on theirs; for
//   ThreadSanitizer.
//
// Streams that pass through sites (a broadcast's learn task, ModelHeader.
// relay_to; a chain reduction's partial sums) go frame by frame over links
// that hold a few frames, each site driving the same RelayProtocol
// (controller/relay_protocol.h) as PeerService, with the budgets its machine
// decided: backpressure, the stall and idle give-ups and a frozen site run
// in virtual time. Other streams are delivered whole after their transfer
// time.
//
// Faults are judged when a call starts (the observer runs first, so it can
// change them for that very call); isolation is checked again when a message
// arrives and between a stream's header and its body.
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
#include "controller/peer_message.h"
#include "controller/peer_transport.h"
#include "controller/site_driver.h"
#include "controller/task_runner.h"

namespace swarm {

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
  // PeerMessage::round().
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
  // Model streams: the header's kind and whether it is a failed result.
  v1::ModelKind model_kind = v1::MODEL_KIND_UNSPECIFIED;
  bool failed_result = false;
  // Model streams: the bytes of the body (0 for a header-only stream).
  uint64_t body_bytes = 0;
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
  // Virtual time: every registered site must run on `runner`, and the
  // network must only be used from the thread that runs it.
  explicit FakeNetwork(ManualRunner* runner);
  // Real threads and the real clock.
  FakeNetwork();
  ~FakeNetwork();
  FakeNetwork(const FakeNetwork&) = delete;
  FakeNetwork& operator=(const FakeNetwork&) = delete;

  // Registers site `name`, reached at `site` (which must outlive every call
  // into it; see Shutdown).
  void AddSite(const std::string& name, SiteDriver* site);
  // The transport site `name` calls out through; owned by the network.
  PeerTransport* TransportFor(const std::string& name);

  // Every call to or from `site` fails with Unavailable until Recover.
  void Isolate(const std::string& site);
  void Recover(const std::string& site);
  bool IsIsolated(const std::string& site) const;
  // Splits the network in two: calls between a site in `side` and one
  // outside it fail with Unavailable until Heal.
  void Partition(std::set<std::string> side);
  // Cuts the links between `site` and each of `others` (both ways) until
  // Heal: a cut that is not a partition (a third site may still reach
  // both sides, as an iptables cut on one host does).
  void CutLinks(const std::string& site, const std::set<std::string>& others);
  void Heal();  // Ends the partition and every cut link.
  // Freezes `site` as a stopped process would be: calls to it wait, and it
  // takes no frame, reply or timer of a relayed stream (its links fill and
  // its senders stall) until Thaw. Its machine's own timers still run.
  void Freeze(const std::string& site);
  void Thaw(const std::string& site);

  // Applies `fault` to the next `count` matching calls (count < 0: to every
  // one). Rules are tried in the order added; the first that matches wins.
  void AddFault(CallMatcher match, Fault fault, int count = -1);
  void ClearFaults();
  // Matching calls arrive `latency` after they are made; a model stream's
  // body then takes `transfer` more (the target has admitted the header and
  // holds the stream open meanwhile). The first matching delay wins.
  void AddDelay(CallMatcher match, absl::Duration latency,
                absl::Duration transfer = absl::ZeroDuration());
  // Whether a RETRY answer to RequestToSubmit may be held by the target
  // until a slot frees or the call's deadline nears, as PeerService lets
  // it (on by default; off: the trainer retries after retry_after_ms).
  void set_hold_permission_retries(bool hold);
  // Chunk size for model streams (default: the header's, else the least).
  void set_chunk_size(uint64_t bytes);
  // Frames a link holds before a write waits (socket buffers; default 4).
  void set_link_window(size_t frames);

  // The relay protocol's obligations an adapter broke (two reads at once,
  // a write while one is in flight): each also breaks its stream. Tests
  // expect none.
  std::vector<std::string> ProtocolErrors() const;

  // Called at the start of every call, before faults are judged, outside
  // the network's lock (it may change faults or isolate sites).
  void SetObserver(std::function<void(const CallRecord&)> observer);

  // Every finished call, in finishing order.
  std::vector<CallRecord> Log() const;
  // Calls under way (sent, not yet answered).
  int calls_in_flight() const;

  // Real threads: from now on every call fails (Unavailable); waits (up to
  // 30 s) for the calls under way to end and stops the network's threads.
  // Call before destroying the sites.
  void Shutdown();

  absl::Time Now() const;

 private:
  class SiteTransport;
  class Pipe;
  class RelayNode;
  struct Frame;
  // One call on its way: the message, what the network does to it, and the
  // caller's `done`.
  struct Call {
    CallRecord record;
    PeerMessage message;
    PeerTransport::Done done;
    std::optional<Fault> fault;
    absl::Duration latency = absl::ZeroDuration();
    absl::Duration transfer = absl::ZeroDuration();
    SiteDriver* target = nullptr;
    // A relayed stream's link (fake_relay.cc); broken when it is answered.
    std::shared_ptr<Pipe> pipe;
    bool answered = false;  // Guarded by the network's mu_.
  };

  void Send(const std::string& from, const v1::SiteInfo& to,
            PeerMessage message, PeerTransport::Done done);
  // Relayed streams (fake_relay.cc): a learn task with a forward list or a
  // partial sum, sent frame by frame by a kSource RelayProtocol.
  static bool Relayed(const PeerMessage& message);
  void SendRelayed(const std::string& from, const v1::SiteInfo& to,
                   PeerMessage message, PeerTransport::Done done);
  // A relayed stream's call from `from` to `to` with `header`, its link and
  // its record (Plan runs); Launch then sends it on its way.
  std::shared_ptr<Call> NewRelayedCall(const std::string& from,
                                       const std::string& to, CallKind kind,
                                       const v1::ModelHeader& header,
                                       uint64_t body_bytes);
  void Launch(std::shared_ptr<Call> call);
  // The relayed stream reached its target: the header frame, then a
  // receiving RelayNode.
  void ArriveRelayed(std::shared_ptr<Call> call);
  void AdmitRelayed(std::shared_ptr<Call> call, const v1::ModelHeader& header);
  // Runs `step` on `site`'s behalf now, or when it thaws.
  void Run(const std::string& site, std::function<void()> step);
  void NoteProtocolError(std::string error);
  // Breaks a relayed stream's link: a pending read or write fails.
  static void BreakPipe(const std::shared_ptr<Pipe>& pipe, absl::Status why);
  // Fills in the call's faults and delay (the observer runs first).
  void Plan(Call& call);
  void Arrive(std::shared_ptr<Call> call);
  // Hands the message to the target; `answered` gets its reply.
  void Deliver(std::shared_ptr<Call> call,
               std::function<void(absl::StatusOr<PeerReply>)> answered);
  void DeliverStream(std::shared_ptr<Call> call,
                     std::function<void(absl::StatusOr<PeerReply>)> answered);
  // Ends the call with `reply` (after the reply faults) and posts it back.
  void Answer(std::shared_ptr<Call> call, absl::StatusOr<PeerReply> reply);
  bool Reachable(const CallRecord& record) const;
  SiteDriver* Target(const std::string& name) const;
  void At(absl::Time when, std::function<void()> step);

  ManualRunner* const manual_;  // Virtual time, or null.
  mutable absl::Mutex mu_;
  std::unique_ptr<ThreadPoolRunner> pool_ ABSL_GUARDED_BY(mu_);  // Threads.
  std::map<std::string, SiteDriver*> sites_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<SiteTransport>> transports_
      ABSL_GUARDED_BY(mu_);
  std::set<std::string> isolated_ ABSL_GUARDED_BY(mu_);
  struct FaultRule {
    CallMatcher match;
    Fault fault;
    int remaining;
  };
  std::vector<FaultRule> faults_ ABSL_GUARDED_BY(mu_);
  struct DelayRule {
    CallMatcher match;
    absl::Duration latency;
    absl::Duration transfer;
  };
  std::vector<DelayRule> delays_ ABSL_GUARDED_BY(mu_);
  bool hold_retries_ ABSL_GUARDED_BY(mu_);
  uint64_t chunk_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const CallRecord&)> observer_ ABSL_GUARDED_BY(mu_);
  std::vector<CallRecord> log_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> partition_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> cut_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::function<void()>>> frozen_
      ABSL_GUARDED_BY(mu_);
  size_t link_window_ ABSL_GUARDED_BY(mu_) = 4;
  std::vector<std::string> protocol_errors_ ABSL_GUARDED_BY(mu_);
  // REQUIRES: mu_ held. Whether a partition separates `a` and `b`.
  bool Partitioned(const std::string& a, const std::string& b) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cut_.count({a, b}) > 0 || cut_.count({b, a}) > 0) return true;
    return !partition_.empty() &&
           (partition_.count(a) > 0) != (partition_.count(b) > 0);
  }
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_FAKE_NETWORK_H_
