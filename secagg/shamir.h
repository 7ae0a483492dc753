// Shamir's t-of-n secret sharing (design section 10): a trainer's self-mask
// seed is split among its neighbours so that any `threshold` of them can
// rebuild it for the aggregator when the trainer drops out after submitting,
// and fewer learn nothing about it. Over GF(2^8): every byte of the secret
// is the constant term of its own random polynomial of degree threshold-1;
// share x holds each polynomial's value at x (1..255).
//
// Pure: the randomness is the caller's (a cryptographic source in the
// daemon: security/secagg_crypto.h SecureRandomBytes).
#ifndef SWARM_SECAGG_SHAMIR_H_
#define SWARM_SECAGG_SHAMIR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swarm::secagg {

// Fills its argument with random bytes. REQUIRES for secrecy: unpredictable
// (a CSPRNG).
using RandomBytes = std::function<void(absl::Span<uint8_t>)>;

struct Share {
  uint8_t x = 0;  // 1..255: which share.
  std::string y;  // As long as the secret.
};

// `count` shares of `secret`, numbered 1..count, any `threshold` of which
// rebuild it. INVALID_ARGUMENT unless 1 <= threshold <= count <= 255.
absl::StatusOr<std::vector<Share>> SplitSecret(absl::string_view secret,
                                               int threshold, int count,
                                               const RandomBytes& random);

// The secret from at least `threshold` shares of one split (the first
// `threshold` are used). INVALID_ARGUMENT when there are fewer, when two
// have the same number or x = 0, or when their lengths differ. Shares of
// another split, or fewer than the split's threshold, give a wrong secret
// (nothing in the shares tells): the caller checks the result (the
// aggregator checks the rebuilt seed against its commitment).
absl::StatusOr<std::string> CombineShares(absl::Span<const Share> shares,
                                          int threshold);

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_SHAMIR_H_
