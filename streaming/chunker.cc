#include "streaming/chunker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace swarm {

absl::StatusOr<std::unique_ptr<Chunker>> Chunker::Create(
    std::shared_ptr<const Model> model, v1::ModelHeader header,
    uint64_t chunk_size) {
  if (model == nullptr) return absl::InvalidArgumentError("no model to send");
  if (chunk_size < kMinChunkSize || chunk_size > kMaxChunkSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size ", chunk_size, " is outside [", kMinChunkSize,
                     ", ", kMaxChunkSize, "]"));
  }
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<StreamDigest> digest,
                         StreamDigest::Create(header.digest_algorithm()));
  header.clear_tensors();
  for (const v1::TensorInfo& info : model->TensorTable()) {
    *header.add_tensors() = info;
  }
  header.set_total_bytes(model->total_bytes());
  header.set_chunk_size(chunk_size);
  return std::unique_ptr<Chunker>(new Chunker(
      std::move(model), std::move(header), chunk_size, std::move(digest)));
}

Chunker::Chunker(std::shared_ptr<const Model> model, v1::ModelHeader header,
                 uint64_t chunk_size, std::unique_ptr<StreamDigest> digest)
    : model_(std::move(model)),
      header_(std::move(header)),
      chunk_size_(chunk_size),
      digest_(std::move(digest)) {}

std::optional<ChunkRef> Chunker::NextChunk() {
  while (tensor_ < model_->num_tensors() &&
         offset_ >= model_->spec(tensor_).byte_size) {
    ++tensor_;
    offset_ = 0;
  }
  if (tensor_ >= model_->num_tensors()) return std::nullopt;
  const absl::string_view bytes = model_->tensor_data(tensor_);
  ChunkRef chunk;
  chunk.tensor_index = static_cast<uint32_t>(tensor_);
  chunk.offset = offset_;
  chunk.data = bytes.substr(
      offset_, std::min<uint64_t>(chunk_size_, bytes.size() - offset_));
  offset_ += chunk.data.size();
  ++chunks_;
  digest_->AddChunk(chunk.tensor_index, chunk.offset, chunk.data);
  return chunk;
}

v1::ModelTrailer Chunker::Trailer() {
  v1::ModelTrailer trailer;
  trailer.set_digest(digest_->Finish());
  trailer.set_chunk_count(chunks_);
  return trailer;
}

}  // namespace swarm
