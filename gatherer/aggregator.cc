#include "gatherer/aggregator.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "gatherer/aggregator_internal.h"
#include "gatherer/aggregator_kernels.h"

namespace swarm {
namespace agg_internal {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// mkdir -p.
absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty directory path");
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at != path.size() && path[at] != '/') continue;
    const std::string prefix = path.substr(0, at);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat(
          "cannot create directory ", prefix, ": ", std::strerror(errno)));
    }
  }
  struct stat info;
  if (stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("offload_dir ", path, " is not a directory"));
  }
  return absl::OkStatus();
}

class CheckingSink final : public TensorSink {
 public:
  explicit CheckingSink(std::shared_ptr<const SharedState> shared)
      : shared_(std::move(shared)) {}
  CheckingSink(const CheckingSink&) = delete;
  CheckingSink& operator=(const CheckingSink&) = delete;

  absl::Status Begin(const v1::ModelHeader& header,
                     const std::vector<TensorSpec>& specs) override {
    if (inner_ != nullptr) {
      return absl::FailedPreconditionError("sink already begun");
    }
    SWARM_RETURN_IF_ERROR(CheckTable(shared_->base->specs(), specs));
    if (shared_->sink_to_disk) {
      file_ = std::make_shared<OffloadFile>(shared_->NewOffloadPath());
      inner_ = std::make_unique<DiskSink>(file_->path());
    } else {
      inner_ = std::make_unique<MemorySink>();
    }
    specs_ = specs;
    check_values_ = !shared_->options.allow_non_finite;
    values_checked_ = true;
    edges_.clear();
    return inner_->Begin(header, specs);
  }

  absl::StatusOr<char*> WritableRange(uint32_t index, uint64_t offset,
                                      uint64_t size) override {
    if (inner_ == nullptr) return absl::FailedPreconditionError("not begun");
    SWARM_ASSIGN_OR_RETURN(char* data,
                           inner_->WritableRange(index, offset, size));
    pending_ = {index, offset, size, data};
    return data;
  }

  absl::Status CommitRange(uint32_t index, uint64_t offset,
                           uint64_t size) override {
    if (inner_ == nullptr || pending_.data == nullptr ||
        pending_.index != index || pending_.offset != offset ||
        pending_.size != size) {
      return absl::InternalError("CommitRange without its WritableRange");
    }
    const char* data = pending_.data;
    pending_ = {};
    const TensorSpec& spec = specs_[index];
    if (check_values_ && values_checked_ && IsFloatDType(spec.dtype) &&
        size > 0) {
      // Whole elements inside the range are checked now, while the bytes
      // are in cache; an element cut by a chunk boundary once all of it has
      // arrived (at Finish).
      const uint64_t element_size = DTypeSize(spec.dtype);
      const uint64_t first = (offset + element_size - 1) / element_size;
      const uint64_t end = (offset + size) / element_size;
      if (offset % element_size != 0) AddEdge(index, offset / element_size);
      if ((offset + size) % element_size != 0) AddEdge(index, end);
      if (end > first) {
        const uint64_t bad = FindNonFinite(
            spec.dtype, data + (first * element_size - offset), end - first);
        if (bad < end - first) return NonFiniteError(spec.name, first + bad);
      }
    }
    return inner_->CommitRange(index, offset, size);
  }

