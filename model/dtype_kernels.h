// Element kernels over a tensor's bytes that every layer may need: which
// dtypes are floating point, and the scan for NaN and Inf (a trainer's
// result is checked before it is sent, an aggregator's input as it
// arrives). Also the vector ISA such loops run with, chosen at run time
// (gatherer/aggregator_kernels.h builds its FedAvg loops on the same choice).
//
// Tensor bytes are read through memcpy-style loads: a tensor mapped from a
// safetensors file need not be aligned to its element size.
#ifndef SWARM_MODEL_DTYPE_KERNELS_H_
#define SWARM_MODEL_DTYPE_KERNELS_H_

#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace swarm {

// Element i of an array of T at `data`, which need not be aligned for T
// (tensor bytes sit at any offset of a file or a stream's buffer).
template <typename T>
inline T LoadRaw(const char* data, uint64_t i) {
  T value;
  std::memcpy(&value, data + i * sizeof(T), sizeof(T));
  return value;
}
template <typename T>
inline void StoreRaw(T value, char* data, uint64_t i) {
  std::memcpy(data + i * sizeof(T), &value, sizeof(T));
}

// F32, F64, F16, BF16 and the two FP8 formats.
bool IsFloatDType(DType dtype);

// Index of the first NaN or Inf among `n` elements of `dtype` at `data`, or
// `n` when there is none (always `n` for integer and bool dtypes).
uint64_t FindNonFinite(DType dtype, const char* data, uint64_t n);

// The widest vector ISA of this CPU the hot loops are built for (the rest
// of the project targets baseline x86-64). Variants are compiled with
// target attributes and chosen at run time.
enum class KernelIsa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// This CPU's ISA, capped by LimitKernelIsaForTesting.
KernelIsa DetectedKernelIsa();
// "avx512", "avx2" (both with FMA) or "portable" (baseline x86-64).
const char* KernelIsaName();
// For tests: run at most variant `max_variant` (0 = portable, 1 = AVX2,
// 2 = AVX-512) from now on.
void LimitKernelIsaForTesting(int max_variant);

}  // namespace swarm

#endif  // SWARM_MODEL_DTYPE_KERNELS_H_
