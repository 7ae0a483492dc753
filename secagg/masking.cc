#include "secagg/masking.h"

namespace swarm::secagg {

absl::Status MaskUpdate(const MaskGenerator& prg, absl::string_view self,
                        const Seed& self_seed, absl::Span<const PairSeed> pairs,
                        uint64_t offset, absl::Span<uint32_t> values) {
  if (absl::Status applied =
          prg.Apply(self_seed, /*subtract=*/false, offset, values);
      !applied.ok()) {
    return applied;
  }
  for (const PairSeed& pair : pairs) {
    if (absl::Status applied =
            prg.Apply(pair.seed, /*subtract=*/!AddsPairMask(self, pair.peer),
                      offset, values);
        !applied.ok()) {
      return applied;
    }
  }
  return absl::OkStatus();
}

absl::Status UnmaskSum(const MaskGenerator& prg, const Unmasking& unmasking,
                       uint64_t offset, absl::Span<uint32_t> sum) {
  for (const Seed& seed : unmasking.self_seeds) {
    if (absl::Status applied = prg.Apply(seed, /*subtract=*/true, offset, sum);
        !applied.ok()) {
      return applied;
    }
  }
  // What the counted trainer added for the dropped one, taken out again.
  for (const Unmasking::DroppedPair& pair : unmasking.dropped_pairs) {
    if (absl::Status applied = prg.Apply(
            pair.seed, /*subtract=*/AddsPairMask(pair.counted, pair.dropped),
            offset, sum);
        !applied.ok()) {
      return applied;
    }
  }
  return absl::OkStatus();
}

}  // namespace swarm::secagg
