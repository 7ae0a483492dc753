// The fake network's relayed streams: a learn task broadcast along a chain
// of trainers (ModelHeader.relay_to) and a chain reduction's partial sums go
// frame by frame over links that hold a few frames, and every site on the
// way drives a RelayProtocol (controller/relay_protocol.h) as PeerService
// does: the same backpressure, stall and idle give-ups, in virtual time.
#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/fake_network.h"
#include "controller/model_receiver.h"
#include "controller/relay_protocol.h"
#include "controller/replies.h"
#include "streaming/assembler.h"
#include "streaming/chunker.h"
#include "streaming/digest.h"

namespace swarm {
namespace {

absl::Status Unavailable(const CallRecord& record, absl::string_view why) {
  return absl::UnavailableError(
      absl::StrCat("fake network: ", CallKindName(record.kind), " from ",
                   record.from, " to ", record.to, ": ", why));
}

}  // namespace

// One frame of a model stream.
struct FakeNetwork::Frame {
  enum class Kind { kHeader, kChunk, kTrailer };
  Kind kind = Kind::kChunk;
  v1::ModelHeader header;
  uint32_t tensor_index = 0;
  uint64_t offset = 0;
  absl::string_view data;
  std::shared_ptr<const void> keep;  // Owns `data`'s bytes.
  v1::ModelTrailer trailer;
};

// The link of one relayed stream: the writer's frames wait in it (at most
// `window`, each ready `per_frame` after the one before) until the reader
// takes them; a write into a full link waits for a read. Callbacks run on
// the writer's or the reader's behalf (FakeNetwork::Run: not while frozen).
class FakeNetwork::Pipe : public std::enable_shared_from_this<Pipe> {
 public:
  using ReadDone = std::function<void(absl::StatusOr<std::optional<Frame>>)>;

  Pipe(FakeNetwork* network, CallRecord record, size_t window)
      : network_(network), record_(std::move(record)), window_(window) {}

  void set_per_frame(absl::Duration per_frame) {
    absl::MutexLock lock(&mu_);
    per_frame_ = per_frame;
  }

  // REQUIRES: no write waiting (the protocol's obligation).
  void Write(Frame frame, std::function<void(bool)> done) {
    std::vector<std::function<void()>> out;
    {
      absl::MutexLock lock(&mu_);
      if (blocked_.has_value()) {
        network_->NoteProtocolError(
            absl::StrCat(Describe(record_), ": two writes at once"));
        BreakLocked(absl::InternalError("two writes at once"), &out);
      }
      if (broken_.has_value()) {
        out.push_back(Post(record_.from, [done] { done(false); }));
      } else if (buffer_.size() < window_) {
        Append(std::move(frame));
        out.push_back(Post(record_.from, [done] { done(true); }));
        Serve(&out);
      } else {
        blocked_.emplace(std::move(frame), std::move(done));
      }
    }
    for (auto& step : out) step();
  }

  void CloseWrites() {
    std::vector<std::function<void()>> out;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      Serve(&out);
    }
    for (auto& step : out) step();
  }

  // REQUIRES: no read pending (the protocol's obligation).
  void Read(ReadDone done) {
    std::vector<std::function<void()>> out;
    {
      absl::MutexLock lock(&mu_);
      if (reader_) {
        network_->NoteProtocolError(
            absl::StrCat(Describe(record_), ": two reads at once"));
        BreakLocked(absl::InternalError("two reads at once"), &out);
        out.push_back(Post(record_.to, [done] {
          done(absl::InternalError("two reads at once"));
        }));
      } else {
        reader_ = std::move(done);
        Serve(&out);
      }
    }
    for (auto& step : out) step();
  }

  void Break(absl::Status why) {
    std::vector<std::function<void()>> out;
    {
      absl::MutexLock lock(&mu_);
      BreakLocked(std::move(why), &out);
    }
    for (auto& step : out) step();
  }

 private:
  static std::string Describe(const CallRecord& record) {
    return absl::StrCat(CallKindName(record.kind), " from ", record.from,
                        " to ", record.to);
  }

  // A step to post for `site` (run after the lock is released).
  std::function<void()> Post(const std::string& site,
                             std::function<void()> step) {
    FakeNetwork* network = network_;
    return [network, site, step = std::move(step)] {
      network->At(network->Now(),
                  [network, site, step] { network->Run(site, step); });
    };
  }

