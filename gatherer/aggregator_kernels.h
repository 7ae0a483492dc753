// Element kernels behind the aggregators: dtype conversions with correct
// rounding and the accumulation loops of FedAvg. The non-finite scan, the
// float-dtype test and the run-time ISA choice are model/dtype_kernels.h's
// (the trainer link needs them too), re-exported here. Without FMA
// (portable ISA) the compensated sums use exact double products instead.
//
// Tensor bytes are read through memcpy-style loads: a tensor mapped from a
// safetensors file need not be aligned to its element size.
//
// Internal to gatherer/; exposed in a header for the tests and the benchmark.
#ifndef SWARM_GATHERER_AGGREGATOR_KERNELS_H_
#define SWARM_GATHERER_AGGREGATOR_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/dtype.h"
#include "model/dtype_kernels.h"

namespace swarm {
namespace agg_internal {

using ::swarm::FindNonFinite;
using ::swarm::IsFloatDType;
using ::swarm::KernelIsaName;
using ::swarm::LimitKernelIsaForTesting;

// ---------------------------------------------------------------------------
// Conversions.

inline float BitsToF32(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
inline uint32_t F32ToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float Bf16ToF32(uint16_t h) { return BitsToF32(uint32_t{h} << 16); }

// Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow gives Inf.
inline uint16_t F32ToBf16(float value) {
  uint32_t bits = F32ToBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Exact (every F16 value is a float). Branch-free so that loops vectorize.
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t magnitude = h & 0x7fffu;
  // Shifting the exponent and mantissa into place and scaling by 2^112
  // rebiases normals and normalizes subnormals exactly.
  float value = BitsToF32(magnitude << 13) * BitsToF32(0x77800000u);
  uint32_t bits = F32ToBits(value);
  // Inf and NaN: force the float exponent to all ones (keeps the payload).
  bits |= magnitude >= 0x7c00u ? 0x7f800000u : 0u;
  return BitsToF32(bits | sign);
}

// Round to nearest, ties to even; NaN stays a quiet NaN, values beyond the
// F16 range become Inf (IEEE 754).
inline uint16_t F32ToF16(float value) {
  constexpr uint32_t kF32Infinity = 255u << 23;
  constexpr uint32_t kF16Max = (127u + 16u) << 23;  // 2^16: rounds to Inf.
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t bits = F32ToBits(value);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint16_t out;
  if (bits >= kF16Max) {
    out = bits > kF32Infinity ? 0x7e00u : 0x7c00u;
  } else if (bits < (113u << 23)) {
    // F16 subnormal or zero: let the FPU round by adding a magic number
    // whose ulp is the F16 subnormal step.
    const float sum = BitsToF32(bits) + BitsToF32(kDenormMagic);
    out = static_cast<uint16_t>(F32ToBits(sum) - kDenormMagic);
  } else {
    const uint32_t mantissa_odd = (bits >> 13) & 1u;
    bits += ((15u - 127u) << 23) + 0xfffu;
    bits += mantissa_odd;
    out = static_cast<uint16_t>(bits >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

// double -> float rounding to odd: truncate, then set the last bit when
// inexact. Rounding that result to nearest-even in any format with at least
// two fewer significant bits (F16, BF16) equals rounding the double directly,
// so there is no double-rounding error.
inline float RoundToOddF32(double value) {
  const float rounded = static_cast<float>(value);
  if (static_cast<double>(rounded) == value || value != value) return rounded;
  uint32_t bits = F32ToBits(rounded);
  const double magnitude = value < 0 ? -value : value;
  const double rounded_magnitude = rounded < 0 ? -static_cast<double>(rounded)
                                               : static_cast<double>(rounded);
  if (rounded_magnitude > magnitude) --bits;  // One step toward zero.
  return BitsToF32(bits | 1u);
}

// OCP FP8. E4M3 is the "fn" variant (no Inf; 0x7f / 0xff are NaN; max 448),
// E5M2 is IEEE-like (Inf, NaN; max 57344).
float F8E4M3ToF32(uint8_t v);
float F8E5M2ToF32(uint8_t v);
// Nearest, ties to even; finite values beyond the range saturate to the
// largest finite value (the ML convention); NaN stays NaN, +-Inf gives NaN
// (E4M3) or Inf (E5M2).
uint8_t DoubleToF8E4M3(double value);
uint8_t DoubleToF8E5M2(double value);

// Element `i` of `dtype` at `data`, as a double (exact for every dtype
// except I64/U64 beyond 2^53).
double LoadAsDouble(DType dtype, const char* data, uint64_t i);
// Stores `value` as element `i`: floats round to nearest-even (correctly
// rounded from the double); integers round to nearest-even and saturate to
// the type's range (NaN -> 0); BOOL is value > 0.5.
void StoreFromDouble(DType dtype, double value, char* data, uint64_t i);
// The same for `n` consecutive elements starting at `data`.
void LoadRangeAsDouble(DType dtype, const char* data, uint64_t n, double* out);
void StoreRangeFromDouble(DType dtype, const double* values, uint64_t n,
                          char* data);

// ---------------------------------------------------------------------------
// Sorting many small columns at once (median, trimmed mean).

// Applies a sorting network (comparators (i, j), i < j) to rows of `count`
// values: afterwards, for every c, rows[0 * stride + c] <=
// rows[1 * stride + c] <= ... Each comparator is a min and a max over the
// run of values, which vectorizes. Only for values without NaN.
void SortRowsByNetwork(const std::pair<uint32_t, uint32_t>* network,
                       size_t size, double* rows, uint64_t stride,
                       uint64_t count);

// ---------------------------------------------------------------------------
// FedAvg accumulation. `w` is the result's weight; `first` means the
// accumulator holds no previous value (it is written, not read).

// Compensated F32 sum: the running value of element i is
// hi[i] + Bf16ToF32(lo[i]). Adds w * x[i] with error-free transformations
// (the product error via FMA or an exact double product, TwoSum for the
// sum), renormalizes (Fast2Sum), and rounds the new compensation to BF16.
void AccumulateF32Compensated(const char* x, uint64_t n, float w, bool first,
                              float* hi, uint16_t* lo);
// acc[i] += w * x[i] in double (x: F32, F64, integers, BOOL as 0/1).
void AccumulateToF64(DType dtype, const char* x, uint64_t n, double w,
                     bool first, double* acc);
// acc[i] += w * x[i] in float (x: F16, BF16, F8).
void AccumulateToF32(DType dtype, const char* x, uint64_t n, float w,
                     bool first, float* acc);

// The final model: out[i] = (running value) * scale + base_scale * base[i],
// rounded once into `dtype` (the tensor's dtype, also base's). `base` may be
// null when base_scale is 0. `out` may alias the accumulator (same index).
void FinishF32Compensated(const float* hi, const uint16_t* lo, uint64_t n,
                          double scale, const char* base, double base_scale,
                          float* out);
void FinishFromF64(const double* acc, uint64_t n, double scale,
                   const char* base, double base_scale, DType dtype, char* out);
void FinishFromF32(const float* acc, uint64_t n, double scale, const char* base,
                   double base_scale, DType dtype, char* out);

// For tests: variant 0 = portable, 1 = AVX2+FMA, 2 = AVX-512+FMA; capped at
// what the CPU supports.
void AccumulateF32CompensatedVariant(int variant, const char* x, uint64_t n,
                                     float w, bool first, float* hi,
                                     uint16_t* lo);

}  // namespace agg_internal
}  // namespace swarm

#endif  // SWARM_GATHERER_AGGREGATOR_KERNELS_H_
