#include "config/election.h"

#include <string>
#include <utility>
#include <vector>

namespace swarm {
namespace {

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kRoundSalt = 0x53574152'4d454c45ull;  // "SWARMELE"

}  // namespace

uint64_t SplitMix64::Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Next() {
  state_ += kGamma;
  return Mix(state_);
}

uint64_t SplitMix64::Bounded(uint64_t bound) {
  // Values below `threshold` are the 2^64 mod bound values that would make
  // r mod bound favour small results; rejecting them leaves a multiple of
  // `bound` equally likely values.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = Next();
    if (r >= threshold) return r % bound;
  }
}

SplitMix64 ElectionRng(uint64_t seed, uint32_t round) {
  return SplitMix64(
      SplitMix64::Mix(seed ^ SplitMix64::Mix(uint64_t{round} + kRoundSalt)));
}

std::vector<std::string> ElectionOrder(const v1::JobConfig& job,
                                       uint32_t round) {
  std::vector<std::string> order;
  if (!job.aggregator_candidates().empty()) {
    order.assign(job.aggregator_candidates().begin(),
                 job.aggregator_candidates().end());
  } else {
    for (const v1::SiteInfo& site : job.sites()) order.push_back(site.name());
  }
  SplitMix64 rng = ElectionRng(job.seed(), round);
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.Bounded(i));
    if (j != i - 1) std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace swarm