  void Append(Frame frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_ready_ = std::max(last_ready_, network_->Now()) + per_frame_;
    buffer_.push_back({last_ready_, std::move(frame)});
  }

  void BreakLocked(absl::Status why, std::vector<std::function<void()>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (broken_.has_value()) return;
    broken_ = std::move(why);
    buffer_.clear();
    if (blocked_.has_value()) {
      std::function<void(bool)> done = std::move(blocked_->second);
      blocked_.reset();
      out->push_back(Post(record_.from, [done] { done(false); }));
    }
    Serve(out);
  }

  // Hands the reader what it can have now.
  void Serve(std::vector<std::function<void()>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!reader_) return;
    if (!broken_.has_value() && !network_->Reachable(record_)) {
      BreakLocked(absl::UnavailableError(
                      absl::StrCat("fake network: ", Describe(record_),
                                   ": connection lost mid-stream")),
                  out);
      return;
    }
    absl::StatusOr<std::optional<Frame>> result;
    if (broken_.has_value()) {
      result = *broken_;
    } else if (!buffer_.empty()) {
      if (buffer_.front().ready > network_->Now()) {
        if (!wake_posted_) {
          wake_posted_ = true;
          network_->At(buffer_.front().ready, [self = shared_from_this()] {
            std::vector<std::function<void()>> out;
            {
              absl::MutexLock lock(&self->mu_);
              self->wake_posted_ = false;
              self->Serve(&out);
            }
            for (auto& step : out) step();
          });
        }
        return;
      }
      result = std::optional<Frame>(std::move(buffer_.front().frame));
      buffer_.pop_front();
      if (blocked_.has_value()) {
        Append(std::move(blocked_->first));
        std::function<void(bool)> done = std::move(blocked_->second);
        blocked_.reset();
        out->push_back(Post(record_.from, [done] { done(true); }));
      }
    } else if (closed_) {
      result = std::optional<Frame>();
    } else {
      return;
    }
    ReadDone reader = std::move(reader_);
    reader_ = nullptr;
    out->push_back(Post(record_.to, [reader, result] { reader(result); }));
  }

  FakeNetwork* const network_;
  const CallRecord record_;  // From, to and kind.
  const size_t window_;
  absl::Mutex mu_;
  absl::Duration per_frame_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  struct Buffered {
    absl::Time ready;
    Frame frame;
  };
  std::deque<Buffered> buffer_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ready_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::optional<std::pair<Frame, std::function<void(bool)>>> blocked_
      ABSL_GUARDED_BY(mu_);
  ReadDone reader_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_posted_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> broken_ ABSL_GUARDED_BY(mu_);
};

void FakeNetwork::BreakPipe(const std::shared_ptr<Pipe>& pipe,
                            absl::Status why) {
  pipe->Break(std::move(why));
}

// One site's end of a relayed stream: its RelayProtocol, the frames queued
// for the next hop, and the adapter's work (the network's part of PeerService
// and GrpcPeerTransport): reads, writes, the site's receiver, the timer.
class FakeNetwork::RelayNode : public std::enable_shared_from_this<RelayNode> {
 public:
  RelayNode(FakeNetwork* network, std::string site, RelayProtocol::Mode mode,
            RelayBudgets budgets, std::string next, std::string what)
      : network_(network),
        site_(std::move(site)),
        mode_(mode),
        protocol_(mode, budgets, std::move(next), std::move(what)) {}

  // kSource: sends `chunker`'s stream on `out`; `done` gets the answer.
  void StartSource(std::shared_ptr<Chunker> chunker, std::shared_ptr<Call> out,
                   PeerTransport::Done done) {
    chunker_ = std::move(chunker);
    source_done_ = std::move(done);
    Frame header;
    header.kind = Frame::Kind::kHeader;
    header.header = chunker_->header();
    Begin(nullptr, std::move(out), std::move(header));
  }

