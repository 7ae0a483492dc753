#include "metrics/metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace swarm {
namespace {

bool IsNameChar(char c, bool first, bool colon_ok) {
  if (absl::ascii_isalpha(c) || c == '_') return true;
  if (c == ':') return colon_ok;
  return !first && absl::ascii_isdigit(c);
}

// `\` and newline escaped; `"` too when `quote`.
std::string Escape(absl::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="x",b="y"` without the closing brace; "" without labels.
std::string OpenLabels(const std::vector<std::string>& names,
                       const std::vector<std::string>& values) {
  if (names.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ",", names[i], "=\"",
                    EscapeLabelValue(values[i]), "\"");
  }
  return out;
}

std::string CloseLabels(const std::string& open) {
  return open.empty() ? "" : open + "}";
}

// A counter or gauge child: one line.
template <typename T>
void AppendChild(const std::string& name, const std::string& open,
                 const std::vector<std::string>& /*bound_texts*/,
                 const T& child, std::string* out) {
  absl::StrAppend(out, name, open, open.empty() ? "" : "}", " ",
                  FormatMetricValue(child.Value()), "\n");
}

// `bound_texts`: the family's bucket bounds as formatted once (the last
// "+Inf"), so that a scrape does not format them again for every child.
void AppendChild(const std::string& name, const std::string& open,
                 const std::vector<std::string>& bound_texts,
                 const Histogram& child, std::string* out) {
  const Histogram::Snapshot snap = child.Read();
  const std::string le_prefix = open.empty() ? "{le=\"" : open + ",le=\"";
  for (size_t i = 0; i <= snap.bounds.size(); ++i) {
    absl::StrAppend(out, name, "_bucket", le_prefix, bound_texts[i], "\"} ",
                    snap.cumulative[i], "\n");
  }
  const std::string labels = CloseLabels(open);
  absl::StrAppend(out, name, "_sum", labels, " ", FormatMetricValue(snap.sum),
                  "\n", name, "_count", labels, " ", snap.count, "\n");
}

// A counter or gauge without labels, computed at exposition time.
class CallbackFamily final : public metrics_internal::FamilyBase {
 public:
  CallbackFamily(std::string name, std::string help, MetricType type,
                 std::function<double()> read)
      : FamilyBase(std::move(name), std::move(help), type, {}, {}),
        read_(std::move(read)) {}

  void AppendSamples(std::string* out) const override {
    absl::StrAppend(out, name(), " ", FormatMetricValue(read_()), "\n");
  }

 private:
  const std::function<double()> read_;
};

absl::Status ValidateLabelNames(const std::vector<std::string>& names,
                                MetricType type) {
  std::set<absl::string_view> seen;
  for (const std::string& name : names) {
    if (absl::Status s = ValidateLabelName(name); !s.ok()) return s;
    if (type == MetricType::kHistogram && name == "le") {
      return absl::InvalidArgumentError(
          "label name \"le\" is invalid: a histogram's buckets use it");
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("label names: \"", name, "\" appears more than once"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBounds(absl::string_view name,
                            const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram \"", name, "\" bounds: ", FormatMetricValue(bounds[i]),
          " is not finite (the +Inf bucket is implicit)"));
    }
    if (i > 0 && !(bounds[i - 1] < bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram \"", name, "\" bounds: must be strictly increasing (",
          FormatMetricValue(bounds[i]), " after ",
          FormatMetricValue(bounds[i - 1]), ")"));
    }
  }
  return absl::OkStatus();
}

// Fields of /proc/self/stat after "(comm)": [0] is field 3 (state).
std::vector<std::string> ProcStatFields() {
  std::ifstream in("/proc/self/stat");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string stat = buffer.str();
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return {};
  return absl::StrSplit(absl::string_view(stat).substr(paren + 1), ' ',
                        absl::SkipWhitespace());
}

double StatField(int field_number) {
  const std::vector<std::string> fields = ProcStatFields();
  const size_t index = field_number - 3;
  double value = 0;
  if (index >= fields.size() || !absl::SimpleAtod(fields[index], &value)) {
    return NAN;
  }
  return value;
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    double value = 0;
    if (absl::StartsWith(line, "btime ") &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(6)), &value)) {
      return value;
    }
  }
  return NAN;
}

double OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return NAN;
  double count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // Not the descriptor of `dir` itself.
}

}  // namespace

absl::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == 0) return "0";
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  // Most values print exactly in six digits (absl's fast formatting).
  std::string text = absl::StrCat(value);
  if (std::strtod(text.c_str(), nullptr) == value) return text;
  for (int precision = 15; precision <= 17; ++precision) {
    text = absl::StrFormat("%.*g", precision, value);
    if (std::strtod(text.c_str(), nullptr) == value) break;
  }
  return text;
}

std::string EscapeHelp(absl::string_view help) {
  return Escape(help, /*quote=*/false);
}

std::string EscapeLabelValue(absl::string_view value) {
  return Escape(value, /*quote=*/true);
}

absl::Status ValidateMetricName(absl::string_view name) {
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, /*colon_ok=*/true)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric name \"", name,
          "\" is invalid: it must match [a-zA-Z_:][a-zA-Z0-9_:]*"));
    }
  }
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "metric name is empty: it must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelName(absl::string_view name) {
  bool ok = !name.empty();
  for (size_t i = 0; i < name.size(); ++i) {
    ok = ok && IsNameChar(name[i], i == 0, /*colon_ok=*/false);
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("label name \"", name,
                     "\" is invalid: it must match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  if (absl::StartsWith(name, "__")) {
    return absl::InvalidArgumentError(
        absl::StrCat("label name \"", name,
                     "\" is invalid: names starting with \"__\" are reserved"));
  }
  return absl::OkStatus();
}

absl::Status Counter::Inc(double delta) {
  if (!(delta >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "counter increment ", FormatMetricValue(delta),
        " is invalid: a counter only goes up (delta must be >= 0)"));
  }
  absl::MutexLock lock(&mu_);
  value_ += delta;
  return absl::OkStatus();
}

double Counter::Value() const {
  absl::MutexLock lock(&mu_);
  return value_;
}

void Gauge::Set(double value) {
  absl::MutexLock lock(&mu_);
  value_ = value;
}

void Gauge::Add(double delta) {
  absl::MutexLock lock(&mu_);
  value_ += delta;
}

double Gauge::Value() const {
  absl::MutexLock lock(&mu_);
  return value_;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[std::isnan(value) ? bounds_.size() : bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snap;
  snap.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (uint64_t n : counts_) snap.cumulative.push_back(total += n);
  snap.sum = sum_;
  snap.count = count_;
  return snap;
}

namespace metrics_internal {

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names,
                       std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {
  for (double bound : bounds_) bound_texts_.push_back(FormatMetricValue(bound));
  bound_texts_.push_back("+Inf");
}

absl::Status FamilyBase::CheckLabelValues(
    const std::vector<std::string>& values) const {
  if (values.size() == label_names_.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "label values of \"%s\": got %d, want %d (one per label name: %s)", name_,
      values.size(), label_names_.size(), absl::StrJoin(label_names_, ", ")));
}

}  // namespace metrics_internal

template <typename T>
absl::StatusOr<T*> Family<T>::WithLabels(
    const std::vector<std::string>& values) {
  if (absl::Status s = CheckLabelValues(values); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Child& child = children_[values];
  if (child.metric == nullptr) {
    if constexpr (std::is_same_v<T, Histogram>) {
      child.metric = std::make_unique<Histogram>(bounds());
    } else {
      child.metric = std::make_unique<T>();
    }
    child.open_labels = OpenLabels(label_names(), values);
  }
  return child.metric.get();
}

template <typename T>
void Family<T>::AppendSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, child] : children_) {
    AppendChild(name(), child.open_labels, bound_texts(), *child.metric, out);
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

absl::StatusOr<metrics_internal::FamilyBase*> MetricsRegistry::Add(
    std::unique_ptr<metrics_internal::FamilyBase> family) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(family->name());
  if (it == families_.end()) {
    metrics_internal::FamilyBase* added = family.get();
    families_.emplace(family->name(), std::move(family));
    return added;
  }
  const metrics_internal::FamilyBase& old = *it->second;
  std::string differs;
  if (old.type() != family->type()) {
    differs = absl::StrCat("a ", MetricTypeName(old.type()), ", not a ",
                           MetricTypeName(family->type()));
  } else if (old.help() != family->help()) {
    differs = "with a different help text";
  } else if (old.label_names() != family->label_names()) {
    differs = absl::StrCat("with label names (",
                           absl::StrJoin(old.label_names(), ", "), ")");
  } else if (old.bounds() != family->bounds()) {
    differs = "with different bucket bounds";
  }
  if (!differs.empty()) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric name \"", family->name(),
                     "\" is already registered as ", differs));
  }
  return it->second.get();
}

template <typename T>
absl::StatusOr<Family<T>*> MetricsRegistry::AddFamily(
    absl::string_view name, absl::string_view help, MetricType type,
    const std::vector<std::string>& label_names, std::vector<double> bounds) {
  if (absl::Status s = ValidateMetricName(name); !s.ok()) return s;
  if (absl::Status s = ValidateLabelNames(label_names, type); !s.ok()) return s;
  if (absl::Status s = ValidateBounds(name, bounds); !s.ok()) return s;
  absl::StatusOr<metrics_internal::FamilyBase*> added =
      Add(std::make_unique<Family<T>>(std::string(name), std::string(help),
                                      type, label_names, std::move(bounds)));
  if (!added.ok()) return added.status();
  auto* family = dynamic_cast<Family<T>*>(*added);
  if (family == nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(
        "metric name \"", name, "\" is already registered as a callback"));
  }
  if (label_names.empty()) {
    if (absl::Status s = family->WithLabels({}).status(); !s.ok()) return s;
  }
  return family;
}

absl::StatusOr<CounterFamily*> MetricsRegistry::AddCounter(
    absl::string_view name, absl::string_view help,
    const std::vector<std::string>& label_names) {
  return AddFamily<Counter>(name, help, MetricType::kCounter, label_names, {});
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::AddGauge(
    absl::string_view name, absl::string_view help,
    const std::vector<std::string>& label_names) {
  return AddFamily<Gauge>(name, help, MetricType::kGauge, label_names, {});
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::AddHistogram(
    absl::string_view name, absl::string_view help,
    const std::vector<std::string>& label_names, std::vector<double> bounds) {
  return AddFamily<Histogram>(name, help, MetricType::kHistogram, label_names,
                              std::move(bounds));
}

absl::Status MetricsRegistry::AddCallback(absl::string_view name,
                                          absl::string_view help,
                                          MetricType type,
                                          std::function<double()> read) {
  if (absl::Status s = ValidateMetricName(name); !s.ok()) return s;
  if (type == MetricType::kHistogram) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric type of \"", name, "\": a callback is a counter or a gauge"));
  }
  absl::MutexLock lock(&mu_);
  if (families_.count(name) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric name \"", name, "\" is already registered"));
  }
  families_.emplace(std::string(name), std::make_unique<CallbackFamily>(
                                           std::string(name), std::string(help),
                                           type, std::move(read)));
  return absl::OkStatus();
}

std::string MetricsRegistry::Exposition() const {
  std::vector<const metrics_internal::FamilyBase*> families;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, family] : families_)
      families.push_back(family.get());
  }
  std::string out;
  out.reserve(last_size_.load(std::memory_order_relaxed) + 4096);
  for (const metrics_internal::FamilyBase* family : families) {
    // The samples go straight after their header; a family without any
    // takes its header back.
    const size_t mark = out.size();
    absl::StrAppend(&out, "# HELP ", family->name(), " ",
                    EscapeHelp(family->help()), "\n# TYPE ", family->name(),
                    " ", MetricTypeName(family->type()), "\n");
    const size_t header_end = out.size();
    family->AppendSamples(&out);
    if (out.size() == header_end) out.resize(mark);
  }
  last_size_.store(out.size(), std::memory_order_relaxed);
  return out;
}

absl::Status RegisterProcessMetrics(MetricsRegistry* registry) {
  const double page_size = sysconf(_SC_PAGESIZE);
  const double ticks = sysconf(_SC_CLK_TCK);
  // Read once: /proc/stat is long (a scrape should not read it each time).
  const double start = BootTimeSeconds() + StatField(22) / ticks;
  struct Entry {
    const char* name;
    const char* help;
    MetricType type;
    std::function<double()> read;
  };
  const Entry entries[] = {
      {"process_resident_memory_bytes", "Resident memory size in bytes.",
       MetricType::kGauge, [=] { return StatField(24) * page_size; }},
      {"process_cpu_seconds_total",
       "Total user and system CPU time spent in seconds.", MetricType::kCounter,
       [=] { return (StatField(14) + StatField(15)) / ticks; }},
      {"process_start_time_seconds",
       "Start time of the process since unix epoch in seconds.",
       MetricType::kGauge, [start] { return start; }},
      {"process_open_fds", "Number of open file descriptors.",
       MetricType::kGauge, OpenFds},
      {"process_threads", "Number of OS threads in the process.",
       MetricType::kGauge, [] { return StatField(20); }},
  };
  for (const Entry& e : entries) {
    if (absl::Status s = registry->AddCallback(e.name, e.help, e.type, e.read);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace swarm
