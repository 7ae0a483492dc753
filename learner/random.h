// A small portable PRNG for the built-in learner: the dataset split, the
// initial weights and the minibatch order must come out the same on every
// site and platform, which std:: distributions do not promise.
//
//   Mix(z)        SplitMix64's finaliser (a bijective 64-bit hash)
//   Next()        state += 0x9e3779b97f4a7c15; return Mix(state)
//   Bounded(n)    unbiased in [0, n) by rejection
//   Shuffle(v)    Fisher–Yates: for i = n-1 down to 1:
//                 swap(v[i], v[Bounded(i+1)])
//   UniformFloat  top 24 bits / 2^24, in [0, 1), exact
//   UniformOpen   (top 53 bits + 0.5) / 2^53, in (0, 1)
//   Normal        Marsaglia's polar method (one value per call)
//   LogGamma(a)   log of a Gamma(a, 1) sample: Marsaglia–Tsang for a >= 1,
//                 log Gamma(a + 1) + log(U) / a for a < 1 (log space, so tiny
//                 shapes do not underflow)
//
// Integer operations are exact everywhere; Normal and LogGamma use std::log,
// std::exp and std::sqrt, identical for one build and C library.
#ifndef SWARM_LEARNER_RANDOM_H_
#define SWARM_LEARNER_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace swarm {

class PortableRng {
 public:
  explicit PortableRng(uint64_t seed) : state_(seed) {}

  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // A generator for the stream (`seed`, `purpose`, `a`, `b`): distinct
  // arguments give unrelated streams.
  static PortableRng ForStream(uint64_t seed, uint64_t purpose, uint64_t a = 0,
                               uint64_t b = 0) {
    return PortableRng(Mix(seed ^ Mix(purpose ^ Mix(a ^ Mix(b)))));
  }

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return Mix(state_);
  }

  // Uniform in [0, bound). Requires bound >= 1.
  uint64_t Bounded(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % bound;
    }
  }

  float UniformFloat() {
    return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f);
  }

  double UniformOpen() {
    return (static_cast<double>(Next() >> 11) + 0.5) *
           (1.0 / 9007199254740992.0);
  }

  double Normal() {
    for (;;) {
      const double u = 2.0 * UniformOpen() - 1.0;
      const double v = 2.0 * UniformOpen() - 1.0;
      const double s = u * u + v * v;
      if (s >= 1.0 || s == 0.0) continue;
      return u * std::sqrt(-2.0 * std::log(s) / s);
    }
  }

  // Requires shape > 0 and finite.
  double LogGamma(double shape) {
    if (shape < 1.0) {
      return LogGamma(shape + 1.0) + std::log(UniformOpen()) / shape;
    }
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      const double x = Normal();
      double v = 1.0 + c * x;
      if (v <= 0.0) continue;
      v = v * v * v;
      const double u = UniformOpen();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) {
        return std::log(d) + std::log(v);
      }
    }
  }

  template <typename T>
  void Shuffle(std::vector<T>& values) {
    for (size_t i = values.size(); i > 1; --i) {
      const size_t j = static_cast<size_t>(Bounded(i));
      if (j != i - 1) std::swap(values[i - 1], values[j]);
    }
  }

 private:
  uint64_t state_;
};

}  // namespace swarm

#endif  // SWARM_LEARNER_RANDOM_H_
