#include "rpc/frame_relay.h"

#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "rpc/grpc_stream.h"
#include "rpc/stream_watchdog.h"

namespace swarm {

// The gRPC call. It keeps the relay alive until its OnDone; the relay
// reaches it until the hold is released (after which gRPC may end it).
class FrameRelay::Call final
    : public grpc::ClientWriteReactor<grpc::ByteBuffer> {
 public:
  Call(std::shared_ptr<FrameRelay> relay, absl::string_view method,
       std::unique_ptr<grpc::ClientContext> context)
      : relay_(std::move(relay)),
        path_(PeerMethodPath(method)),
        rpc_(path_.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING),
        context_(std::move(context)) {}

  void Begin(grpc::ChannelInterface* channel, const grpc::ByteBuffer& header) {
    grpc::internal::ClientCallbackWriterFactory<grpc::ByteBuffer>::Create(
        channel, rpc_, context_.get(), &reply_, this);
    AddHold();
    frame_ = header;
    StartWrite(&frame_);
    StartCall();
  }

  // REQUIRES: no write in flight (the relay's `writing_` says so).
  void Write(grpc::ByteBuffer frame) {
    frame_ = std::move(frame);
    StartWrite(&frame_);
  }

  void OnWriteDone(bool ok) override { relay_->OnWriteDone(ok); }

  void OnDone(const grpc::Status& status) override {
    absl::StatusOr<v1::Reply> result =
        UploadOutcome(status, std::move(reply_), writes_done_, path_);
    std::shared_ptr<FrameRelay> relay = std::move(relay_);
    delete this;
    relay->Ended();
    relay->Deliver(std::move(result));
  }

  std::shared_ptr<grpc::ClientContext> context() const { return context_; }
  void set_writes_done() { writes_done_ = true; }

 private:
  std::shared_ptr<FrameRelay> relay_;
  const std::string path_;
  const grpc::internal::RpcMethod rpc_;
  // Shared with the watchdog's cancel, which may run after the call ended.
  const std::shared_ptr<grpc::ClientContext> context_;
  grpc::ByteBuffer frame_;
  v1::Reply reply_;
  bool writes_done_ = false;
};

std::shared_ptr<FrameRelay> FrameRelay::Start(
    grpc::ChannelInterface* channel, absl::string_view method,
    std::unique_ptr<grpc::ClientContext> context,
    const grpc::ByteBuffer& header_frame, Options options,
    StreamWatchdog* watchdog, std::function<void()> on_room, Done done) {
  std::shared_ptr<FrameRelay> relay(new FrameRelay());
  relay->max_queued_ = std::max<size_t>(1, options.max_queued_frames);
  relay->on_room_ = std::move(on_room);
  relay->watchdog_ = watchdog;
  relay->stall_timeout_ = options.stall_timeout;
  relay->what_ = std::move(options.what);
  relay->done_ = std::move(done);
  auto* call = new Call(relay, method, std::move(context));
  {
    absl::MutexLock lock(&relay->mu_);
    relay->call_ = call;
    relay->writing_ = true;  // The header.
    relay->Arm();
  }
  call->Begin(channel, header_frame);
  return relay;
}

FrameRelay::~FrameRelay() = default;

void FrameRelay::Arm() {
  // A write that does not finish within the stall timeout means the next
  // hop stopped taking frames (frozen, or its own next hop is).
  std::shared_ptr<grpc::ClientContext> context = call_->context();
  watchdog_->Watch(this, absl::Now() + stall_timeout_,
                   absl::StrCat(what_, ": no frame taken for ",
                                absl::FormatDuration(stall_timeout_)),
                   [context, weak = weak_from_this()] {
                     context->TryCancel();
                     if (std::shared_ptr<FrameRelay> relay = weak.lock()) {
                       relay->OnStalled();
                     }
                   });
}

// The cancelled write to a frozen next hop may not come back until that
// hop wakes (gRPC completes it with the transport): the relay ends now, so
// that the receiver reads on and its caller hears why at once.
void FrameRelay::OnStalled() {
  bool room = false;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    queue_.clear();
    room = want_room_;
    want_room_ = false;
  }
  Deliver(absl::DeadlineExceededError(absl::StrCat(
      what_, ": no frame taken for ", absl::FormatDuration(stall_timeout_))));
  if (room) on_room_();
}

