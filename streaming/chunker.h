// Turns a model into a header, chunks of at most `chunk_size` bytes, and a
// trailer whose digest is computed as the chunks are produced.
#ifndef SWARM_STREAMING_CHUNKER_H_
#define SWARM_STREAMING_CHUNKER_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/swarm.pb.h"
#include "streaming/digest.h"
#include "model/model.h"

namespace swarm {

inline constexpr uint64_t kDefaultChunkSize = 1ull << 20;
inline constexpr uint64_t kMinChunkSize = 4096;
inline constexpr uint64_t kMaxChunkSize = 64ull << 20;

// A view of one chunk's bytes inside the model; valid while the model lives.
struct ChunkRef {
  uint32_t tensor_index = 0;
  uint64_t offset = 0;
  absl::string_view data;
};

class Chunker {
 public:
  // `header` supplies kind, job, round, sender, metrics, ...; the tensor
  // table, total_bytes, chunk_size and digest_algorithm are filled in from the
  // model and arguments. Fails on a chunk size outside
  // [kMinChunkSize, kMaxChunkSize] or an unknown digest algorithm.
  static absl::StatusOr<std::unique_ptr<Chunker>> Create(
      std::shared_ptr<const Model> model, v1::ModelHeader header,
      uint64_t chunk_size = kDefaultChunkSize);

  Chunker(const Chunker&) = delete;
  Chunker& operator=(const Chunker&) = delete;

  const v1::ModelHeader& header() const { return header_; }
  const std::shared_ptr<const Model>& model() const { return model_; }

  // The next chunk in tensor order, or nullopt after the last one.
  // Zero-size tensors produce no chunk.
  std::optional<ChunkRef> NextChunk();

  // Caller obligation: NextChunk() returned nullopt. Call once.
  v1::ModelTrailer Trailer();

 private:
  Chunker(std::shared_ptr<const Model> model, v1::ModelHeader header,
          uint64_t chunk_size, std::unique_ptr<StreamDigest> digest);

  std::shared_ptr<const Model> model_;
  v1::ModelHeader header_;
  uint64_t chunk_size_;
  std::unique_ptr<StreamDigest> digest_;
  size_t tensor_ = 0;
  uint64_t offset_ = 0;
  uint64_t chunks_ = 0;
};

}  // namespace swarm

#endif  // SWARM_STREAMING_CHUNKER_H_
