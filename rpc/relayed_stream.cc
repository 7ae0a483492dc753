#include "rpc/relayed_stream.h"

#include <grpcpp/support/client_callback.h>

#include <utility>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "rpc/grpc_stream.h"
#include "rpc/stream_watchdog.h"

namespace swarm {

// The call to the next hop. It keeps the stream alive until its OnDone; the
// stream reaches it until it releases the hold (after which gRPC may end
// it). A hold is never released while a write is in flight.
class RelayedStream::OnwardCall final
    : public grpc::ClientWriteReactor<grpc::ByteBuffer> {
 public:
  OnwardCall(std::shared_ptr<RelayedStream> stream, absl::string_view method,
             std::unique_ptr<grpc::ClientContext> context)
      : stream_(std::move(stream)),
        path_(PeerMethodPath(method)),
        rpc_(path_.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING),
        context_(std::move(context)) {}

  void Begin(grpc::ChannelInterface* channel) {
    grpc::internal::ClientCallbackWriterFactory<grpc::ByteBuffer>::Create(
        channel, rpc_, context_.get(), &reply_, this);
    AddHold();
    StartCall();
  }
  void Write(grpc::ByteBuffer frame) {
    frame_ = std::move(frame);
    StartWrite(&frame_);
  }
  void Close() {
    writes_done_ = true;
    StartWritesDone();
    RemoveHold();
  }
  void Cancel() { context_->TryCancel(); }
  void Release() { RemoveHold(); }

  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnDone(const grpc::Status& status) override {
    absl::StatusOr<v1::Reply> result =
        UploadOutcome(status, std::move(reply_), writes_done_, path_);
    std::shared_ptr<RelayedStream> stream = std::move(stream_);
    delete this;
    stream->OnOnwardEnd(std::move(result));
  }

 private:
  std::shared_ptr<RelayedStream> stream_;
  const std::string path_;
  const grpc::internal::RpcMethod rpc_;
  const std::unique_ptr<grpc::ClientContext> context_;
  grpc::ByteBuffer frame_;
  v1::Reply reply_;
  bool writes_done_ = false;
};

std::shared_ptr<RelayedStream> RelayedStream::Create(
    RelayProtocol::Mode mode, RelayBudgets budgets, std::string next,
    std::string what, std::shared_ptr<StreamWatchdog> watchdog,
    std::shared_ptr<Side> side) {
  return std::shared_ptr<RelayedStream>(
      new RelayedStream(mode, budgets, std::move(next), std::move(what),
                        watchdog, std::move(side)));
}

RelayedStream::RelayedStream(RelayProtocol::Mode mode, RelayBudgets budgets,
                             std::string next, std::string what,
                             std::shared_ptr<StreamWatchdog> watchdog,
                             std::shared_ptr<Side> side)
    : watchdog_(std::move(watchdog)),
      side_(std::move(side)),
      protocol_(mode, budgets, std::move(next), std::move(what)) {}

RelayedStream::~RelayedStream() { watchdog_->Forget(this); }

void RelayedStream::OpenOnward(grpc::ChannelInterface* channel,
                               absl::string_view method,
                               std::unique_ptr<grpc::ClientContext> context) {
  auto* call = new OnwardCall(shared_from_this(), method, std::move(context));
  {
    absl::MutexLock lock(&mu_);
    onward_ = call;
  }
  call->Begin(channel);
}

bool RelayedStream::Start(std::vector<grpc::ByteBuffer> header_frames) {
  const size_t count = header_frames.size();
  return Step(
      [count](RelayProtocol& p, absl::Time now) { p.Start(now, count); },
      std::move(header_frames), /*own_read=*/true);
}

bool RelayedStream::FrameRead(std::vector<grpc::ByteBuffer> produced) {
  const size_t count = produced.size();
  return Step(
      [count](RelayProtocol& p, absl::Time now) { p.OnFrameRead(now, count); },
      std::move(produced), /*own_read=*/true);
}

void RelayedStream::ReadEnd(absl::Status status,
                            std::vector<grpc::ByteBuffer> produced) {
  const size_t count = produced.size();
  Step([&status, count](RelayProtocol& p,
                        absl::Time now) { p.OnReadEnd(now, status, count); },
       std::move(produced));
}

void RelayedStream::SiteReplied(v1::Reply reply) {
  Step([&reply](RelayProtocol& p, absl::Time) {
    p.OnSiteReply(std::move(reply));
  });
}

bool RelayedStream::onward_open() const {
  absl::MutexLock lock(&mu_);
  return onward_ != nullptr && !protocol_.finished();
}

void RelayedStream::OnWriteDone(bool ok) {
  OnwardCall* release = nullptr;
  {
    absl::MutexLock lock(&mu_);
    onward_writing_ = false;
    if ((!ok || release_after_write_) && onward_ != nullptr) {
      release = onward_;
      onward_ = nullptr;
    }
  }
  if (release != nullptr) release->Release();
  Step([ok](RelayProtocol& p, absl::Time now) { p.OnWriteDone(now, ok); });
}

void RelayedStream::OnOnwardEnd(absl::StatusOr<v1::Reply> reply) {
  Step([&reply](RelayProtocol& p, absl::Time now) {
    p.OnOnwardEnd(now, std::move(reply));
  });
}

void RelayedStream::OnTimer() {
  {
    absl::MutexLock lock(&mu_);
    armed_ = absl::InfiniteFuture();
  }
  Step([](RelayProtocol& p, absl::Time now) { p.Tick(now); });
}

bool RelayedStream::Step(const Input& input,
                         std::vector<grpc::ByteBuffer> frames, bool own_read) {
  RelayProtocol::Actions actions;
  std::optional<grpc::ByteBuffer> write;
  OnwardCall* writer = nullptr;
  OnwardCall* closer = nullptr;
  OnwardCall* canceller = nullptr;
  bool release = false;
  absl::Time arm = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    for (grpc::ByteBuffer& frame : frames) queue_.Push(std::move(frame));
    input(protocol_, absl::Now());
    actions = protocol_.TakeActions();
    write = queue_.Apply(actions);
    if (write.has_value() && onward_ != nullptr) {
      writer = onward_;
      onward_writing_ = true;
    }
    if (actions.close_onward && onward_ != nullptr) {
      closer = onward_;
      onward_ = nullptr;
    }
    if (actions.cancel_onward && onward_ != nullptr) {
      // A write in flight may come back only when a frozen hop wakes: the
      // hold goes with it (OnWriteDone), else now.
      canceller = onward_;
      release = !onward_writing_;
      release_after_write_ = onward_writing_;
      if (release) onward_ = nullptr;
    }
    const absl::Time deadline = protocol_.NextDeadline();
    if (deadline < armed_) arm = armed_ = deadline;
  }
  if (writer != nullptr) writer->Write(std::move(*write));
  if (closer != nullptr) closer->Close();
  if (canceller != nullptr) {
    canceller->Cancel();
    if (release) canceller->Release();
  }
  if (arm != absl::InfiniteFuture()) Arm(arm);
  const bool read = actions.read;
  if (own_read) actions.read = false;
  Carry(actions);
  return read;
}

void RelayedStream::Arm(absl::Time deadline) {
  // Armed again only for an earlier deadline: a later one is found when
  // this one fires (not one watchdog wake per frame).
  watchdog_->Watch(this, deadline, /*what=*/"", [weak = weak_from_this()] {
    if (std::shared_ptr<RelayedStream> stream = weak.lock()) {
      stream->OnTimer();
    }
  });
}

void RelayedStream::Carry(const RelayProtocol::Actions& actions) {
  if (!actions.given_up.empty()) {
    SWARM_LOG_WARNING("giving up %s", actions.given_up);
  }
  if (actions.cancel_incoming) side_->CancelIncoming();
  if (actions.read) side_->Read();
  if (actions.to_site.has_value()) side_->TellSite(*actions.to_site);
  if (actions.answer.has_value()) side_->Answer(*actions.answer);
  if (actions.onward_done.has_value()) side_->OnwardDone(*actions.onward_done);
}

}  // namespace swarm
