// Multi-Krum, Bulyan, centered clipping and geometric median over models.
//
// Results are kept in files like the median's (ResultFiles); Finish makes
// passes over every result in blocks of coordinates (with bucketing, over
// the buckets' means). What each holds in memory during Finish, beyond the
// files' page cache:
//  - all: the output model (base layout), and per thread n blocks of
//    doubles (n inputs) plus a block of scratch;
//  - Multi-Krum and Bulyan: an n x n matrix of squared distances (one per
//    thread while it is summed). Pass 1 sums the distances, pass 2 the
//    mean of the selected inputs (Multi-Krum) or, per coordinate, the mean
//    of the n - 4f selected values closest to their median (Bulyan);
//  - centered clipping: the center lives in the output model (it starts as
//    the base, the previous global model) and n distances; pass 0 measures
//    the distances to the base, each of the `clipping_iterations` passes
//    moves the center one step and measures the distances to the new one;
//  - geometric median: the same, starting from the coordinate-wise median
//    (one more pass), with Weiszfeld steps.
// Too few inputs for f attackers (a round closed with missing trainers):
// the coordinate-wise median of what there is, said in the metadata.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/robust_requirements.h"
#include "common/status_macros.h"
#include "gatherer/aggregator.h"
#include "gatherer/aggregator_internal.h"
#include "gatherer/aggregator_kernels.h"
#include "gatherer/result_files.h"
#include "gatherer/robust_rules.h"

namespace swarm {
namespace agg_internal {
namespace {

const char* MethodLabel(v1::AggregationMethod method) {
  switch (method) {
    case v1::AGGREGATION_MULTI_KRUM:
      return "multi_krum";
    case v1::AGGREGATION_BULYAN:
      return "bulyan";
    case v1::AGGREGATION_CENTERED_CLIPPING:
      return "centered_clipping";
    default:
      return "geometric_median";
  }
}

class RobustAggregator final : public FileBackedAggregator {
 public:
  explicit RobustAggregator(std::shared_ptr<SharedState> shared)
      : FileBackedAggregator(std::move(shared)) {}

  absl::StatusOr<Model> Finish() override;

 private:
  // Calls fn(part, range, rows) for every block, rows holding the n inputs'
  // values of `range` (input k at rows[k * block_]); part < threads_ names
  // the calling thread's share. Stops at the first read error.
  template <typename Fn>
  absl::Status ForEachBlock(const Fn& fn);

  // n x n squared distances between the inputs.
  absl::StatusOr<DistanceMatrix> PairwiseDistances();
  // z <- a * z + sum_k w[k] * x_k over the output model (a == 0: z is not
  // read); then, if `distances`, the inputs' L2 distances to the new z.
  absl::Status Step(const StepWeights& step, std::vector<double>* distances);
  // Per coordinate, over the `selected` inputs: the mean of the `beta`
  // closest to their median, or (beta == 0) their median.
  absl::Status CoordinatePass(const std::vector<uint32_t>& selected,
                              uint32_t beta);
  absl::Status CenteredClipping(std::string* note);
  absl::Status GeometricMedian(std::string* note);