  // A receiving site: `in`'s header was admitted by `receiver`; `out` (may
  // be null) is the call to the next hop, which starts with `onward`.
  void StartReceiver(std::shared_ptr<Call> in,
                     std::shared_ptr<ModelReceiver> receiver,
                     std::shared_ptr<Call> out, v1::ModelHeader onward) {
    receiver_ = std::move(receiver);
    if (const ModelAdmission::ChainHop* hop = receiver_->chain_hop()) {
      absl::StatusOr<std::unique_ptr<StreamDigest>> digest =
          StreamDigest::Create(hop->onward.digest_algorithm());
      if (digest.ok()) digest_ = std::move(*digest);
      receiver_->set_emit(
          [this](uint32_t index, uint64_t offset, absl::string_view data) {
            return Emit(index, offset, data);
          });
    }
    Frame header;
    header.kind = Frame::Kind::kHeader;
    header.header = std::move(onward);
    Begin(std::move(in), std::move(out), std::move(header));
  }

 private:
  using Input = std::function<void(RelayProtocol&, absl::Time)>;

  void Begin(std::shared_ptr<Call> in, std::shared_ptr<Call> out,
             Frame header) {
    in_ = std::move(in);
    out_ = std::move(out);
    if (out_ != nullptr) {
      // The next hop's answer ends the onward side.
      out_->done = [self =
                        shared_from_this()](absl::StatusOr<PeerReply> reply) {
        self->Step([&](RelayProtocol& p, absl::Time now) {
          p.OnOnwardEnd(now, reply.ok() ? absl::StatusOr<v1::Reply>(
                                              std::move(reply->reply))
                                        : reply.status());
        });
      };
    }
    std::vector<Frame> frames;
    if (out_ != nullptr) frames.push_back(std::move(header));
    const size_t count = frames.size();
    Step([count](RelayProtocol& p, absl::Time now) { p.Start(now, count); },
         std::move(frames));
    if (out_ != nullptr) network_->Launch(out_);
  }

  // One input, then its actions carried out (outside the lock).
  void Step(const Input& input, std::vector<Frame> frames = {}) {
    RelayProtocol::Actions actions;
    std::optional<Frame> write;
    absl::Time arm = absl::InfiniteFuture();
    {
      absl::MutexLock lock(&mu_);
      for (Frame& frame : frames) queue_.Push(std::move(frame));
      input(protocol_, network_->Now());
      actions = protocol_.TakeActions();
      write = queue_.Apply(actions);
      const absl::Time deadline = protocol_.NextDeadline();
      if (deadline < armed_) arm = armed_ = deadline;
    }
    if (arm != absl::InfiniteFuture()) {
      network_->At(arm, [self = shared_from_this()] {
        self->network_->Run(self->site_, [self] { self->OnTimer(); });
      });
    }
    Carry(std::move(actions), std::move(write));
  }

  void OnTimer() {
    {
      absl::MutexLock lock(&mu_);
      armed_ = absl::InfiniteFuture();
    }
    Step([](RelayProtocol& p, absl::Time now) { p.Tick(now); });
  }

  void Carry(RelayProtocol::Actions actions, std::optional<Frame> write) {
    std::shared_ptr<RelayNode> self = shared_from_this();
    if (write.has_value()) {
      out_->pipe->Write(std::move(*write), [self](bool ok) {
        self->Step(
            [ok](RelayProtocol& p, absl::Time now) { p.OnWriteDone(now, ok); });
      });
    }
    if (actions.close_onward) out_->pipe->CloseWrites();
    if (actions.cancel_onward) {
      network_->Answer(out_, absl::CancelledError(absl::StrCat(
                                 "given up by ", site_, " (relay protocol)")));
    }
    if (actions.cancel_incoming) {
      network_->Answer(
          in_, absl::CancelledError(absl::StrCat("given up by ", site_,
                                                 ": the sender is idle")));
    }
    if (actions.read) Read();
    if (actions.to_site.has_value()) TellSite(*actions.to_site);
    if (actions.answer.has_value()) {
      PeerReply reply;
      reply.reply = std::move(*actions.answer);
      network_->Answer(in_, std::move(reply));
    }
    if (actions.onward_done.has_value()) {
      absl::StatusOr<PeerReply> done = PeerReply();
      if (actions.onward_done->ok()) {
        done->reply = std::move(**actions.onward_done);
      } else {
        done = actions.onward_done->status();
      }
      source_done_(std::move(done));
    }
  }

  void Read() {
    std::shared_ptr<RelayNode> self = shared_from_this();
    if (mode_ == RelayProtocol::Mode::kSource) {
      return network_->At(network_->Now(), [self] {
        self->network_->Run(self->site_, [self] { self->Produce(); });
      });
    }
    in_->pipe->Read([self](absl::StatusOr<std::optional<Frame>> frame) {
      self->OnIncoming(std::move(frame));
    });
  }