  absl::StatusOr<Model> Finish() override {
    if (inner_ == nullptr) return absl::FailedPreconditionError("not begun");
    SWARM_ASSIGN_OR_RETURN(Model model, inner_->Finish());
    inner_.reset();
    // Map our specs (payload order) to the model's tensors by name: a file
    // lists empty tensors that share an offset by name.
    std::vector<uint64_t> offsets;
    offsets.reserve(specs_.size());
    const char* start =
        model.storage() != nullptr ? model.storage()->data() : nullptr;
    for (const TensorSpec& spec : specs_) {
      const int at = model.FindTensor(spec.name);
      if (at < 0 || model.spec(at) != spec) {
        return absl::InternalError(
            absl::StrCat("sink lost tensor \"", spec.name, "\""));
      }
      offsets.push_back(
          static_cast<uint64_t>(model.tensor_data(at).data() - start));
    }
    for (const auto& [index, element] : edges_) {
      const int at = model.FindTensor(specs_[index].name);
      const uint64_t element_size = DTypeSize(specs_[index].dtype);
      if (FindNonFinite(specs_[index].dtype,
                        model.tensor_data(at).data() + element * element_size,
                        1) == 0) {
        return NonFiniteError(specs_[index].name, element);
      }
    }
    auto storage = std::make_shared<VerifiedStorage>(
        model.storage(), shared_, std::move(file_), values_checked_);
    SWARM_ASSIGN_OR_RETURN(
        Model verified,
        Model::FromStorage(specs_, std::move(offsets), std::move(storage)));
    verified.metadata() = model.metadata();
    return verified;
  }

  void Abort() override {
    if (inner_ != nullptr) inner_->Abort();
    inner_.reset();
    file_.reset();
  }

 private:
  struct Pending {
    uint32_t index = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    char* data = nullptr;
  };
  struct Edge {
    uint32_t index;
    uint64_t element;
  };
  using Edges = std::vector<Edge>;
  // More elements cut by chunk boundaries than this (a sender of tiny or odd
  // chunks) and the sink stops tracking them: its model is then not marked
  // as checked, and Add scans it in full.
  static constexpr size_t kMaxEdges = 1 << 16;

  void AddEdge(uint32_t index, uint64_t element) {
    if (!values_checked_) return;
    if (edges_.size() >= kMaxEdges) {
      values_checked_ = false;
      edges_ = Edges();
      return;
    }
    edges_.push_back({index, element});
  }

  const std::shared_ptr<const SharedState> shared_;
  std::unique_ptr<TensorSink> inner_;
  std::shared_ptr<OffloadFile> file_;
  std::vector<TensorSpec> specs_;
  bool check_values_ = true;
  Pending pending_;
  bool values_checked_ = true;
  Edges edges_;
};

