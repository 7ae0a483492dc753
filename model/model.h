// A model: an ordered list of named tensors over one block of bytes.
//
// The bytes live in a ModelStorage, either anonymous memory the model owns
// (writable) or a read-only mapping of a safetensors file. A Model is
// move-only; share one between threads as std::shared_ptr<const Model>.
#ifndef SWARM_MODEL_MODEL_H_
#define SWARM_MODEL_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "proto/swarm.pb.h"

namespace swarm {
namespace persist {
class WritableMappedFile;
}  // namespace persist

struct TensorSpec {
  std::string name;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<uint64_t> shape;
  // shape's element count times the dtype's size.
  uint64_t byte_size = 0;

  bool operator==(const TensorSpec& other) const {
    return name == other.name && dtype == other.dtype && shape == other.shape &&
           byte_size == other.byte_size;
  }
  bool operator!=(const TensorSpec& other) const { return !(*this == other); }
};

// Builds a spec, computing byte_size; fails on unknown dtype or overflow.
absl::StatusOr<TensorSpec> MakeTensorSpec(std::string name, DType dtype,
                                          std::vector<uint64_t> shape);

// Checks one wire table row (name non-empty, dtype known, byte_size equal to
// shape x dtype size) and converts it.
absl::StatusOr<TensorSpec> TensorSpecFromInfo(const v1::TensorInfo& info);
v1::TensorInfo TensorSpecToInfo(const TensorSpec& spec);

// The bytes behind a model.
class ModelStorage {
 public:
  virtual ~ModelStorage() = default;
  virtual const char* data() const = 0;
  // nullptr when the storage is read-only.
  virtual char* mutable_data() = 0;
  virtual uint64_t size() const = 0;
  // File-backed storage drops its pages from the process's resident set
  // (they come back from the file when read again); memory does nothing.
  virtual void ReleaseResidentPages() const {}
};

// Anonymous memory (mmap), with transparent huge pages requested for large
// blocks. Not copyable.
//
// Freed blocks of at least kMinRecycledBytes go to a process-wide pool and
// are handed out again for the same rounded size: a site receives, trains
// and aggregates models of one size round after round, and fresh memory
// costs a page fault and a page clear per 2 MiB / 4 KiB, which at loopback
// speeds is a large share of a transfer. The pool never lets the process
// map more of these blocks than it had in use at once (idle blocks are
// unmapped before a fresh one would exceed that), so it does not raise a
// site's peak memory; within SetHeapStorageRecycleLimit.
class HeapStorage final : public ModelStorage {
 public:
  static constexpr uint64_t kMinRecycledBytes = 1ull << 20;
  enum class Init { kZeroed, kUninitialized };
  // kUninitialized is for callers that overwrite every byte (e.g. sinks).
  static absl::StatusOr<std::shared_ptr<HeapStorage>> Allocate(
      uint64_t size, Init init = Init::kZeroed);
  ~HeapStorage() override;
  HeapStorage(const HeapStorage&) = delete;
  HeapStorage& operator=(const HeapStorage&) = delete;

  const char* data() const override { return data_; }
  char* mutable_data() override { return data_; }
  uint64_t size() const override { return size_; }

 private:
  HeapStorage(char* data, uint64_t size, uint64_t mapped_size)
      : data_(data), size_(size), mapped_size_(mapped_size) {}
  char* data_;
  uint64_t size_;
  uint64_t mapped_size_;
};

// Writable storage in a file of its own under a directory, unlinked as soon
// as it is made (nothing is left behind, whatever happens to the process):
// a shared mapping, so its pages are the page cache's, written back to disk
// under memory pressure rather than held as the process's anonymous memory
// (disk offload). Space is reserved up front (fallocate): a full disk fails
// Create, never a later write. Reads as zeros until written.
class ScratchFileStorage final : public ModelStorage {
 public:
  // ResourceExhausted when the disk has no room for `size` bytes; an error
  // naming `dir` when it cannot hold a file.
  static absl::StatusOr<std::shared_ptr<ScratchFileStorage>> Create(
      const std::string& dir, uint64_t size);
  ~ScratchFileStorage() override;
  ScratchFileStorage(const ScratchFileStorage&) = delete;
  ScratchFileStorage& operator=(const ScratchFileStorage&) = delete;