  // kSource: the next frame of this site's own stream.
  void Produce() {
    std::optional<ChunkRef> chunk = chunker_->NextChunk();
    std::vector<Frame> frames(1);
    if (!chunk.has_value()) {
      frames[0].kind = Frame::Kind::kTrailer;
      frames[0].trailer = chunker_->Trailer();
      return Step([](RelayProtocol& p,
                     absl::Time now) { p.OnReadEnd(now, absl::OkStatus(), 1); },
                  std::move(frames));
    }
    frames[0].tensor_index = chunk->tensor_index;
    frames[0].offset = chunk->offset;
    frames[0].data = chunk->data;
    frames[0].keep = chunker_;
    Step([](RelayProtocol& p, absl::Time now) { p.OnFrameRead(now, 1); },
         std::move(frames));
  }

  void OnIncoming(absl::StatusOr<std::optional<Frame>> frame) {
    Assembler* assembler = receiver_->assembler();
    absl::Status fed = frame.status();
    if (fed.ok() && assembler == nullptr) {
      fed = absl::InvalidArgumentError("bad header");
    }
    if (fed.ok() && !frame->has_value()) return OnIncomingEnd(assembler);
    std::vector<Frame> onward;
    if (fed.ok()) {
      Frame& in = **frame;
      if (in.kind == Frame::Kind::kChunk) {
        fed = assembler->OnChunk(in.tensor_index, in.offset, in.data);
      } else if (in.kind == Frame::Kind::kTrailer) {
        fed = assembler->OnTrailer(in.trailer);
      } else {
        fed = absl::InvalidArgumentError("a second header");
      }
      if (mode_ == RelayProtocol::Mode::kRelay) onward.push_back(std::move(in));
      if (mode_ == RelayProtocol::Mode::kHop) onward.swap(emitted_);
    }
    if (!fed.ok()) {
      if (assembler != nullptr) assembler->Abort(fed);
      return Step(
          [&](RelayProtocol& p, absl::Time now) { p.OnReadEnd(now, fed); });
    }
    const size_t count = onward.size();
    Step([count](RelayProtocol& p,
                 absl::Time now) { p.OnFrameRead(now, count); },
         std::move(onward));
  }

  void OnIncomingEnd(Assembler* assembler) {
    body_ = assembler->Finish();
    std::vector<Frame> onward;
    if (mode_ == RelayProtocol::Mode::kHop && body_.ok()) {
      Frame trailer;
      trailer.kind = Frame::Kind::kTrailer;
      if (digest_ != nullptr) trailer.trailer.set_digest(digest_->Finish());
      trailer.trailer.set_chunk_count(chunks_);
      onward.push_back(std::move(trailer));
    }
    const absl::Status status = body_.status();
    const size_t count = onward.size();
    Step([&](RelayProtocol& p,
             absl::Time now) { p.OnReadEnd(now, status, count); },
         std::move(onward));
  }

  // A hop's output chunk: on to the next hop (the digest of what goes out).
  absl::Status Emit(uint32_t index, uint64_t offset, absl::string_view data) {
    auto bytes = std::make_shared<const std::string>(data);
    if (digest_ != nullptr) digest_->AddChunk(index, offset, *bytes);
    ++chunks_;
    Frame frame;
    frame.tensor_index = index;
    frame.offset = offset;
    frame.data = *bytes;
    frame.keep = std::move(bytes);
    emitted_.push_back(std::move(frame));
    return absl::OkStatus();
  }

  void TellSite(const absl::Status& status) {
    absl::StatusOr<Model> model = Model();
    if (!status.ok()) {
      model = status;
    } else if (mode_ != RelayProtocol::Mode::kHop) {
      model = std::move(body_);
    }
    std::shared_ptr<RelayNode> self = shared_from_this();
    receiver_->Finish(std::move(model), [self](v1::Reply reply) {
      self->Step([&](RelayProtocol& p, absl::Time) {
        p.OnSiteReply(std::move(reply));
      });
    });
  }

