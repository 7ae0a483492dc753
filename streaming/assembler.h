// Turns a stream of model frames back into a model, enforcing the frame rules
// of design section 7, and writes the bytes into a TensorSink.
//
// Frame rules: exactly one header, first; a valid tensor table (unique names,
// known dtypes, byte sizes equal to shape x dtype size, totals within limits,
// and, when expected_specs is set, the same names, dtypes and shapes); chunks
// that name a known tensor, lie inside it, are not empty and never overlap;
// one trailer, after which nothing may come; at the trailer every byte of
// every tensor has arrived, the chunk count matches and the digest matches.
// The first violation puts the assembler in a failed state: the sink is
// aborted and every later call returns that first error.
#ifndef SWARM_STREAMING_ASSEMBLER_H_
#define SWARM_STREAMING_ASSEMBLER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"
#include "streaming/digest.h"

namespace swarm {

struct AssemblerLimits {
  // Serialized header size.
  uint64_t max_header_bytes = 16ull << 20;
  // Sum of the tensors' byte sizes.
  uint64_t max_model_bytes = 64ull << 30;
  uint64_t max_tensors = 1ull << 20;
  uint64_t max_chunk_bytes = 64ull << 20;
};

struct AssemblerOptions {
  AssemblerLimits limits;
  // When set, the header's tensor table must match these specs exactly (the
  // round's model): same order, names, dtypes and shapes.
  std::optional<std::vector<TensorSpec>> expected_specs;
  // When not empty, tensors after the expected ones are let in when their
  // names start with this (a server optimizer's state; its owner checks
  // their shapes).
  std::string extra_tensor_prefix;
  // When set, the header must be of this kind.
  std::optional<v1::ModelKind> expected_kind;
};

// Handed to a chunk's filler (Assembler::OnChunk): takes the chunk's bytes,
// in order, as the filler writes them, for the stream digest.
class ChunkDigestFeed {
 public:
  explicit ChunkDigestFeed(StreamDigest* digest) : digest_(digest) {}
  ChunkDigestFeed(const ChunkDigestFeed&) = delete;
  ChunkDigestFeed& operator=(const ChunkDigestFeed&) = delete;

  void Add(absl::string_view bytes) {
    digest_->AddChunkBytes(bytes);
    fed_ += bytes.size();
  }
  uint64_t fed() const { return fed_; }

 private:
  StreamDigest* digest_;
  uint64_t fed_ = 0;
};

class Assembler {
 public:
  // `sink` must outlive the assembler.
  Assembler(TensorSink* sink, AssemblerOptions options);
  ~Assembler();
  Assembler(const Assembler&) = delete;
  Assembler& operator=(const Assembler&) = delete;

  // `serialized_size` is the header's size on the wire.
  absl::Status OnHeader(const v1::ModelHeader& header,
                        uint64_t serialized_size);

  // A chunk of `size` bytes at `offset` of tensor `tensor_index`. After the
  // range is validated, `fill(dst, feed)` must write exactly `size` bytes to
  // dst and pass the same bytes, in order, to `feed` (from wherever they are
  // hottest in cache); a feed of any other length fails the stream.
  absl::Status OnChunk(
      uint32_t tensor_index, uint64_t offset, uint64_t size,
      absl::FunctionRef<absl::Status(char* dst, ChunkDigestFeed* feed)> fill);
  absl::Status OnChunk(uint32_t tensor_index, uint64_t offset,
                       absl::string_view data);

  absl::Status OnTrailer(const v1::ModelTrailer& trailer);

  // Dispatches a parsed frame (copies chunk bytes once).
  absl::Status OnFrame(const v1::ModelFrame& frame);

  // After the stream ended: the model, or the stream's error (a missing
  // trailer is an error). Call once.
  absl::StatusOr<Model> Finish();

  // Marks the stream failed (e.g. cancelled) and aborts the sink.
  void Abort(absl::Status reason);

  // Valid after a successful OnHeader.
  const v1::ModelHeader& header() const { return header_; }
  bool has_header() const { return stage_ != Stage::kWantHeader; }
  const absl::Status& error() const { return error_; }
  uint64_t bytes_received() const { return bytes_received_; }
  // The digest this assembler computed over the chunks it received (equal
  // to the trailer's). Empty until the trailer was checked.
  const std::string& stream_digest() const { return stream_digest_; }

 private:
  enum class Stage { kWantHeader, kChunks, kTrailed, kFinished, kFailed };

  absl::Status Fail(absl::Status status);
  absl::Status ValidateHeader(const v1::ModelHeader& header,
                              uint64_t serialized_size);
  // Records [offset, offset+size) of `tensor` as received; error on overlap.
  absl::Status MarkReceived(uint32_t tensor, uint64_t offset, uint64_t size);

  TensorSink* sink_;
  AssemblerOptions options_;
  Stage stage_ = Stage::kWantHeader;
  absl::Status error_;
  v1::ModelHeader header_;
  std::vector<TensorSpec> specs_;
  std::unique_ptr<StreamDigest> digest_;
  // Per tensor: received ranges as begin -> end, merged when adjacent.
  std::vector<std::map<uint64_t, uint64_t>> received_;
  uint64_t chunks_ = 0;
  uint64_t bytes_received_ = 0;
  std::string stream_digest_;
};

}  // namespace swarm

#endif  // SWARM_STREAMING_ASSEMBLER_H_
