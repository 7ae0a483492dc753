#include "learner/test_learner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "learner/learner_params.h"

namespace swarm {
namespace {

constexpr const char* kKnownKeys[] = {
    "size",         "init_scale", "init_offset",    "delta",
    "sample_count", "metrics",    "default_metric", "fail_round",
    "train_ms",     "payload",    "tensors",
};

// A parameter's value for `site`: "<key>.<site>" wins over "<key>".
using Param = swarm::LearnerParam;
constexpr auto& Lookup = swarm::LookupLearnerParam;
constexpr auto& BadParam = swarm::BadLearnerParam;

absl::StatusOr<double> ParseDouble(const Param& param) {
  double value;
  if (!absl::SimpleAtod(param.value, &value)) {
    return BadParam(param, "is not a number");
  }
  return value;
}

absl::StatusOr<float> ParseFloat(const Param& param) {
  float value;
  if (!absl::SimpleAtof(param.value, &value)) {
    return BadParam(param, "is not a number");
  }
  return value;
}

absl::StatusOr<uint32_t> ParseRound(const Param& param,
                                    absl::string_view text) {
  uint64_t value;
  absl::string_view stripped = absl::StripAsciiWhitespace(text);
  if (stripped.empty() || stripped[0] == '-' || stripped[0] == '+' ||
      !absl::SimpleAtoi(stripped, &value) ||
      value > std::numeric_limits<uint32_t>::max()) {
    return BadParam(param,
                    absl::StrFormat("has a bad round number \"%s\"", stripped));
  }
  return static_cast<uint32_t>(value);
}

// "0:0.50, 1:0.72" -> {0: 0.5, 1: 0.72}. Empty -> {}.
absl::StatusOr<std::map<uint32_t, double>> ParseMetrics(const Param& param) {
  std::map<uint32_t, double> out;
  if (absl::StripAsciiWhitespace(param.value).empty()) return out;
  for (absl::string_view entry : absl::StrSplit(param.value, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    if (parts.size() != 2) {
      return BadParam(param,
                      absl::StrFormat("has entry \"%s\", not round:value",
                                      absl::StripAsciiWhitespace(entry)));
    }
    SWARM_ASSIGN_OR_RETURN(uint32_t round, ParseRound(param, parts[0]));
    double value;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(parts[1]), &value)) {
      return BadParam(
          param, absl::StrFormat("has a bad value \"%s\" for round %d",
                                 absl::StripAsciiWhitespace(parts[1]), round));
    }
    if (!out.emplace(round, value).second) {
      return BadParam(param, absl::StrFormat("lists round %d twice", round));
    }
  }
  return out;
}

// "3" or "3,5" -> {3, 5}. Empty -> {}.
absl::StatusOr<std::set<uint32_t>> ParseRounds(const Param& param) {
  std::set<uint32_t> out;
  if (absl::StripAsciiWhitespace(param.value).empty()) return out;
  for (absl::string_view entry : absl::StrSplit(param.value, ',')) {
    SWARM_ASSIGN_OR_RETURN(uint32_t round, ParseRound(param, entry));
    out.insert(round);
  }
  return out;
}

}  // namespace