void FrameRelay::Deliver(absl::StatusOr<v1::Reply> result) {
  Done done;
  {
    absl::MutexLock lock(&mu_);
    done = std::move(done_);
    done_ = nullptr;
  }
  if (done) done(std::move(result));
}

FrameRelay::PushResult FrameRelay::Push(const grpc::ByteBuffer& frame) {
  std::vector<grpc::ByteBuffer> frames;
  frames.push_back(frame);
  return Push(std::move(frames));
}

FrameRelay::PushResult FrameRelay::Push(std::vector<grpc::ByteBuffer> frames) {
  grpc::ByteBuffer next;
  bool writes_done = false;
  PushResult result;
  Call* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (ended_ || closed_ || call_ == nullptr) return kEnded;
    if (frames.empty()) return kQueued;
    for (grpc::ByteBuffer& frame : frames) queue_.push_back(std::move(frame));
    if (!TakeNextWrite(&next, &writes_done)) next.Clear();
    call = call_;
    result = queue_.size() >= max_queued_ ? kFull : kQueued;
    if (result == kFull) want_room_ = true;
  }
  // Outside the lock: gRPC may run the reaction (OnWriteDone) inline.
  if (next.Valid()) call->Write(std::move(next));
  return result;
}

bool FrameRelay::TakeNextWrite(grpc::ByteBuffer* frame, bool* writes_done) {
  *writes_done = false;
  if (writing_ || ended_ || call_ == nullptr) return false;
  if (!queue_.empty()) {
    *frame = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    Arm();
    return true;
  }
  if (closed_ && !hold_released_) {
    *writes_done = true;
    return false;
  }
  return false;
}

void FrameRelay::OnWriteDone(bool ok) {
  grpc::ByteBuffer next;
  bool writes_done = false;
  bool room = false;
  Call* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    watchdog_->Forget(this);
    if (!ok) {
      // The next hop broke or was cancelled: nothing more goes out; the
      // call's status (OnDone) says why.
      ended_ = true;
      queue_.clear();
    } else if (!TakeNextWrite(&next, &writes_done)) {
      next.Clear();
    }
    if (want_room_ && (ended_ || queue_.size() < max_queued_)) {
      want_room_ = false;
      room = true;
    }
    call = call_;
    if (writes_done || (ended_ && !hold_released_)) {
      hold_released_ = true;
      call_ = nullptr;
    } else {
      writes_done = false;
      call = next.Valid() ? call : nullptr;
    }
  }
  if (call != nullptr) {
    if (next.Valid()) {
      call->Write(std::move(next));
    } else {
      if (writes_done) {
        call->set_writes_done();
        call->StartWritesDone();
      }
      call->RemoveHold();
    }
  }
  if (room) on_room_();
}

void FrameRelay::Close() {
  Call* call = nullptr;
  bool writes_done = false;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    if (writing_ || hold_released_ || call_ == nullptr) return;
    // Nothing in flight: the queue is empty (a write would be in flight).
    writes_done = !ended_;
    hold_released_ = true;
    call = call_;
    call_ = nullptr;
  }
  if (writes_done) {
    call->set_writes_done();
    call->StartWritesDone();
  }
  call->RemoveHold();
}

void FrameRelay::Cancel() {
  std::shared_ptr<grpc::ClientContext> context;
  Call* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    queue_.clear();
    if (call_ == nullptr) return;
    context = call_->context();
    if (!writing_ && !hold_released_) {
      hold_released_ = true;
      call = call_;
      call_ = nullptr;
    }
  }
  context->TryCancel();
  if (call != nullptr) call->RemoveHold();
}

void FrameRelay::Ended() {
  bool room = false;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    call_ = nullptr;
    queue_.clear();
    room = want_room_;
    want_room_ = false;
  }
  watchdog_->Forget(this);
  if (room) on_room_();
}

}  // namespace swarm