uint64_t NewInstanceToken() {
  std::random_device device;
  const uint64_t random = (uint64_t{device()} << 32) ^ device();
  return random ^
         static_cast<uint64_t>(
             std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace

std::string SharedState::NewOffloadPath() const {
  const uint64_t n = next_file.fetch_add(1, std::memory_order_relaxed);
  return absl::StrFormat("%s/result-%d-%016x-%06d.safetensors",
                         options.offload_dir, getpid(), instance_token, n);
}

OffloadFile::~OffloadFile() { unlink(path_.c_str()); }

const VerifiedStorage* VerifiedBy(const Model& model,
                                  const SharedState* owner) {
  const auto* verified =
      dynamic_cast<const VerifiedStorage*>(model.storage().get());
  if (verified == nullptr || verified->owner() != owner) return nullptr;
  return verified;
}

absl::Status CheckTable(const std::vector<TensorSpec>& base,
                        const std::vector<TensorSpec>& result) {
  absl::flat_hash_map<absl::string_view, size_t> base_index;
  absl::flat_hash_map<absl::string_view, size_t> result_index;
  for (size_t i = 0; i < base.size(); ++i) base_index[base[i].name] = i;
  for (size_t i = 0; i < result.size(); ++i) result_index[result[i].name] = i;
  for (const TensorSpec& spec : base) {
    if (!result_index.contains(spec.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "result lacks tensor \"", spec.name, "\" of the base model"));
    }
  }
  for (const TensorSpec& spec : result) {
    if (!base_index.contains(spec.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("result has tensor \"", spec.name,
                       "\" that the base model does not have"));
    }
  }
  if (base.size() != result.size()) {
    // Same name sets of different sizes cannot happen with unique names.
    return absl::InvalidArgumentError("result has duplicate tensor names");
  }
  for (size_t i = 0; i < base.size(); ++i) {
    if (result[i].name != base[i].name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", base[i].name, "\" is at position ",
          result_index[base[i].name], " of the result but at position ", i,
          " of the base model (tensors reordered)"));
    }
    if (result[i].dtype != base[i].dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", base[i].name, "\" has dtype ",
                       DTypeName(result[i].dtype), " but the base model's is ",
                       DTypeName(base[i].dtype)));
    }
    if (result[i].shape != base[i].shape ||
        result[i].byte_size != base[i].byte_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", base[i].name, "\" has shape ",
          ShapeString(result[i].shape), " but the base model's is ",
          ShapeString(base[i].shape)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Model> ViewInBaseOrder(const std::vector<TensorSpec>& base,
                                      const Model& model) {
  std::vector<TensorSpec> reordered;
  reordered.reserve(model.num_tensors());
  std::vector<size_t> from;
  for (const TensorSpec& spec : base) {
    const int at = model.FindTensor(spec.name);
    if (at >= 0) {
      reordered.push_back(model.spec(at));
      from.push_back(static_cast<size_t>(at));
    }
  }
  if (reordered.size() == base.size() && model.num_tensors() == base.size()) {
    SWARM_RETURN_IF_ERROR(CheckTable(base, reordered));
  } else {
    SWARM_RETURN_IF_ERROR(CheckTable(base, model.specs()));
  }
  const std::vector<uint64_t> offsets = StorageOffsets(model);
  std::vector<uint64_t> reordered_offsets;
  reordered_offsets.reserve(from.size());
  for (size_t at : from) reordered_offsets.push_back(offsets[at]);
  SWARM_ASSIGN_OR_RETURN(
      Model view,
      Model::FromStorage(std::move(reordered), std::move(reordered_offsets),
                         model.storage()));
  view.metadata() = model.metadata();
  return view;
}

std::vector<uint64_t> StorageOffsets(const Model& model) {
  std::vector<uint64_t> offsets;
  offsets.reserve(model.num_tensors());
  const char* start =
      model.storage() != nullptr ? model.storage()->data() : nullptr;
  for (size_t i = 0; i < model.num_tensors(); ++i) {
    offsets.push_back(
        static_cast<uint64_t>(model.tensor_data(i).data() - start));
  }
  return offsets;
}

absl::Status CheckCountAndKind(int64_t sample_count, v1::PayloadKind kind) {
  if (sample_count <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample count ", sample_count, " is not positive"));
  }
  if (kind != v1::PAYLOAD_KIND_FULL_WEIGHTS &&
      kind != v1::PAYLOAD_KIND_WEIGHT_DIFF) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown payload kind ", static_cast<int>(kind)));
  }
  return absl::OkStatus();
}

absl::Status NonFiniteError(const std::string& tensor, uint64_t element) {
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor \"", tensor, "\" has a NaN or Inf value at element ", element,
      " (refused; the job option allow_non_finite accepts them)"));
}

absl::Status CheckFinite(const Model& model, int num_threads) {
  std::vector<uint64_t> elements;
  std::vector<uint64_t> cost;
  uint64_t total = 0;
  for (const TensorSpec& spec : model.specs()) {
    const uint64_t size = DTypeSize(spec.dtype);
    elements.push_back(spec.byte_size / size);
    cost.push_back(IsFloatDType(spec.dtype) ? size : 0);
    total += IsFloatDType(spec.dtype) ? spec.byte_size : 0;
  }
  const int parts = total >= kMinParallelBytes ? num_threads : 1;
  const std::vector<std::vector<Range>> work = SplitWork(elements, cost, parts);
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  std::vector<std::pair<uint64_t, uint64_t>> first_bad(work.size(),
                                                       {kNone, kNone});
  RunParallel(static_cast<int>(work.size()), [&](int part) {
    for (const Range& range : work[part]) {
      const TensorSpec& spec = model.spec(range.tensor);
      const uint64_t size = DTypeSize(spec.dtype);
      const uint64_t n = range.end - range.begin;
      const uint64_t bad = FindNonFinite(
          spec.dtype,
          model.tensor_data(range.tensor).data() + range.begin * size, n);
      if (bad < n) {
        first_bad[part] = {range.tensor, range.begin + bad};
        return;
      }
    }
  });
  const auto bad = *std::min_element(first_bad.begin(), first_bad.end());
  if (bad.first == kNone) return absl::OkStatus();
  return NonFiniteError(model.spec(bad.first).name, bad.second);
}

