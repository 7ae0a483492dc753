// A test PRG for secagg's tests (SplitMix64 keyed by the seed):
// deterministic and seekable, not cryptographic; the daemon's is
// security/secagg_crypto.h.
#ifndef SWARM_SECAGG_TEST_MASK_GENERATOR_H_
#define SWARM_SECAGG_TEST_MASK_GENERATOR_H_

#include <cstdint>

#include "secagg/masking.h"

namespace swarm::secagg {

class TestGenerator final : public MaskGenerator {
 public:
  absl::Status Apply(const Seed& seed, bool subtract, uint64_t offset,
                     absl::Span<uint32_t> values) const override {
    uint64_t key = 0;
    for (uint8_t b : seed) key = key * 131 + b;
    for (size_t i = 0; i < values.size(); ++i) {
      uint64_t z = key + (offset + i) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      const uint32_t word = static_cast<uint32_t>(z ^ (z >> 31));
      values[i] = subtract ? values[i] - word : values[i] + word;
    }
    return absl::OkStatus();
  }
};

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_TEST_MASK_GENERATOR_H_
