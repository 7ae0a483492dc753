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
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
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

namespace swarm {
namespace agg_internal {
namespace {

// Per-thread budget for the n blocks of doubles.
constexpr uint64_t kBlockBudgetBytes = 64ull << 20;
constexpr uint64_t kMinBlockCoordinates = 256;

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

class FileSet {
 public:
  FileSet() = default;
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;
  ~FileSet() {
    for (int fd : fds_) close(fd);
  }
  absl::Status Open(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("cannot open result file ", path,
                                              ": ", std::strerror(errno)));
    }
    fds_.push_back(fd);
    return absl::OkStatus();
  }
  int fd(size_t i) const { return fds_[i]; }

 private:
  std::vector<int> fds_;
};

absl::Status ReadFully(int fd, char* out, uint64_t size, uint64_t offset,
                       const std::string& path) {
  while (size > 0) {
    const ssize_t n = pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat(
          "cannot read result file ", path, " at offset ", offset, ": ",
          n == 0 ? "unexpected end of file" : std::strerror(errno)));
    }
    out += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

class CoordinateAggregator final : public Aggregator {
 public:
  explicit CoordinateAggregator(std::shared_ptr<SharedState> shared)
      : shared_(std::move(shared)) {}

  absl::Status Add(const Model& result, int64_t sample_count,
                   v1::PayloadKind kind) override {
    SWARM_RETURN_IF_ERROR(CheckAddable(sample_count, kind));
    SWARM_RETURN_IF_ERROR(CheckTable(shared_->base->specs(), result.specs()));
    const VerifiedStorage* verified = VerifiedBy(result, shared_.get());
    if (!shared_->options.allow_non_finite &&
        (verified == nullptr || !verified->values_checked())) {
      SWARM_RETURN_IF_ERROR(CheckFinite(result, shared_->num_threads));
    }
    Stored stored;
    stored.diff = kind == v1::PAYLOAD_KIND_WEIGHT_DIFF;
    if (verified != nullptr && verified->file() != nullptr) {
      // Streamed into our offload directory already: keep that file.
      stored.path = verified->file()->path();
      stored.owned = verified->file();
      stored.offsets = StorageOffsets(result);
    } else {
      // A result held in memory (e.g. this site's own) is written to the
      // offload directory: a failure there is this site's disk, not the
      // result (common/storage_error.h), so it is never answered RETRY.
      stored.owned = std::make_shared<OffloadFile>(shared_->NewOffloadPath());
      stored.path = stored.owned->path();
      SWARM_RETURN_IF_ERROR(
          AsStorageError(result.SaveSafetensors(stored.path)));
      absl::StatusOr<Model> saved = Model::LoadSafetensors(stored.path);
      if (!saved.ok()) return AsStorageError(saved.status());
      SWARM_ASSIGN_OR_RETURN(Model view,
                             ViewInBaseOrder(shared_->base->specs(), *saved));
      stored.offsets = StorageOffsets(view);
    }
    Commit(std::move(stored), sample_count);
    return absl::OkStatus();
  }

