// The chain a global model belongs to (design section 6): for every round
// before it that was aggregated at a failover attempt (above 0), which
// attempt. Two chains of one job are ordered by the first round where their
// attempts differ, and the lower attempt wins, on every site alike: that is
// how a partition that let two sites aggregate one round still ends in one
// sequence of global models.
//
// Pure values; no clock, no I/O.
#ifndef SWARM_CONTROLLER_LINEAGE_H_
#define SWARM_CONTROLLER_LINEAGE_H_

#include <cstdint>
#include <map>
#include <string>

#include "google/protobuf/repeated_ptr_field.h"
#include "proto/swarm.pb.h"

namespace swarm {

// Round -> attempt, for the rounds aggregated at an attempt above 0.
using Lineage = std::map<uint32_t, uint32_t>;

Lineage LineageFromProto(
    const google::protobuf::RepeatedPtrField<v1::RoundAttempt>& rounds);
void LineageToProto(
    const Lineage& lineage,
    google::protobuf::RepeatedPtrField<v1::RoundAttempt>* rounds);

// The attempt at which `round` was aggregated in `lineage` (0 when absent).
uint32_t AttemptOf(const Lineage& lineage, uint32_t round);

// `lineage` extended by `round` aggregated at `attempt`.
Lineage Extend(Lineage lineage, uint32_t round, uint32_t attempt);

// Orders two chains over the rounds before `below`: negative when `a` wins
// (it has the lower attempt at the first round where they differ), positive
// when `b` wins, 0 when they agree on every such round. When it is not 0,
// `*round` (if given) is set to that first round.
int CompareChains(const Lineage& a, const Lineage& b, uint32_t below,
                  uint32_t* round = nullptr);

// "round 3 at attempt 1, round 7 at attempt 2", or "no failover".
std::string DescribeLineage(const Lineage& lineage);

}  // namespace swarm

#endif  // SWARM_CONTROLLER_LINEAGE_H_
