// Crash-safe file replacement: every file that matters is written to a
// temporary sibling, fsynced, renamed over the final name, and its directory
// fsynced. A crash leaves the old file or the new one, never a torn one; a
// crash may leave a temporary ".<name>.tmp.<pid>.<hex>" file behind, which
// Workspace::CleanStaleOffloadAll removes at start-up.
#ifndef SWARM_PERSIST_ATOMIC_FILE_H_
#define SWARM_PERSIST_ATOMIC_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swarm::persist {

// fsyncs directory `dir` so that renames and creations in it are durable.
absl::Status FsyncDirectory(const std::string& dir);

// Replaces `path` with `contents` atomically (see the file comment). On any
// failure the old file, if any, is untouched and the temporary file removed.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// Reads the whole of `path`. NotFound when it does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Streams a file to a temporary sibling of `final_path`; Commit() makes it
// appear under `final_path` atomically. Destroying the writer without a
// successful Commit() removes the temporary file and leaves any old file at
// `final_path` untouched. Not thread-safe; one writer per final path at a time
// (two writers racing for one path: the last Commit wins).
class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(
      const std::string& final_path);

  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Appends `bytes` (small appends are buffered). After an error the writer
  // is failed: further calls return FailedPrecondition and nothing is
  // committed.
  absl::Status Append(absl::string_view bytes);

  // Flushes, fsyncs, renames over the final path and fsyncs the directory.
  // Call at most once; after it (whatever the result) the writer is spent.
  absl::Status Commit();

  const std::string& final_path() const { return final_path_; }
  const std::string& temp_path() const { return temp_path_; }
  // Bytes appended so far.
  uint64_t size() const { return size_; }

 private:
  AtomicFileWriter(std::string final_path, std::string temp_path, int fd);
  absl::Status Flush();
  absl::Status CheckUsable() const;
  void Abandon();

  const std::string final_path_;
  const std::string temp_path_;
  int fd_;
  std::string buffer_;
  uint64_t size_ = 0;
  bool failed_ = false;
  bool done_ = false;  // Committed or abandoned: the temp file is gone.
};

}  // namespace swarm::persist

#endif  // SWARM_PERSIST_ATOMIC_FILE_H_
