#include "gatherer/robust_rules.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace swarm {
namespace agg_internal {

std::vector<double> KrumScores(const DistanceMatrix& d, uint32_t n,
                               const std::vector<uint32_t>& candidates, int f) {
  const int size = static_cast<int>(candidates.size());
  const int k = std::min(size - 1, std::max(1, size - f - 2));
  std::vector<double> scores;
  scores.reserve(candidates.size());
  std::vector<double> others;
  for (uint32_t i : candidates) {
    others.clear();
    for (uint32_t j : candidates) {
      if (j != i) others.push_back(d[static_cast<size_t>(i) * n + j]);
    }
    std::sort(others.begin(), others.end());
    double score = 0;
    for (int t = 0; t < k; ++t) score += others[t];
    scores.push_back(score);
  }
  return scores;
}

namespace {

// Indices into `candidates` ordered by score, ties to the lower index.
std::vector<size_t> ByScore(const std::vector<double>& scores,
                            const std::vector<uint32_t>& candidates) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (scores[a] != scores[b]) return scores[a] < scores[b];
    return candidates[a] < candidates[b];
  });
  return order;
}

}  // namespace

std::vector<uint32_t> MultiKrumSelect(const DistanceMatrix& d, uint32_t n,
                                      int f, int m) {
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  const int count =
      std::clamp(m == 0 ? static_cast<int>(n) - f : m, 1, static_cast<int>(n));
  const std::vector<size_t> order = ByScore(KrumScores(d, n, all, f), all);
  std::vector<uint32_t> selected;
  for (int t = 0; t < count; ++t) selected.push_back(all[order[t]]);
  std::sort(selected.begin(), selected.end());
  return selected;
}

std::vector<uint32_t> BulyanSelect(const DistanceMatrix& d, uint32_t n, int f) {
  std::vector<uint32_t> remaining(n);
  std::iota(remaining.begin(), remaining.end(), 0u);
  const int theta = std::max(1, static_cast<int>(n) - 2 * f);
  std::vector<uint32_t> selected;
  for (int t = 0; t < theta; ++t) {
    const std::vector<size_t> order =
        ByScore(KrumScores(d, n, remaining, f), remaining);
    selected.push_back(remaining[order[0]]);
    remaining.erase(remaining.begin() + static_cast<long>(order[0]));
  }
  std::sort(selected.begin(), selected.end());
  return selected;
}

double MedianOf(std::vector<double>& values) {
  // NaN (allow_non_finite) sorts last, as in the coordinate median.
  std::sort(values.begin(), values.end(),
            [](double a, double b) { return a < b || (b != b && a == a); });
  const size_t n = values.size();
  if (n % 2 == 1) return values[n / 2];
  return 0.5 * values[n / 2 - 1] + 0.5 * values[n / 2];
}

double MeanClosestToMedian(std::vector<double>& values, uint32_t beta) {
  const double median = MedianOf(values);  // Sorts.
  // The beta closest form a window of the sorted values around the middle:
  // grow it one value at a time from the middle, taking the closer side.
  size_t low = values.size() / 2;
  size_t high = low;
  double sum = 0;
  for (uint32_t t = 0; t < beta; ++t) {
    const bool take_low =
        high == values.size() ||
        (low > 0 && median - values[low - 1] <= values[high] - median);
    if (take_low) {
      sum += values[--low];
    } else {
      sum += values[high++];
    }
  }
  return sum / static_cast<double>(beta);
}

StepWeights CenteredClippingStep(const std::vector<double>& distances,
                                 double radius) {
  StepWeights step;
  const double n = static_cast<double>(distances.size());
  if (radius <= 0) {
    std::vector<double> copy = distances;
    radius = MedianOf(copy);
  }
  step.radius = radius;
  double kept = 0;
  for (double distance : distances) {
    const double clip =
        distance <= radius || distance == 0 ? 1.0 : radius / distance;
    step.w.push_back(clip / n);
    kept += clip / n;
  }
  step.a = 1.0 - kept;
  return step;
}

StepWeights WeiszfeldStep(const std::vector<double>& distances) {
  StepWeights step;
  double largest = 0;  // Finite: an infinite distance gets no weight.
  for (double distance : distances) {
    if (std::isfinite(distance)) largest = std::max(largest, distance);
  }
  const double nu = std::max(1e-12, 1e-6 * largest);
  double total = 0;
  for (double distance : distances) {
    step.w.push_back(1.0 / std::max(nu, distance));
    total += step.w.back();
  }
  for (double& w : step.w) w /= total;
  return step;
}

}  // namespace agg_internal
}  // namespace swarm
