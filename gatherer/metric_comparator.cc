#include "gatherer/metric_comparator.h"

#include <cmath>

namespace swarm {

MetricComparator::MetricComparator(v1::MetricDirection direction)
    : direction_(direction),
      lower_is_better_(direction == v1::METRIC_LOWER_IS_BETTER) {}

bool MetricComparator::IsUsable(std::optional<double> metric) {
  return metric.has_value() && std::isfinite(*metric);
}

int MetricComparator::Compare(std::optional<double> a,
                              std::optional<double> b) const {
  const bool a_usable = IsUsable(a);
  const bool b_usable = IsUsable(b);
  if (!a_usable || !b_usable) {
    // Only a usable metric can win; two unusable ones tie.
    return static_cast<int>(a_usable) - static_cast<int>(b_usable);
  }
  if (*a == *b) return 0;
  const bool a_larger = *a > *b;
  return a_larger != lower_is_better_ ? 1 : -1;
}

bool MetricComparator::IsBetter(std::optional<double> candidate,
                                std::optional<double> incumbent) const {
  return Compare(candidate, incumbent) > 0;
}

bool MetricComparator::BeatsRecord(std::optional<double> score,
                                   const v1::BestRecord& best) const {
  std::optional<double> incumbent;
  if (best.present()) incumbent = best.metric();
  return IsBetter(score, incumbent);
}

}  // namespace swarm
