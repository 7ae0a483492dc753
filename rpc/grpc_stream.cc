#include "rpc/grpc_stream.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <malloc.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/swarm.grpc.pb.h"

namespace swarm {
namespace {

// Wire tags of the ModelFrame / ModelChunk fields (field number << 3 | type).
constexpr uint32_t kFrameChunkTag = (2 << 3) | 2;
constexpr uint32_t kChunkTensorIndexTag = (1 << 3) | 0;
constexpr uint32_t kChunkOffsetTag = (2 << 3) | 0;
constexpr uint32_t kChunkDataTag = (3 << 3) | 2;

// Framing around the largest chunk or header: tags, lengths, gRPC prefix.
constexpr int kFrameOverhead = 4096;

// Initial HTTP/2 stream window; see ApplyModelStreamArgs.
constexpr int kStreamWindowBytes = 32 << 20;

uint8_t* PutVarint(uint64_t value, uint8_t* out) {
  while (value >= 0x80) {
    *out++ = static_cast<uint8_t>(value | 0x80);
    value >>= 7;
  }
  *out++ = static_cast<uint8_t>(value);
  return out;
}

size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

void ReleaseKeepAlive(void* keep_alive) {
  delete static_cast<std::shared_ptr<const void>*>(keep_alive);
}

grpc::ByteBuffer SerializedBuffer(
    const google::protobuf::MessageLite& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// The single-copy path for a canonically encoded chunk frame. Returns
// nullopt when the frame is something else (the caller then parses it fully).
std::optional<absl::Status> TryFeedChunk(grpc::ByteBuffer* frame,
                                         Assembler* assembler) {
  grpc::ProtoBufferReader reader(frame);
  if (!reader.status().ok()) return std::nullopt;
  google::protobuf::io::CodedInputStream in(&reader);
  if (in.ReadTag() != kFrameChunkTag) return std::nullopt;
  uint32_t chunk_size = 0;
  if (!in.ReadVarint32(&chunk_size)) return std::nullopt;
  const auto outer_limit = in.PushLimit(static_cast<int>(chunk_size));
  uint32_t tensor_index = 0;
  uint64_t offset = 0;
  uint32_t tag = in.ReadTag();
  if (tag == kChunkTensorIndexTag) {
    if (!in.ReadVarint32(&tensor_index)) return std::nullopt;
    tag = in.ReadTag();
  }
  if (tag == kChunkOffsetTag) {
    if (!in.ReadVarint64(&offset)) return std::nullopt;
    tag = in.ReadTag();
  }
  if (tag != kChunkDataTag) return std::nullopt;
  uint32_t data_size = 0;
  if (!in.ReadVarint32(&data_size)) return std::nullopt;
  // Only when the data is the chunk's last field are index and offset final.
  if (in.BytesUntilLimit() != static_cast<int>(data_size)) return std::nullopt;
  // Piece by piece straight out of gRPC's slices: each piece is digested
  // while it is still in cache from decryption or the socket read, then
  // copied once into the sink.
  absl::Status status = assembler->OnChunk(
      tensor_index, offset, data_size, [&](char* dst, ChunkDigestFeed* feed) {
        uint32_t left = data_size;
        while (left > 0) {
          const void* piece = nullptr;
          int piece_size = 0;
          if (!in.GetDirectBufferPointer(&piece, &piece_size) ||
              piece_size <= 0) {
            return absl::DataLossError("chunk frame is truncated");
          }
          const uint32_t take =
              std::min<uint32_t>(left, static_cast<uint32_t>(piece_size));
          feed->Add(absl::string_view(static_cast<const char*>(piece), take));
          std::memcpy(dst, piece, take);
          in.Skip(static_cast<int>(take));
          dst += take;
          left -= take;
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  in.PopLimit(outer_limit);
  if (in.ReadTag() != 0) {
    absl::Status trailing = absl::InvalidArgumentError(
        "unexpected fields after a chunk in its frame");
    assembler->Abort(trailing);
    return trailing;
  }
  return absl::OkStatus();
}

}  // namespace

std::string PeerMethodPath(absl::string_view method) {
  return absl::StrCat("/", v1::Peer::service_full_name(), "/", method);
}

int MaxModelFrameMessageBytes(const AssemblerLimits& limits) {
  const uint64_t biggest =
      std::max(limits.max_chunk_bytes, limits.max_header_bytes) +
      kFrameOverhead;
  return static_cast<int>(std::min<uint64_t>(biggest, INT32_MAX));
}

void ApplyModelStreamArgs(grpc::ChannelArguments* args,
                          const AssemblerLimits& limits) {
  args->SetMaxReceiveMessageSize(MaxModelFrameMessageBytes(limits));
  args->SetMaxSendMessageSize(MaxModelFrameMessageBytes(limits));
  // Fewer, larger HTTP/2 DATA frames (the protocol's maximum).
  args->SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 24) - 1);
  // Start with a flow-control window of several chunks instead of 64 KiB, so
  // a new stream runs at full speed at once instead of waiting for the
  // bandwidth-delay estimate to grow it.
  args->SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  // No GRPC_ARG_TSI_MAX_FRAME_SIZE: gRPC caps TLS protected frames at 16 KiB
  // (one TLS record) whatever is asked, so setting it changes nothing.
}

void ApplyModelStreamArgs(grpc::ServerBuilder* builder,
                          const AssemblerLimits& limits) {
  builder->SetMaxReceiveMessageSize(MaxModelFrameMessageBytes(limits));
  builder->SetMaxSendMessageSize(MaxModelFrameMessageBytes(limits));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 24) - 1);
  // Peers ping every kPeerKeepaliveMs (PeerChannels): accepted, never
  // counted as abuse (by default a server sends GOAWAY to a client pinging
  // more often than every 5 minutes without data).
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      kPeerKeepaliveMs / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                              kStreamWindowBytes);
}

