#include "rpc/frame_relay.h"

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace swarm {

// The pushing side of the stream: `on_room` when a paused pusher may push
// again, `done` once with the next site's answer.
class FrameRelay::Pusher final : public RelayedStream::Side {
 public:
  Pusher(std::function<void()> on_room, Done done)
      : on_room_(std::move(on_room)), done_(std::move(done)) {}

  // A Push found the queue full (its on_room may have run already).
  void Paused() {
    absl::MutexLock lock(&mu_);
    ++paused_;
  }
  // Cancel: a paused pusher is woken (its next Push says kEnded).
  void Wake() {
    {
      absl::MutexLock lock(&mu_);
      if (paused_ <= 0) return;
      paused_ = 0;
    }
    on_room_();
  }

  void Read() override {
    {
      absl::MutexLock lock(&mu_);
      --paused_;
    }
    on_room_();
  }
  void CancelIncoming() override {}
  void TellSite(absl::Status) override {}
  void Answer(v1::Reply) override {}
  void OnwardDone(absl::StatusOr<v1::Reply> reply) override {
    Done done;
    {
      absl::MutexLock lock(&mu_);
      done = std::move(done_);
      done_ = nullptr;
    }
    if (done) done(std::move(reply));
  }

 private:
  const std::function<void()> on_room_;
  absl::Mutex mu_;
  Done done_ ABSL_GUARDED_BY(mu_);
  // Pauses reported minus rooms given: 1 while a pusher waits.
  int paused_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<FrameRelay> FrameRelay::Start(
    grpc::ChannelInterface* channel, absl::string_view method,
    std::unique_ptr<grpc::ClientContext> context,
    const grpc::ByteBuffer& header_frame, Options options,
    std::shared_ptr<StreamWatchdog> watchdog, std::function<void()> on_room,
    Done done) {
  std::shared_ptr<FrameRelay> relay(new FrameRelay());
  relay->pusher_ =
      std::make_shared<Pusher>(std::move(on_room), std::move(done));
  RelayBudgets budgets;
  budgets.stall = options.stall_timeout;
  budgets.max_queued = std::max<size_t>(1, options.max_queued_frames);
  relay->stream_ =
      RelayedStream::Create(RelayProtocol::Mode::kSource, budgets, "",
                            std::move(options.what), watchdog, relay->pusher_);
  relay->stream_->OpenOnward(channel, method, std::move(context));
  std::vector<grpc::ByteBuffer> header;
  header.push_back(header_frame);
  relay->stream_->Start(std::move(header));  // The caller pushes at once.
  return relay;
}

FrameRelay::~FrameRelay() = default;

FrameRelay::PushResult FrameRelay::Push(const grpc::ByteBuffer& frame) {
  std::vector<grpc::ByteBuffer> frames;
  frames.push_back(frame);
  return Push(std::move(frames));
}

FrameRelay::PushResult FrameRelay::Push(std::vector<grpc::ByteBuffer> frames) {
  if (!stream_->onward_open()) return kEnded;
  if (frames.empty()) return kQueued;
  if (stream_->FrameRead(std::move(frames))) return kQueued;
  if (!stream_->onward_open()) return kEnded;
  pusher_->Paused();
  return kFull;
}

void FrameRelay::Close() { stream_->ReadEnd(absl::OkStatus()); }

void FrameRelay::Cancel() {
  stream_->ReadEnd(absl::CancelledError("the incoming stream broke"));
  pusher_->Wake();
}

}  // namespace swarm
