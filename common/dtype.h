// Element types shared by the wire protocol, the model type and safetensors.
#ifndef SWARM_COMMON_DTYPE_H_
#define SWARM_COMMON_DTYPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/swarm.pb.h"

namespace swarm {

using DType = ::swarm::v1::DType;

// Bytes per element; 0 for DTYPE_UNSPECIFIED or an unknown value.
uint64_t DTypeSize(DType dtype);

// The safetensors name ("F32", "BF16", ...). "?" for an unknown value.
absl::string_view DTypeName(DType dtype);

// Parses a safetensors dtype name. InvalidArgument names the unknown string.
absl::StatusOr<DType> ParseDTypeName(absl::string_view name);

// Number of elements of `shape` (1 for a scalar), or an error when the product
// overflows 64 bits.
absl::StatusOr<uint64_t> ElementCount(absl::Span<const uint64_t> shape);

// Bytes needed for `shape` of `dtype`, with overflow and dtype checks.
absl::StatusOr<uint64_t> TensorByteSize(DType dtype,
                                        absl::Span<const uint64_t> shape);

}  // namespace swarm

#endif  // SWARM_COMMON_DTYPE_H_
