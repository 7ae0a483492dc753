// Sends a model stream's frames to the next site as they are pushed (the
// head of a pipelined broadcast, JobConfig.broadcast_learn_tasks, or of a
// reduction chain): a client-streaming call, one write in flight at a time.
// A RelayedStream in RelayProtocol's kSource mode: the protocol decides
// backpressure and the stall give-up (controller/relay_protocol.h).
//
//   auto relay = FrameRelay::Start(channel, "LearnTask", std::move(context),
//                                  header_frame, options, on_room, done);
//   per frame received:  if (relay->Push(frame) == FrameRelay::kFull)
//                          stop reading until on_room runs;
//   at the end:          relay->Close();   (or Cancel(why) if it broke)
//   `done` then runs once with the next site's reply or why forwarding
//   failed.
//
// Backpressure: at most `max_queued_frames` frames wait. A full queue makes
// the receiver stop reading, so a chain of sites runs at its slowest link
// and no site buffers more than a few frames. A next hop that takes no frame
// for `stall_timeout` is given up (its call cancelled): the receiver reads on
// for its own copy, and the site that started the broadcast sends to the
// sites after it directly.
#ifndef SWARM_RPC_FRAME_RELAY_H_
#define SWARM_RPC_FRAME_RELAY_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/swarm.pb.h"
#include "rpc/relayed_stream.h"

namespace swarm {

class StreamWatchdog;

class FrameRelay : public std::enable_shared_from_this<FrameRelay> {
 public:
  struct Options {
    size_t max_queued_frames = 8;
    absl::Duration stall_timeout = absl::Seconds(10);
    // Says which hop, in logs and errors ("learn task to site-c").
    std::string what = "forwarded stream";
  };
  enum PushResult {
    kQueued,  // There is room for more.
    kFull,    // Queued, but the queue is full: `on_room` runs once later.
    kEnded,   // Forwarding ended (failed or cancelled): dropped.
  };
  using Done = std::function<void(absl::StatusOr<v1::Reply>)>;

  // Starts forwarding to `method` on `channel`, `header_frame` first.
  // `on_room` and `done` run on gRPC or watchdog threads, with no lock of
  // the relay's held. REQUIRES: `channel` and `watchdog` outlive the relay's
  // `done`.
  static std::shared_ptr<FrameRelay> Start(
      grpc::ChannelInterface* channel, absl::string_view method,
      std::unique_ptr<grpc::ClientContext> context,
      const grpc::ByteBuffer& header_frame, Options options,
      std::shared_ptr<StreamWatchdog> watchdog, std::function<void()> on_room,
      Done done);

  ~FrameRelay();
  FrameRelay(const FrameRelay&) = delete;
  FrameRelay& operator=(const FrameRelay&) = delete;

  // Queues `frame` (a copy shares its slices) to go after the ones before.
  PushResult Push(const grpc::ByteBuffer& frame);
  // Queues `frames` in order, as one step: kFull at most once for all of
  // them, so `on_room` runs at most once for the batch. (Pushing them one
  // by one could report kFull twice: `on_room` may run between the two,
  // and then once more.) An empty batch is kQueued, or kEnded.
  PushResult Push(std::vector<grpc::ByteBuffer> frames);
  // Every frame was pushed: the stream is closed after the last one.
  void Close();
  // The incoming stream broke: the forward is cancelled.
  void Cancel();

 private:
  class Pusher;
  FrameRelay() = default;

  std::shared_ptr<Pusher> pusher_;
  std::shared_ptr<RelayedStream> stream_;
};

}  // namespace swarm

#endif  // SWARM_RPC_FRAME_RELAY_H_