void TuneMallocForModelStreams() {
  // Served from the heap up to 32 MiB (glibc's maximum for this setting)...
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  // ...and up to 256 MiB of free heap top kept instead of trimmed.
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

grpc::ByteBuffer EncodeHeaderFrame(const v1::ModelHeader& header) {
  v1::ModelFrame frame;
  *frame.mutable_header() = header;
  return SerializedBuffer(frame);
}

grpc::ByteBuffer EncodeTrailerFrame(const v1::ModelTrailer& trailer) {
  v1::ModelFrame frame;
  *frame.mutable_trailer() = trailer;
  return SerializedBuffer(frame);
}

grpc::ByteBuffer EncodeChunkFrame(const ChunkRef& chunk,
                                  std::shared_ptr<const void> keep_alive) {
  const uint64_t size = chunk.data.size();
  const uint64_t inner = 1 + VarintSize(chunk.tensor_index) + 1 +
                         VarintSize(chunk.offset) + 1 + VarintSize(size) + size;
  uint8_t prefix[48];
  uint8_t* out = prefix;
  *out++ = kFrameChunkTag;
  out = PutVarint(inner, out);
  *out++ = kChunkTensorIndexTag;
  out = PutVarint(chunk.tensor_index, out);
  *out++ = kChunkOffsetTag;
  out = PutVarint(chunk.offset, out);
  *out++ = kChunkDataTag;
  out = PutVarint(size, out);
  grpc::Slice slices[2] = {
      grpc::Slice(prefix, static_cast<size_t>(out - prefix)),
      grpc::Slice(const_cast<char*>(chunk.data.data()), size, &ReleaseKeepAlive,
                  new std::shared_ptr<const void>(std::move(keep_alive)))};
  return grpc::ByteBuffer(slices, size == 0 ? 1 : 2);
}

absl::Status FeedFrame(grpc::ByteBuffer* frame, Assembler* assembler) {
  if (std::optional<absl::Status> fed = TryFeedChunk(frame, assembler)) {
    return *fed;
  }
  v1::ModelFrame message;
  grpc::ProtoBufferReader reader(frame);
  if (!reader.status().ok() || !message.ParseFromZeroCopyStream(&reader)) {
    absl::Status malformed = absl::InvalidArgumentError(
        "malformed frame: not a swarm.v1.ModelFrame");
    assembler->Abort(malformed);
    return malformed;
  }
  return assembler->OnFrame(message);
}

bool WriteModelFrames(
    Chunker* chunker,
    absl::FunctionRef<bool(const grpc::ByteBuffer&, grpc::WriteOptions)>
        write) {
  if (!write(EncodeHeaderFrame(chunker->header()), grpc::WriteOptions())) {
    return false;
  }
  // The storage stays alive until gRPC has released every chunk's bytes.
  const std::shared_ptr<const void> keep_alive = chunker->model()->storage();
  while (std::optional<ChunkRef> chunk = chunker->NextChunk()) {
    if (!write(EncodeChunkFrame(*chunk, keep_alive), grpc::WriteOptions())) {
      return false;
    }
  }
  return write(EncodeTrailerFrame(chunker->Trailer()),
               grpc::WriteOptions().set_last_message());
}

absl::StatusOr<Model> ReadModelFrames(
    absl::FunctionRef<bool(grpc::ByteBuffer*)> read, Assembler* assembler) {
  grpc::ByteBuffer frame;
  while (read(&frame)) {
    absl::Status fed = FeedFrame(&frame, assembler);
    if (!fed.ok()) return fed;
  }
  return assembler->Finish();
}

absl::Status ToAbslStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::StatusOr<v1::Reply> StreamModelToPeer(grpc::ChannelInterface* channel,
                                            absl::string_view method,
                                            grpc::ClientContext* context,
                                            Chunker* chunker) {
  const std::string path = PeerMethodPath(method);
  const grpc::internal::RpcMethod rpc(
      path.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING);
  v1::Reply reply;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          channel, rpc, context, &reply));
  // The trailer's write is the last message and also closes this side.
  const bool written = WriteModelFrames(
      chunker, [&](const grpc::ByteBuffer& frame, grpc::WriteOptions options) {
        return writer->Write(frame, options);
      });
  const grpc::Status status = writer->Finish();
  return UploadOutcome(status, std::move(reply), written, path);
}