  absl::Status AddFile(const std::string& path, int64_t sample_count,
                       v1::PayloadKind kind) override {
    SWARM_RETURN_IF_ERROR(CheckAddable(sample_count, kind));
    SWARM_ASSIGN_OR_RETURN(Model file, Model::LoadSafetensors(path));
    SWARM_ASSIGN_OR_RETURN(Model view,
                           ViewInBaseOrder(shared_->base->specs(), file));
    if (!shared_->options.allow_non_finite) {
      SWARM_RETURN_IF_ERROR(CheckFinite(view, shared_->num_threads));
    }
    Stored stored;
    stored.diff = kind == v1::PAYLOAD_KIND_WEIGHT_DIFF;
    stored.path = path;
    stored.offsets = StorageOffsets(view);
    Commit(std::move(stored), sample_count);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<TensorSink>> NewResultSink() override {
    return NewCheckingSink(shared_);
  }

  absl::StatusOr<Model> Finish() override {
    if (finished_) return absl::FailedPreconditionError("already finished");
    if (stored_.empty()) {
      return absl::FailedPreconditionError("no results to aggregate");
    }
    const Model& base = *shared_->base;
    const uint64_t n = stored_.size();
    FileSet files;
    for (const Stored& stored : stored_) {
      SWARM_RETURN_IF_ERROR(files.Open(stored.path));
    }
    SWARM_ASSIGN_OR_RETURN(
        Model out,
        Model::Create(base.specs(), HeapStorage::Init::kUninitialized));

    const uint64_t block =
        std::min(shared_->options.block_coordinates,
                 std::max(kMinBlockCoordinates,
                          kBlockBudgetBytes / (n * sizeof(double))));
    std::vector<Range> blocks;
    for (size_t t = 0; t < base.num_tensors(); ++t) {
      const uint64_t elements =
          base.spec(t).byte_size / DTypeSize(base.spec(t).dtype);
      for (uint64_t begin = 0; begin < elements; begin += block) {
        blocks.push_back({t, begin, std::min(elements, begin + block)});
      }
    }
    std::vector<char> diff(n);
    for (uint64_t k = 0; k < n; ++k) diff[k] = stored_[k].diff;
    const bool any_diff =
        std::any_of(stored_.begin(), stored_.end(),
                    [](const Stored& stored) { return stored.diff; });
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
      std::vector<char> raw(block * sizeof(double));
      std::vector<double> base_values(any_diff ? block : 0);
      std::vector<double> column(n);
      std::vector<double> reduced(block);
      for (size_t b = next.fetch_add(1); b < blocks.size() && !failed.load();
           b = next.fetch_add(1)) {
        const Range& range = blocks[b];
        const DType dtype = base.spec(range.tensor).dtype;
        const uint64_t size = DTypeSize(dtype);
        const uint64_t count = range.end - range.begin;
        for (uint64_t k = 0; k < n; ++k) {
          absl::Status status =
              ReadFully(files.fd(k), raw.data(), count * size,
                        stored_[k].offsets[range.tensor] + range.begin * size,
                        stored_[k].path);
          if (!status.ok()) {
            std::lock_guard<std::mutex> lock(error_mu);
            if (error.ok()) error = std::move(status);
            failed = true;
            return;
          }
          LoadRangeAsDouble(dtype, raw.data(), count, &values[k * block]);
        }
        if (any_diff) {
          LoadRangeAsDouble(
              dtype, base.tensor_data(range.tensor).data() + range.begin * size,
              count, base_values.data());
        }
        for (uint64_t k = 0; k < n; ++k) {
          if (!diff[k]) continue;
          double* row = &values[k * block];
          for (uint64_t j = 0; j < count; ++j) row[j] += base_values[j];
        }
        if (use_network) {
          // In runs of coordinates small enough for n rows to stay in L1/L2.
          for (uint64_t j = 0; j < count; j += sub_block) {
            const uint64_t m = std::min(sub_block, count - j);
            SortRowsByNetwork(network.data(), network.size(), &values[j], block,
                              m);
            ReduceSortedRows(&values[j], block, n, m, &reduced[j]);
          }
        } else {
          for (uint64_t j = 0; j < count; ++j) {
            for (uint64_t k = 0; k < n; ++k) column[k] = values[k * block + j];
            SortValues(column.data(), n);
            ReduceSortedRows(column.data(), 1, n, 1, &reduced[j]);
          }
        }
        StoreRangeFromDouble(
            dtype, reduced.data(), count,
            out.mutable_tensor_data(range.tensor).data() + range.begin * size);
      }
    });
    SWARM_RETURN_IF_ERROR(error);
    finished_ = true;
    stored_.clear();  // Removes the files we own.
    out.metadata()["aggregation"] =
        shared_->options.method == v1::AGGREGATION_MEDIAN ? "median"
                                                          : "trimmed_mean";
    out.metadata()["num_results"] = absl::StrCat(n);
    out.metadata()["total_samples"] = absl::StrCat(total_samples_);
    return out;
  }

  int64_t num_added() const override {
    return static_cast<int64_t>(stored_.size());
  }
  int64_t total_samples() const override { return total_samples_; }
  v1::AggregationMethod method() const override {
    return shared_->options.method;
  }

 private:
  struct Stored {
    std::string path;
    // Set when the aggregator owns the file (removed with the last owner).
    std::shared_ptr<OffloadFile> owned;
    // File offset of each tensor, in base order.
    std::vector<uint64_t> offsets;
    bool diff = false;
  };

  absl::Status CheckAddable(int64_t sample_count, v1::PayloadKind kind) const {
    if (finished_) return absl::FailedPreconditionError("already finished");
    SWARM_RETURN_IF_ERROR(CheckCountAndKind(sample_count, kind));
    if (sample_count > std::numeric_limits<int64_t>::max() - total_samples_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample count ", sample_count, " overflows the round's total"));
    }
    return absl::OkStatus();
  }

  void Commit(Stored stored, int64_t sample_count) {
    stored_.push_back(std::move(stored));
    total_samples_ += sample_count;
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

  const std::shared_ptr<SharedState> shared_;
  std::vector<Stored> stored_;
  int64_t total_samples_ = 0;
  bool finished_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> NewCoordinateAggregator(
    std::shared_ptr<SharedState> shared) {
  return std::make_unique<CoordinateAggregator>(std::move(shared));
}

}  // namespace agg_internal
}  // namespace swarm
