// Weighted FedAvg: new = sum_i(w_i * x_i) / sum_i(w_i), where a weight
// difference x_i counts as base + x_i, so
//   new = S / W + (W_diff / W) * base,   S = sum_i w_i x_i (as sent).
// Only S (and the weight totals) are kept: memory is one running sum however
// many results arrive, and each result is read once while it is added.
//
// Running sums, per tensor dtype:
//   F32      kCompensated: the F32 head lives in the output model's own
//            memory (acc_), a BF16 compensation term beside it (wide_);
//            Finish rounds head + compensation in place, so a round of an
//            F32 model allocates 1.5x the model and nothing more (in
//            unlinked files under the offload directory when there is one).
//            kFloat64: an F64 sum in wide_.
//   F64      an F64 sum in acc_ (in place).
//   F16/BF16/F8   an F32 sum in wide_.
//   integers/BOOL an F64 sum in wide_.
// Weights are float: w_i = count_i * 2^-k with 2^k <= the first count, so
// products stay in range. The compensated kernel recovers the exact product
// error of w_i * x_i; a count above 2^24 is itself rounded to 24 bits
// (a relative change of the weight below 6e-8). W sums the same rounded
// weights, so the mean stays a mean.
//
// The weight of a result is its claimed sample count, capped at
// max_claimed_samples (a clipped claim is counted, not refused), or 1 with
// equal_weights.
//
// Untouched on a bad result: every check (table, count, kind, values) runs
// before the first write to the sum. Values are checked either by the sink
// the result streamed into (per chunk, in cache) or, for a model from
// elsewhere, by a read-only scan before the accumulation pass.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/storage_error.h"
#include "gatherer/aggregator.h"
#include "gatherer/aggregator_internal.h"
#include "gatherer/aggregator_kernels.h"

namespace swarm {
namespace agg_internal {
namespace {

constexpr uint64_t kWideAlignment = 64;

class FedAvgAggregator final : public Aggregator {
 public:
  explicit FedAvgAggregator(std::shared_ptr<SharedState> shared)
      : shared_(std::move(shared)) {}

  // Plans the sums; their memory is taken by the first Add (Allocate), so
  // a round holds no model-sized sum before its first result.
  absl::Status Init() {
    const Model& base = *shared_->base;
    const bool compensated =
        shared_->options.f32_accumulator == F32Accumulator::kCompensated;
    uint64_t wide_bytes = 0;
    std::vector<uint64_t>& wide_offsets = wide_offsets_;
    for (const TensorSpec& spec : base.specs()) {
      TensorAcc tensor;
      tensor.elements = spec.byte_size / DTypeSize(spec.dtype);
      uint64_t wide_element = 0;
      switch (spec.dtype) {
        case v1::DTYPE_F32:
          tensor.kind = compensated ? Kind::kF32Compensated : Kind::kF32InF64;
          wide_element = compensated ? sizeof(uint16_t) : sizeof(double);
          break;
        case v1::DTYPE_F64:
          tensor.kind = Kind::kF64InPlace;
          break;
        case v1::DTYPE_F16:
        case v1::DTYPE_BF16:
        case v1::DTYPE_F8_E4M3:
        case v1::DTYPE_F8_E5M2:
          tensor.kind = Kind::kInF32;
          wide_element = sizeof(float);
          break;
        default:
          tensor.kind = Kind::kInF64;
          wide_element = sizeof(double);
          break;
      }
      wide_offsets.push_back(wide_bytes);
      wide_bytes += (tensor.elements * wide_element + kWideAlignment - 1) /
                    kWideAlignment * kWideAlignment;
      tensors_.push_back(tensor);
      // Cost of one element in Add: result bytes + sum bytes read + written.
      elements_.push_back(tensor.elements);
      cost_.push_back(
          DTypeSize(spec.dtype) +
          2 * (tensor.kind == Kind::kF32Compensated
                   ? 6
                   : (tensor.kind == Kind::kF64InPlace ? 8 : wide_element)));
    }
    wide_bytes_ = wide_bytes;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      total_cost_ += elements_[t] * cost_[t];
    }
    return absl::OkStatus();
  }

