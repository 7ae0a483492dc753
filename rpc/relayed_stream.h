// The gRPC adapter of RelayProtocol (controller/relay_protocol.h): one model
// stream passing through this site, its frames forwarded to the next hop on
// a client-streaming call as they come. The protocol decides; this class
// only moves bytes: it steps the protocol under its lock, writes, closes or
// cancels the onward call, arms the protocol's timer on the watchdog, and
// hands the incoming side's actions (read, cancel, tell the site, answer)
// to its Side.
//
//   auto stream = RelayedStream::Create(mode, budgets, next, what, watchdog,
//                                        side);
//   stream->OpenOnward(channel, "LearnTask", std::move(context));  // not
//                                                                   // kReceive
//   stream->Start({header_frame});
//   per frame read:   stream->FrameRead(frames it produced onward);
//   at the end:       stream->ReadEnd(status, frames);
//   the site's reply: stream->SiteReplied(reply);
#ifndef SWARM_RPC_RELAYED_STREAM_H_
#define SWARM_RPC_RELAYED_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "controller/relay_protocol.h"
#include "proto/swarm.pb.h"

namespace swarm {

class StreamWatchdog;

class RelayedStream : public std::enable_shared_from_this<RelayedStream> {
 public:
  // The incoming side: a server reactor, or FrameRelay's pusher. Called
  // with no lock of the stream held, on any thread, each action once (see
  // RelayProtocol's obligations).
  class Side {
   public:
    virtual ~Side() = default;
    virtual void Read() = 0;
    virtual void CancelIncoming() = 0;
    virtual void TellSite(absl::Status status) = 0;
    virtual void Answer(v1::Reply reply) = 0;
    virtual void OnwardDone(absl::StatusOr<v1::Reply> reply) = 0;
  };

  static std::shared_ptr<RelayedStream> Create(
      RelayProtocol::Mode mode, RelayBudgets budgets, std::string next,
      std::string what, std::shared_ptr<StreamWatchdog> watchdog,
      std::shared_ptr<Side> side);
  ~RelayedStream();
  RelayedStream(const RelayedStream&) = delete;
  RelayedStream& operator=(const RelayedStream&) = delete;

  // Starts the call to the next hop. REQUIRES: mode is not kReceive; before
  // Start; `channel` outlives the call.
  void OpenOnward(grpc::ChannelInterface* channel, absl::string_view method,
                  std::unique_ptr<grpc::ClientContext> context);
  // The header was admitted; `header_frames` go onward first. Returns
  // whether to read now (the caller reads itself: Side::Read is not called
  // for it).
  bool Start(std::vector<grpc::ByteBuffer> header_frames);
  // The pending read returned a frame that put `produced` onward. Returns
  // whether to read on now (as Start); false: reading paused (Side::Read
  // resumes it) or over.
  bool FrameRead(std::vector<grpc::ByteBuffer> produced);
  void ReadEnd(absl::Status status,
               std::vector<grpc::ByteBuffer> produced = {});
  void SiteReplied(v1::Reply reply);
  // Whether frames still go onward (FrameRelay's kEnded).
  bool onward_open() const;

 private:
  class OnwardCall;
  using Input = std::function<void(RelayProtocol&, absl::Time)>;

  RelayedStream(RelayProtocol::Mode mode, RelayBudgets budgets,
                std::string next, std::string what,
                std::shared_ptr<StreamWatchdog> watchdog,
                std::shared_ptr<Side> side);

  // One input under the lock, then its actions carried out outside it.
  // Returns whether it decided a read; with `own_read` the caller carries
  // that read out.
  bool Step(const Input& input, std::vector<grpc::ByteBuffer> frames = {},
            bool own_read = false);
  // The incoming side's actions.
  void Carry(const RelayProtocol::Actions& actions);
  void Arm(absl::Time deadline);
  void OnTimer();
  // The onward call's events.
  void OnWriteDone(bool ok);
  void OnOnwardEnd(absl::StatusOr<v1::Reply> reply);

  // Shared: the stream forgets itself in it when its last owner drops it,
  // which can be a gRPC thread ending the onward call after the service or
  // transport that made the stream is gone.
  const std::shared_ptr<StreamWatchdog> watchdog_;
  const std::shared_ptr<Side> side_;
  mutable absl::Mutex mu_;
  RelayProtocol protocol_ ABSL_GUARDED_BY(mu_);
  RelayQueue<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  absl::Time armed_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Until its hold is released (closed, cancelled or broken).
  OnwardCall* onward_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool onward_writing_ ABSL_GUARDED_BY(mu_) = false;
  // Cancelled during a write: the hold goes when the write comes back.
  bool release_after_write_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace swarm

#endif  // SWARM_RPC_RELAYED_STREAM_H_
