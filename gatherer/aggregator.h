// Aggregators: turn one round's trainer results into the next global model.
//
// One interface for every method. An aggregator is made for one round from
// the round's base model (the global model the trainers started from), fed
// one result at a time as results arrive, and finished once:
//
//   SWARM_ASSIGN_OR_RETURN(std::unique_ptr<Aggregator> agg,
//                          Aggregator::Create(options, base));
//   // Per incoming stream (any thread, concurrently):
//   SWARM_ASSIGN_OR_RETURN(std::unique_ptr<TensorSink> sink,
//                          agg->NewResultSink());
//   ... Assembler(sink.get(), ...) ... -> Model result
//   // Then, one result at a time:
//   SWARM_RETURN_IF_ERROR(agg->Add(result, header.sample_count(),
//                                  header.payload_kind()));
//   ...
//   SWARM_ASSIGN_OR_RETURN(Model next_global, agg->Finish());
//
// Methods:
//  - FedAvg: the mean of the results weighted by sample count. Linear, so it
//    keeps a running sum only: memory is the sum plus the result being added,
//    whatever the number of results; Add folds a result in and keeps nothing
//    of it.
//  - Coordinate-wise median and trimmed mean (drop floor(trim_fraction * n)
//    values at each end, average the rest). They need all results at once,
//    so results are kept in safetensors files under the offload directory
//    and Finish reads them back in blocks of coordinates, one block of every
//    file at a time: memory is the output model plus n blocks. Both are
//    unweighted: they are the robust choice against a trainer that sends
//    outliers, and weighting by a self-reported sample count would let that
//    trainer buy back the influence the method takes away. Sample counts are
//    still checked and summed.
//  - Multi-Krum, Bulyan, centered clipping and geometric median
//    (robust_aggregator.cc): like median, every result is kept in a file
//    under the offload directory, and Finish makes passes over the files in
//    blocks of coordinates. Memory: the output model (which also holds the
//    current center of the iterative rules), per thread n blocks of doubles,
//    and an n x n distance matrix. Unweighted, for the same reason as the
//    median.
//  - Bucketing (bucket_size s > 1, any method but FedAvg): results are
//    shuffled (bucket_seed) into buckets of s and each bucket's mean is one
//    input of the method; done block by block as files are read, so it
//    costs no memory beyond a block.
//  - Sample-count cap (max_claimed_samples) and equal weights: FedAvg's
//    weight is min(claim, cap), or 1 with equal weights; a clipped claim is
//    counted (sample_claims_clipped), not refused. For every method
//    total_samples sums the claims after clipping. Partial sums (chain
//    reduction) are refused with either option: their weights were applied
//    by the trainers.
//
// Payload kinds: a result is full weights or a weight difference against
// the base model; a difference counts as base + difference. Kinds may mix
// within a round.
//
// Validation happens before anything is folded in: a result whose tensor
// table differs from the base's (a missing, extra or reordered tensor, a
// different dtype or shape), a NaN or Inf value (unless allowed), a sample
// count <= 0 or an unknown payload kind is refused with InvalidArgument
// naming the tensor or the rule, and the aggregate is exactly as before:
// later results aggregate as if the bad one had never been offered.
//
// Dtypes: the new model has the base's layout and dtypes.
//  - F32 (FedAvg): a compensated sum (F32 head + BF16 compensation per
//    element) by default, or an F64 sum; see F32Accumulator.
//  - F16, BF16, F8: summed in F32 (13+ more significant bits than the data).
//  - F64: summed in F64.
//  - Integers and BOOL: averaged like the floats (in F64), then rounded to
//    nearest (ties to even) and saturated to the type's range; BOOL becomes
//    true when the (weighted) mean of 0/1 is above 0.5. A counter such as
//    BatchNorm's num_batches_tracked thus gets the average count; a buffer
//    every trainer leaves alone keeps its value. Exact for magnitudes below
//    2^53.
//  - Median and trimmed mean work in F64 for every dtype.
//  Results round once, to nearest-even, into the model's dtype (F16/BF16 via
//  round-to-odd, so there is no double rounding).
//
// Threads: Add and Finish spread large models over options.num_threads
// threads (tensors are cut into ranges). Calls to Add and Finish must not
// overlap; NewResultSink and the sinks it returns may be used from other
// threads meanwhile.
#ifndef SWARM_GATHERER_AGGREGATOR_H_
#define SWARM_GATHERER_AGGREGATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"