std::unique_ptr<TensorSink> NewCheckingSink(
    std::shared_ptr<const SharedState> shared) {
  return std::make_unique<CheckingSink>(std::move(shared));
}

std::vector<std::vector<Range>> SplitWork(
    const std::vector<uint64_t>& elements,
    const std::vector<uint64_t>& cost_per_element, int parts) {
  constexpr uint64_t kAlign = 64;
  parts = std::max(parts, 1);
  uint64_t total = 0;
  for (size_t t = 0; t < elements.size(); ++t) {
    total += elements[t] * cost_per_element[t];
  }
  std::vector<std::vector<Range>> work(parts);
  int part = 0;
  uint64_t done = 0;  // Cost assigned to parts before `part`, plus current.
  for (size_t t = 0; t < elements.size(); ++t) {
    const uint64_t cost = cost_per_element[t];
    if (cost == 0 || elements[t] == 0) continue;
    uint64_t begin = 0;
    while (begin < elements[t]) {
      // This part ends once the running cost reaches (part+1)/parts.
      const uint64_t goal =
          part + 1 >= parts ? std::numeric_limits<uint64_t>::max()
                            : static_cast<uint64_t>(static_cast<double>(total) *
                                                    (part + 1) / parts);
      uint64_t end = elements[t];
      if (goal != std::numeric_limits<uint64_t>::max()) {
        const uint64_t room = goal > done ? (goal - done) / cost : 0;
        if (room < elements[t] - begin) {
          end = std::min(elements[t],
                         (begin + room + kAlign - 1) / kAlign * kAlign);
          if (end <= begin) end = std::min(elements[t], begin + kAlign);
        }
      }
      work[part].push_back({t, begin, end});
      done += (end - begin) * cost;
      begin = end;
      if (part + 1 < parts && done >= goal) ++part;
    }
  }
  // Drop trailing empty parts (small inputs).
  while (work.size() > 1 && work.back().empty()) work.pop_back();
  return work;
}

}  // namespace agg_internal

AggregatorOptions AggregatorOptions::FromJobConfig(const v1::JobConfig& config,
                                                   std::string offload_dir) {
  AggregatorOptions options;
  options.method = config.aggregation_method();
  options.trim_fraction =
      config.trim_fraction() == 0 ? 0.1 : config.trim_fraction();
  options.allow_non_finite = config.allow_non_finite();
  options.offload_dir = std::move(offload_dir);
  options.tolerated_attackers = static_cast<int>(config.tolerated_attackers());
  options.krum_selected = static_cast<int>(config.krum_selected());
  options.clipping_radius = config.clipping_radius();
  if (config.clipping_iterations() > 0) {
    options.clipping_iterations =
        static_cast<int>(config.clipping_iterations());
  }
  if (config.geometric_median_iterations() > 0) {
    options.geometric_median_iterations =
        static_cast<int>(config.geometric_median_iterations());
  }
  options.bucket_size = static_cast<int>(config.bucket_size());
  options.bucket_seed = config.seed();
  options.max_claimed_samples = config.max_claimed_samples();
  options.equal_weights = config.equal_weights();
  return options;
}

