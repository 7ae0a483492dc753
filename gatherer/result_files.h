// Results kept as safetensors files for the methods that need every result
// at once (median, trimmed mean, and the robust methods), and the block
// reader their Finish passes use. Internal to gatherer/.
//
// Memory: one path, one offset per tensor and a flag per result; the values
// stay in the files (page cache). A reader holds one file descriptor per
// result; each thread that loads blocks holds its own scratch (a few blocks).
#ifndef SWARM_GATHERER_RESULT_FILES_H_
#define SWARM_GATHERER_RESULT_FILES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gatherer/aggregator_internal.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {
namespace agg_internal {

class ResultFiles {
 public:
  explicit ResultFiles(std::shared_ptr<SharedState> shared)
      : shared_(std::move(shared)) {}
  ResultFiles(const ResultFiles&) = delete;
  ResultFiles& operator=(const ResultFiles&) = delete;

  // Checks the result (table, values, count, kind) and keeps it: the file
  // it streamed into (our sink), else a new file under offload_dir. On error
  // nothing is kept.
  absl::Status Add(const Model& result, int64_t sample_count,
                   v1::PayloadKind kind);
  // Keeps `path` (read in place at Finish; never modified or removed).
  absl::Status AddFile(const std::string& path, int64_t sample_count,
                       v1::PayloadKind kind);
  // FailedPrecondition from now on; removes the files we own.
  void Finish();

  size_t size() const { return stored_.size(); }
  bool finished() const { return finished_; }
  // Claims summed after the cap, and claims the cap cut.
  int64_t total_samples() const { return total_samples_; }
  int64_t claims_clipped() const { return claims_clipped_; }

  // Per-thread buffers of Reader::Load.
  struct Scratch {
    std::vector<char> raw;
    std::vector<double> base;
    std::vector<double> row;
  };

  // Reads blocks of coordinates of every input. The inputs are the
  // results, or with bucket_size s > 1 the means of ceil(n / s) buckets of
  // results shuffled by bucket_seed. Values are full weights (a difference
  // plus the base) as doubles.
  class Reader {
   public:
    static absl::StatusOr<std::unique_ptr<Reader>> Open(
        const ResultFiles& files);
    ~Reader();
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

    // Inputs after bucketing.
    uint64_t rows() const { return buckets_.size(); }
    const std::vector<std::vector<uint32_t>>& buckets() const {
      return buckets_;
    }
    // Loads `range` of every input: input k's values at rows[k * stride],
    // stride >= range.end - range.begin.
    absl::Status Load(const Range& range, double* rows, uint64_t stride,
                      Scratch* scratch) const;

   private:
    explicit Reader(const ResultFiles& files) : files_(files) {}
    absl::Status LoadResult(size_t k, const Range& range, double* out,
                            Scratch* scratch) const;

    const ResultFiles& files_;
    std::vector<int> fds_;
    std::vector<std::vector<uint32_t>> buckets_;
    bool any_diff_ = false;
  };

  const SharedState& shared() const { return *shared_; }

 private:
  struct Stored {
    std::string path;
    // Set when we own the file (removed with the last owner).
    std::shared_ptr<OffloadFile> owned;
    // File offset of each tensor, in base order.
    std::vector<uint64_t> offsets;
    bool diff = false;
  };

  absl::Status CheckAddable(int64_t sample_count, v1::PayloadKind kind) const;
  void Commit(Stored stored, int64_t sample_count);

  const std::shared_ptr<SharedState> shared_;
  std::vector<Stored> stored_;
  int64_t total_samples_ = 0;
  std::atomic<int64_t> claims_clipped_{0};
  bool finished_ = false;
};

// The model's elements cut into blocks of at most `block` coordinates (no
// block spans two tensors).
std::vector<Range> PlanBlocks(const Model& base, uint64_t block);

// Coordinates per block for n inputs: options.block_coordinates, lowered so
// that n blocks of doubles stay within a per-thread budget.
uint64_t BlockCoordinates(const AggregatorOptions& options, uint64_t n);

// An Aggregator that keeps every result whole in ResultFiles and combines
// them in its Finish (the coordinate-wise and the robust rules): the
// adding, counting and sink half they share.
class FileBackedAggregator : public Aggregator {
 public:
  explicit FileBackedAggregator(std::shared_ptr<SharedState> shared)
      : shared_(std::move(shared)) {}

  absl::Status Add(const Model& result, int64_t sample_count,
                   v1::PayloadKind kind) final {
    return files_.Add(result, sample_count, kind);
  }
  absl::Status AddFile(const std::string& path, int64_t sample_count,
                       v1::PayloadKind kind) final {
    return files_.AddFile(path, sample_count, kind);
  }
  absl::StatusOr<std::unique_ptr<TensorSink>> NewResultSink() final {
    return NewCheckingSink(shared_);
  }
  int64_t num_added() const final {
    return static_cast<int64_t>(files_.size());
  }
  int64_t total_samples() const final { return files_.total_samples(); }
  int64_t sample_claims_clipped() const final {
    return files_.claims_clipped();
  }
  v1::AggregationMethod method() const final { return shared_->options.method; }

 protected:
  const std::shared_ptr<SharedState> shared_;
  ResultFiles files_{shared_};
};

}  // namespace agg_internal
}  // namespace swarm

#endif  // SWARM_GATHERER_RESULT_FILES_H_
