// Model streams over gRPC without needless copies.
//
// Frames travel as raw grpc::ByteBuffers that are valid `swarm.v1.ModelFrame`
// messages on the wire, so any protobuf client interoperates. On send, a
// chunk's bytes are referenced from the model's storage (no copy: the
// transport hands them to the socket). On receive, a chunk's bytes are copied
// once, from gRPC's slices straight into the sink.
#ifndef SWARM_RPC_GRPC_STREAM_H_
#define SWARM_RPC_GRPC_STREAM_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/sync_stream.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"
#include "streaming/chunker.h"

namespace swarm {

// "/swarm.v1.Peer/<method>".
std::string PeerMethodPath(absl::string_view method);

// Largest gRPC message a model stream needs: the biggest chunk or header plus
// framing. Used as the receive limit instead of "unlimited".
int MaxModelFrameMessageBytes(const AssemblerLimits& limits);

// How often a site pings each peer's connection (HTTP/2 keepalive), and how
// long it waits for the answer before it closes a dead connection.
inline constexpr int kPeerKeepaliveMs = 10000;

// Channel and server settings for model streams: the receive limit above,
// large HTTP/2 frames.
void ApplyModelStreamArgs(grpc::ChannelArguments* args,
                          const AssemblerLimits& limits);
void ApplyModelStreamArgs(grpc::ServerBuilder* builder,
                          const AssemblerLimits& limits);

// Makes glibc malloc keep the buffers gRPC allocates for every socket read
// (up to a few MiB each) instead of mapping and unmapping them, which costs a
// page fault per 4 KiB received. Call once at start-up of a process that
// moves models; harmless elsewhere.
void TuneMallocForModelStreams();

// Frame encoding.
grpc::ByteBuffer EncodeHeaderFrame(const v1::ModelHeader& header);
// References chunk.data; `keep_alive` is held until gRPC releases the bytes.
grpc::ByteBuffer EncodeChunkFrame(const ChunkRef& chunk,
                                  std::shared_ptr<const void> keep_alive);
grpc::ByteBuffer EncodeTrailerFrame(const v1::ModelTrailer& trailer);

// Decodes one frame and feeds it to `assembler`. Chunk frames in the
// canonical field order take the single-copy path; anything else is parsed as
// a ModelFrame message.
absl::Status FeedFrame(grpc::ByteBuffer* frame, Assembler* assembler);

// Writes every frame of `chunker` with `write`; false from `write` means the
// stream broke (the caller learns why from the call's final status). The
// trailer's options mark it as the last message: on a client it leaves
// together with the half-close, on a server with the call's status.
bool WriteModelFrames(
    Chunker* chunker,
    absl::FunctionRef<bool(const grpc::ByteBuffer&, grpc::WriteOptions)> write);

// Reads frames with `read` until it returns false, then finishes the model.
absl::StatusOr<Model> ReadModelFrames(
    absl::FunctionRef<bool(grpc::ByteBuffer*)> read, Assembler* assembler);

// Client side of a client-streaming model RPC (LearnTask, SubmitResult,
// FinalResult) on gRPC's callback API: returns at once; no thread waits while
// the frames go out (one write in flight at a time). `done` runs once, on a
// gRPC thread, with the peer's reply or the failure (gRPC failures as absl
// statuses with the same code). REQUIRES: `channel` outlives the call.
void StartModelUpload(grpc::ChannelInterface* channel, absl::string_view method,
                      std::unique_ptr<grpc::ClientContext> context,
                      std::unique_ptr<Chunker> chunker,
                      std::function<void(absl::StatusOr<v1::Reply>)> done);

// The same, blocking the calling thread until the peer replies (tests and
// benches that measure one stream).
absl::StatusOr<v1::Reply> StreamModelToPeer(grpc::ChannelInterface* channel,
                                            absl::string_view method,
                                            grpc::ClientContext* context,
                                            Chunker* chunker);

// Server side: receives a whole stream into `assembler`.
absl::StatusOr<Model> ReceiveModelStream(
    grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
    Assembler* assembler);

// Server side of a server-streaming model RPC (FetchModel).
bool SendModelStream(grpc::ServerWriterInterface<grpc::ByteBuffer>* writer,
                     Chunker* chunker);

// Client side of FetchModel: streams the reply into `assembler`.
absl::StatusOr<Model> FetchModelFromPeer(grpc::ChannelInterface* channel,
                                         grpc::ClientContext* context,
                                         const v1::FetchModelRequest& request,
                                         Assembler* assembler);

// How a client-streaming model upload ended: an OK status with a reply
// means the peer decided, even if it stopped reading early (it refused the
// header); the reply says why. A failed status, or an upload that broke off
// without a reply, is an error naming `path`.
absl::StatusOr<v1::Reply> UploadOutcome(const grpc::Status& status,
                                        v1::Reply reply, bool all_written,
                                        absl::string_view path);

// absl <-> gRPC status conversions.
absl::Status ToAbslStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

// A grpc::Service whose model-stream methods take raw ByteBuffers and whose
// control methods take generated messages. Subclasses register methods with
// the Add* helpers (the generated Peer::Service cannot mix the two).
class RawModelService : public grpc::Service {
 public:
  using UploadHandler = std::function<grpc::Status(
      grpc::ServerContext*, grpc::ServerReader<grpc::ByteBuffer>*, v1::Reply*)>;
  using CallbackUploadHandler =
      std::function<grpc::ServerReadReactor<grpc::ByteBuffer>*(
          grpc::CallbackServerContext*, v1::Reply*)>;
  using DownloadHandler = std::function<grpc::Status(
      grpc::ServerContext*, const v1::FetchModelRequest*,
      grpc::ServerWriter<grpc::ByteBuffer>*)>;

 protected:
  // A client-streaming method whose request frames are raw.
  void AddModelUploadMethod(absl::string_view method, UploadHandler handler);
  // The same on gRPC's callback API: `handler` returns the reactor that
  // reads the frames (no thread waits for them).
  void AddCallbackUploadMethod(absl::string_view method,
                               CallbackUploadHandler handler);
  // FetchModel: unary request, raw response frames.
  void AddModelDownloadMethod(absl::string_view method,
                              DownloadHandler handler);

  template <typename Request, typename Response>
  void AddUnaryMethod(absl::string_view method,
                      std::function<grpc::Status(grpc::ServerContext*,
                                                 const Request*, Response*)>
                          handler);

  // A unary method on gRPC's callback API: `handler` returns a reactor that
  // finishes the call later (a held request parks no thread).
  template <typename Request, typename Response>
  void AddCallbackUnaryMethod(
      absl::string_view method,
      std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*,
                                              const Request*, Response*)>
          handler);

 private:
  // Adds `method`; returns its index (for MarkMethodCallback).
  int AddCountedMethod(grpc::internal::RpcServiceMethod* method);
  // RpcServiceMethod keeps a const char* to the name.
  const char* StoreName(absl::string_view method);
  std::vector<std::unique_ptr<std::string>> names_;
  int methods_added_ = 0;
};

}  // namespace swarm

#include "rpc/grpc_stream_inl.h"

#endif  // SWARM_RPC_GRPC_STREAM_H_
