// Coordinate-wise median and trimmed mean.
//
// Both need every result's value of a coordinate at once, so results stay in
// safetensors files: ones that streamed through the aggregator's sink are
// already there (offload_dir), others are written there by Add, and files
// given to AddFile are read in place. Finish walks the model in blocks of
// coordinates: for each block it preads that block of every file (through
// the page cache, so file pages never count against the process), converts
// to double, and sorts every coordinate's n values at once with a sorting
// network (Batcher's odd-even merge sort, each comparator a vectorized
// min/max over a run of coordinates; up to 256 results, and only when NaN
// cannot occur; otherwise one sort per coordinate). Memory: the output model
// plus, per thread, n blocks of doubles. Threads take blocks from a shared
// counter. Finish holds one file descriptor per result.
//
// Median: the middle value, or the mean of the two middle values for an even
// count. Trimmed mean: sort, drop k = floor(trim_fraction * n) values at each
// end (k < n / 2 as trim_fraction < 0.5), average the rest. NaN (when
// allowed) sorts above +Inf. A weight difference counts as base + difference.
// With bucketing (bucket_size > 1) the n values of a coordinate are the
// means of the buckets (result_files.h), formed as each block is read.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/storage_error.h"
#include "gatherer/aggregator.h"
#include "gatherer/aggregator_internal.h"
#include "gatherer/aggregator_kernels.h"
#include "gatherer/result_files.h"

namespace swarm {
namespace agg_internal {
namespace {

// NaN last; a strict weak order even with NaNs.
struct NanLast {
  bool operator()(double a, double b) const {
    return a < b || (b != b && a == a);
  }
};

// Sorts `n` values: insertion sort for the usual handful of results (no
// call overhead, branch-light), std::sort beyond.
void SortValues(double* values, size_t n) {
  if (n > 32) {
    std::sort(values, values + n, NanLast());
    return;
  }
  const NanLast less;
  for (size_t i = 1; i < n; ++i) {
    const double value = values[i];
    size_t j = i;
    for (; j > 0 && less(value, values[j - 1]); --j) values[j] = values[j - 1];
    values[j] = value;
  }
}

// Batcher's odd-even merge sort network for n inputs: comparators (i, j),
// i < j, that sort any n values when applied in order. Built for the next
// power of two; comparators that touch the padding (as if +Inf) are dropped.
std::vector<std::pair<uint32_t, uint32_t>> SortingNetwork(uint32_t n) {
  std::vector<std::pair<uint32_t, uint32_t>> network;
  uint32_t padded = 1;
  while (padded < n) padded <<= 1;
  for (uint32_t p = 1; p < padded; p <<= 1) {
    for (uint32_t k = p; k >= 1; k >>= 1) {
      for (uint32_t j = k % p; j + k < padded; j += 2 * k) {
        for (uint32_t i = 0; i < k && i + j + k < padded; ++i) {
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p) && i + j + k < n) {
            network.emplace_back(i + j, i + j + k);
          }
        }
      }
    }
  }
  return network;
}

class CoordinateAggregator final : public FileBackedAggregator {
 public:
  explicit CoordinateAggregator(std::shared_ptr<SharedState> shared)
      : FileBackedAggregator(std::move(shared)) {}

