// Prometheus metrics kept in-process, and their text exposition format
// (version 0.0.4). No HTTP here: Exposition() returns the text a /metrics
// handler would serve.
//
//   MetricsRegistry registry;
//   auto sent = registry.AddCounter("swarm_models_sent_total",
//                                   "Models sent to a peer.", {"peer"});
//   absl::StatusOr<Counter*> to_b = (*sent)->WithLabels({"site-b"});
//   (*to_b)->Inc().IgnoreError();  // Only a negative or NaN delta fails.
//
// Everything is thread-safe. Families and their children are never removed:
// a pointer returned by Add*() or WithLabels() stays valid for the lifetime
// of the registry. Lock order: registry, then family, then child.
#ifndef SWARM_METRICS_METRICS_H_
#define SWARM_METRICS_METRICS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace swarm {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as on a # TYPE line.
absl::string_view MetricTypeName(MetricType type);

// A monotone value. Starts at 0.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta`. InvalidArgument (and no change) when it is negative or NaN.
  absl::Status Inc(double delta = 1);
  double Value() const;

 private:
  mutable absl::Mutex mu_;
  double value_ ABSL_GUARDED_BY(mu_) = 0;
};

// A value that goes up and down. Starts at 0.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value);
  void Add(double delta);
  double Value() const;

 private:
  mutable absl::Mutex mu_;
  double value_ ABSL_GUARDED_BY(mu_) = 0;
};

// Counts observations into buckets with fixed upper bounds (strictly
// increasing and finite; the +Inf bucket is implicit).
class Histogram {
 public:
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // bounds.size() + 1; the last is +Inf.
    double sum = 0;
    uint64_t count = 0;
  };

  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // A value lands in the first bucket whose bound is >= value (NaN: +Inf).
  void Observe(double value);
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // Per bucket, not sums.
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

namespace metrics_internal {

// What every family has; the registry keeps them by name.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names, std::vector<double> bounds);
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  const std::vector<double>& bounds() const { return bounds_; }
  // Histograms: the bounds as the exposition prints them, then "+Inf".
  const std::vector<std::string>& bound_texts() const { return bound_texts_; }

  // Appends the sample lines (not # HELP / # TYPE), sorted by label values.
  virtual void AppendSamples(std::string* out) const = 0;

 protected:
  // InvalidArgument unless there is one value per label name.
  absl::Status CheckLabelValues(const std::vector<std::string>& values) const;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // Histograms only.
  std::vector<std::string> bound_texts_;
};

}  // namespace metrics_internal

// The children of one metric family, one per tuple of label values.
// T is Counter, Gauge or Histogram.
template <typename T>
class Family final : public metrics_internal::FamilyBase {
 public:
  using FamilyBase::FamilyBase;

  // The child for `values` (one per label name, in order), created on first
  // use. InvalidArgument on a wrong number of values.
  absl::StatusOr<T*> WithLabels(const std::vector<std::string>& values);

  void AppendSamples(std::string* out) const override;

 private:
  mutable absl::Mutex mu_;
  struct Child {
    std::unique_ptr<T> metric;
    // `{a="x",b="y"` (escaped, no closing brace; "" without labels), made
    // once: a scrape does not escape the label values again.
    std::string open_labels;
  };
  std::map<std::vector<std::string>, Child> children_ ABSL_GUARDED_BY(mu_);
};

// Defined and instantiated in metrics.cc for these three.
extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family, or returns the one already registered under `name`
  // when type, help, label names (and bounds) are the same. Errors:
  // InvalidArgument for an invalid metric or label name (or histogram
  // bounds), AlreadyExists when `name` is taken by a different family.
  // A family without labels has its one child from the start (WithLabels({})).
  absl::StatusOr<CounterFamily*> AddCounter(
      absl::string_view name, absl::string_view help,
      const std::vector<std::string>& label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(
      absl::string_view name, absl::string_view help,
      const std::vector<std::string>& label_names = {});
  absl::StatusOr<HistogramFamily*> AddHistogram(
      absl::string_view name, absl::string_view help,
      const std::vector<std::string>& label_names, std::vector<double> bounds);

  // A counter or gauge without labels whose value `read` computes at every
  // Exposition() (called without the registry's lock held, but it must be
  // thread-safe). AlreadyExists when `name` is taken.
  absl::Status AddCallback(absl::string_view name, absl::string_view help,
                           MetricType type, std::function<double()> read);

  // The text format 0.0.4: per family (by name) # HELP, # TYPE, then its
  // samples by label values. Families without children are left out.
  std::string Exposition() const;

 private:
  template <typename T>
  absl::StatusOr<Family<T>*> AddFamily(
      absl::string_view name, absl::string_view help, MetricType type,
      const std::vector<std::string>& label_names, std::vector<double> bounds);
  absl::StatusOr<metrics_internal::FamilyBase*> Add(
      std::unique_ptr<metrics_internal::FamilyBase> family);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<metrics_internal::FamilyBase>,
           std::less<>>
      families_ ABSL_GUARDED_BY(mu_);
  // The size of the last exposition: the next one reserves as much.
  mutable std::atomic<size_t> last_size_{0};
};

// Registers the standard process metrics, read from /proc/self/stat (and
// /proc/stat's btime, /proc/self/fd) at each exposition:
// process_resident_memory_bytes, process_cpu_seconds_total,
// process_start_time_seconds, process_open_fds, process_threads.
absl::Status RegisterProcessMetrics(MetricsRegistry* registry);

// Exposed for tests. A sample value or `le` bound as Prometheus reads it:
// "+Inf", "-Inf", "NaN", an integer without exponent when exact and below
// 1e15, otherwise the shortest of %.15g..%.17g that reads back the same.
std::string FormatMetricValue(double value);
// `\` and newline escaped (# HELP text).
std::string EscapeHelp(absl::string_view help);
// `\`, `"` and newline escaped (label values).
std::string EscapeLabelValue(absl::string_view value);
// InvalidArgument naming `field` and the rule.
absl::Status ValidateMetricName(absl::string_view name);
absl::Status ValidateLabelName(absl::string_view name);

}  // namespace swarm

#endif  // SWARM_METRICS_METRICS_H_
