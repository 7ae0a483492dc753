#include "gatherer/result_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/storage_error.h"
#include "gatherer/aggregator_kernels.h"

namespace swarm {
namespace agg_internal {
namespace {

// Per-thread budget for the n blocks of doubles.
constexpr uint64_t kBlockBudgetBytes = 64ull << 20;
constexpr uint64_t kMinBlockCoordinates = 256;

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

// Results 0..n-1 shuffled by `seed` (Fisher-Yates with our own draws, so
// the order does not depend on the standard library) and cut into buckets
// of `size` (the last may be smaller). size <= 1: one result per bucket, in
// order.
std::vector<std::vector<uint32_t>> MakeBuckets(uint32_t n, int size,
                                               uint64_t seed) {
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  std::vector<std::vector<uint32_t>> buckets;
  if (size <= 1) {
    for (uint32_t i : order) buckets.push_back({i});
    return buckets;
  }
  std::mt19937_64 engine(seed);
  for (uint32_t i = n; i > 1; --i) {
    const uint32_t j = static_cast<uint32_t>(engine() % i);
    std::swap(order[i - 1], order[j]);
  }
  for (uint32_t begin = 0; begin < n; begin += static_cast<uint32_t>(size)) {
    const uint32_t end = std::min<uint32_t>(n, begin + size);
    buckets.emplace_back(order.begin() + begin, order.begin() + end);
  }
  return buckets;
}

}  // namespace

absl::Status ResultFiles::CheckAddable(int64_t sample_count,
                                       v1::PayloadKind kind) const {
  if (finished_) return absl::FailedPreconditionError("already finished");
  SWARM_RETURN_IF_ERROR(CheckCountAndKind(sample_count, kind));
  if (sample_count > std::numeric_limits<int64_t>::max() - total_samples_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample count ", sample_count, " overflows the round's total"));
  }
  if (stored_.size() >= std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError("too many results in one round");
  }
  return absl::OkStatus();
}

void ResultFiles::Commit(Stored stored, int64_t sample_count) {
  stored_.push_back(std::move(stored));
  bool clipped = false;
  total_samples_ += CappedSampleCount(shared_->options, sample_count, &clipped);
  if (clipped) ++claims_clipped_;
}

absl::Status ResultFiles::Add(const Model& result, int64_t sample_count,
                              v1::PayloadKind kind) {
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
    SWARM_RETURN_IF_ERROR(AsStorageError(result.SaveSafetensors(stored.path)));
    absl::StatusOr<Model> saved = Model::LoadSafetensors(stored.path);
    if (!saved.ok()) return AsStorageError(saved.status());
    SWARM_ASSIGN_OR_RETURN(Model view,
                           ViewInBaseOrder(shared_->base->specs(), *saved));
    stored.offsets = StorageOffsets(view);
  }
  Commit(std::move(stored), sample_count);
  return absl::OkStatus();
}

absl::Status ResultFiles::AddFile(const std::string& path, int64_t sample_count,
                                  v1::PayloadKind kind) {
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

void ResultFiles::Finish() {
  finished_ = true;
  stored_.clear();  // Removes the files we own.
}

absl::StatusOr<std::unique_ptr<ResultFiles::Reader>> ResultFiles::Reader::Open(
    const ResultFiles& files) {
  std::unique_ptr<Reader> reader(new Reader(files));
  for (const Stored& stored : files.stored_) {
    const int fd = open(stored.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat(
          "cannot open result file ", stored.path, ": ", std::strerror(errno)));
    }
    reader->fds_.push_back(fd);
    reader->any_diff_ = reader->any_diff_ || stored.diff;
  }
  const AggregatorOptions& options = files.shared_->options;
  reader->buckets_ = MakeBuckets(static_cast<uint32_t>(files.stored_.size()),
                                 options.bucket_size, options.bucket_seed);
  return reader;
}

ResultFiles::Reader::~Reader() {
  for (int fd : fds_) close(fd);
}

absl::Status ResultFiles::Reader::LoadResult(size_t k, const Range& range,
                                             double* out,
                                             Scratch* scratch) const {
  const Stored& stored = files_.stored_[k];
  const Model& base = *files_.shared_->base;
  const DType dtype = base.spec(range.tensor).dtype;
  const uint64_t size = DTypeSize(dtype);
  const uint64_t count = range.end - range.begin;
  scratch->raw.resize(count * size);
  SWARM_RETURN_IF_ERROR(ReadFully(
      fds_[k], scratch->raw.data(), count * size,
      stored.offsets[range.tensor] + range.begin * size, stored.path));
  LoadRangeAsDouble(dtype, scratch->raw.data(), count, out);
  if (stored.diff) {
    for (uint64_t j = 0; j < count; ++j) out[j] += scratch->base[j];
  }
  return absl::OkStatus();
}

absl::Status ResultFiles::Reader::Load(const Range& range, double* rows,
                                       uint64_t stride,
                                       Scratch* scratch) const {
  const Model& base = *files_.shared_->base;
  const DType dtype = base.spec(range.tensor).dtype;
  const uint64_t count = range.end - range.begin;
  if (any_diff_) {
    scratch->base.resize(count);
    LoadRangeAsDouble(
        dtype,
        base.tensor_data(range.tensor).data() + range.begin * DTypeSize(dtype),
        count, scratch->base.data());
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    double* out = rows + b * stride;
    const std::vector<uint32_t>& bucket = buckets_[b];
    if (bucket.size() == 1) {
      SWARM_RETURN_IF_ERROR(LoadResult(bucket[0], range, out, scratch));
      continue;
    }
    // A bucket's mean, summed in the bucket's (shuffled) order.
    scratch->row.resize(count);
    std::fill(out, out + count, 0.0);
    for (uint32_t k : bucket) {
      SWARM_RETURN_IF_ERROR(LoadResult(k, range, scratch->row.data(), scratch));
      for (uint64_t j = 0; j < count; ++j) out[j] += scratch->row[j];
    }
    const double scale = 1.0 / static_cast<double>(bucket.size());
    for (uint64_t j = 0; j < count; ++j) out[j] *= scale;
  }
  return absl::OkStatus();
}

std::vector<Range> PlanBlocks(const Model& base, uint64_t block) {
  std::vector<Range> blocks;
  for (size_t t = 0; t < base.num_tensors(); ++t) {
    const uint64_t elements =
        base.spec(t).byte_size / DTypeSize(base.spec(t).dtype);
    for (uint64_t begin = 0; begin < elements; begin += block) {
      blocks.push_back({t, begin, std::min(elements, begin + block)});
    }
  }
  return blocks;
}

uint64_t BlockCoordinates(const AggregatorOptions& options, uint64_t n) {
  return std::min(options.block_coordinates,
                  std::max(kMinBlockCoordinates,
                           kBlockBudgetBytes /
                               (std::max<uint64_t>(n, 1) * sizeof(double))));
}

int64_t CappedSampleCount(const AggregatorOptions& options,
                          int64_t sample_count, bool* clipped) {
  *clipped = false;
  if (options.max_claimed_samples > 0 &&
      static_cast<uint64_t>(sample_count) > options.max_claimed_samples) {
    *clipped = true;
    return static_cast<int64_t>(options.max_claimed_samples);
  }
  return sample_count;
}

}  // namespace agg_internal
}  // namespace swarm
