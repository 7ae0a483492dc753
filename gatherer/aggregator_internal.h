// Pieces shared by the aggregators (internal to gatherer/): validation, the
// checking result sink, offload files and work splitting over threads.
#ifndef SWARM_GATHERER_AGGREGATOR_INTERNAL_H_
#define SWARM_GATHERER_AGGREGATOR_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gatherer/aggregator.h"
#include "model/model.h"
#include "model/tensor_sink.h"

namespace swarm {
namespace agg_internal {

// What an aggregator shares with the sinks it hands out (which may outlive
// it). Immutable after construction except for the file counter.
struct SharedState {
  std::shared_ptr<const Model> base;
  AggregatorOptions options;
  int num_threads = 1;
  // Sinks write to files under options.offload_dir.
  bool sink_to_disk = false;
  // Distinguishes this aggregator's file names from other instances'.
  uint64_t instance_token = 0;
  mutable std::atomic<uint64_t> next_file{0};

  // A fresh path under options.offload_dir.
  std::string NewOffloadPath() const;
};

// Owns a file name: removes the file (if it exists) when destroyed.
class OffloadFile {
 public:
  explicit OffloadFile(std::string path) : path_(std::move(path)) {}
  ~OffloadFile();
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The storage of a model produced by a checking sink: read-only, and marked
// with the aggregator state whose base and rules it was checked against.
// (When allow_non_finite is set, values are never checked nor needed to be.)
class VerifiedStorage final : public ModelStorage {
 public:
  VerifiedStorage(std::shared_ptr<ModelStorage> inner,
                  std::shared_ptr<const SharedState> owner,
                  std::shared_ptr<OffloadFile> file, bool values_checked)
      : inner_(std::move(inner)),
        owner_(std::move(owner)),
        file_(std::move(file)),
        values_checked_(values_checked) {}
  VerifiedStorage(const VerifiedStorage&) = delete;
  VerifiedStorage& operator=(const VerifiedStorage&) = delete;

  const char* data() const override { return inner_->data(); }
  char* mutable_data() override { return nullptr; }
  uint64_t size() const override { return inner_->size(); }

  const SharedState* owner() const { return owner_.get(); }
  // The file behind the model (disk sinks), or null (memory sinks).
  const std::shared_ptr<OffloadFile>& file() const { return file_; }
  // False when the sink could not check every value (then Add scans).
  bool values_checked() const { return values_checked_; }

 private:
  std::shared_ptr<ModelStorage> inner_;
  std::shared_ptr<const SharedState> owner_;
  std::shared_ptr<OffloadFile> file_;
  bool values_checked_;
};

// `model`'s storage when a sink of `owner` produced and checked it, else null.
const VerifiedStorage* VerifiedBy(const Model& model, const SharedState* owner);

// The result's tensor table must equal the base's: same names in the same
// order, same dtypes and shapes. InvalidArgument naming the first tensor
// that differs (missing, extra, reordered, dtype, shape).
absl::Status CheckTable(const std::vector<TensorSpec>& base,
                        const std::vector<TensorSpec>& result);

// For a safetensors file, whose header is an unordered map: the same names,
// dtypes and shapes as `base` in any order (errors as CheckTable). Returns a
// view of `model` with its tensors in base order.
absl::StatusOr<Model> ViewInBaseOrder(const std::vector<TensorSpec>& base,
                                      const Model& model);

// Byte offset of each tensor of `model` inside its storage.
std::vector<uint64_t> StorageOffsets(const Model& model);

// sample_count > 0 and a known payload kind.
absl::Status CheckCountAndKind(int64_t sample_count, v1::PayloadKind kind);

// No NaN / Inf in any float tensor (scanned on `num_threads` threads).
// InvalidArgument naming the first offending tensor and element.
absl::Status CheckFinite(const Model& model, int num_threads);

absl::Status NonFiniteError(const std::string& tensor, uint64_t element);

// A sink that checks the table at Begin and the values per committed chunk,
// writing into memory or (shared->sink_to_disk) an offload file.
std::unique_ptr<TensorSink> NewCheckingSink(
    std::shared_ptr<const SharedState> shared);

// The method-specific aggregators (fedavg.cc, coordinate_aggregator.cc).
// `shared` is complete and validated.
absl::StatusOr<std::unique_ptr<Aggregator>> NewFedAvgAggregator(
    std::shared_ptr<SharedState> shared);
absl::StatusOr<std::unique_ptr<Aggregator>> NewCoordinateAggregator(
    std::shared_ptr<SharedState> shared);
absl::StatusOr<std::unique_ptr<Aggregator>> NewRobustAggregator(
    std::shared_ptr<SharedState> shared);

// The sample count a claim counts for: min(claim, max_claimed_samples) (a
// cap of 0: none). `*clipped` is set when the cap cut the claim.
int64_t CappedSampleCount(const AggregatorOptions& options,
                          int64_t sample_count, bool* clipped);

// Is `method` one of the robust vector methods (robust_aggregator.cc)?
bool IsRobustVectorMethod(v1::AggregationMethod method);

// ---------------------------------------------------------------------------
// Work splitting.

// Elements [begin, end) of tensor `tensor`.
struct Range {
  size_t tensor = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Cuts the elements of all tensors (elements[t] each, costing
// cost_per_element[t]; tensors of cost 0 are skipped) into `parts`
// contiguous shares of about equal cost. Cuts fall on multiples of 64
// elements so that no two shares write the same cache line.
std::vector<std::vector<Range>> SplitWork(
    const std::vector<uint64_t>& elements,
    const std::vector<uint64_t>& cost_per_element, int parts);

// Below this many bytes of work a second thread costs more than it saves.
inline constexpr uint64_t kMinParallelBytes = 4ull << 20;

// Runs fn(0) .. fn(n - 1), fn(0) on the calling thread, the rest on their own
// threads; returns when all are done.
template <typename Fn>
void RunParallel(int n, const Fn& fn) {
  if (n <= 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  for (int i = 1; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  fn(0);
  for (std::thread& thread : threads) thread.join();
}

}  // namespace agg_internal
}  // namespace swarm

#endif  // SWARM_GATHERER_AGGREGATOR_INTERNAL_H_
