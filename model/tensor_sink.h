// Where an Assembler puts the bytes of an incoming model.
#ifndef SWARM_MODEL_TENSOR_SINK_H_
#define SWARM_MODEL_TENSOR_SINK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {
namespace persist {
class WritableMappedFile;
}

// The metadata an assembled model carries: the header's metadata plus "job",
// "round", "sender" and "kind" where the sender did not set them.
std::map<std::string, std::string> ModelMetadataFromHeader(
    const v1::ModelHeader& header);

// The Assembler calls, in order: Begin once; then WritableRange and
// CommitRange for each chunk (ranges are validated: inside the tensor, never
// twice); then Finish once after the digest checked out, or Abort on any
// error. A sink is used for one stream.
class TensorSink {
 public:
  virtual ~TensorSink() = default;

  // `specs` come from the validated header, in payload order.
  virtual absl::Status Begin(const v1::ModelHeader& header,
                             const std::vector<TensorSpec>& specs) = 0;
  // Memory for bytes [offset, offset + size) of tensor `index`; the Assembler
  // fills it, then calls CommitRange with the same arguments.
  virtual absl::StatusOr<char*> WritableRange(uint32_t index, uint64_t offset,
                                              uint64_t size) = 0;
  virtual absl::Status CommitRange(uint32_t index, uint64_t offset,
                                   uint64_t size) = 0;
  // The finished model (metadata from the header).
  virtual absl::StatusOr<Model> Finish() = 0;
  // Discards what was received; leaves nothing behind.
  virtual void Abort() = 0;
};

// Assembles into anonymous memory.
class MemorySink final : public TensorSink {
 public:
  MemorySink() = default;
  MemorySink(const MemorySink&) = delete;
  MemorySink& operator=(const MemorySink&) = delete;

  absl::Status Begin(const v1::ModelHeader& header,
                     const std::vector<TensorSpec>& specs) override;
  absl::StatusOr<char*> WritableRange(uint32_t index, uint64_t offset,
                                      uint64_t size) override;
  absl::Status CommitRange(uint32_t, uint64_t, uint64_t) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Model> Finish() override;
  void Abort() override;

 private:
  Model model_;
  bool begun_ = false;
};

// Writes a safetensors file at `path` as chunks arrive (into a temporary
// sibling, reserved up front), then renames it into place and maps it
// read-only. The returned model is a view over that mapping. A failed or
// aborted stream leaves no file behind and an existing file at `path` intact.
// Failures of the file itself (no space, an I/O error) are marked
// AsStorageError (common/storage_error.h).
class DiskSink final : public TensorSink {
 public:
  // kUnlinkWhenMapped: Finish removes the file once the model maps it (the
  // mapping keeps its contents): a model kept out of anonymous memory, with
  // nothing left on disk to clean up.
  enum class Keep { kFile, kUnlinkWhenMapped };
  explicit DiskSink(std::string path, Keep keep = Keep::kFile);
  ~DiskSink() override;
  DiskSink(const DiskSink&) = delete;
  DiskSink& operator=(const DiskSink&) = delete;

  absl::Status Begin(const v1::ModelHeader& header,
                     const std::vector<TensorSpec>& specs) override;
  absl::StatusOr<char*> WritableRange(uint32_t index, uint64_t offset,
                                      uint64_t size) override;
  absl::Status CommitRange(uint32_t, uint64_t, uint64_t) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Model> Finish() override;
  void Abort() override;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Keep keep_;
  std::unique_ptr<persist::WritableMappedFile> file_;
  // Offset of each tensor's first byte in the file.
  std::vector<uint64_t> file_offsets_;
};

}  // namespace swarm

#endif  // SWARM_MODEL_TENSOR_SINK_H_
