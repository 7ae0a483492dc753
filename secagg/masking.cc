#include "secagg/masking.h"

namespace swarm::secagg {

void MaskUpdate(const MaskGenerator& prg, absl::string_view self,
                const Seed& self_seed, absl::Span<const PairSeed> pairs,
                uint64_t offset, absl::Span<uint32_t> values) {
  prg.Apply(self_seed, /*subtract=*/false, offset, values);
  for (const PairSeed& pair : pairs) {
    prg.Apply(pair.seed, /*subtract=*/!AddsPairMask(self, pair.peer), offset,
              values);
  }
}

void UnmaskSum(const MaskGenerator& prg, const Unmasking& unmasking,
               uint64_t offset, absl::Span<uint32_t> sum) {
  for (const Seed& seed : unmasking.self_seeds) {
    prg.Apply(seed, /*subtract=*/true, offset, sum);
  }
  // What the counted trainer added for the dropped one, taken out again.
  for (const Unmasking::DroppedPair& pair : unmasking.dropped_pairs) {
    prg.Apply(pair.seed,
              /*subtract=*/AddsPairMask(pair.counted, pair.dropped), offset,
              sum);
  }
}

}  // namespace swarm::secagg