  absl::StatusOr<Model> Finish() override {
    if (files_.finished()) {
      return absl::FailedPreconditionError("already finished");
    }
    if (files_.size() == 0) {
      return absl::FailedPreconditionError("no results to aggregate");
    }
    const Model& base = *shared_->base;
    SWARM_ASSIGN_OR_RETURN(std::unique_ptr<ResultFiles::Reader> reader,
                           ResultFiles::Reader::Open(files_));
    // With bucketing, the inputs are the buckets' means.
    const uint64_t n = reader->rows();
    SWARM_ASSIGN_OR_RETURN(
        Model out,
        Model::Create(base.specs(), HeapStorage::Init::kUninitialized));
    const uint64_t block = BlockCoordinates(shared_->options, n);
    const std::vector<Range> blocks = PlanBlocks(base, block);
    // Sorting networks need an order without NaN: when NaN may occur, or for
    // very many results, each coordinate is sorted on its own.
    const bool use_network = !shared_->options.allow_non_finite && n <= 256;
    const std::vector<std::pair<uint32_t, uint32_t>> network =
        use_network ? SortingNetwork(static_cast<uint32_t>(n))
                    : std::vector<std::pair<uint32_t, uint32_t>>();
    const uint64_t sub_block =
        std::max<uint64_t>(8, (32768 / (n * sizeof(double))) / 8 * 8);
    const int threads = static_cast<int>(std::min<uint64_t>(
        std::max(1, shared_->num_threads), std::max<size_t>(1, blocks.size())));

    std::atomic<size_t> next{0};
    std::mutex error_mu;
    absl::Status error;
    std::atomic<bool> failed{false};
    RunParallel(threads, [&](int) {
      std::vector<double> values(n * block);
      std::vector<double> column(n);
      std::vector<double> reduced(block);
      ResultFiles::Scratch scratch;
      for (size_t b = next.fetch_add(1); b < blocks.size() && !failed.load();
           b = next.fetch_add(1)) {
        const Range& range = blocks[b];
        const DType dtype = base.spec(range.tensor).dtype;
        const uint64_t size = DTypeSize(dtype);
        const uint64_t count = range.end - range.begin;
        absl::Status status =
            reader->Load(range, values.data(), block, &scratch);
        if (!status.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (error.ok()) error = std::move(status);
          failed = true;
          return;
        }
        ReduceBlock(use_network ? &network : nullptr, sub_block, n, block,
                    count, values.data(), column.data(), reduced.data());
        StoreRangeFromDouble(
            dtype, reduced.data(), count,
            out.mutable_tensor_data(range.tensor).data() + range.begin * size);
      }
    });
    SWARM_RETURN_IF_ERROR(error);
    const size_t results = files_.size();
    reader.reset();
    files_.Finish();
    out.metadata()["aggregation"] =
        shared_->options.method == v1::AGGREGATION_MEDIAN ? "median"
                                                          : "trimmed_mean";
    if (n != results) out.metadata()["buckets"] = absl::StrCat(n);
    out.metadata()["num_results"] = absl::StrCat(results);
    out.metadata()["total_samples"] = absl::StrCat(files_.total_samples());
    return out;
  }

 private:
  // Sorts and reduces the `count` coordinates of a loaded block (`values`:
  // n rows of `block` doubles) into `reduced`: by `network` in runs of
  // `sub_block` coordinates, or (null `network`) each coordinate on its own
  // through `column` (n doubles).
  void ReduceBlock(const std::vector<std::pair<uint32_t, uint32_t>>* network,
                   uint64_t sub_block, uint64_t n, uint64_t block,
                   uint64_t count, double* values, double* column,
                   double* reduced) const {
    if (network != nullptr) {
      // In runs of coordinates small enough for n rows to stay in L1/L2.
      for (uint64_t j = 0; j < count; j += sub_block) {
        const uint64_t m = std::min(sub_block, count - j);
        SortRowsByNetwork(network->data(), network->size(), &values[j], block,
                          m);
        ReduceSortedRows(&values[j], block, n, m, &reduced[j]);
      }
    } else {
      for (uint64_t j = 0; j < count; ++j) {
        for (uint64_t k = 0; k < n; ++k) column[k] = values[k * block + j];
        SortValues(column, n);
        ReduceSortedRows(column, 1, n, 1, &reduced[j]);
      }
    }
  }

  // `rows` holds `count` coordinates of n sorted rows (row k at
  // rows[k * stride]); writes each coordinate's median / trimmed mean.
  void ReduceSortedRows(const double* rows, uint64_t stride, uint64_t n,
                        uint64_t count, double* out) const {
    if (shared_->options.method == v1::AGGREGATION_MEDIAN) {
      const double* upper = rows + (n / 2) * stride;
      if (n % 2 == 1) {
        std::copy(upper, upper + count, out);
        return;
      }
      const double* lower = rows + (n / 2 - 1) * stride;
      for (uint64_t c = 0; c < count; ++c) {
        out[c] = 0.5 * lower[c] + 0.5 * upper[c];
      }
      return;
    }
    // The epsilon keeps e.g. 0.3 * 10 from flooring to 2.
    const uint64_t trim = static_cast<uint64_t>(std::floor(
        shared_->options.trim_fraction * static_cast<double>(n) + 1e-9));
    const double kept = static_cast<double>(n - 2 * trim);
    // Summed in ascending order, coordinate by coordinate.
    std::copy(rows + trim * stride, rows + trim * stride + count, out);
    for (uint64_t k = trim + 1; k < n - trim; ++k) {
      const double* row = rows + k * stride;
      for (uint64_t c = 0; c < count; ++c) out[c] += row[c];
    }
    for (uint64_t c = 0; c < count; ++c) out[c] /= kept;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> NewCoordinateAggregator(
    std::shared_ptr<SharedState> shared) {
  return std::make_unique<CoordinateAggregator>(std::move(shared));
}

}  // namespace agg_internal
}  // namespace swarm