absl::StatusOr<v1::Reply> UploadOutcome(const grpc::Status& status,
                                        v1::Reply reply, bool all_written,
                                        absl::string_view path) {
  if (!status.ok()) return ToAbslStatus(status);
  if (!all_written && reply.message().empty()) {
    return absl::UnavailableError(
        absl::StrCat("model stream to ", path, " broke"));
  }
  return reply;
}

namespace {

// One model upload as a client write reactor: header, chunks, trailer, one
// write in flight at a time; deletes itself when the call is done.
class ModelUpload final : public grpc::ClientWriteReactor<grpc::ByteBuffer> {
 public:
  ModelUpload(absl::string_view method,
              std::unique_ptr<grpc::ClientContext> context,
              std::unique_ptr<Chunker> chunker,
              std::function<void(absl::StatusOr<v1::Reply>)> done)
      : path_(PeerMethodPath(method)),
        rpc_(path_.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING),
        context_(std::move(context)),
        chunker_(std::move(chunker)),
        keep_alive_(chunker_->model()->storage()),
        done_(std::move(done)) {}

  void Start(grpc::ChannelInterface* channel) {
    grpc::internal::ClientCallbackWriterFactory<grpc::ByteBuffer>::Create(
        channel, rpc_, context_.get(), &reply_, this);
    frame_ = EncodeHeaderFrame(chunker_->header());
    StartWrite(&frame_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok || last_sent_) {
      // Broken (the peer may have answered already), or all written: the
      // call's status comes with OnDone.
      all_written_ = ok && last_sent_;
      return;
    }
    // The storage stays alive until gRPC has released every chunk's bytes.
    if (std::optional<ChunkRef> chunk = chunker_->NextChunk()) {
      frame_ = EncodeChunkFrame(*chunk, keep_alive_);
      StartWrite(&frame_);
      return;
    }
    frame_ = EncodeTrailerFrame(chunker_->Trailer());
    last_sent_ = true;
    StartWriteLast(&frame_, grpc::WriteOptions());
  }

  void OnDone(const grpc::Status& status) override {
    absl::StatusOr<v1::Reply> result =
        UploadOutcome(status, std::move(reply_), all_written_, path_);
    std::function<void(absl::StatusOr<v1::Reply>)> done = std::move(done_);
    delete this;
    done(std::move(result));
  }

