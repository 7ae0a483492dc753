#include "learner/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace swarm {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
constexpr int kMaxDims = 4;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

absl::Status Corrupt(const std::string& path, absl::string_view why) {
  return absl::DataLossError(
      absl::StrFormat("%s: corrupted IDX file: %s", path, why));
}

// The zlib error of `file` if there is one, else "unexpected end of file".
std::string GzError(gzFile_s* file, const std::string& path) {
  int code = Z_OK;
  const char* message = gzerror(file, &code);
  if (code != Z_OK && code != Z_STREAM_END && message != nullptr &&
      *message != '\0') {
    absl::string_view text = message;
    // zlib prefixes its messages with the path.
    absl::ConsumePrefix(&text, path);
    absl::ConsumePrefix(&text, ": ");
    return absl::StrFormat("zlib: %s", text);
  }
  return "unexpected end of file";
}

// Reads exactly `size` bytes; false on EOF or error.
bool ReadFully(gzFile_s* file, uint8_t* out, uint64_t size) {
  while (size > 0) {
    const unsigned chunk =
        static_cast<unsigned>(std::min<uint64_t>(size, 1u << 30));
    const int got = gzread(file, out, chunk);
    if (got <= 0) return false;
    out += got;
    size -= static_cast<uint64_t>(got);
  }
  return true;
}

// Opens `path` for reading (gzip or plain), mapping the open error to a
// status.
absl::StatusOr<GzFile> OpenIdxFile(const std::string& path) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrFormat("%s: no such file", path));
    }
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(
          absl::StrFormat("%s: cannot open: %s", path, std::strerror(err)));
    }
    return absl::UnavailableError(
        absl::StrFormat("%s: cannot open: %s", path,
                        err != 0 ? std::strerror(err) : "gzopen failed"));
  }
  gzbuffer(file.get(), 1 << 17);
  return file;
}

// Reads and checks the magic, the element type and the dimension count;
// returns the dimension count.
absl::StatusOr<int> ReadIdxHeader(gzFile_s* file, const std::string& path) {
  uint8_t header[4];
  if (!ReadFully(file, header, sizeof(header))) {
    return Corrupt(path, absl::StrFormat("header: %s", GzError(file, path)));
  }
  if (header[0] != 0 || header[1] != 0) {
    return Corrupt(path,
                   absl::StrFormat("bad magic %02x%02x%02x%02x", header[0],
                                   header[1], header[2], header[3]));
  }
  if (header[2] != kTypeUnsignedByte) {
    return Corrupt(path,
                   absl::StrFormat("unsupported element type 0x%02x (only "
                                   "0x08, unsigned byte, is supported)",
                                   header[2]));
  }
  const int num_dims = header[3];
  if (num_dims < 1 || num_dims > kMaxDims) {
    return Corrupt(path, absl::StrFormat("%d dimensions (expected 1..%d)",
                                         num_dims, kMaxDims));
  }
  return num_dims;
}

// Reads the `num_dims` sizes into `dims`; returns their product (the data
// bytes), checked against kMaxIdxBytes.
absl::StatusOr<uint64_t> ReadIdxDims(gzFile_s* file, const std::string& path,
                                     int num_dims,
                                     std::vector<uint32_t>* dims) {
  uint64_t total = 1;
  for (int d = 0; d < num_dims; ++d) {
    uint8_t be[4];
    if (!ReadFully(file, be, sizeof(be))) {
      return Corrupt(path, absl::StrFormat("size of dimension %d: %s", d,
                                           GzError(file, path)));
    }
    const uint32_t size = (uint32_t{be[0]} << 24) | (uint32_t{be[1]} << 16) |
                          (uint32_t{be[2]} << 8) | uint32_t{be[3]};
    if (size == 0) {
      return Corrupt(path, absl::StrFormat("dimension %d has size 0", d));
    }
    total *= size;  // At most (2^30)^... checked below before overflow.
    if (total > kMaxIdxBytes) {
      return Corrupt(
          path, absl::StrFormat("declares more than %d bytes", kMaxIdxBytes));
    }
    dims->push_back(size);
  }
  return total;
}

// Checks that nothing follows the `total` data bytes; reading to the end
// also makes zlib check the CRC.
absl::Status CheckIdxEnd(gzFile_s* file, const std::string& path,
                         uint64_t total) {
  uint8_t extra;
  const int got = gzread(file, &extra, 1);
  if (got > 0) {
    return Corrupt(
        path, absl::StrFormat("trailing bytes after %d data bytes", total));
  }
  if (got < 0) {
    return Corrupt(path, GzError(file, path));
  }
  int code = Z_OK;
  gzerror(file, &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    return Corrupt(path, GzError(file, path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  SWARM_ASSIGN_OR_RETURN(GzFile file, OpenIdxFile(path));
  SWARM_ASSIGN_OR_RETURN(const int num_dims, ReadIdxHeader(file.get(), path));
  IdxArray out;
  SWARM_ASSIGN_OR_RETURN(const uint64_t total,
                         ReadIdxDims(file.get(), path, num_dims, &out.dims));
  out.data.resize(total);
  if (!ReadFully(file.get(), out.data.data(), total)) {
    return Corrupt(
        path, absl::StrFormat("truncated: dims [%s] need %d data bytes: %s",
                              absl::StrJoin(out.dims, ", "), total,
                              GzError(file.get(), path)));
  }
  SWARM_RETURN_IF_ERROR(CheckIdxEnd(file.get(), path, total));
  return out;
}

}  // namespace swarm
