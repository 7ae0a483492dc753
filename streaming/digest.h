// The end-to-end digest of a model stream (see ModelTrailer in swarm.proto):
// for every chunk in stream order, tensor_index (u32 LE), offset (u64 LE),
// length (u64 LE), then the chunk's bytes.
//
// XXH3-128 is built in. SHA-256 (the digest a signed model needs) is not:
// the core links no libcrypto, so its implementation lives in security/
// (security/sha256_digest.h) and a program that sends or receives SHA-256
// streams registers it once at start (RegisterStreamDigest below).
#ifndef SWARM_STREAMING_DIGEST_H_
#define SWARM_STREAMING_DIGEST_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {

class StreamDigest {
 public:
  // InvalidArgument for an unknown algorithm value; FailedPrecondition for
  // an algorithm whose implementation this program did not register.
  static absl::StatusOr<std::unique_ptr<StreamDigest>> Create(
      v1::DigestAlgorithm algorithm);
  virtual ~StreamDigest() = default;

  // Adds one chunk.
  void AddChunk(uint32_t tensor_index, uint64_t offset, absl::string_view data);
  // The same in pieces: BeginChunk, then AddChunkBytes over exactly `length`
  // bytes in order (so a receiver can digest each piece while it is still in
  // cache). The result equals AddChunk's.
  void BeginChunk(uint32_t tensor_index, uint64_t offset, uint64_t length);
  void AddChunkBytes(absl::string_view bytes) {
    Update(bytes.data(), bytes.size());
  }
  // The digest bytes. Call once, after the last chunk.
  virtual std::string Finish() = 0;

 protected:
  StreamDigest() = default;
  virtual void Update(const void* data, size_t size) = 0;
};

// Makes a new digest of one algorithm.
using StreamDigestMaker = std::unique_ptr<StreamDigest> (*)();

// Installs `maker` as the implementation of `algorithm` for the whole
// program (the last registration wins; safe from any thread, before or while
// streams run). InvalidArgument for DIGEST_XXH3_128 (built in) and for an
// unknown algorithm value.
absl::Status RegisterStreamDigest(v1::DigestAlgorithm algorithm,
                                  StreamDigestMaker maker);

// A model's content digest (XXH3-128): every tensor's name, dtype and shape,
// then its bytes, in table order. Equal models (same table, same bytes) give
// equal digests whatever their storage or metadata.
std::string ModelContentDigest(const Model& model);

}  // namespace swarm

#endif  // SWARM_STREAMING_DIGEST_H_
