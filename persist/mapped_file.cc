#include "persist/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "persist/atomic_file.h"
#include "persist/file_util.h"

namespace swarm::persist {
namespace {

// Reserves [0, size) of `fd` on disk. Returns an errno value, 0 on success.
int ReserveSpace(int fd, uint64_t size) {
  const off_t length = static_cast<off_t>(size);
  while (fallocate(fd, 0, 0, length) != 0) {
    if (errno == EINTR) continue;
    if (errno != EOPNOTSUPP && errno != ENOSYS) return errno;
    // The file system cannot fallocate: glibc's emulation writes a byte into
    // every block, which reserves the space all the same.
    return posix_fallocate(fd, 0, length);
  }
  return 0;
}

}  // namespace

// ---------------------------------------------------------------- MappedFile

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(
    const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoError(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    close(fd);
    return std::unique_ptr<MappedFile>(new MappedFile(path, nullptr, 0));
  }
  void* data = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // The mapping keeps its own reference to the file.
  if (data == MAP_FAILED) {
    return ErrnoError(err, absl::StrCat("cannot mmap ", size, " bytes of"),
                      path);
  }
  // Readers walk tensors front to back; a failed hint is harmless.
  madvise(data, size, MADV_SEQUENTIAL);
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const char*>(data), size));
}

MappedFile::MappedFile(std::string path, const char* data, size_t size)
    : path_(std::move(path)), data_(data), size_(size) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
}

void MappedFile::ReleaseResidentPages() const {
  // A private read-only file mapping holds no data of its own: dropping its
  // pages loses nothing. Failure (an old kernel) only leaves them resident.
  if (data_ != nullptr) madvise(const_cast<char*>(data_), size_, MADV_DONTNEED);
}

// -------------------------------------------------------- WritableMappedFile

absl::StatusOr<std::unique_ptr<WritableMappedFile>> WritableMappedFile::Create(
    const std::string& final_path, uint64_t size) {
  if (size > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) ||
      size > std::numeric_limits<size_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot create ", final_path, " of ", size, " bytes: size too large"));
  }
  SWARM_ASSIGN_OR_RETURN(TempFile temp, CreateTempSibling(final_path));
  auto fail = [&temp](absl::Status status) {
    close(temp.fd);
    unlink(temp.path.c_str());
    return status;
  };
  char* data = nullptr;
  if (size > 0) {
    const int err = ReserveSpace(temp.fd, size);
    if (err != 0) {
      return fail(ErrnoError(
          err, absl::StrCat("cannot reserve ", size, " bytes on disk for"),
          absl::StrCat(final_path, " (temporary file ", temp.path, ")")));
    }
    void* mapped = mmap(nullptr, static_cast<size_t>(size),
                        PROT_READ | PROT_WRITE, MAP_SHARED, temp.fd, 0);
    if (mapped == MAP_FAILED) {
      return fail(ErrnoError(
          errno, absl::StrCat("cannot mmap ", size, " bytes of"), temp.path));
    }
    data = static_cast<char*>(mapped);
  }
  return std::unique_ptr<WritableMappedFile>(new WritableMappedFile(
      final_path, std::move(temp.path), temp.fd, data, size));
}

WritableMappedFile::WritableMappedFile(std::string final_path,
                                       std::string temp_path, int fd,
                                       char* data, uint64_t size)
    : final_path_(std::move(final_path)),
      temp_path_(std::move(temp_path)),
      fd_(fd),
      data_(data),
      size_(size) {}

WritableMappedFile::~WritableMappedFile() {
  Release();
  // After Commit() the temporary name is gone: renamed on success, removed by
  // Commit() itself on failure.
  if (!done_) unlink(temp_path_.c_str());
}

void WritableMappedFile::Release() {
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  data_ = nullptr;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<std::unique_ptr<MappedFile>> WritableMappedFile::Commit() {
  if (done_) {
    return absl::FailedPreconditionError(
        absl::StrCat("mapped file ", final_path_, " was already committed"));
  }
  done_ = true;
  absl::Status status;
  if (data_ != nullptr &&
      msync(data_, static_cast<size_t>(size_), MS_SYNC) != 0) {
    status = ErrnoError(errno, "cannot msync", temp_path_);
  }
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  data_ = nullptr;
  if (status.ok()) status = FsyncFd(fd_, temp_path_);
  if (status.ok())
    status = CloseFd(fd_, temp_path_);
  else
    close(fd_);
  fd_ = -1;
  if (status.ok() && rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    status = ErrnoError(
        errno, absl::StrCat("cannot rename ", temp_path_, " to"), final_path_);
  }
  if (!status.ok()) {
    unlink(temp_path_.c_str());
    return status;
  }
  SWARM_RETURN_IF_ERROR(FsyncDirectory(DirName(final_path_)));
  return MappedFile::Open(final_path_);
}

}  // namespace swarm::persist
