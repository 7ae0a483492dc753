// What each aggregation method needs of the number of its inputs n to
// tolerate f attackers (design section 11). One definition for the job
// config's checks (config/) and the aggregators' fallback (gatherer/).
#ifndef SWARM_COMMON_ROBUST_REQUIREMENTS_H_
#define SWARM_COMMON_ROBUST_REQUIREMENTS_H_

#include "proto/swarm.pb.h"

namespace swarm {

// The fewest inputs `method` needs to tolerate f attackers: Multi-Krum
// 2f + 3 (each score sums n - f - 2 >= f + 1 distances), Bulyan 4f + 3
// (n - 2f selected, of which n - 4f >= 3 kept per coordinate), centered
// clipping, geometric median, median and trimmed mean 2f + 1 (a majority
// honest), FedAvg 1 (it tolerates no attacker at all).
inline int RobustRequiredInputs(v1::AggregationMethod method, int f) {
  switch (method) {
    case v1::AGGREGATION_MULTI_KRUM:
      return 2 * f + 3;
    case v1::AGGREGATION_BULYAN:
      return 4 * f + 3;
    case v1::AGGREGATION_FEDAVG:
      return 1;
    default:
      return 2 * f + 1;
  }
}

// The same rule as text, for messages: "n >= 4f + 3".
inline const char* RobustRequirementText(v1::AggregationMethod method) {
  switch (method) {
    case v1::AGGREGATION_MULTI_KRUM:
      return "n >= 2f + 3";
    case v1::AGGREGATION_BULYAN:
      return "n >= 4f + 3";
    case v1::AGGREGATION_FEDAVG:
      return "n >= 1";
    default:
      return "n >= 2f + 1";
  }
}

}  // namespace swarm

#endif  // SWARM_COMMON_ROBUST_REQUIREMENTS_H_
