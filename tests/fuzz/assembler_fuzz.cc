// libFuzzer target: the frame assembler fed arbitrary frames, through the
// same decoding path as the gRPC service (FeedFrame on raw frame bytes).
// Input: a sequence of [u16 little-endian length][frame bytes].
#include <cstddef>
#include <cstdint>

#include "streaming/assembler.h"
#include "rpc/grpc_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  swarm::MemorySink sink;
  swarm::AssemblerOptions options;
  options.limits.max_model_bytes = 1 << 20;  // keep allocations small
  options.limits.max_tensors = 64;
  swarm::Assembler assembler(&sink, options);
  size_t at = 0;
  while (at + 2 <= size) {
    const size_t length = data[at] | (data[at + 1] << 8);
    at += 2;
    const size_t take = length < size - at ? length : size - at;
    grpc::Slice slice(data + at, take);
    grpc::ByteBuffer frame(&slice, 1);
    at += take;
    if (!swarm::FeedFrame(&frame, &assembler).ok()) return 0;
  }
  absl::StatusOr<swarm::Model> model = assembler.Finish();
  if (model.ok() && model->total_bytes() != assembler.header().total_bytes()) {
    __builtin_trap();
  }
  return 0;
}