namespace swarm {

// How FedAvg keeps the running sum of F32 tensors.
//
// Why compensated by default: FedAvg is bound by memory traffic, and per
// element of each added result it reads the result (4 bytes) and reads and
// writes the running sum. An F64 sum makes that 4 + 8 + 8 = 20 bytes, a
// compensated F32 + BF16 sum 4 + 6 + 6 = 16, a plain F32 sum 12 (too
// inaccurate: up to 1/2 ulp lost per result). Memory follows: the sum is
// 2x (F64) or 1.5x (compensated) the F32 tensors, so with a result in
// flight F64 alone reaches 3x the model. Measured by bench/aggregate_bench
// on the shared 2-core development VM (AVX-512; n = 8 results of 256 MiB;
// noisy): compensated 0.67-0.78x single-threaded memcpy when the machine is
// otherwise idle, F64 0.5-0.55x; peak RSS 2.5x vs 4.0x the model (both
// including one freed result kept by HeapStorage's recycling pool). An
// 8-bit quantized compensation (14 bytes, 1.25x memory) was tried: 6%
// faster on an idle machine, 30% slower with the cores shared (its quantum
// arithmetic costs instructions), and half as precise; not worth it. All
// are far more accurate than needed to round the mean to F32.
enum class F32Accumulator {
  // Per element an F32 head plus a BF16 compensation term (6 bytes), updated
  // with error-free transformations: the product error from an FMA (or an
  // exact double product), TwoSum for the addition, Fast2Sum to renormalize.
  // Only rounding the new compensation to BF16 loses anything: at most
  // 2^-10 ulp of the running sum per added result (an F32 sum: 2^-1). So
  // the mean is correctly rounded to F32 up to about n * 2^-10 ulp of the
  // terms' magnitude (visible only where results cancel).
  kCompensated,
  // Per element an F64 sum (8 bytes): exact products, 2^-53 per addition.
  // Simplest; 2x the F32 tensors in memory and a third more traffic.
  kFloat64,
};

struct AggregatorOptions {
  v1::AggregationMethod method = v1::AGGREGATION_FEDAVG;
  // Trimmed mean: the share dropped at each end, in [0, 0.5).
  double trim_fraction = 0.1;
  // Accept NaN / Inf values in results. FedAvg then propagates them (a
  // coordinate with a non-finite input comes out NaN or Inf); median and
  // trimmed mean sort NaN above +Inf; the robust vector rules count a
  // result at a NaN distance as infinitely far (no weight, not selected).
  bool allow_non_finite = false;
  // Directory for results kept on disk (created if missing). Required for
  // median and trimmed mean. For FedAvg it is optional: when set,
  // NewResultSink writes incoming results there instead of into memory
  // (disk offload), and Add folds them in from the mapped file; the running
  // sum, and the model Finish returns, then live in unlinked files there
  // too (page cache, not anonymous memory). Files the aggregator writes are
  // removed when no longer needed, at the latest by Finish or the
  // destructor.
  std::string offload_dir;
  // Create makes `offload_dir` if missing. False: it must exist already (a
  // site's job folder has it from configure on; the site's machine does no
  // I/O when it opens a round).
  bool make_offload_dir = true;
  // Threads for Add and Finish on large models; 0 = min(2, hardware threads).
  int num_threads = 0;
  F32Accumulator f32_accumulator = F32Accumulator::kCompensated;
  // Median / trimmed mean: coordinates read from every file per step (fewer
  // when many results would make n blocks large).
  uint64_t block_coordinates = 65536;