  FakeNetwork* const network_;
  const std::string site_;
  const RelayProtocol::Mode mode_;
  absl::Mutex mu_;
  RelayProtocol protocol_ ABSL_GUARDED_BY(mu_);
  RelayQueue<Frame> queue_ ABSL_GUARDED_BY(mu_);
  absl::Time armed_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Set before the first step, then read only.
  std::shared_ptr<Call> in_;
  std::shared_ptr<Call> out_;
  // kSource.
  std::shared_ptr<Chunker> chunker_;
  PeerTransport::Done source_done_;
  // A receiving site (its reads are one at a time: the protocol's
  // obligation, which the link checks).
  std::shared_ptr<ModelReceiver> receiver_;
  std::unique_ptr<StreamDigest> digest_;
  uint64_t chunks_ = 0;
  std::vector<Frame> emitted_;
  absl::StatusOr<Model> body_ = absl::UnknownError("no body yet");
};

// ---------------------------------------------------------------------------

bool FakeNetwork::Relayed(const PeerMessage& message) {
  return message.is_model_stream() &&
         ((message.header.kind() == v1::MODEL_KIND_LEARN_TASK &&
           message.header.relay_to_size() > 0) ||
          message.header.kind() == v1::MODEL_KIND_PARTIAL_SUM);
}

std::shared_ptr<FakeNetwork::Call> FakeNetwork::NewRelayedCall(
    const std::string& from, const std::string& to, CallKind kind,
    const v1::ModelHeader& header, uint64_t body_bytes) {
  auto call = std::make_shared<Call>();
  CallRecord& record = call->record;
  record.kind = kind;
  record.from = from;
  record.to = to;
  record.round = header.round();
  record.aggregator = header.aggregator();
  record.model_kind = header.kind();
  record.failed_result = header.failed();
  record.body_bytes = body_bytes;
  call->message.kind = kind;
  call->message.header = header;
  call->target = Target(to);
  Plan(*call);
  size_t window;
  uint64_t chunk_size = header.chunk_size();
  {
    absl::MutexLock lock(&mu_);
    window = link_window_;
    if (chunk_size == 0) chunk_size = chunk_size_ != 0 ? chunk_size_ : 0;
  }
  call->pipe = std::make_shared<Pipe>(this, record, window);
  if (call->transfer > absl::ZeroDuration()) {
    chunk_size = std::max(chunk_size, kMinChunkSize);
    const uint64_t frames =
        std::max<uint64_t>(1, (body_bytes + chunk_size - 1) / chunk_size);
    call->pipe->set_per_frame(call->transfer / static_cast<int64_t>(frames));
  }
  return call;
}

void FakeNetwork::Launch(std::shared_ptr<Call> call) {
  const CallRecord& record = call->record;
  if (call->fault == Fault::kDrop) {
    return Answer(call, Unavailable(record, record.fault));
  }
  if (call->target == nullptr) {
    return Answer(call, Unavailable(record, "no such site"));
  }
  At(record.start + call->latency, [this, call] {
    Run(call->record.to, [this, call] { ArriveRelayed(call); });
  });
}

void FakeNetwork::SendRelayed(const std::string& from, const v1::SiteInfo& to,
                              PeerMessage message, PeerTransport::Done done) {
  uint64_t chunk_size = message.header.chunk_size();
  if (chunk_size == 0) {
    absl::MutexLock lock(&mu_);
    chunk_size = chunk_size_ != 0 ? chunk_size_ : kMinChunkSize;
  }
  std::shared_ptr<const Model> model = message.model != nullptr
                                           ? message.model
                                           : std::make_shared<const Model>();
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(model, message.header, chunk_size);
  if (!chunker.ok()) {
    return At(Now(), [done, status = chunker.status()] { done(status); });
  }
  std::shared_ptr<Chunker> source = std::move(*chunker);
  std::shared_ptr<Call> call = NewRelayedCall(
      from, to.name(), message.kind, source->header(), model->total_bytes());
  // As GrpcPeerTransport: the head's stall budget is the machine's
  // relay_stall, else the call's timeout.
  RelayBudgets budgets;
  budgets.stall = message.relay_stall > absl::ZeroDuration()
                      ? message.relay_stall
                      : message.timeout;
  auto node = std::make_shared<RelayNode>(
      this, from, RelayProtocol::Mode::kSource, budgets, to.name(),
      absl::StrCat("round ", message.round(), " ", CallKindName(message.kind),
                   " to ", to.name()));
  node->StartSource(std::move(source), std::move(call), std::move(done));
}

