// Ranks the validation metrics of global models (design section 3, step 7).
//
// A metric is *usable* when it is present and finite. An unusable metric
// (missing, NaN, +Inf or -Inf) never wins: not against a usable metric, and
// not against another unusable one. Infinities count as unusable because no
// real accuracy or loss is infinite; an infinite value means a broken
// evaluation, and letting -Inf win a lower-is-better job would pin the best
// record to that broken model for good.
//
// Ties never win: a candidate must be strictly better than the incumbent, so
// an earlier record keeps its place against an equal later score.
#ifndef SWARM_GATHERER_METRIC_COMPARATOR_H_
#define SWARM_GATHERER_METRIC_COMPARATOR_H_

#include <optional>

#include "proto/swarm.pb.h"

namespace swarm {

// Stateless apart from the direction; cheap to copy. All methods are const,
// so one instance may be shared between threads.
class MetricComparator {
 public:
  // METRIC_LOWER_IS_BETTER ranks smaller values first (a loss). Every other
  // value, including numbers this build does not know, ranks larger values
  // first, as METRIC_HIGHER_IS_BETTER (the proto default) does. Validating
  // the direction of a job config is the config validator's task.
  explicit MetricComparator(v1::MetricDirection direction);

  v1::MetricDirection direction() const { return direction_; }
  bool lower_is_better() const { return lower_is_better_; }

  // Present and finite.
  static bool IsUsable(std::optional<double> metric);

  // > 0 when `a` is strictly better than `b`, < 0 when `b` is strictly better
  // than `a`, 0 otherwise (equal values, or neither usable). A usable metric
  // is better than an unusable one.
  int Compare(std::optional<double> a, std::optional<double> b) const;

  // Compare(candidate, incumbent) > 0.
  bool IsBetter(std::optional<double> candidate,
                std::optional<double> incumbent) const;

  // Whether a round's score beats the best-so-far record. A record that is
  // not present, or whose metric is unusable, loses to any usable score; an
  // unusable score never beats anything.
  bool BeatsRecord(std::optional<double> score,
                   const v1::BestRecord& best) const;

 private:
  v1::MetricDirection direction_;
  bool lower_is_better_;
};

}  // namespace swarm

#endif  // SWARM_GATHERER_METRIC_COMPARATOR_H_
