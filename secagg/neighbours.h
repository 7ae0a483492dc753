// Who a trainer masks with and shares its self-mask seed with (design
// section 10): every other trainer (the complete graph, the default), or,
// for many sites, k of them (SecAgg+, Bell et al. 2020): a k-regular graph
// drawn from the job's seed, so that every site computes the same graph
// and a trainer's cost grows with k, not with the number of trainers.
//
// The graph: the trainers in an order shuffled by the seed, as a ring, each
// joined to the k/2 before it and the k/2 after it. Symmetric: j is i's
// neighbour exactly when i is j's.
#ifndef SWARM_SECAGG_NEIGHBOURS_H_
#define SWARM_SECAGG_NEIGHBOURS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace swarm::secagg {

// `self`'s neighbours among `trainers` (names, any order, `self` among
// them), sorted by name. `degree` 0, or at least the number of other
// trainers: the complete graph. Otherwise it must be even and at least 2
// (INVALID_ARGUMENT naming the rule).
absl::StatusOr<std::vector<std::string>> Neighbours(
    const std::vector<std::string>& trainers, const std::string& self,
    int degree, uint64_t seed);

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_NEIGHBOURS_H_
