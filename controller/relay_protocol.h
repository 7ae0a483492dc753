// The relay and hop protocol of one model stream passing through a site
// (design section 9): a learn task forwarded along a broadcast
// (ModelHeader.relay_to), a partial sum passing through a chain reduction's
// hop, a partial sum arriving at the aggregator, and the stream a chain's or
// broadcast's head sends. It decides, from frames in and frames out:
//
//   read the next incoming frame        (one read pending at most, ever)
//   write the next frame onward         (one write in flight at most)
//   pause reading                       (the next hop's queue is full:
//                                        backpressure) and resume
//   give the next hop up                (a write not taken for `stall`)
//   give the sender up                  (a pending read with no frame for
//                                        `idle`)
//   close the onward stream, tell the site how the stream ended, and fold
//   the next hop's answers into the reply (Reply.relayed)
//
// Pure logic, after gatherer/gatherer.h: no gRPC, no thread, no clock. Every
// input that depends on time takes `now`; NextDeadline() says when to call
// Tick() without a new input. The budgets come from the machine (the
// admission of the stream, PeerMessage.relay_stall); RelayStallBudget says
// how they grow along a chain.
//
// NOT thread-safe: the adapter (rpc/ reactors, the fake network) serializes
// every call under its own lock, and after EVERY input calls TakeActions()
// and carries the actions out (outside its lock is fine: each action is
// decided once). The frames themselves stay with the adapter (RelayQueue
// below keeps them in step with the protocol's count).
//
// The caller's obligations:
// - `read`: start exactly one read; report it with exactly one OnFrameRead()
//   or OnReadEnd(). (kSource: "read" means produce the next frames.)
// - `write`: write the oldest queued frame; report it with one OnWriteDone()
//   unless the onward call ended first (OnOnwardEnd), or the next hop was
//   given up (`cancel_onward`): a late completion is then ignored.
// - `cancel_incoming`: cancel the incoming call; the pending read then ends
//   (OnReadEnd, any status: the protocol says why).
// - `to_site`: hand the site the stream (kReceive / kRelay: the assembled
//   model when the status is OK; kHop: the status alone), then report its
//   reply with OnSiteReply().
// - `answer`: finish the incoming call with this reply.
#ifndef SWARM_CONTROLLER_RELAY_PROTOCOL_H_
#define SWARM_CONTROLLER_RELAY_PROTOCOL_H_

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/swarm.pb.h"

namespace swarm {

// How long a hop may wait for the next hop to take a frame, with
// `hops_after` sites after the next hop: one failover timeout (at least 1 s)
// per hop from the next one on. A site frozen further down stalls every hop
// above it through backpressure, and the forwarder nearest to it must give
// it up first so that the rest flows again; a chain's head (the scatterer's
// or the first trainer's stream) passes the chain's length.
absl::Duration RelayStallBudget(absl::Duration failover, int hops_after);
// How long a partial sum's sender may stay silent while a read waits: one
// failover timeout (at least 1 s).
absl::Duration RelayIdleBudget(absl::Duration failover);

struct RelayBudgets {
  // A write to the next hop not taken within this: the next hop is given
  // up. Infinite: never.
  absl::Duration stall = absl::InfiniteDuration();
  // A pending read with no frame within this: the sender is given up.
  // Infinite: never (paused reads never count: backpressure is on purpose).
  absl::Duration idle = absl::InfiniteDuration();
  // Frames waiting for the next hop (besides the one in flight) before
  // reading pauses.
  size_t max_queued = 8;
};

class RelayProtocol {
 public:
  enum class Mode {
    kReceive,  // The stream ends here; the site's reply answers it.
    kRelay,    // Forwarded as it comes; the site judges its own copy at the
               // end, and its reply waits for the next hop's, which joins
               // it (Reply.relayed).
    kHop,      // Transformed as it comes (a partial sum plus this site's
               // result); the site hears once both the incoming stream and
               // the next hop's answer are known (the incoming failure
               // first).
    kSource,   // No incoming call: this site's own stream to a chain's
               // first hop; "read" produces the next frames.
  };

