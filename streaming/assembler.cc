#include "streaming/assembler.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace swarm {

Assembler::Assembler(TensorSink* sink, AssemblerOptions options)
    : sink_(sink), options_(std::move(options)) {}

Assembler::~Assembler() {
  if (stage_ == Stage::kChunks || stage_ == Stage::kTrailed) sink_->Abort();
}

absl::Status Assembler::Fail(absl::Status status) {
  if (stage_ == Stage::kFailed) return error_;
  const bool sink_begun = stage_ == Stage::kChunks || stage_ == Stage::kTrailed;
  stage_ = Stage::kFailed;
  error_ = std::move(status);
  if (sink_begun) sink_->Abort();
  return error_;
}

void Assembler::Abort(absl::Status reason) {
  if (stage_ == Stage::kFinished) return;
  Fail(std::move(reason)).IgnoreError();
}

absl::Status Assembler::ValidateHeader(const v1::ModelHeader& header,
                                       uint64_t serialized_size) {
  const AssemblerLimits& limits = options_.limits;
  if (serialized_size > limits.max_header_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header of ", serialized_size,
                     " bytes exceeds the limit of ", limits.max_header_bytes));
  }
  if (options_.expected_kind.has_value() &&
      header.kind() != *options_.expected_kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header kind ", v1::ModelKind_Name(header.kind()), " where ",
        v1::ModelKind_Name(*options_.expected_kind), " was expected"));
  }
  if (static_cast<uint64_t>(header.tensors_size()) > limits.max_tensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("header lists ", header.tensors_size(),
                     " tensors, more than the limit of ", limits.max_tensors));
  }
  SWARM_ASSIGN_OR_RETURN(digest_,
                         StreamDigest::Create(header.digest_algorithm()));
  specs_.clear();
  specs_.reserve(header.tensors_size());
  absl::flat_hash_set<absl::string_view> names;
  uint64_t total = 0;
  for (const v1::TensorInfo& info : header.tensors()) {
    SWARM_ASSIGN_OR_RETURN(TensorSpec spec, TensorSpecFromInfo(info));
    if (!names.insert(info.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name \"", info.name(), "\""));
    }
    if (spec.byte_size > UINT64_MAX - total) {
      return absl::InvalidArgumentError("model size overflows 64 bits");
    }
    total += spec.byte_size;
    specs_.push_back(std::move(spec));
  }
  if (total != header.total_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header total_bytes ", header.total_bytes(),
                     " differs from the tensors' sum ", total));
  }
  if (total > limits.max_model_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model of ", total, " bytes exceeds the limit of ",
                     limits.max_model_bytes));
  }
  if (options_.expected_specs.has_value()) {
    const std::vector<TensorSpec>& expected = *options_.expected_specs;
    for (size_t i = 0; i < expected.size() || i < specs_.size(); ++i) {
      if (i >= specs_.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", expected[i].name,
                         "\" of the round's model is missing"));
      }
      if (i >= expected.size()) {
        if (!options_.extra_tensor_prefix.empty() &&
            absl::StartsWith(specs_[i].name, options_.extra_tensor_prefix)) {
          continue;
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", specs_[i].name, "\" is not in the round's model"));
      }
      if (specs_[i].name != expected[i].name) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor #", i, " is \"", specs_[i].name,
            "\" where the round's model has \"", expected[i].name, "\""));
      }
      if (specs_[i] != expected[i]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", specs_[i].name,
            "\" differs in dtype or shape from the round's model"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Assembler::OnHeader(const v1::ModelHeader& header,
                                 uint64_t serialized_size) {
  switch (stage_) {
    case Stage::kWantHeader:
      break;
    case Stage::kFailed:
      return error_;
    case Stage::kTrailed:
    case Stage::kFinished:
      return Fail(absl::InvalidArgumentError("frame after the trailer"));
    case Stage::kChunks:
      return Fail(absl::InvalidArgumentError("second header in one stream"));
  }
  absl::Status valid = ValidateHeader(header, serialized_size);
  if (!valid.ok()) return Fail(std::move(valid));
  header_ = header;
  received_.assign(specs_.size(), {});
  absl::Status begun = sink_->Begin(header_, specs_);
  if (!begun.ok()) return Fail(std::move(begun));
  stage_ = Stage::kChunks;
  return absl::OkStatus();
}

absl::Status Assembler::MarkReceived(uint32_t tensor, uint64_t offset,
                                     uint64_t size) {
  std::map<uint64_t, uint64_t>& ranges = received_[tensor];
  const uint64_t end = offset + size;
  // The first range starting after `offset`, and the one before it.
  auto next = ranges.upper_bound(offset);
  if (next != ranges.end() && next->first < end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk [", offset, ", ", end, ") of tensor \"", specs_[tensor].name,
        "\" overlaps bytes already received"));
  }
  auto prev = next == ranges.begin() ? ranges.end() : std::prev(next);
  if (prev != ranges.end() && prev->second > offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk [", offset, ", ", end, ") of tensor \"", specs_[tensor].name,
        "\" overlaps bytes already received"));
  }
  // Insert, merging with adjacent neighbours (the in-order case is O(1)).
  uint64_t new_end = end;
  if (next != ranges.end() && next->first == end) {
    new_end = next->second;
    ranges.erase(next);
  }
  if (prev != ranges.end() && prev->second == offset) {
    prev->second = new_end;
  } else {
    ranges.emplace(offset, new_end);
  }
  return absl::OkStatus();
}