  // Set by Finish for its passes.
  std::unique_ptr<ResultFiles::Reader> reader_;
  uint64_t n_ = 0;
  uint64_t block_ = 0;
  std::vector<Range> blocks_;
  int threads_ = 1;
  Model out_;
};

template <typename Fn>
absl::Status RobustAggregator::ForEachBlock(const Fn& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  absl::Status error;
  RunParallel(threads_, [&](int part) {
    std::vector<double> rows(n_ * block_);
    ResultFiles::Scratch scratch;
    for (size_t b = next.fetch_add(1); b < blocks_.size() && !failed.load();
         b = next.fetch_add(1)) {
      absl::Status status =
          reader_->Load(blocks_[b], rows.data(), block_, &scratch);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (error.ok()) error = std::move(status);
        failed = true;
        return;
      }
      fn(part, blocks_[b], rows.data());
    }
  });
  return error;
}

absl::StatusOr<DistanceMatrix> RobustAggregator::PairwiseDistances() {
  std::vector<DistanceMatrix> parts(threads_, DistanceMatrix(n_ * n_, 0.0));
  SWARM_RETURN_IF_ERROR(
      ForEachBlock([&](int part, const Range& range, const double* rows) {
        const uint64_t count = range.end - range.begin;
        DistanceMatrix& d = parts[part];
        for (uint64_t i = 0; i < n_; ++i) {
          for (uint64_t j = i + 1; j < n_; ++j) {
            const double* x = rows + i * block_;
            const double* y = rows + j * block_;
            double sum = 0;
            for (uint64_t c = 0; c < count; ++c) {
              const double diff = x[c] - y[c];
              sum += diff * diff;
            }
            d[i * n_ + j] += sum;
          }
        }
      }));
  DistanceMatrix d(n_ * n_, 0.0);
  for (const DistanceMatrix& part : parts) {
    for (size_t i = 0; i < d.size(); ++i) d[i] += part[i];
  }
  for (uint64_t i = 0; i < n_; ++i) {
    for (uint64_t j = i + 1; j < n_; ++j) {
      // NaN (allow_non_finite) counts as infinitely far.
      if (!(d[i * n_ + j] >= 0)) d[i * n_ + j] = HUGE_VAL;
      d[j * n_ + i] = d[i * n_ + j];
    }
  }
  return d;
}

absl::Status RobustAggregator::Step(const StepWeights& step,
                                    std::vector<double>* distances) {
  std::vector<std::vector<double>> parts(threads_,
                                         std::vector<double>(n_, 0.0));
  std::vector<std::vector<double>> centers(threads_,
                                           std::vector<double>(block_));
  SWARM_RETURN_IF_ERROR(
      ForEachBlock([&](int part, const Range& range, const double* rows) {
        const uint64_t count = range.end - range.begin;
        const DType dtype = out_.spec(range.tensor).dtype;
        char* data = out_.mutable_tensor_data(range.tensor).data() +
                     range.begin * DTypeSize(dtype);
        double* z = centers[part].data();
        if (step.a != 0) {
          LoadRangeAsDouble(dtype, data, count, z);
          for (uint64_t c = 0; c < count; ++c) z[c] *= step.a;
        } else {
          std::fill(z, z + count, 0.0);
        }
        for (uint64_t k = 0; k < n_; ++k) {
          const double w = step.w[k];
          if (w == 0) continue;
          const double* x = rows + k * block_;
          for (uint64_t c = 0; c < count; ++c) z[c] += w * x[c];
        }
        StoreRangeFromDouble(dtype, z, count, data);
        if (distances == nullptr) return;
        for (uint64_t k = 0; k < n_; ++k) {
          const double* x = rows + k * block_;
          double sum = 0;
          for (uint64_t c = 0; c < count; ++c) {
            const double diff = x[c] - z[c];
            sum += diff * diff;
          }
          parts[part][k] += sum;
        }
      }));
  if (distances != nullptr) {
    distances->assign(n_, 0.0);
    for (const std::vector<double>& part : parts) {
      for (uint64_t k = 0; k < n_; ++k) (*distances)[k] += part[k];
    }
    // NaN (allow_non_finite) counts as infinitely far: such a result gets
    // no weight in the next step.
    for (double& distance : *distances) {
      distance = distance >= 0 ? std::sqrt(distance) : HUGE_VAL;
    }
  }
  return absl::OkStatus();
}

absl::Status RobustAggregator::CoordinatePass(
    const std::vector<uint32_t>& selected, uint32_t beta) {
  std::vector<std::vector<double>> outputs(threads_,
                                           std::vector<double>(block_));
  return ForEachBlock([&](int part, const Range& range, const double* rows) {
    const uint64_t count = range.end - range.begin;
    const DType dtype = out_.spec(range.tensor).dtype;
    std::vector<double> column(selected.size());
    double* reduced = outputs[part].data();
    for (uint64_t c = 0; c < count; ++c) {
      for (size_t s = 0; s < selected.size(); ++s) {
        column[s] = rows[selected[s] * block_ + c];
      }
      reduced[c] =
          beta == 0 ? MedianOf(column) : MeanClosestToMedian(column, beta);
    }
    StoreRangeFromDouble(dtype, reduced, count,
                         out_.mutable_tensor_data(range.tensor).data() +
                             range.begin * DTypeSize(dtype));
  });
}

absl::Status RobustAggregator::CenteredClipping(std::string* note) {
  // The center starts at the base (the previous global model).
  const Model& base = *shared_->base;
  for (size_t t = 0; t < base.num_tensors(); ++t) {
    std::memcpy(out_.mutable_tensor_data(t).data(), base.tensor_data(t).data(),
                base.spec(t).byte_size);
  }
  std::vector<double> distances;
  StepWeights stay;
  stay.a = 1;
  stay.w.assign(n_, 0.0);
  SWARM_RETURN_IF_ERROR(Step(stay, &distances));
  const int iterations = shared_->options.clipping_iterations;
  for (int l = 0; l < iterations; ++l) {
    const StepWeights step =
        CenteredClippingStep(distances, shared_->options.clipping_radius);
    if (l == 0) absl::StrAppend(note, "radius ", step.radius);
    SWARM_RETURN_IF_ERROR(
        Step(step, l + 1 < iterations ? &distances : nullptr));
  }
  return absl::OkStatus();
}

absl::Status RobustAggregator::GeometricMedian(std::string* note) {
  // Weiszfeld starts from the coordinate-wise median (robust already, and
  // finite where a minority of results is not), then measures distances.
  std::vector<uint32_t> all(n_);
  for (uint32_t k = 0; k < n_; ++k) all[k] = k;
  SWARM_RETURN_IF_ERROR(CoordinatePass(all, 0));
  StepWeights stay;
  stay.a = 1;
  stay.w.assign(n_, 0.0);
  std::vector<double> distances;
  SWARM_RETURN_IF_ERROR(Step(stay, &distances));
  const int iterations = shared_->options.geometric_median_iterations;
  for (int l = 0; l < iterations; ++l) {
    SWARM_RETURN_IF_ERROR(Step(WeiszfeldStep(distances),
                               l + 1 < iterations ? &distances : nullptr));
  }
  absl::StrAppend(note, "iterations ", iterations);
  return absl::OkStatus();
}

absl::StatusOr<Model> RobustAggregator::Finish() {
  if (files_.finished())
    return absl::FailedPreconditionError("already finished");
  if (files_.size() == 0) {
    return absl::FailedPreconditionError("no results to aggregate");
  }
  const AggregatorOptions& options = shared_->options;
  const Model& base = *shared_->base;
  SWARM_ASSIGN_OR_RETURN(reader_, ResultFiles::Reader::Open(files_));
  n_ = reader_->rows();
  block_ = BlockCoordinates(options, n_);
  blocks_ = PlanBlocks(base, block_);
  threads_ = static_cast<int>(std::min<uint64_t>(
      std::max(1, shared_->num_threads), std::max<size_t>(1, blocks_.size())));
  SWARM_ASSIGN_OR_RETURN(
      out_, Model::Create(base.specs(), HeapStorage::Init::kUninitialized));
  const int f = options.tolerated_attackers;
  std::string label = MethodLabel(options.method);
  std::string note;
  const int needed = RobustRequiredInputs(options.method, f);
  std::vector<uint32_t> all(n_);
  for (uint32_t k = 0; k < n_; ++k) all[k] = k;
  if (static_cast<int>(n_) < needed) {
    label = absl::StrCat("median (fallback: ", label, " with f = ", f,
                         " needs ", needed, " inputs, had ", n_, ")");
    SWARM_RETURN_IF_ERROR(CoordinatePass(all, 0));
  } else if (options.method == v1::AGGREGATION_MULTI_KRUM ||
             options.method == v1::AGGREGATION_BULYAN) {
    SWARM_ASSIGN_OR_RETURN(DistanceMatrix d, PairwiseDistances());
    const uint32_t n = static_cast<uint32_t>(n_);
    if (options.method == v1::AGGREGATION_MULTI_KRUM) {
      const std::vector<uint32_t> selected =
          MultiKrumSelect(d, n, f, options.krum_selected);
      StepWeights mean;
      mean.w.assign(n_, 0.0);
      for (uint32_t k : selected) mean.w[k] = 1.0 / selected.size();
      SWARM_RETURN_IF_ERROR(Step(mean, nullptr));
      note = absl::StrJoin(selected, ",");
    } else {
      const std::vector<uint32_t> selected = BulyanSelect(d, n, f);
      SWARM_RETURN_IF_ERROR(CoordinatePass(
          selected, static_cast<uint32_t>(selected.size()) - 2 * f));
      note = absl::StrJoin(selected, ",");
    }
  } else if (options.method == v1::AGGREGATION_CENTERED_CLIPPING) {
    SWARM_RETURN_IF_ERROR(CenteredClipping(&note));
  } else {
    SWARM_RETURN_IF_ERROR(GeometricMedian(&note));
  }
  const size_t results = files_.size();
  reader_.reset();
  files_.Finish();
  Model out = std::move(out_);
  out.metadata()["aggregation"] = label;
  // Multi-Krum, Bulyan: the inputs selected (in the order added, or bucket
  // numbers); centered clipping: the first radius.
  if (!note.empty()) out.metadata()["aggregation_detail"] = note;
  if (n_ != results) out.metadata()["buckets"] = absl::StrCat(n_);
  out.metadata()["num_results"] = absl::StrCat(results);
  out.metadata()["total_samples"] = absl::StrCat(files_.total_samples());
  return out;
}

}  // namespace

bool IsRobustVectorMethod(v1::AggregationMethod method) {
  return method == v1::AGGREGATION_MULTI_KRUM ||
         method == v1::AGGREGATION_BULYAN ||
         method == v1::AGGREGATION_CENTERED_CLIPPING ||
         method == v1::AGGREGATION_GEOMETRIC_MEDIAN;
}

absl::StatusOr<std::unique_ptr<Aggregator>> NewRobustAggregator(
    std::shared_ptr<SharedState> shared) {
  return std::make_unique<RobustAggregator>(std::move(shared));
}

}  // namespace agg_internal
}  // namespace swarm
