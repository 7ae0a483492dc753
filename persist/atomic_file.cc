#include "persist/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "persist/file_util.h"

namespace swarm::persist {
namespace {

// Appends smaller than this are gathered before write(2).
constexpr size_t kBufferBytes = 1 << 20;

}  // namespace

absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open directory", dir);
  absl::Status status;
  while (fsync(fd) != 0) {
    if (errno == EINTR) continue;
    // EINVAL: the file system cannot sync directories (nothing to do).
    if (errno != EINVAL)
      status = ErrnoError(errno, "cannot fsync directory", dir);
    break;
  }
  close(fd);
  return status;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer,
                         AtomicFileWriter::Create(path));
  SWARM_RETURN_IF_ERROR(writer->Append(contents));
  return writer->Commit();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  std::string contents;
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    contents.reserve(static_cast<size_t>(st.st_size));
  }
  char chunk[64 * 1024];
  while (true) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return ErrnoError(err, "cannot read", path);
    }
    if (n == 0) break;
    contents.append(chunk, static_cast<size_t>(n));
  }
  close(fd);
  return contents;
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(
    const std::string& final_path) {
  SWARM_ASSIGN_OR_RETURN(TempFile temp, CreateTempSibling(final_path));
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(final_path, std::move(temp.path), temp.fd));
}

AtomicFileWriter::AtomicFileWriter(std::string final_path,
                                   std::string temp_path, int fd)
    : final_path_(std::move(final_path)),
      temp_path_(std::move(temp_path)),
      fd_(fd) {}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (done_) return;
  done_ = true;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::CheckUsable() const {
  if (done_) {
    return absl::FailedPreconditionError(
        absl::StrCat("atomic writer for ", final_path_, " was already ",
                     failed_ ? "abandoned after an error" : "committed"));
  }
  if (failed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "atomic writer for ", final_path_, " failed earlier; nothing written"));
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status status = WriteFully(fd_, buffer_, temp_path_);
  buffer_.clear();
  return status;
}

absl::Status AtomicFileWriter::Append(absl::string_view bytes) {
  SWARM_RETURN_IF_ERROR(CheckUsable());
  absl::Status status;
  if (buffer_.size() + bytes.size() <= kBufferBytes) {
    buffer_.append(bytes.data(), bytes.size());
  } else {
    status = Flush();
    if (status.ok()) status = WriteFully(fd_, bytes, temp_path_);
  }
  if (!status.ok()) {
    failed_ = true;
    Abandon();
    return status;
  }
  size_ += bytes.size();
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  SWARM_RETURN_IF_ERROR(CheckUsable());
  absl::Status status = Flush();
  if (status.ok()) status = FsyncFd(fd_, temp_path_);
  if (status.ok()) {
    status = CloseFd(fd_, temp_path_);
    fd_ = -1;
  }
  if (status.ok() && rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    status = ErrnoError(
        errno, absl::StrCat("cannot rename ", temp_path_, " to"), final_path_);
  }
  if (!status.ok()) {
    failed_ = true;
    Abandon();
    return status;
  }
  done_ = true;
  return FsyncDirectory(DirName(final_path_));
}

}  // namespace swarm::persist
