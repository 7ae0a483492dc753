#include "model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "persist/mapped_file.h"
#include "persist/safetensors.h"

namespace swarm {
namespace {

constexpr uint64_t kTensorAlignment = 64;
// Below this, huge pages are not worth asking for.
constexpr uint64_t kHugePageThreshold = 4ull << 20;
constexpr uint64_t kHugePageSize = 2ull << 20;

// Keeps a mapped safetensors file alive under a model.
class MappedFileStorage final : public ModelStorage {
 public:
  explicit MappedFileStorage(std::unique_ptr<persist::MappedFile> file)
      : file_(std::move(file)) {}
  const char* data() const override { return file_->data().data(); }
  char* mutable_data() override { return nullptr; }
  uint64_t size() const override { return file_->size(); }
  void ReleaseResidentPages() const override { file_->ReleaseResidentPages(); }

 private:
  std::unique_ptr<persist::MappedFile> file_;
};

absl::Status CheckUniqueNames(const std::vector<TensorSpec>& specs) {
  absl::flat_hash_set<absl::string_view> names;
  for (const TensorSpec& spec : specs) {
    if (spec.name.empty()) {
      return absl::InvalidArgumentError("tensor with an empty name");
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name \"", spec.name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSpecSize(const TensorSpec& spec) {
  SWARM_ASSIGN_OR_RETURN(uint64_t expected,
                         TensorByteSize(spec.dtype, spec.shape));
  if (expected != spec.byte_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", spec.name, "\": byte_size ", spec.byte_size,
                     " differs from shape x dtype size ", expected));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TensorSpec> MakeTensorSpec(std::string name, DType dtype,
                                          std::vector<uint64_t> shape) {
  absl::StatusOr<uint64_t> size = TensorByteSize(dtype, shape);
  if (!size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", name, "\": ", size.status().message()));
  }
  TensorSpec spec;
  spec.name = std::move(name);
  spec.dtype = dtype;
  spec.shape = std::move(shape);
  spec.byte_size = *size;
  return spec;
}

absl::StatusOr<TensorSpec> TensorSpecFromInfo(const v1::TensorInfo& info) {
  if (info.name().empty()) {
    return absl::InvalidArgumentError("tensor with an empty name");
  }
  absl::StatusOr<uint64_t> size = TensorByteSize(
      info.dtype(),
      std::vector<uint64_t>(info.shape().begin(), info.shape().end()));
  if (!size.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", info.name(), "\": ", size.status().message()));
  }
  if (*size != info.byte_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", info.name(), "\": byte_size ", info.byte_size(),
        " differs from shape x dtype size ", *size));
  }
  TensorSpec spec;
  spec.name = info.name();
  spec.dtype = info.dtype();
  spec.shape.assign(info.shape().begin(), info.shape().end());
  spec.byte_size = info.byte_size();
  return spec;
}

v1::TensorInfo TensorSpecToInfo(const TensorSpec& spec) {
  v1::TensorInfo info;
  info.set_name(spec.name);
  info.set_dtype(spec.dtype);
  for (uint64_t dim : spec.shape) info.add_shape(dim);
  info.set_byte_size(spec.byte_size);
  return info;
}

namespace {

// Idle blocks of freed HeapStorage, by mapped size, for the next block of
// the same size: a site receives, trains and aggregates models of one size
// round after round, and a fresh block costs a page fault and a page clear
// per page (on this kind of virtual machine the largest single cost of
// receiving a model on loopback).
//
// The pool never makes the process map more model memory than it had in
// use at once (`peak_live_`): before a fresh block is mapped, idle blocks
// are unmapped until the live blocks, the idle ones and the new one fit in
// the larger of that peak and what is live with the new block. So the
// process's peak resident memory is what it would be without the pool; the
// pool only keeps pages that were recently in use from being given back
// and cleared again.
class StoragePool {
 public:
  static StoragePool& Get() {
    static StoragePool* pool = new StoragePool;
    return *pool;
  }