  const char* data() const override { return data_; }
  char* mutable_data() override { return data_; }
  uint64_t size() const override { return size_; }
  // Unmaps the pages from the process; their contents stay in the file (the
  // page cache, then the disk) and come back when read.
  void ReleaseResidentPages() const override;

 private:
  explicit ScratchFileStorage(
      std::unique_ptr<persist::WritableMappedFile> file);
  std::unique_ptr<persist::WritableMappedFile> file_;
  char* data_;
  uint64_t size_;
};

// Most bytes of freed HeapStorage kept for reuse (default: a quarter of the
// physical memory; 0 disables).
void SetHeapStorageRecycleLimit(uint64_t bytes);
// Bytes currently idle in the pool (for tests and status).
uint64_t HeapStorageRecycledBytes();
// Unmaps every idle block (a job ended: its models' sizes may not come
// again) and starts the pool's count of the most in use at once afresh.
void ReleaseIdleHeapStorage();

class Model {
 public:
  // An empty model (no tensors).
  Model() = default;
  Model(Model&&) = default;
  Model& operator=(Model&&) = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Allocates zeroed, writable storage for `specs` (names must be unique).
  // Each tensor starts at a 64-byte aligned address.
  static absl::StatusOr<Model> Create(
      std::vector<TensorSpec> specs,
      HeapStorage::Init init = HeapStorage::Init::kZeroed);

  // Create's layout (every tensor 64-byte aligned) in a ScratchFileStorage
  // under `dir` instead of memory: zeroed, writable, file-backed.
  static absl::StatusOr<Model> CreateInFile(std::vector<TensorSpec> specs,
                                            const std::string& dir);

  // A model over existing storage: tensor i occupies
  // [offsets[i], offsets[i] + specs[i].byte_size) of `storage`.
  static absl::StatusOr<Model> FromStorage(
      std::vector<TensorSpec> specs, std::vector<uint64_t> offsets,
      std::shared_ptr<ModelStorage> storage);

  // Maps a safetensors file read-only; the model is a view over the mapping.
  // Tensors are in file (offset) order; `__metadata__` becomes metadata().
  static absl::StatusOr<Model> LoadSafetensors(const std::string& path);

  // Writes the model as a safetensors file atomically (temp, fsync, rename,
  // fsync dir), with metadata() as `__metadata__`.
  absl::Status SaveSafetensors(const std::string& path) const;
  // The same with `metadata` instead of metadata().
  absl::Status SaveSafetensors(
      const std::string& path,
      const std::map<std::string, std::string>& metadata) const;

  // A deep copy into new writable memory.
  absl::StatusOr<Model> Clone() const;

  size_t num_tensors() const { return specs_.size(); }
  const TensorSpec& spec(size_t i) const { return specs_[i]; }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  // Index of the tensor called `name`, or -1.
  int FindTensor(absl::string_view name) const;
  uint64_t total_bytes() const { return total_bytes_; }

  absl::string_view tensor_data(size_t i) const {
    return absl::string_view(storage_->data() + offsets_[i],
                             specs_[i].byte_size);
  }
  bool writable() const {
    return storage_ != nullptr && storage_->mutable_data() != nullptr;
  }
  // Caller obligation: writable().
  absl::Span<char> mutable_tensor_data(size_t i) {
    return absl::Span<char>(storage_->mutable_data() + offsets_[i],
                            specs_[i].byte_size);
  }

  // The storage, kept alive by whoever holds it (e.g. bytes in flight).
  const std::shared_ptr<ModelStorage>& storage() const { return storage_; }

  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  // The wire tensor table.
  std::vector<v1::TensorInfo> TensorTable() const;

  // True when both models have the same tensor names, dtypes and shapes in
  // the same order (data and metadata are not compared).
  bool SameLayout(const Model& other) const;

 private:
  std::vector<TensorSpec> specs_;
  std::vector<uint64_t> offsets_;
  uint64_t total_bytes_ = 0;
  std::shared_ptr<ModelStorage> storage_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace swarm

#endif  // SWARM_MODEL_MODEL_H_
