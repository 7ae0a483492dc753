// Small POSIX helpers shared by the persist/ library: errno -> absl::Status,
// path splitting, and the temporary sibling files that atomic writes go
// through. Not a general-purpose file API: use atomic_file.h and
// mapped_file.h.
#ifndef SWARM_PERSIST_FILE_UTIL_H_
#define SWARM_PERSIST_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swarm::persist {

// A status for a failed system call. The code follows errno (ENOENT ->
// NotFound, ENOSPC -> ResourceExhausted, ...); the message reads
// "<what> <path>: <strerror>".
absl::Status ErrnoError(int err, absl::string_view what,
                        absl::string_view path);

// The directory part of `path` ("." when `path` has no slash, "/" for a file
// in the root).
std::string DirName(absl::string_view path);
// The last component of `path` (empty when `path` ends with a slash).
std::string BaseName(absl::string_view path);

// True for the names CreateTempSibling makes: ".<basename>.tmp.<pid>.<hex>".
// Start-up cleanup removes files with such names (what a crash left behind).
bool IsTempFileName(absl::string_view file_name);

// A freshly created, empty temporary file beside `final_path`.
struct TempFile {
  std::string path;
  int fd = -1;  // Open O_RDWR | O_CLOEXEC; the caller owns and closes it.
};

// Creates (O_EXCL, mode 0644 less umask) ".<basename>.tmp.<pid>.<random>" in
// the directory of `final_path`. The caller must close `fd` and either rename
// or unlink `path`.
absl::StatusOr<TempFile> CreateTempSibling(const std::string& final_path);

// Writes all of `bytes` to `fd` (retrying short writes and EINTR). `path`
// only names the file in the error.
absl::Status WriteFully(int fd, absl::string_view bytes,
                        const std::string& path);

// fsync(2) with an error naming `path`.
absl::Status FsyncFd(int fd, const std::string& path);

// close(2) with an error naming `path`. `fd` is closed whatever the result.
absl::Status CloseFd(int fd, const std::string& path);

}  // namespace swarm::persist

#endif  // SWARM_PERSIST_FILE_UTIL_H_
