// Reads IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or
// plain, with zlib.
//
// Format (big-endian): two zero bytes, a type byte (only 0x08, unsigned byte,
// is supported), a dimension count byte (1..4), then one uint32 size per
// dimension, then the product of the sizes in bytes of data, and nothing
// after. Every one of these is checked.
#ifndef SWARM_LEARNER_IDX_READER_H_
#define SWARM_LEARNER_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace swarm {

struct IdxArray {
  // Sizes, outermost first (e.g. {60000, 28, 28}).
  std::vector<uint32_t> dims;
  // Row-major, product(dims) bytes.
  std::vector<uint8_t> data;
};

// Largest data an IDX file may declare (guards against corrupted headers).
inline constexpr uint64_t kMaxIdxBytes = 1ull << 30;

// Reads `path` (gzip or plain). Errors:
//   NotFound           the file does not exist ("<path>: no such file")
//   PermissionDenied / Unavailable   it cannot be opened for another reason
//   DataLoss           bad magic, unsupported type, bad dimension count,
//                      a zero or oversized size, truncated data, trailing
//                      bytes, or a gzip error (e.g. CRC mismatch); the message
//                      starts with the path.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

}  // namespace swarm

#endif  // SWARM_LEARNER_IDX_READER_H_
