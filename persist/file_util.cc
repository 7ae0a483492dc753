#include "persist/file_util.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace swarm::persist {
namespace {

constexpr absl::string_view kTempInfix = ".tmp.";
constexpr int kTempRandomHexDigits = 16;

uint64_t RandomBits() {
  uint64_t bits = 0;
  if (getrandom(&bits, sizeof(bits), GRND_NONBLOCK) == sizeof(bits)) {
    return bits;
  }
  // No entropy available yet (early boot): a counter and the clock are enough
  // because O_EXCL catches any collision.
  static std::atomic<uint64_t> counter{0};
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  bits = static_cast<uint64_t>(now.tv_nsec) ^
         (static_cast<uint64_t>(now.tv_sec) << 30) ^
         (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  return bits;
}

}  // namespace

absl::Status ErrnoError(int err, absl::string_view what,
                        absl::string_view path) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

std::string DirName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

std::string BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return std::string(path);
  return std::string(path.substr(slash + 1));
}

bool IsTempFileName(absl::string_view name) {
  // ".<basename>.tmp.<pid>.<hex>"
  if (name.size() < 2 || name[0] != '.') return false;
  const size_t last_dot = name.rfind('.');
  if (last_dot == absl::string_view::npos || last_dot == 0) return false;
  const absl::string_view hex = name.substr(last_dot + 1);
  if (hex.size() != kTempRandomHexDigits) return false;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  const absl::string_view before_hex = name.substr(0, last_dot);
  const size_t pid_dot = before_hex.rfind('.');
  if (pid_dot == absl::string_view::npos) return false;
  const absl::string_view pid = before_hex.substr(pid_dot + 1);
  if (pid.empty()) return false;
  for (char c : pid) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  // before_hex[pid_dot] is the dot that ends ".tmp".
  const absl::string_view head = before_hex.substr(0, pid_dot + 1);
  return head.size() > kTempInfix.size() + 1 &&
         absl::EndsWith(head, kTempInfix);
}

absl::StatusOr<TempFile> CreateTempSibling(const std::string& final_path) {
  const std::string base = BaseName(final_path);
  if (base.empty() || base == "." || base == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("path \"", final_path, "\" does not name a file"));
  }
  const std::string dir = DirName(final_path);
  int last_errno = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    TempFile temp;
    temp.path = absl::StrFormat("%s/.%s%s%d.%016x", dir, base, kTempInfix,
                                static_cast<int>(getpid()), RandomBits());
    temp.fd =
        open(temp.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (temp.fd >= 0) return temp;
    last_errno = errno;
    if (last_errno != EEXIST) break;
  }
  return ErrnoError(last_errno, "cannot create a temporary file for",
                    final_path);
}

absl::Status WriteFully(int fd, absl::string_view bytes,
                        const std::string& path) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, absl::StrCat("cannot write ", left, " bytes to"),
                        path);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncFd(int fd, const std::string& path) {
  while (fsync(fd) != 0) {
    if (errno == EINTR) continue;
    return ErrnoError(errno, "cannot fsync", path);
  }
  return absl::OkStatus();
}

absl::Status CloseFd(int fd, const std::string& path) {
  // Linux closes the descriptor even when close() fails, so never retry.
  if (close(fd) != 0 && errno != EINTR) {
    return ErrnoError(errno, "cannot close", path);
  }
  return absl::OkStatus();
}

}  // namespace swarm::persist