absl::StatusOr<TestLearnerOptions> ParseTestLearnerOptions(
    absl::string_view site, const std::map<std::string, std::string>& params) {
  TestLearnerOptions options;
  options.site = std::string(site);
  if (auto p = Lookup(params, "size", site)) {
    SWARM_ASSIGN_OR_RETURN(options.size,
                           ParseUintParam(*p, 1, TestLearner::kMaxSize));
  }
  if (auto p = Lookup(params, "tensors", site)) {
    for (absl::string_view entry : absl::StrSplit(p->value, ',')) {
      SWARM_ASSIGN_OR_RETURN(
          uint64_t elements,
          ParseUintParam(*p, entry, 1, TestLearner::kMaxSize));
      options.tensor_sizes.push_back(elements);
    }
  }
  if (auto p = Lookup(params, "init_scale", site)) {
    SWARM_ASSIGN_OR_RETURN(options.init_scale, ParseFloat(*p));
  }
  if (auto p = Lookup(params, "init_offset", site)) {
    SWARM_ASSIGN_OR_RETURN(options.init_offset, ParseFloat(*p));
  }
  if (auto p = Lookup(params, "delta", site)) {
    SWARM_ASSIGN_OR_RETURN(options.delta, ParseFloat(*p));
  }
  if (auto p = Lookup(params, "sample_count", site)) {
    SWARM_ASSIGN_OR_RETURN(
        options.sample_count,
        ParseUintParam(*p, 1, std::numeric_limits<uint64_t>::max()));
  }
  if (auto p = Lookup(params, "metrics", site)) {
    SWARM_ASSIGN_OR_RETURN(options.metrics, ParseMetrics(*p));
  }
  if (auto p = Lookup(params, "default_metric", site)) {
    SWARM_ASSIGN_OR_RETURN(options.default_metric, ParseDouble(*p));
  }
  if (auto p = Lookup(params, "fail_round", site)) {
    SWARM_ASSIGN_OR_RETURN(options.fail_rounds, ParseRounds(*p));
  }
  if (auto p = Lookup(params, "train_ms", site)) {
    // At most a day: a test that needs longer is a mistake.
    SWARM_ASSIGN_OR_RETURN(uint64_t ms,
                           ParseUintParam(*p, 0, 24ull * 3600 * 1000));
    options.train_time = absl::Milliseconds(static_cast<int64_t>(ms));
  }
  if (auto p = Lookup(params, "payload", site)) {
    std::string value = absl::AsciiStrToLower(p->value);
    if (value == "full") {
      options.weight_diff = false;
    } else if (value == "diff") {
      options.weight_diff = true;
    } else {
      return BadParam(*p, "is not \"full\" or \"diff\"");
    }
  }
  return options;
}

std::set<std::string> UnknownTestLearnerParams(
    const std::map<std::string, std::string>& params) {
  return UnknownLearnerParams(params, kKnownKeys);
}

absl::StatusOr<std::unique_ptr<TestLearner>> TestLearner::Create(
    TestLearnerOptions options) {
  if (options.size < 1 || options.size > kMaxSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "test learner: size %d is not in [1, %d]", options.size, kMaxSize));
  }
  for (uint64_t elements : options.tensor_sizes) {
    if (elements < 1 || elements > kMaxSize) {
      return absl::InvalidArgumentError(
          absl::StrFormat("test learner: tensor of %d elements is not in "
                          "[1, %d]",
                          elements, kMaxSize));
    }
  }
  if (options.sample_count < 1) {
    return absl::InvalidArgumentError(
        "test learner: sample_count must be at least 1");
  }
  if (options.train_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("test learner: negative train time");
  }
  return std::unique_ptr<TestLearner>(new TestLearner(std::move(options)));
}

TestLearner::TestLearner(TestLearnerOptions options)
    : options_(std::move(options)) {}

float TestLearner::InitialValue(uint64_t i) const {
  return static_cast<float>(i) * options_.init_scale + options_.init_offset;
}

double TestLearner::MetricFor(uint32_t round) const {
  auto it = options_.metrics.find(round);
  return it == options_.metrics.end() ? options_.default_metric : it->second;
}

std::vector<uint64_t> TestLearner::TensorSizes() const {
  if (!options_.tensor_sizes.empty()) return options_.tensor_sizes;
  return {options_.size};
}