absl::Status Assembler::OnChunk(
    uint32_t tensor_index, uint64_t offset, uint64_t size,
    absl::FunctionRef<absl::Status(char* dst, ChunkDigestFeed* feed)> fill) {
  switch (stage_) {
    case Stage::kChunks:
      break;
    case Stage::kFailed:
      return error_;
    case Stage::kWantHeader:
      return Fail(absl::InvalidArgumentError("chunk before the header"));
    case Stage::kTrailed:
    case Stage::kFinished:
      return Fail(absl::InvalidArgumentError("frame after the trailer"));
  }
  if (tensor_index >= specs_.size()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("chunk names unknown tensor index ", tensor_index,
                     " (the header lists ", specs_.size(), ")")));
  }
  const TensorSpec& spec = specs_[tensor_index];
  if (size == 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("empty chunk for tensor \"", spec.name, "\"")));
  }
  if (size > options_.limits.max_chunk_bytes) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("chunk of ", size, " bytes exceeds the limit of ",
                     options_.limits.max_chunk_bytes)));
  }
  if (offset > spec.byte_size || size > spec.byte_size - offset) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "chunk [", offset, ", +", size, ") runs past the end of tensor \"",
        spec.name, "\" (", spec.byte_size, " bytes)")));
  }
  absl::Status marked = MarkReceived(tensor_index, offset, size);
  if (!marked.ok()) return Fail(std::move(marked));
  absl::StatusOr<char*> dst = sink_->WritableRange(tensor_index, offset, size);
  if (!dst.ok()) return Fail(dst.status());
  digest_->BeginChunk(tensor_index, offset, size);
  ChunkDigestFeed feed(digest_.get());
  absl::Status filled = fill(*dst, &feed);
  if (!filled.ok()) return Fail(std::move(filled));
  if (feed.fed() != size) {
    return Fail(absl::InternalError(absl::StrCat(
        "chunk filler digested ", feed.fed(), " of ", size, " bytes")));
  }
  absl::Status committed = sink_->CommitRange(tensor_index, offset, size);
  if (!committed.ok()) return Fail(std::move(committed));
  ++chunks_;
  bytes_received_ += size;
  return absl::OkStatus();
}

absl::Status Assembler::OnChunk(uint32_t tensor_index, uint64_t offset,
                                absl::string_view data) {
  return OnChunk(tensor_index, offset, data.size(),
                 [&](char* dst, ChunkDigestFeed* feed) {
                   feed->Add(data);
                   std::memcpy(dst, data.data(), data.size());
                   return absl::OkStatus();
                 });
}

absl::Status Assembler::OnTrailer(const v1::ModelTrailer& trailer) {
  switch (stage_) {
    case Stage::kChunks:
      break;
    case Stage::kFailed:
      return error_;
    case Stage::kWantHeader:
      return Fail(absl::InvalidArgumentError("trailer before the header"));
    case Stage::kTrailed:
    case Stage::kFinished:
      return Fail(absl::InvalidArgumentError("frame after the trailer"));
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const std::map<uint64_t, uint64_t>& ranges = received_[i];
    if (specs_[i].byte_size == 0) continue;
    uint64_t missing_at = 0;
    if (!ranges.empty() && ranges.begin()->first == 0) {
      missing_at = ranges.begin()->second;
    }
    if (missing_at != specs_[i].byte_size) {
      return Fail(absl::DataLossError(absl::StrCat(
          "tensor \"", specs_[i].name, "\" is missing bytes from offset ",
          missing_at, " (", specs_[i].byte_size, " bytes expected)")));
    }
  }
  if (trailer.chunk_count() != chunks_) {
    return Fail(absl::DataLossError(
        absl::StrCat("trailer counts ", trailer.chunk_count(), " chunks, ",
                     chunks_, " arrived")));
  }
  const std::string digest = digest_->Finish();
  if (digest != trailer.digest()) {
    return Fail(absl::DataLossError(absl::StrCat(
        "digest mismatch: computed ", absl::BytesToHexString(digest),
        ", trailer says ", absl::BytesToHexString(trailer.digest()))));
  }
  stream_digest_ = digest;
  stage_ = Stage::kTrailed;
  return absl::OkStatus();
}

absl::Status Assembler::OnFrame(const v1::ModelFrame& frame) {
  switch (frame.frame_case()) {
    case v1::ModelFrame::kHeader:
      return OnHeader(frame.header(), frame.header().ByteSizeLong());
    case v1::ModelFrame::kChunk:
      return OnChunk(frame.chunk().tensor_index(), frame.chunk().offset(),
                     frame.chunk().data());
    case v1::ModelFrame::kTrailer:
      return OnTrailer(frame.trailer());
    case v1::ModelFrame::FRAME_NOT_SET:
      break;
  }
  return Fail(
      absl::InvalidArgumentError("empty frame (no header, chunk or trailer)"));
}

absl::StatusOr<Model> Assembler::Finish() {
  switch (stage_) {
    case Stage::kTrailed:
      break;
    case Stage::kFailed:
      return error_;
    case Stage::kFinished:
      return absl::FailedPreconditionError("assembler already finished");
    case Stage::kWantHeader:
      return Fail(absl::DataLossError("stream ended before the header"));
    case Stage::kChunks:
      return Fail(absl::DataLossError(
          absl::StrCat("stream ended without a trailer after ", bytes_received_,
                       " of ", header_.total_bytes(), " bytes")));
  }
  absl::StatusOr<Model> model = sink_->Finish();
  if (!model.ok()) {
    stage_ = Stage::kFailed;
    error_ = model.status();
    sink_->Abort();
    return error_;
  }
  stage_ = Stage::kFinished;
  return model;
}

}  // namespace swarm