  // What the adapter does now (see the obligations above).
  struct Actions {
    bool read = false;
    bool write = false;
    // Drop every queued frame (the next hop is gone).
    bool drop_queued = false;
    bool close_onward = false;
    bool cancel_onward = false;
    bool cancel_incoming = false;
    std::optional<absl::Status> to_site;
    std::optional<v1::Reply> answer;
    // kSource: forwarding is over, with the next hop's reply or why not.
    std::optional<absl::StatusOr<v1::Reply>> onward_done;
    // A budget ran out: what was given up and why (for the log).
    std::string given_up;
  };

  // `next` names the next hop in the relayed answers and in errors; `what`
  // says which stream ("round 3 partial sum to site-c").
  RelayProtocol(Mode mode, RelayBudgets budgets, std::string next,
                std::string what);

  // The header was admitted. `header_frames` frames are queued for the next
  // hop (its header: 1; 0 for kReceive). REQUIRES: called once, first.
  void Start(absl::Time now, size_t header_frames);
  // A read returned a frame, which put `produced` frames onward (queued by
  // the adapter; dropped if the next hop is gone). REQUIRES: a read was
  // pending.
  void OnFrameRead(absl::Time now, size_t produced);
  // The incoming stream ended: OK when it was whole (trailer checked,
  // model assembled), else why not; `produced` frames went onward (a hop's
  // trailer). REQUIRES: a read was pending, or the stream broke on its own.
  void OnReadEnd(absl::Time now, absl::Status status, size_t produced = 0);
  // The write in flight finished (`ok`: taken; else the onward call broke).
  void OnWriteDone(absl::Time now, bool ok);
  // The onward call ended: the next hop's reply, or why the call failed.
  void OnOnwardEnd(absl::Time now, absl::StatusOr<v1::Reply> reply);
  // The site answered the stream (after `to_site`).
  void OnSiteReply(v1::Reply reply);
  // The timers: the stall and idle budgets.
  void Tick(absl::Time now);

  // When Tick() must run next (InfiniteFuture: no timer).
  absl::Time NextDeadline() const;
  // The actions decided since the last call.
  Actions TakeActions();

  // Inspection, for tests and logs.
  bool reading() const { return reading_; }
  bool writing() const { return writing_; }
  bool paused() const;
  size_t queued() const { return queued_; }
  // Whether the call is over for this site: answered (kSource: forwarding
  // done).
  bool finished() const { return finished_; }

 private:
  bool has_onward() const { return mode_ != Mode::kReceive; }
  // Frames may still go out: the onward call neither ended nor broke.
  bool onward_open() const {
    return has_onward() && !onward_.has_value() && !write_failed_;
  }
  // The one place reads and writes start, and the onward stream closes.
  void Pump(absl::Time now);
  void EndOnward(absl::StatusOr<v1::Reply> result, bool cancel);
  // kHop: tells the site once both halves are known.
  void MaybeTellSite();
  void MaybeAnswer();

  const Mode mode_;
  const RelayBudgets budgets_;
  const std::string next_;
  const std::string what_;
  Actions actions_;

  // The incoming side.
  bool started_ = false;
  bool reading_ = false;
  absl::Time read_since_;
  bool sender_given_up_ = false;
  std::optional<absl::Status> incoming_;  // Set once the stream ended.

  // The onward side.
  size_t queued_ = 0;
  bool writing_ = false;
  absl::Time write_since_;
  bool closed_ = false;
  bool write_failed_ = false;  // The onward call broke; its end follows.
  std::optional<absl::StatusOr<v1::Reply>> onward_;  // Set once it ended.

  // The site and the answer.
  bool site_told_ = false;
  std::optional<v1::Reply> site_reply_;
  bool finished_ = false;
};

// The frames behind a RelayProtocol's count: push what each input produced
// before reporting it, then Apply() the actions to take the frame to write.
template <typename Frame>
class RelayQueue {
 public:
  void Push(Frame frame) { frames_.push_back(std::move(frame)); }
  // Drops what `actions` drops; returns the frame to write, if any.
  std::optional<Frame> Apply(const RelayProtocol::Actions& actions) {
    std::optional<Frame> write;
    if (actions.write && !frames_.empty()) {
      write = std::move(frames_.front());
      frames_.pop_front();
    }
    if (actions.drop_queued) frames_.clear();
    return write;
  }
  size_t size() const { return frames_.size(); }

 private:
  std::deque<Frame> frames_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_RELAY_PROTOCOL_H_