absl::StatusOr<Model> TestLearner::InitialModel() {
  const std::vector<uint64_t> sizes = TensorSizes();
  std::vector<TensorSpec> specs;
  for (size_t t = 0; t < sizes.size(); ++t) {
    SWARM_ASSIGN_OR_RETURN(
        TensorSpec spec,
        MakeTensorSpec(t == 0 ? std::string(kTensorName)
                              : absl::StrCat(kTensorName, "_", t),
                       v1::DTYPE_F32, {sizes[t]}));
    specs.push_back(std::move(spec));
  }
  SWARM_ASSIGN_OR_RETURN(
      Model model,
      Model::Create(std::move(specs), HeapStorage::Init::kUninitialized));
  uint64_t first = 0;  // The model-wide number of the tensor's element 0.
  for (size_t t = 0; t < sizes.size(); ++t) {
    absl::Span<char> bytes = model.mutable_tensor_data(t);
    for (uint64_t i = 0; i < sizes[t]; ++i) {
      const float value = InitialValue(first + i);
      std::memcpy(bytes.data() + i * sizeof(float), &value, sizeof(float));
    }
    first += sizes[t];
  }
  return model;
}

absl::StatusOr<Metrics> TestLearner::Validate(const Model& global,
                                              uint32_t round) {
  if (global.num_tensors() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("test learner (site %s): round %d: empty global model",
                        options_.site, round));
  }
  const double metric = MetricFor(round);
  return Metrics{{"accuracy", metric}, {"loss", 1.0 - metric}};
}

absl::StatusOr<TrainOutput> TestLearner::Train(
    const Model& global, uint32_t round, const std::atomic<bool>& cancel) {
  auto cancelled = [&] {
    return absl::CancelledError(absl::StrFormat(
        "test learner (site %s): training of round %d cancelled", options_.site,
        round));
  };
  if (cancel.load(std::memory_order_acquire)) return cancelled();
  if (global.num_tensors() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("test learner (site %s): round %d: empty global model",
                        options_.site, round));
  }
  for (size_t t = 0; t < global.num_tensors(); ++t) {
    if (global.spec(t).dtype != v1::DTYPE_F32) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "test learner (site %s): tensor \"%s\" is %s, only F32 is supported",
          options_.site, global.spec(t).name, DTypeName(global.spec(t).dtype)));
    }
  }

  // Test-only wait: poll the flag (see the header).
  if (options_.train_time > absl::ZeroDuration()) {
    const absl::Time deadline = absl::Now() + options_.train_time;
    for (;;) {
      if (cancel.load(std::memory_order_acquire)) return cancelled();
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      absl::SleepFor(std::min(left, absl::Milliseconds(1)));
    }
  }
  if (options_.fail_rounds.count(round) > 0) {
    return absl::InternalError(absl::StrFormat(
        "test learner (site %s): scripted training failure in round %d",
        options_.site, round));
  }

  TrainOutput out;
  out.sample_count = options_.sample_count;
  const float delta = options_.delta;
  if (options_.weight_diff) {
    SWARM_ASSIGN_OR_RETURN(
        out.model,
        Model::Create(global.specs(), HeapStorage::Init::kUninitialized));
    out.kind = v1::PAYLOAD_KIND_WEIGHT_DIFF;
    for (size_t t = 0; t < out.model.num_tensors(); ++t) {
      absl::Span<char> bytes = out.model.mutable_tensor_data(t);
      for (size_t off = 0; off + sizeof(float) <= bytes.size();
           off += sizeof(float)) {
        std::memcpy(bytes.data() + off, &delta, sizeof(float));
      }
    }
  } else {
    SWARM_ASSIGN_OR_RETURN(out.model, global.Clone());
    out.kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
    for (size_t t = 0; t < out.model.num_tensors(); ++t) {
      absl::Span<char> bytes = out.model.mutable_tensor_data(t);
      for (size_t off = 0; off + sizeof(float) <= bytes.size();
           off += sizeof(float)) {
        float value;
        std::memcpy(&value, bytes.data() + off, sizeof(float));
        value += delta;
        std::memcpy(bytes.data() + off, &value, sizeof(float));
      }
    }
  }
  out.model.metadata().clear();  // The controller writes its own.
  if (cancel.load(std::memory_order_acquire)) return cancelled();
  return out;
}

}  // namespace swarm
