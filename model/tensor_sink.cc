#include "model/tensor_sink.h"

#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/storage_error.h"
#include "persist/mapped_file.h"
#include "persist/safetensors.h"

namespace swarm {
std::map<std::string, std::string> ModelMetadataFromHeader(
    const v1::ModelHeader& header) {
  std::map<std::string, std::string> metadata(header.metadata().begin(),
                                              header.metadata().end());
  metadata.emplace("job", header.job_id());
  metadata.emplace("round", absl::StrCat(header.round()));
  metadata.emplace("sender", header.sender());
  metadata.emplace("kind", v1::ModelKind_Name(header.kind()));
  return metadata;
}

absl::Status MemorySink::Begin(const v1::ModelHeader& header,
                               const std::vector<TensorSpec>& specs) {
  if (begun_) return absl::FailedPreconditionError("sink already begun");
  // Every byte is overwritten: the Assembler checks full coverage.
  SWARM_ASSIGN_OR_RETURN(
      model_, Model::Create(specs, HeapStorage::Init::kUninitialized));
  model_.metadata() = ModelMetadataFromHeader(header);
  begun_ = true;
  return absl::OkStatus();
}

absl::StatusOr<char*> MemorySink::WritableRange(uint32_t index, uint64_t offset,
                                                uint64_t size) {
  if (!begun_ || index >= model_.num_tensors() ||
      offset > model_.spec(index).byte_size ||
      size > model_.spec(index).byte_size - offset) {
    return absl::InternalError("range outside the model");
  }
  return model_.mutable_tensor_data(index).data() + offset;
}

absl::StatusOr<Model> MemorySink::Finish() {
  if (!begun_) return absl::FailedPreconditionError("sink never begun");
  begun_ = false;
  return std::move(model_);
}

void MemorySink::Abort() {
  model_ = Model();
  begun_ = false;
}

DiskSink::DiskSink(std::string path, Keep keep)
    : path_(std::move(path)), keep_(keep) {}

DiskSink::~DiskSink() = default;

absl::Status DiskSink::Begin(const v1::ModelHeader& header,
                             const std::vector<TensorSpec>& specs) {
  if (file_ != nullptr)
    return absl::FailedPreconditionError("sink already begun");
  std::vector<persist::TensorDecl> decls;
  decls.reserve(specs.size());
  for (const TensorSpec& spec : specs) {
    decls.push_back({spec.name, spec.dtype, spec.shape});
  }
  SWARM_ASSIGN_OR_RETURN(
      persist::SafetensorsLayout layout,
      persist::MakeSafetensorsLayout(decls, ModelMetadataFromHeader(header)));
  SWARM_ASSIGN_OR_RETURN(std::string prefix,
                         persist::EncodeSafetensorsPrefix(layout));
  if (layout.data_size > UINT64_MAX - prefix.size()) {
    return absl::InvalidArgumentError("model size overflows 64 bits");
  }
  absl::StatusOr<std::unique_ptr<persist::WritableMappedFile>> file =
      persist::WritableMappedFile::Create(path_,
                                          prefix.size() + layout.data_size);
  if (!file.ok()) return AsStorageError(file.status());
  file_ = *std::move(file);
  std::memcpy(file_->data(), prefix.data(), prefix.size());
  file_offsets_.clear();
  for (const persist::SafetensorsTensor& tensor : layout.tensors) {
    file_offsets_.push_back(prefix.size() + tensor.begin);
  }
  return absl::OkStatus();
}

absl::StatusOr<char*> DiskSink::WritableRange(uint32_t index, uint64_t offset,
                                              uint64_t size) {
  if (file_ == nullptr || index >= file_offsets_.size()) {
    return absl::InternalError("range outside the model");
  }
  const uint64_t begin = file_offsets_[index] + offset;
  if (begin < file_offsets_[index] || begin > file_->size() ||
      size > file_->size() - begin) {
    return absl::InternalError("range outside the model");
  }
  return file_->data() + begin;
}

absl::StatusOr<Model> DiskSink::Finish() {
  if (file_ == nullptr)
    return absl::FailedPreconditionError("sink never begun");
  std::unique_ptr<persist::WritableMappedFile> file = std::move(file_);
  absl::StatusOr<std::unique_ptr<persist::MappedFile>> mapped = file->Commit();
  if (!mapped.ok()) return AsStorageError(mapped.status());
  mapped->reset();
  absl::StatusOr<Model> model = Model::LoadSafetensors(path_);
  if (keep_ == Keep::kUnlinkWhenMapped) unlink(path_.c_str());
  if (!model.ok()) return AsStorageError(model.status());
  return model;
}

void DiskSink::Abort() { file_.reset(); }

}  // namespace swarm