  // A block of exactly `mapped_size` bytes, counted live, or nullptr: then
  // `*unmap` holds idle blocks the caller must unmap before it maps a fresh
  // block of that size, which is counted live.
  char* Take(uint64_t mapped_size,
             std::vector<std::pair<uint64_t, char*>>* unmap) {
    absl::MutexLock lock(&mu_);
    live_bytes_ += mapped_size;
    auto it = idle_.find(mapped_size);
    if (it != idle_.end()) {
      char* block = it->second;
      idle_.erase(it);
      idle_bytes_ -= mapped_size;
      return block;
    }
    const uint64_t allowed = std::max(peak_live_, live_bytes_);
    while (!idle_.empty() && live_bytes_ + idle_bytes_ > allowed) {
      auto largest = std::prev(idle_.end());
      unmap->push_back(*largest);
      idle_bytes_ -= largest->first;
      idle_.erase(largest);
    }
    peak_live_ = allowed;
    return nullptr;
  }

  // `block` is no longer in use. Keeps it if the pool has room (returns
  // true); else the caller unmaps it.
  bool Give(char* block, uint64_t mapped_size) {
    absl::MutexLock lock(&mu_);
    live_bytes_ -= mapped_size;
    if (idle_bytes_ + mapped_size > limit_) return false;
    idle_.emplace(mapped_size, block);
    idle_bytes_ += mapped_size;
    return true;
  }

  // A block Take counted live was never mapped.
  void Forget(uint64_t mapped_size) {
    absl::MutexLock lock(&mu_);
    live_bytes_ -= mapped_size;
  }

  void SetLimit(uint64_t bytes) {
    std::vector<std::pair<uint64_t, char*>> released;
    {
      absl::MutexLock lock(&mu_);
      limit_ = bytes;
      while (idle_bytes_ > limit_ && !idle_.empty()) {
        auto it = std::prev(idle_.end());
        released.push_back(*it);
        idle_bytes_ -= it->first;
        idle_.erase(it);
      }
    }
    for (auto& [size, block] : released) munmap(block, size);
  }

  void ReleaseIdle() {
    std::multimap<uint64_t, char*> released;
    {
      absl::MutexLock lock(&mu_);
      released.swap(idle_);
      idle_bytes_ = 0;
      peak_live_ = live_bytes_;
    }
    for (auto& [size, block] : released) munmap(block, size);
  }

  uint64_t idle_bytes() {
    absl::MutexLock lock(&mu_);
    return idle_bytes_;
  }

 private:
  absl::Mutex mu_;
  std::multimap<uint64_t, char*> idle_ ABSL_GUARDED_BY(mu_);
  uint64_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of pooled-size blocks in use, and the most in use at once since
  // the last ReleaseIdle.
  uint64_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_live_ ABSL_GUARDED_BY(mu_) = 0;
  // At most this many idle bytes (a quarter of physical memory unless set).
  uint64_t limit_ ABSL_GUARDED_BY(mu_) =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) /
      4;
};

uint64_t RoundUp(uint64_t value, uint64_t to) {
  return (value + to - 1) / to * to;
}

}  // namespace

void SetHeapStorageRecycleLimit(uint64_t bytes) {
  StoragePool::Get().SetLimit(bytes);
}

uint64_t HeapStorageRecycledBytes() { return StoragePool::Get().idle_bytes(); }

void ReleaseIdleHeapStorage() { StoragePool::Get().ReleaseIdle(); }

