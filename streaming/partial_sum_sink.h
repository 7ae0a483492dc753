// One hop of a chain reduction (JobConfig.reduce_results_in_chain): a
// TensorSink that receives a partial sum of results and, chunk by chunk as
// it arrives, passes on
//
//   out = partial_scale * in + own_weight * own_result
//
// over the same byte range, so that a hop holds no copy of the partial sum
// and the sum flows through a chain of trainers at the pace of its slowest
// link. What carries the chunks on (a gRPC stream, the fake network's next
// delivery) is the caller's: `emit` gets every output range in order.
//
//   PartialSumSink sink(own_result, own_samples, emit);
//   Assembler assembler(&sink, options);   // checks ranges and the digest
//   ... feed the incoming frames ...
//   assembler.Finish()  -> OK once every range went through `emit`.
//
// Only F32 tensors are summed (the partial's values are F32 sums); the
// partial's tensor table must equal the own result's, name for name. Each
// output element is rounded to F32 once per hop (computed in F64).
//
// Not thread-safe: one stream, as TensorSink.
#ifndef SWARM_STREAMING_PARTIAL_SUM_SINK_H_
#define SWARM_STREAMING_PARTIAL_SUM_SINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/model.h"
#include "model/tensor_sink.h"

namespace swarm {

// OK when `specs` may travel as a partial sum (every tensor F32); otherwise
// says which tensor is not.
absl::Status CheckPartialSumLayout(const std::vector<TensorSpec>& specs);

class PartialSumSink final : public TensorSink {
 public:
  // `emit(tensor_index, offset, data)`: an output range (valid during the
  // call only); a non-OK return fails the stream.
  using Emit =
      std::function<absl::Status(uint32_t, uint64_t, absl::string_view)>;

  // REQUIRES: `own` stays unchanged while the sink is in use.
  PartialSumSink(std::shared_ptr<const Model> own, double own_weight,
                 Emit emit);
  PartialSumSink(const PartialSumSink&) = delete;
  PartialSumSink& operator=(const PartialSumSink&) = delete;

  // InvalidArgument when the partial's table differs from the own result's
  // (naming the first tensor that differs) or a tensor is not F32.
  absl::Status Begin(const v1::ModelHeader& header,
                     const std::vector<TensorSpec>& specs) override;
  absl::StatusOr<char*> WritableRange(uint32_t index, uint64_t offset,
                                      uint64_t size) override;
  absl::Status CommitRange(uint32_t index, uint64_t offset,
                           uint64_t size) override;
  // An empty model: the sum went on through `emit`.
  absl::StatusOr<Model> Finish() override { return Model(); }
  void Abort() override {}

  uint64_t bytes_emitted() const { return bytes_emitted_; }

 private:
  const std::shared_ptr<const Model> own_;
  const double own_weight_;
  const Emit emit_;
  double scale_ = 1;
  std::vector<char> scratch_;
  uint64_t bytes_emitted_ = 0;
};

}  // namespace swarm

#endif  // SWARM_STREAMING_PARTIAL_SUM_SINK_H_
