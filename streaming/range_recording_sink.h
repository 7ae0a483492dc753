// RangeRecordingSink: a TensorSink for tests that records the ranges an
// assembler asks for and hands out a small scratch buffer, so a test can
// stream a tensor of many GiB without the memory (issue 13: offsets past
// 4 GiB).
#ifndef SWARM_STREAMING_RANGE_RECORDING_SINK_H_
#define SWARM_STREAMING_RANGE_RECORDING_SINK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"

namespace swarm {

// Records the ranges the assembler asks for and hands out a small scratch
// buffer: a tensor of many GiB costs no memory.
class RangeRecordingSink final : public TensorSink {
 public:
  struct Range {
    uint32_t index;
    uint64_t offset;
    uint64_t size;
  };
  absl::Status Begin(const v1::ModelHeader&,
                     const std::vector<TensorSpec>&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<char*> WritableRange(uint32_t index, uint64_t offset,
                                      uint64_t size) override {
    ranges.push_back({index, offset, size});
    scratch.assign(size, '\0');
    return scratch.data();
  }
  absl::Status CommitRange(uint32_t, uint64_t, uint64_t) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Model> Finish() override {
    return absl::UnimplementedError("the recording sink holds no model");
  }
  void Abort() override {}

  std::vector<Range> ranges;
  std::string scratch;
};

}  // namespace swarm

#endif  // SWARM_STREAMING_RANGE_RECORDING_SINK_H_
