// The decisions of the robust methods, on numbers alone (no models): which
// results Multi-Krum and Bulyan select from the pairwise distances, Bulyan's
// per-coordinate rule, and the weights of one centered-clipping or
// Weiszfeld step. robust_aggregator.cc runs them over models; they sit here
// so that small cases can be checked by hand. Internal to gatherer/.
#ifndef SWARM_GATHERER_ROBUST_RULES_H_
#define SWARM_GATHERER_ROBUST_RULES_H_

#include <cstdint>
#include <vector>

#include "proto/swarm.pb.h"

namespace swarm {
namespace agg_internal {

// n x n squared distances, row-major (d[i * n + j]), symmetric, zero
// diagonal.
using DistanceMatrix = std::vector<double>;

// Krum scores of `candidates` among themselves: for each candidate the sum
// of its squared distances to its k nearest other candidates, k = |C| - f -
// 2 (at least 1, at most |C| - 1; Bulyan's last rounds of Krum have fewer
// than 2f + 3 candidates).
std::vector<double> KrumScores(const DistanceMatrix& d, uint32_t n,
                               const std::vector<uint32_t>& candidates, int f);

// Multi-Krum: the m inputs with the lowest Krum scores among all n (ties to
// the lower index), sorted by index. m = 0 means n - f.
std::vector<uint32_t> MultiKrumSelect(const DistanceMatrix& d, uint32_t n,
                                      int f, int m);

// Bulyan's selection: theta = n - 2f inputs taken one at a time, each the
// Krum winner among those not yet taken. Sorted by index.
std::vector<uint32_t> BulyanSelect(const DistanceMatrix& d, uint32_t n, int f);

// Bulyan's coordinate rule: the mean of the `beta` of `values` closest to
// their median (ties to the lower value). Sorts `values` (size theta >=
// beta >= 1).
double MeanClosestToMedian(std::vector<double>& values, uint32_t beta);
// The median of `values` (mean of the two middle ones for an even count).
// Sorts `values`, NaN last.
double MedianOf(std::vector<double>& values);

// One step of an iteration z <- a * z + sum_k w[k] * x_k.
struct StepWeights {
  double a = 0;
  std::vector<double> w;
  // The clipping radius used (centered clipping).
  double radius = 0;
};

// Centered clipping: with distances d_k = |x_k - z| and radius tau (0:
// the median of the d_k), z + mean_k((x_k - z) * min(1, tau / d_k)).
StepWeights CenteredClippingStep(const std::vector<double>& distances,
                                 double radius);
// Smoothed Weiszfeld: sum_k x_k / max(nu, d_k) over sum_k 1 / max(nu, d_k),
// nu = 1e-6 times the largest finite distance (at least 1e-12); an infinite
// distance (a result with NaN values) gets no weight.
StepWeights WeiszfeldStep(const std::vector<double>& distances);

}  // namespace agg_internal
}  // namespace swarm

#endif  // SWARM_GATHERER_ROBUST_RULES_H_