void FakeNetwork::ArriveRelayed(std::shared_ptr<Call> call) {
  if (!Reachable(call->record)) {
    return Answer(call, Unavailable(call->record, "unreachable on arrival"));
  }
  if (call->fault == Fault::kLoseAfterAck) {
    PeerReply acked;
    acked.reply = OkReply("acknowledged (lost by the fake network)");
    return Answer(call, std::move(acked));
  }
  {
    absl::MutexLock lock(&mu_);
    ++call->record.deliveries;
  }
  call->pipe->Read([this, call](absl::StatusOr<std::optional<Frame>> frame) {
    if (!frame.ok()) return Answer(call, frame.status());
    if (!frame->has_value() || (*frame)->kind != Frame::Kind::kHeader) {
      return Answer(call, absl::InvalidArgumentError(
                              "the first frame of a model stream must "
                              "be its header"));
    }
    AdmitRelayed(call, (*frame)->header);
  });
}

void FakeNetwork::AdmitRelayed(std::shared_ptr<Call> call,
                               const v1::ModelHeader& header) {
  const std::string& site = call->record.to;
  auto receiver = std::make_shared<ModelReceiver>(call->target);
  v1::ModelFrame frame;
  *frame.mutable_header() = header;
  absl::Status admitted = receiver->Begin(header, frame.ByteSizeLong());
  if (!admitted.ok()) return Answer(call, admitted);
  if (receiver->answered()) {
    PeerReply peer;
    peer.reply = receiver->reply();
    return Answer(call, std::move(peer));
  }
  RelayProtocol::Mode mode = RelayProtocol::Mode::kReceive;
  std::string next;
  v1::ModelHeader onward;
  if (const ModelAdmission::ChainHop* hop = receiver->chain_hop()) {
    mode = RelayProtocol::Mode::kHop;
    next = hop->next;
    onward = hop->onward;
  } else if (header.kind() == v1::MODEL_KIND_LEARN_TASK &&
             header.relay_to_size() > 0 &&
             Target(header.relay_to(0)) != nullptr) {
    mode = RelayProtocol::Mode::kRelay;
    next = header.relay_to(0);
    onward = header;
    onward.mutable_relay_to()->DeleteSubrange(0, 1);
  }
  std::shared_ptr<Call> out;
  if (mode != RelayProtocol::Mode::kReceive) {
    out = NewRelayedCall(site, next, call->record.kind, onward,
                         onward.total_bytes());
  }
  auto node = std::make_shared<RelayNode>(
      this, site, mode, receiver->relay_budgets(), next,
      absl::StrCat("round ", header.round(), " ",
                   v1::ModelKind_Name(header.kind()), " from ", header.sender(),
                   next.empty() ? "" : " to ", next));
  node->StartReceiver(std::move(call), std::move(receiver), std::move(out),
                      std::move(onward));
}

// ---------------------------------------------------------------------------
// Frozen sites and the protocol's errors.

void FakeNetwork::Freeze(const std::string& site) {
  absl::MutexLock lock(&mu_);
  frozen_[site];
}

void FakeNetwork::Thaw(const std::string& site) {
  std::vector<std::function<void()>> steps;
  {
    absl::MutexLock lock(&mu_);
    auto it = frozen_.find(site);
    if (it == frozen_.end()) return;
    steps = std::move(it->second);
    frozen_.erase(it);
  }
  for (std::function<void()>& step : steps) At(Now(), std::move(step));
}

void FakeNetwork::Run(const std::string& site, std::function<void()> step) {
  {
    absl::MutexLock lock(&mu_);
    auto it = frozen_.find(site);
    if (it != frozen_.end()) {
      it->second.push_back(std::move(step));
      return;
    }
  }
  step();
}

void FakeNetwork::set_link_window(size_t frames) {
  absl::MutexLock lock(&mu_);
  link_window_ = std::max<size_t>(1, frames);
}

void FakeNetwork::NoteProtocolError(std::string error) {
  absl::MutexLock lock(&mu_);
  protocol_errors_.push_back(std::move(error));
}

std::vector<std::string> FakeNetwork::ProtocolErrors() const {
  absl::MutexLock lock(&mu_);
  return protocol_errors_;
}

}  // namespace swarm
