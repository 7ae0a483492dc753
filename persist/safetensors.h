// The safetensors file format (https://github.com/huggingface/safetensors):
//   8 bytes   little-endian u64 N, the header length
//   N bytes   UTF-8 JSON header, possibly right-padded with spaces:
//             {"<tensor name>": {"dtype": "F32", "shape": [2, 3],
//                                "data_offsets": [begin, end]},
//              ...,
//              "__metadata__": {"<key>": "<string value>", ...}}
//   the rest  the data section: raw little-endian tensor bytes; offsets are
//             relative to its start.
// Every rule of the format is enforced on read (tensors tile the data section
// exactly: no overlap, no gap, nothing out of bounds; byte ranges match
// shape x dtype size), and the same rules are checked before writing.
#ifndef SWARM_PERSIST_SAFETENSORS_H_
#define SWARM_PERSIST_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "persist/mapped_file.h"

namespace swarm::persist {

struct SafetensorsTensor {
  std::string name;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<uint64_t> shape;  // Empty for a scalar.
  // Byte range in the data section: [begin, end).
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsLayout {
  // In data order: sorted by (begin, end); zero-size tensors sharing an
  // offset are ordered by name when parsed.
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__".
  uint64_t data_size = 0;                       // Bytes in the data section.
};

// Headers longer than this are refused (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Validates the JSON header (without the 8-byte length prefix; trailing
// whitespace padding allowed) against a data section of `data_size` bytes.
// InvalidArgument whose message names the tensor and the broken rule.
absl::StatusOr<SafetensorsLayout> ParseSafetensorsHeader(absl::string_view json,
                                                         uint64_t data_size);

// Validates a whole file image. On success `*data_start` (if not null)
// receives the offset of the data section in `file_bytes`. DataLoss when the
// image is shorter than it claims (truncated), InvalidArgument otherwise.
absl::StatusOr<SafetensorsLayout> ParseSafetensors(absl::string_view file_bytes,
                                                   uint64_t* data_start);

struct TensorDecl {
  std::string name;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<uint64_t> shape;
};

// Lays `tensors` out back to back in the given order (begin/end computed,
// data_size set). InvalidArgument for a bad name, dtype or shape.
absl::StatusOr<SafetensorsLayout> MakeSafetensorsLayout(
    const std::vector<TensorDecl>& tensors,
    std::map<std::string, std::string> metadata);

// The file prefix: 8-byte length + JSON header, padded with spaces so that the
// data section starts at a multiple of 8. Validates `layout` first with the
// parser's rules; in addition `layout.tensors` must be in data order (each
// begins where the previous one ends), as WriteSafetensorsFile writes them in
// vector order. Names and metadata must be valid UTF-8.
absl::StatusOr<std::string> EncodeSafetensorsPrefix(
    const SafetensorsLayout& layout);

// A validated safetensors file, mapped read-only (see MappedFile for the
// caller's obligations). Thread-safe for concurrent reads.
class SafetensorsFile {
 public:
  // Errors name `path`: NotFound, DataLoss (truncated), InvalidArgument.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }
  // Index into layout().tensors of the tensor called `name`, if any.
  std::optional<size_t> FindTensor(absl::string_view name) const;

  // The bytes of layout().tensors[i]; requires i < layout().tensors.size().
  // This and data_section() return empty views after ReleaseFile().
  absl::string_view tensor_data(size_t i) const;
  absl::string_view data_section() const;
  // Offset of the data section in the file.
  uint64_t data_start() const { return data_start_; }

  // The mapping. Must not be called after ReleaseFile().
  const MappedFile& file() const { return *file_; }
  // Hands the mapping to the caller (e.g. to keep the bytes alive beyond this
  // object); layout() stays valid.
  std::unique_ptr<MappedFile> ReleaseFile() { return std::move(file_); }

 private:
  SafetensorsFile(std::unique_ptr<MappedFile> file, SafetensorsLayout layout,
                  uint64_t data_start);

  const std::string path_;
  std::unique_ptr<MappedFile> file_;
  const SafetensorsLayout layout_;
  const uint64_t data_start_;
};

// Writes a safetensors file atomically (AtomicFileWriter: the old file stays
// until the new one is complete and synced). `tensor_data[i]` must hold
// exactly the bytes of `layout.tensors[i]` (end - begin).
absl::Status WriteSafetensorsFile(
    const std::string& path, const SafetensorsLayout& layout,
    absl::Span<const absl::string_view> tensor_data);

}  // namespace swarm::persist

#endif  // SWARM_PERSIST_SAFETENSORS_H_