  // Robust methods (JobConfig fields of the same names; 0 = the default the
  // proto documents). The attackers tolerated, f.
  int tolerated_attackers = 0;
  // Multi-Krum: results averaged (0 = n - f).
  int krum_selected = 0;
  // Centered clipping: radius (0 = adaptive: the median distance) and
  // iterations.
  double clipping_radius = 0;
  int clipping_iterations = 3;
  // Geometric median: Weiszfeld iterations.
  int geometric_median_iterations = 10;
  // Bucketing: results per bucket (0 or 1: none), and the seed of the
  // shuffle (the controller mixes the job's seed with the round).
  int bucket_size = 0;
  uint64_t bucket_seed = 0;
  // Sample-count cap (0: none) and equal weights (FedAvg).
  uint64_t max_claimed_samples = 0;
  bool equal_weights = false;

  // The job's aggregation settings (method, trim_fraction, allow_non_finite,
  // the robust methods' parameters, the sample-count cap)
  // with `offload_dir`, e.g. <workspace>/<job>/offload. A zero trim_fraction
  // in the config means the documented default 0.1.
  static AggregatorOptions FromJobConfig(const v1::JobConfig& config,
                                         std::string offload_dir);
};

class Aggregator {
 public:
  // An aggregator for one round. `base` is the round's global model; the new
  // model gets its layout and dtypes. InvalidArgument for a bad option (the
  // message names it), a method that needs offload_dir without one, or an
  // unsupported dtype in `base`.
  static absl::StatusOr<std::unique_ptr<Aggregator>> Create(
      AggregatorOptions options, std::shared_ptr<const Model> base);

  virtual ~Aggregator() = default;
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // Folds in one result. `result` is only read during the call; the caller
  // may free it afterwards (FedAvg keeps nothing of it; median and trimmed
  // mean keep a file). On any error the aggregate is unchanged.
  // FailedPrecondition after Finish.
  virtual absl::Status Add(const Model& result, int64_t sample_count,
                           v1::PayloadKind kind) = 0;

  // Adds a result stored as a safetensors file. Median and trimmed mean read
  // the file in place at Finish (it must stay unchanged until then); FedAvg
  // reads it once, now. The file is never modified or removed.
  virtual absl::Status AddFile(const std::string& path, int64_t sample_count,
                               v1::PayloadKind kind) = 0;

  // One trainer's share of a partial sum (chain reduction).
  struct PartialTerm {
    int64_t sample_count = 0;
    v1::PayloadKind kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
  };
  // Chain reduction: folds in a partial sum whose values are `scale` times
  // sum_i(terms[i].sample_count * result_i), as if each result had been
  // added on its own (up to the F32 rounding of the sum on its way). FedAvg
  // only (Unimplemented otherwise); F32 tensors only. On any error the
  // aggregate is unchanged.
  virtual absl::Status AddPartialSum(const Model& sum, double scale,
                                     const std::vector<PartialTerm>& terms) {
    return absl::UnimplementedError(
        "only FedAvg adds partial sums (chain reduction)");
  }

  // A sink for one incoming result stream. It refuses a tensor table that
  // differs from the base at Begin, and NaN / Inf values as each chunk is
  // committed (while the chunk is still in cache), so that Add of the model
  // it produces skips its own pass over the values: FedAvg then reads each
  // result exactly once. It writes into memory, or into a file under
  // offload_dir when one is set (always for median and trimmed mean; Add
  // then keeps that file instead of copying the result). The model it
  // produces is read-only. Thread-safe; sinks may outlive the aggregator.
  virtual absl::StatusOr<std::unique_ptr<TensorSink>> NewResultSink() = 0;

  // The new global model (base layout and dtypes; metadata "aggregation",
  // "num_results" and "total_samples"). Call once, after at least one
  // result. Removes the aggregator's offload files.
  virtual absl::StatusOr<Model> Finish() = 0;

  // Results folded in so far, and the sum of their sample counts.
  virtual int64_t num_added() const = 0;
  virtual int64_t total_samples() const = 0;
  virtual v1::AggregationMethod method() const = 0;
  // Results whose claimed sample count was above max_claimed_samples.
  virtual int64_t sample_claims_clipped() const { return 0; }

 protected:
  Aggregator() = default;
};

}  // namespace swarm

#endif  // SWARM_GATHERER_AGGREGATOR_H_