absl::StatusOr<std::shared_ptr<HeapStorage>> HeapStorage::Allocate(
    uint64_t size, Init init) {
  if (size == 0) {
    return std::shared_ptr<HeapStorage>(new HeapStorage(nullptr, 0, 0));
  }
  if (size > UINT64_MAX - kHugePageSize) {
    return absl::ResourceExhaustedError("model size overflows 64 bits");
  }
  const uint64_t mapped_size =
      RoundUp(size, size >= kHugePageThreshold ? kHugePageSize : 4096);
  char* data = nullptr;
  if (mapped_size >= kMinRecycledBytes) {
    std::vector<std::pair<uint64_t, char*>> unmap;
    data = StoragePool::Get().Take(mapped_size, &unmap);
    for (auto& [idle_size, block] : unmap) munmap(block, idle_size);
    if (data != nullptr && init == Init::kZeroed) {
      std::memset(data, 0, size);
    }
  }
  if (data == nullptr) {
    void* fresh = mmap(nullptr, mapped_size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) {
      if (mapped_size >= kMinRecycledBytes) {
        StoragePool::Get().Forget(mapped_size);  // Not live after all.
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", size,
                       " bytes for a model: ", std::strerror(errno)));
    }
    if (mapped_size >= kHugePageThreshold) {
      madvise(fresh, mapped_size,
              MADV_HUGEPAGE);  // A hint; failure is harmless.
    }
    data = static_cast<char*>(fresh);
  }
  return std::shared_ptr<HeapStorage>(new HeapStorage(data, size, mapped_size));
}

HeapStorage::~HeapStorage() {
  if (data_ == nullptr) return;
  if (mapped_size_ >= kMinRecycledBytes &&
      StoragePool::Get().Give(data_, mapped_size_)) {
    return;
  }
  munmap(data_, mapped_size_);
}

absl::StatusOr<std::shared_ptr<ScratchFileStorage>> ScratchFileStorage::Create(
    const std::string& dir, uint64_t size) {
  SWARM_ASSIGN_OR_RETURN(
      std::unique_ptr<persist::WritableMappedFile> file,
      persist::WritableMappedFile::Create(absl::StrCat(dir, "/scratch"), size));
  // Unlinked at once: the mapping (and the descriptor the file object
  // holds) keep the contents; nothing is left if the process dies.
  if (unlink(file->temp_path().c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot unlink ", file->temp_path(),
                                            ": ", std::strerror(errno)));
  }
  return std::shared_ptr<ScratchFileStorage>(
      new ScratchFileStorage(std::move(file)));
}

ScratchFileStorage::ScratchFileStorage(
    std::unique_ptr<persist::WritableMappedFile> file)
    : file_(std::move(file)), data_(file_->data()), size_(file_->size()) {}

// The file object unmaps and closes; its unlink of the (already removed)
// temporary name finds nothing.
ScratchFileStorage::~ScratchFileStorage() = default;

void ScratchFileStorage::ReleaseResidentPages() const {
  // A shared mapping: dropping its pages from the process loses nothing
  // (dirty ones stay in the page cache until written back).
  if (size_ > 0) madvise(data_, size_, MADV_DONTNEED);
}

namespace {

// Create's layout: each tensor at a 64-byte aligned offset. Returns the
// offsets and sets `end` to the bytes the storage needs.
absl::StatusOr<std::vector<uint64_t>> AlignedOffsets(
    const std::vector<TensorSpec>& specs, uint64_t* end) {
  SWARM_RETURN_IF_ERROR(CheckUniqueNames(specs));
  std::vector<uint64_t> offsets;
  offsets.reserve(specs.size());
  *end = 0;
  for (const TensorSpec& spec : specs) {
    SWARM_RETURN_IF_ERROR(CheckSpecSize(spec));
    const uint64_t begin =
        (*end + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    if (begin < *end || spec.byte_size > UINT64_MAX - begin) {
      return absl::InvalidArgumentError("model size overflows 64 bits");
    }
    offsets.push_back(begin);
    *end = begin + spec.byte_size;
  }
  return offsets;
}

}  // namespace

absl::StatusOr<Model> Model::Create(std::vector<TensorSpec> specs,
                                    HeapStorage::Init init) {
  uint64_t end = 0;
  SWARM_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets,
                         AlignedOffsets(specs, &end));
  SWARM_ASSIGN_OR_RETURN(std::shared_ptr<HeapStorage> storage,
                         HeapStorage::Allocate(end, init));
  return FromStorage(std::move(specs), std::move(offsets), std::move(storage));
}

