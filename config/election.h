// The aggregator election (design section 3, step 2): for each round, a
// permutation of the job's aggregator candidates drawn from (seed, round).
// Its first member aggregates the round; the rest are the ordered backups
// (failover, design section 6).
//
// Every site computes the same order with no communication, so the draw is
// fully specified here and uses no implementation-defined library pieces
// (std::shuffle and the std distributions differ between standard libraries):
//
//   mix(z)    = SplitMix64's finaliser:
//               z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
//               z = (z ^ (z >> 27)) * 0x94d049bb133111eb
//               z ^ (z >> 31)
//   state     = mix(seed ^ mix(round + 0x5357'4152'4d45'4c45))   ("SWARMELE")
//   next()    = state += 0x9e3779b97f4a7c15; mix(state)           (SplitMix64)
//   bounded(n)= threshold = (2^64 - n) mod n; draw r = next() until
//               r >= threshold; r mod n                          (unbiased)
//   shuffle   = Fisher–Yates over the candidates in config order:
//               for i = n-1 down to 1: swap(a[i], a[bounded(i + 1)])
//
// All arithmetic is modulo 2^64.
#ifndef SWARM_CONFIG_ELECTION_H_
#define SWARM_CONFIG_ELECTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/swarm.pb.h"

namespace swarm {

// SplitMix64 (Steele, Lea, Flood 2014): a small, fast, portable PRNG whose
// output depends only on its 64-bit state. Not for cryptography.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  // The finaliser alone (a bijective 64-bit hash).
  static uint64_t Mix(uint64_t z);

  uint64_t Next();
  // Uniform in [0, bound), without modulo bias. Requires bound >= 1.
  uint64_t Bounded(uint64_t bound);

 private:
  uint64_t state_;
};

// The generator ElectionOrder uses for (seed, round).
SplitMix64 ElectionRng(uint64_t seed, uint32_t round);

// The election order of `round`: a permutation of job.aggregator_candidates
// (all sites, in order, when the list is empty, as WithDefaults makes it).
// Identical on every machine and compiler. Empty when there is no candidate.
std::vector<std::string> ElectionOrder(const v1::JobConfig& job,
                                       uint32_t round);

}  // namespace swarm

#endif  // SWARM_CONFIG_ELECTION_H_
