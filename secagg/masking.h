// Pairwise and self masks (design section 10, after Bonawitz et al. 2017,
// "Practical Secure Aggregation for Privacy-Preserving Machine Learning").
// Trainer i uploads its encoded update plus
//   PRG(self seed of i) + sum over peers j of sign(i, j) * PRG(s_ij)
// mod 2^32, where s_ij is the seed i and j agreed on for the round and
// attempt (security/secagg_crypto.h) and sign(i, j) is + when i's name sorts
// before j's, - otherwise. In the sum of every trainer's upload each pair's
// masks cancel; the aggregator removes the self masks (rebuilt from shares)
// and, for a trainer j that dropped out before its upload was counted, the
// masks s_ij that each counted trainer i added for it (its seeds revealed by
// the survivors). Nothing else is revealed: one upload alone is uniformly
// random to whoever lacks its seeds.
//
// Pure arithmetic; the PRG is the caller's (MaskGenerator).
#ifndef SWARM_SECAGG_MASKING_H_
#define SWARM_SECAGG_MASKING_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swarm::secagg {

using Seed = std::array<uint8_t, 32>;

// Expands a seed into a stream of 32-bit words, the same stream for the
// same seed on every site. REQUIRES of an implementation: a cryptographic
// PRG (security/secagg_crypto.h AesCtrMaskGenerator), thread-safe const.
class MaskGenerator {
 public:
  virtual ~MaskGenerator() = default;
  // values[i] += word[offset + i] of the seed's stream (or -= with
  // `subtract`), mod 2^32. `offset` lets a model be masked chunk by chunk.
  // An error (the cipher library failed) may leave `values` partly masked:
  // the caller drops them.
  virtual absl::Status Apply(const Seed& seed, bool subtract, uint64_t offset,
                             absl::Span<uint32_t> values) const = 0;
};

struct PairSeed {
  std::string peer;
  Seed seed;
};

// Masks trainer `self`'s encoded update (`values`, words offset.. of the
// model) in place with its self mask and its pairwise masks.
absl::Status MaskUpdate(const MaskGenerator& prg, absl::string_view self,
                        const Seed& self_seed, absl::Span<const PairSeed> pairs,
                        uint64_t offset, absl::Span<uint32_t> values);

// What removes the masks from the sum of the counted uploads.
struct Unmasking {
  // The self seed of every trainer whose upload is in the sum.
  std::vector<Seed> self_seeds;
  // For each counted trainer `counted` and each trainer `dropped` whose
  // upload is not in the sum: their pairwise seed.
  struct DroppedPair {
    std::string counted;
    std::string dropped;
    Seed seed;
  };
  std::vector<DroppedPair> dropped_pairs;
};

// Removes the masks from `sum` (words offset.. of the summed model), in
// place: what is left is the sum of the counted trainers' encodings.
absl::Status UnmaskSum(const MaskGenerator& prg, const Unmasking& unmasking,
                       uint64_t offset, absl::Span<uint32_t> sum);

// Whether trainer `self` adds (true) or subtracts its pairwise mask with
// `peer`.
inline bool AddsPairMask(absl::string_view self, absl::string_view peer) {
  return self < peer;
}

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_MASKING_H_