absl::StatusOr<Model> Model::CreateInFile(std::vector<TensorSpec> specs,
                                          const std::string& dir) {
  uint64_t end = 0;
  SWARM_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets,
                         AlignedOffsets(specs, &end));
  SWARM_ASSIGN_OR_RETURN(std::shared_ptr<ScratchFileStorage> storage,
                         ScratchFileStorage::Create(dir, end));
  return FromStorage(std::move(specs), std::move(offsets), std::move(storage));
}

absl::StatusOr<Model> Model::FromStorage(
    std::vector<TensorSpec> specs, std::vector<uint64_t> offsets,
    std::shared_ptr<ModelStorage> storage) {
  if (storage == nullptr) return absl::InvalidArgumentError("no storage");
  if (offsets.size() != specs.size()) {
    return absl::InvalidArgumentError("one offset per tensor is required");
  }
  SWARM_RETURN_IF_ERROR(CheckUniqueNames(specs));
  Model model;
  for (size_t i = 0; i < specs.size(); ++i) {
    SWARM_RETURN_IF_ERROR(CheckSpecSize(specs[i]));
    if (offsets[i] > storage->size() ||
        specs[i].byte_size > storage->size() - offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", specs[i].name, "\" lies outside its storage"));
    }
    model.total_bytes_ += specs[i].byte_size;
  }
  model.specs_ = std::move(specs);
  model.offsets_ = std::move(offsets);
  model.storage_ = std::move(storage);
  return model;
}

absl::StatusOr<Model> Model::LoadSafetensors(const std::string& path) {
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<persist::SafetensorsFile> file,
                         persist::SafetensorsFile::Open(path));
  const persist::SafetensorsLayout layout = file->layout();
  const uint64_t data_start = static_cast<uint64_t>(
      file->data_section().data() - file->file().data().data());
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> offsets;
  specs.reserve(layout.tensors.size());
  for (const persist::SafetensorsTensor& tensor : layout.tensors) {
    SWARM_ASSIGN_OR_RETURN(
        TensorSpec spec,
        MakeTensorSpec(tensor.name, tensor.dtype, tensor.shape));
    specs.push_back(std::move(spec));
    offsets.push_back(data_start + tensor.begin);
  }
  auto storage = std::make_shared<MappedFileStorage>(file->ReleaseFile());
  SWARM_ASSIGN_OR_RETURN(
      Model model, FromStorage(std::move(specs), std::move(offsets), storage));
  model.metadata_ = layout.metadata;
  return model;
}

absl::Status Model::SaveSafetensors(const std::string& path) const {
  return SaveSafetensors(path, metadata_);
}

absl::Status Model::SaveSafetensors(
    const std::string& path,
    const std::map<std::string, std::string>& metadata) const {
  std::vector<persist::TensorDecl> decls;
  std::vector<absl::string_view> data;
  decls.reserve(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    decls.push_back({specs_[i].name, specs_[i].dtype, specs_[i].shape});
    data.push_back(tensor_data(i));
  }
  SWARM_ASSIGN_OR_RETURN(persist::SafetensorsLayout layout,
                         persist::MakeSafetensorsLayout(decls, metadata));
  return persist::WriteSafetensorsFile(path, layout, data);
}

absl::StatusOr<Model> Model::Clone() const {
  SWARM_ASSIGN_OR_RETURN(Model copy,
                         Create(specs_, HeapStorage::Init::kUninitialized));
  for (size_t i = 0; i < specs_.size(); ++i) {
    const absl::string_view from = tensor_data(i);
    if (!from.empty()) {
      std::memcpy(copy.mutable_tensor_data(i).data(), from.data(), from.size());
    }
  }
  copy.metadata_ = metadata_;
  return copy;
}

int Model::FindTensor(absl::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<v1::TensorInfo> Model::TensorTable() const {
  std::vector<v1::TensorInfo> table;
  table.reserve(specs_.size());
  for (const TensorSpec& spec : specs_) table.push_back(TensorSpecToInfo(spec));
  return table;
}

bool Model::SameLayout(const Model& other) const {
  return specs_ == other.specs_;
}

}  // namespace swarm
