// Memory-mapped files: read-only views of whole files, and files written
// through a mapping that appear atomically under their final name.
#ifndef SWARM_PERSIST_MAPPED_FILE_H_
#define SWARM_PERSIST_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swarm::persist {

// A whole regular file mapped read-only. The view stays valid for the life of
// the object. Caller obligation: nobody may truncate or rewrite the file in
// place while it is mapped (reading a truncated page raises SIGBUS); replacing
// it by rename, as everything in persist/ does, is safe: the mapping keeps the
// old contents. Thread-safe for concurrent reads.
class MappedFile {
 public:
  // NotFound when `path` does not exist; InvalidArgument when it is not a
  // regular file. An empty file gives an empty view (nothing is mapped).
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::string_view data() const { return absl::string_view(data_, size_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Drops the mapping's pages from this process's resident set; the view
  // stays valid and a later read faults them back in from the page cache
  // or the file. Safe while other threads read (they refault). Counts as
  // memory only for RSS: the kernel may keep the file's pages cached.
  void ReleaseResidentPages() const;

 private:
  MappedFile(std::string path, const char* data, size_t size);

  const std::string path_;
  const char* const data_;  // nullptr when size_ == 0.
  const size_t size_;
};

// A new file of a fixed size, written through a shared read-write mapping of a
// temporary sibling of its final path, then published by Commit(). The space
// is reserved up front (fallocate), so writes through data() cannot SIGBUS
// on a full disk: a full disk fails Create() instead. Destroying the object
// without a successful Commit() removes the temporary file and leaves any old
// file at the final path untouched. Not thread-safe: the caller serialises
// Commit() against its own writes to data().
class WritableMappedFile {
 public:
  // Creates ".<basename>.tmp.<pid>.<random>" beside `final_path`, `size`
  // bytes long (zero-filled), and maps it. ResourceExhausted (naming the path
  // and size) when the disk has no room.
  static absl::StatusOr<std::unique_ptr<WritableMappedFile>> Create(
      const std::string& final_path, uint64_t size);

  WritableMappedFile(const WritableMappedFile&) = delete;
  WritableMappedFile& operator=(const WritableMappedFile&) = delete;
  ~WritableMappedFile();

  // `size()` writable bytes (a non-null pointer even for size 0). Invalid
  // after Commit().
  char* data() { return data_ != nullptr ? data_ : empty_; }
  uint64_t size() const { return size_; }
  const std::string& final_path() const { return final_path_; }
  const std::string& temp_path() const { return temp_path_; }

  // msyncs and fsyncs the data, unmaps, renames the temporary file to the
  // final path, fsyncs the directory and returns the final file mapped
  // read-only. Call at most once; after it (whatever the result) data() must
  // not be used. On failure the temporary file is removed.
  absl::StatusOr<std::unique_ptr<MappedFile>> Commit();

 private:
  WritableMappedFile(std::string final_path, std::string temp_path, int fd,
                     char* data, uint64_t size);
  void Release();

  const std::string final_path_;
  const std::string temp_path_;
  int fd_;
  char* data_;  // nullptr when size_ == 0 or after Commit().
  const uint64_t size_;
  bool done_ = false;  // Commit() was called.
  char empty_[1] = {0};
};

}  // namespace swarm::persist

#endif  // SWARM_PERSIST_MAPPED_FILE_H_