 private:
  const std::string path_;
  const grpc::internal::RpcMethod rpc_;
  const std::unique_ptr<grpc::ClientContext> context_;
  const std::unique_ptr<Chunker> chunker_;
  const std::shared_ptr<const void> keep_alive_;
  std::function<void(absl::StatusOr<v1::Reply>)> done_;
  grpc::ByteBuffer frame_;
  v1::Reply reply_;
  bool last_sent_ = false;
  bool all_written_ = false;
};

}  // namespace

void StartModelUpload(grpc::ChannelInterface* channel, absl::string_view method,
                      std::unique_ptr<grpc::ClientContext> context,
                      std::unique_ptr<Chunker> chunker,
                      std::function<void(absl::StatusOr<v1::Reply>)> done) {
  auto* upload = new ModelUpload(method, std::move(context), std::move(chunker),
                                 std::move(done));
  upload->Start(channel);
}

absl::StatusOr<Model> ReceiveModelStream(
    grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
    Assembler* assembler) {
  return ReadModelFrames(
      [reader](grpc::ByteBuffer* frame) { return reader->Read(frame); },
      assembler);
}

bool SendModelStream(grpc::ServerWriterInterface<grpc::ByteBuffer>* writer,
                     Chunker* chunker) {
  return WriteModelFrames(chunker, [writer](const grpc::ByteBuffer& frame,
                                            grpc::WriteOptions options) {
    return writer->Write(frame, options);
  });
}

absl::StatusOr<Model> FetchModelFromPeer(grpc::ChannelInterface* channel,
                                         grpc::ClientContext* context,
                                         const v1::FetchModelRequest& request,
                                         Assembler* assembler) {
  const std::string path = PeerMethodPath("FetchModel");
  const grpc::internal::RpcMethod rpc(
      path.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          channel, rpc, context, request));
  absl::StatusOr<Model> model = ReadModelFrames(
      [&](grpc::ByteBuffer* frame) { return reader->Read(frame); }, assembler);
  if (!model.ok()) context->TryCancel();
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    // The server's reason beats "stream ended without a trailer".
    assembler->Abort(ToAbslStatus(status));
    return ToAbslStatus(status);
  }
  return model;
}

int RawModelService::AddCountedMethod(
    grpc::internal::RpcServiceMethod* method) {
  AddMethod(method);
  return methods_added_++;
}

void RawModelService::AddModelUploadMethod(absl::string_view method,
                                           UploadHandler handler) {
  using Handler =
      grpc::internal::ClientStreamingHandler<RawModelService, grpc::ByteBuffer,
                                             v1::Reply>;
  AddCountedMethod(new grpc::internal::RpcServiceMethod(
      StoreName(method), grpc::internal::RpcMethod::CLIENT_STREAMING,
      new Handler(
          [handler](RawModelService*, grpc::ServerContext* context,
                    grpc::ServerReader<grpc::ByteBuffer>* reader,
                    v1::Reply* reply) {
            return handler(context, reader, reply);
          },
          this)));
}

void RawModelService::AddCallbackUploadMethod(absl::string_view method,
                                              CallbackUploadHandler handler) {
  const int index = AddCountedMethod(new grpc::internal::RpcServiceMethod(
      StoreName(method), grpc::internal::RpcMethod::CLIENT_STREAMING, nullptr));
  MarkMethodCallback(
      index,
      new grpc::internal::CallbackClientStreamingHandler<grpc::ByteBuffer,
                                                         v1::Reply>(
          [handler](grpc::CallbackServerContext* context, v1::Reply* reply) {
            return handler(context, reply);
          }));
}

void RawModelService::AddModelDownloadMethod(absl::string_view method,
                                             DownloadHandler handler) {
  using Handler = grpc::internal::ServerStreamingHandler<
      RawModelService, v1::FetchModelRequest, grpc::ByteBuffer>;
  AddCountedMethod(new grpc::internal::RpcServiceMethod(
      StoreName(method), grpc::internal::RpcMethod::SERVER_STREAMING,
      new Handler(
          [handler](RawModelService*, grpc::ServerContext* context,
                    const v1::FetchModelRequest* request,
                    grpc::ServerWriter<grpc::ByteBuffer>* writer) {
            return handler(context, request, writer);
          },
          this)));
}

const char* RawModelService::StoreName(absl::string_view method) {
  names_.push_back(std::make_unique<std::string>(PeerMethodPath(method)));
  return names_.back()->c_str();
}

}  // namespace swarm