  // The sums' memory, at the first Add: the output model (uninitialized:
  // the first Add writes every element of the sums kept in it, and Finish
  // every other tensor) and the wide or compensation terms beside it. With
  // an offload directory (disk offload) both live in unlinked files there
  // (ScratchFileStorage), so that the sum, and the model Finish makes of
  // it, are page cache the kernel can write back rather than anonymous
  // memory: an aggregator's anonymous memory then stays near one model (the
  // result being added, its own) however large the model. A file that
  // cannot be made is a storage error (the site's disk, not the result).
  absl::Status Allocate() {
    if (allocated_) return absl::OkStatus();
    const std::string& dir = shared_->options.offload_dir;
    if (dir.empty()) {
      SWARM_ASSIGN_OR_RETURN(acc_,
                             Model::Create(shared_->base->specs(),
                                           HeapStorage::Init::kUninitialized));
      SWARM_ASSIGN_OR_RETURN(
          wide_, HeapStorage::Allocate(wide_bytes_,
                                       HeapStorage::Init::kUninitialized));
    } else {
      absl::StatusOr<Model> acc =
          Model::CreateInFile(shared_->base->specs(), dir);
      if (!acc.ok()) return AsStorageError(acc.status());
      absl::StatusOr<std::shared_ptr<ScratchFileStorage>> wide =
          ScratchFileStorage::Create(dir, wide_bytes_);
      if (!wide.ok()) return AsStorageError(wide.status());
      acc_ = *std::move(acc);
      wide_ = *std::move(wide);
    }
    allocated_ = true;
    const std::vector<uint64_t>& wide_offsets = wide_offsets_;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      char* wide = wide_->mutable_data() + wide_offsets[t];
      char* own = acc_.mutable_tensor_data(t).data();
      TensorAcc& tensor = tensors_[t];
      switch (tensor.kind) {
        case Kind::kF32Compensated:
          tensor.f32 = reinterpret_cast<float*>(own);
          tensor.bf16 = reinterpret_cast<uint16_t*>(wide);
          break;
        case Kind::kF64InPlace:
          tensor.f64 = reinterpret_cast<double*>(own);
          break;
        case Kind::kF32InF64:
        case Kind::kInF64:
          tensor.f64 = reinterpret_cast<double*>(wide);
          break;
        case Kind::kInF32:
          tensor.f32 = reinterpret_cast<float*>(wide);
          break;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Add(const Model& result, int64_t sample_count,
                   v1::PayloadKind kind) override {
    if (finished_) return absl::FailedPreconditionError("already finished");
    SWARM_RETURN_IF_ERROR(CheckCountAndKind(sample_count, kind));
    SWARM_RETURN_IF_ERROR(CheckTable(shared_->base->specs(), result.specs()));
    if (sample_count > std::numeric_limits<int64_t>::max() - total_samples_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample count ", sample_count, " overflows the round's total"));
    }
    const VerifiedStorage* verified = VerifiedBy(result, shared_.get());
    if (!shared_->options.allow_non_finite &&
        (verified == nullptr || !verified->values_checked())) {
      SWARM_RETURN_IF_ERROR(CheckFinite(result, shared_->num_threads));
    }
    SWARM_RETURN_IF_ERROR(Allocate());
    // Valid: from here on nothing fails.
    bool clipped = false;
    const int64_t counted =
        CappedSampleCount(shared_->options, sample_count, &clipped);
    const int64_t weight_count = shared_->options.equal_weights ? 1 : counted;
    const bool first = num_added_ == 0;
    if (first) {
      weight_exponent_ = std::ilogb(static_cast<double>(weight_count));
    }
    const float weight = static_cast<float>(
        std::ldexp(static_cast<double>(weight_count), -weight_exponent_));
    Accumulate(result, weight, first);
    ++num_added_;
    if (clipped) ++claims_clipped_;
    total_samples_ += counted;
    weight_sum_ += weight;
    if (kind == v1::PAYLOAD_KIND_WEIGHT_DIFF) diff_weight_sum_ += weight;
    return absl::OkStatus();
  }

  absl::Status AddPartialSum(const Model& sum, double scale,
                             const std::vector<PartialTerm>& terms) override {
    if (finished_) return absl::FailedPreconditionError("already finished");
    if (terms.empty()) {
      return absl::InvalidArgumentError("a partial sum of no results");
    }
    if (shared_->options.max_claimed_samples > 0 ||
        shared_->options.equal_weights) {
      return absl::FailedPreconditionError(
          "a partial sum is weighted by its trainers' own sample counts: "
          "refused with max_claimed_samples or equal_weights");
    }
    if (!(scale > 0) || !std::isfinite(scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("partial_scale ", scale, " is not a positive number"));
    }
    int64_t samples = 0;
    for (const PartialTerm& term : terms) {
      SWARM_RETURN_IF_ERROR(CheckCountAndKind(term.sample_count, term.kind));
      if (term.sample_count >
          std::numeric_limits<int64_t>::max() - total_samples_ - samples) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample count ", term.sample_count,
                         " overflows the round's total"));
      }
      samples += term.sample_count;
    }
    SWARM_RETURN_IF_ERROR(CheckTable(shared_->base->specs(), sum.specs()));
    for (const TensorSpec& spec : sum.specs()) {
      if (spec.dtype != v1::DTYPE_F32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", spec.name, " is ", v1::DType_Name(spec.dtype),
            ": a partial sum carries F32 tensors only"));
      }
    }
    const VerifiedStorage* verified = VerifiedBy(sum, shared_.get());
    if (!shared_->options.allow_non_finite &&
        (verified == nullptr || !verified->values_checked())) {
      SWARM_RETURN_IF_ERROR(CheckFinite(sum, shared_->num_threads));
    }
    SWARM_RETURN_IF_ERROR(Allocate());
    // Valid: from here on nothing fails.
    const bool first = num_added_ == 0;
    if (first) {
      weight_exponent_ =
          std::ilogb(static_cast<double>(terms.front().sample_count));
    }
    // The weights each term would have had on its own (Add), so the mean's
    // denominator is the star's; the data is scaled by a power of two.
    Accumulate(sum, static_cast<float>(std::ldexp(scale, -weight_exponent_)),
               first);
    for (const PartialTerm& term : terms) {
      const float weight = static_cast<float>(std::ldexp(
          static_cast<double>(term.sample_count), -weight_exponent_));
      ++num_added_;
      total_samples_ += term.sample_count;
      weight_sum_ += weight;
      if (term.kind == v1::PAYLOAD_KIND_WEIGHT_DIFF) {
        diff_weight_sum_ += weight;
      }
    }
    return absl::OkStatus();
  }

  absl::Status AddFile(const std::string& path, int64_t sample_count,
                       v1::PayloadKind kind) override {
    if (finished_) return absl::FailedPreconditionError("already finished");
    SWARM_RETURN_IF_ERROR(CheckCountAndKind(sample_count, kind));
    SWARM_ASSIGN_OR_RETURN(Model file, Model::LoadSafetensors(path));
    SWARM_ASSIGN_OR_RETURN(Model result,
                           ViewInBaseOrder(shared_->base->specs(), file));
    return Add(result, sample_count, kind);
  }

  absl::StatusOr<std::unique_ptr<TensorSink>> NewResultSink() override {
    return NewCheckingSink(shared_);
  }

  absl::StatusOr<Model> Finish() override {
    if (finished_) return absl::FailedPreconditionError("already finished");
    if (num_added_ == 0) {
      return absl::FailedPreconditionError("no results to aggregate");
    }
    finished_ = true;
    const Model& base = *shared_->base;
    const double scale = 1.0 / weight_sum_;
    const double base_scale = diff_weight_sum_ / weight_sum_;
    // Finish reads the sum, writes the output (and reads base for diffs).
    std::vector<uint64_t> cost;
    uint64_t total = 0;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      cost.push_back(DTypeSize(base.spec(t).dtype) + 8);
      total += elements_[t] * cost.back();
    }
    const std::vector<std::vector<Range>> work = SplitWork(
        elements_, cost, total >= kMinParallelBytes ? shared_->num_threads : 1);
    RunParallel(static_cast<int>(work.size()), [&](int part) {
      for (const Range& range : work[part]) {
        FinishRange(range, scale, base_scale);
      }
    });
    wide_.reset();
    acc_.metadata().clear();
    acc_.metadata()["aggregation"] = "fedavg";
    acc_.metadata()["num_results"] = absl::StrCat(num_added_);
    acc_.metadata()["total_samples"] = absl::StrCat(total_samples_);
    return std::move(acc_);
  }

  int64_t num_added() const override { return num_added_; }
  int64_t total_samples() const override { return total_samples_; }
  int64_t sample_claims_clipped() const override { return claims_clipped_; }
  v1::AggregationMethod method() const override {
    return v1::AGGREGATION_FEDAVG;
  }

 private:
  enum class Kind {
    kF32Compensated,  // f32 = head (in acc_), bf16 = compensation (wide_)
    kF32InF64,        // f64 (wide_)
    kF64InPlace,      // f64 (in acc_)
    kInF32,           // f32 (wide_): F16, BF16, F8
    kInF64,           // f64 (wide_): integers, BOOL
  };
  struct TensorAcc {
    Kind kind = Kind::kInF64;
    uint64_t elements = 0;
    float* f32 = nullptr;
    double* f64 = nullptr;
    uint16_t* bf16 = nullptr;
  };

  void Accumulate(const Model& result, float weight, bool first) {
    const std::vector<std::vector<Range>> work =
        SplitWork(elements_, cost_,
                  total_cost_ >= kMinParallelBytes ? shared_->num_threads : 1);
    RunParallel(static_cast<int>(work.size()), [&](int part) {
      for (const Range& range : work[part]) {
        const TensorAcc& tensor = tensors_[range.tensor];
        const DType dtype = result.spec(range.tensor).dtype;
        const char* x = result.tensor_data(range.tensor).data() +
                        range.begin * DTypeSize(dtype);
        const uint64_t n = range.end - range.begin;
        switch (tensor.kind) {
          case Kind::kF32Compensated:
            AccumulateF32Compensated(x, n, weight, first,
                                     tensor.f32 + range.begin,
                                     tensor.bf16 + range.begin);
            break;
          case Kind::kF32InF64:
          case Kind::kF64InPlace:
          case Kind::kInF64:
            AccumulateToF64(dtype, x, n, weight, first,
                            tensor.f64 + range.begin);
            break;
          case Kind::kInF32:
            AccumulateToF32(dtype, x, n, weight, first,
                            tensor.f32 + range.begin);
            break;
        }
      }
    });
  }

  void FinishRange(const Range& range, double scale, double base_scale) {
    const TensorAcc& tensor = tensors_[range.tensor];
    const DType dtype = acc_.spec(range.tensor).dtype;
    const uint64_t size = DTypeSize(dtype);
    const char* base = base_scale != 0
                           ? shared_->base->tensor_data(range.tensor).data() +
                                 range.begin * size
                           : nullptr;
    char* out =
        acc_.mutable_tensor_data(range.tensor).data() + range.begin * size;
    const uint64_t n = range.end - range.begin;
    switch (tensor.kind) {
      case Kind::kF32Compensated:
        FinishF32Compensated(tensor.f32 + range.begin,
                             tensor.bf16 + range.begin, n, scale, base,
                             base_scale, reinterpret_cast<float*>(out));
        break;
      case Kind::kF32InF64:
      case Kind::kF64InPlace:
      case Kind::kInF64:
        FinishFromF64(tensor.f64 + range.begin, n, scale, base, base_scale,
                      dtype, out);
        break;
      case Kind::kInF32:
        FinishFromF32(tensor.f32 + range.begin, n, scale, base, base_scale,
                      dtype, out);
        break;
    }
  }

  const std::shared_ptr<SharedState> shared_;
  Model acc_;
  std::shared_ptr<ModelStorage> wide_;
  // Planned by Init, taken by Allocate.
  uint64_t wide_bytes_ = 0;
  std::vector<uint64_t> wide_offsets_;
  bool allocated_ = false;
  std::vector<TensorAcc> tensors_;
  std::vector<uint64_t> elements_;
  std::vector<uint64_t> cost_;
  uint64_t total_cost_ = 0;
  int64_t num_added_ = 0;
  int64_t total_samples_ = 0;
  std::atomic<int64_t> claims_clipped_{0};
  int weight_exponent_ = 0;
  double weight_sum_ = 0;
  double diff_weight_sum_ = 0;
  bool finished_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> NewFedAvgAggregator(
    std::shared_ptr<SharedState> shared) {
  auto aggregator = std::make_unique<FedAvgAggregator>(std::move(shared));
  SWARM_RETURN_IF_ERROR(aggregator->Init());
  return aggregator;
}

}  // namespace agg_internal
}  // namespace swarm