namespace {

// The robust methods' own options (Create's checks).
absl::Status CheckRobustOptions(const AggregatorOptions& options) {
  const auto bad = [](absl::string_view field, double value,
                      absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", value, " ", rule));
  };
  if (options.tolerated_attackers < 0) {
    return bad("tolerated_attackers", options.tolerated_attackers,
               "is negative");
  }
  if (options.krum_selected < 0) {
    return bad("krum_selected", options.krum_selected, "is negative");
  }
  if (!(options.clipping_radius >= 0) ||
      !std::isfinite(options.clipping_radius)) {
    return bad("clipping_radius", options.clipping_radius,
               "is not a finite number >= 0");
  }
  if (options.clipping_iterations < 1 || options.clipping_iterations > 100) {
    return bad("clipping_iterations", options.clipping_iterations,
               "is not in [1, 100]");
  }
  if (options.geometric_median_iterations < 1 ||
      options.geometric_median_iterations > 1000) {
    return bad("geometric_median_iterations",
               options.geometric_median_iterations, "is not in [1, 1000]");
  }
  if (options.bucket_size < 0) {
    return bad("bucket_size", options.bucket_size, "is negative");
  }
  if (options.bucket_size > 1 && options.method == v1::AGGREGATION_FEDAVG) {
    return absl::InvalidArgumentError(
        "bucket_size: bucketing is for the robust methods (FedAvg of bucket "
        "means is FedAvg)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Create(
    AggregatorOptions options, std::shared_ptr<const Model> base) {
  using agg_internal::SharedState;
  if (base == nullptr) return absl::InvalidArgumentError("no base model");
  for (const TensorSpec& spec : base->specs()) {
    if (DTypeSize(spec.dtype) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", spec.name, "\" has unsupported dtype ",
                       static_cast<int>(spec.dtype)));
    }
  }
  const bool coordinate = options.method == v1::AGGREGATION_MEDIAN ||
                          options.method == v1::AGGREGATION_TRIMMED_MEAN;
  const bool robust = agg_internal::IsRobustVectorMethod(options.method);
  if (!coordinate && !robust && options.method != v1::AGGREGATION_FEDAVG) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown aggregation method ", static_cast<int>(options.method)));
  }
  if (options.method == v1::AGGREGATION_TRIMMED_MEAN &&
      !(options.trim_fraction >= 0 && options.trim_fraction < 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trim_fraction ", options.trim_fraction, " is outside [0, 0.5)"));
  }
  SWARM_RETURN_IF_ERROR(CheckRobustOptions(options));
  if ((coordinate || robust) && options.offload_dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(v1::AggregationMethod_Name(options.method),
                     " keeps results on disk and needs an offload_dir"));
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads ", options.num_threads, " is negative"));
  }
  if (options.block_coordinates == 0) {
    return absl::InvalidArgumentError("block_coordinates must be positive");
  }
  if (!options.offload_dir.empty()) {
    while (options.offload_dir.size() > 1 &&
           options.offload_dir.back() == '/') {
      options.offload_dir.pop_back();
    }
    if (options.make_offload_dir) {
      SWARM_RETURN_IF_ERROR(agg_internal::MakeDirs(options.offload_dir));
    }
  }
  auto shared = std::make_shared<SharedState>();
  shared->base = std::move(base);
  shared->num_threads = options.num_threads > 0
                            ? options.num_threads
                            : static_cast<int>(std::clamp(
                                  std::thread::hardware_concurrency(), 1u, 2u));
  shared->sink_to_disk = !options.offload_dir.empty();
  shared->instance_token = agg_internal::NewInstanceToken();
  shared->options = std::move(options);
  if (coordinate) {
    return agg_internal::NewCoordinateAggregator(std::move(shared));
  }
  if (robust) return agg_internal::NewRobustAggregator(std::move(shared));
  return agg_internal::NewFedAvgAggregator(std::move(shared));
}

}  // namespace swarm
