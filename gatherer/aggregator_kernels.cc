#include "gatherer/aggregator_kernels.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>

// The error-free transformations below need every operation rounded on its
// own: no contraction of a*b+c into an FMA behind our back (the build also
// passes -ffp-contract=off for this file), and no -ffast-math.
#if defined(__FAST_MATH__)
#error "aggregator_kernels.cc must not be built with -ffast-math"
#endif

namespace swarm {
namespace agg_internal {
namespace {

// The vector ISA the hot loops run with (model/dtype_kernels.h).
using Isa = KernelIsa;
inline Isa DetectedIsa() { return DetectedKernelIsa(); }

// ---------------------------------------------------------------------------
// FP8 tables.

struct F8Format {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool has_infinity;  // E5M2: IEEE-like; E4M3 "fn": only NaN at all ones.
};
constexpr F8Format kE4M3 = {4, 3, 7, false};
constexpr F8Format kE5M2 = {5, 2, 15, true};

float DecodeF8(const F8Format& format, uint8_t v) {
  const bool negative = (v & 0x80u) != 0;
  const int exponent =
      (v >> format.mantissa_bits) & ((1 << format.exponent_bits) - 1);
  const int mantissa = v & ((1 << format.mantissa_bits) - 1);
  const int max_exponent = (1 << format.exponent_bits) - 1;
  float magnitude;
  if (format.has_infinity && exponent == max_exponent) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else if (!format.has_infinity && exponent == max_exponent &&
             mantissa == (1 << format.mantissa_bits) - 1) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa),
                           1 - format.bias - format.mantissa_bits);
  } else {
    magnitude =
        std::ldexp(static_cast<float>(mantissa + (1 << format.mantissa_bits)),
                   exponent - format.bias - format.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

struct F8Table {
  explicit F8Table(const F8Format& format) {
    for (int v = 0; v < 256; ++v) {
      decode[v] = DecodeF8(format, static_cast<uint8_t>(v));
    }
    // Non-negative finite codes 0x00.. are increasing in value.
    num_finite = 0;
    while (num_finite < 128 && std::isfinite(decode[num_finite])) ++num_finite;
    nan_code = format.has_infinity ? 0x7f : 0x7f;
    infinity_code = format.has_infinity ? 0x7c : 0x7f;
  }

  uint8_t Encode(double value) const {
    if (value != value) return nan_code;
    const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
    const double magnitude = std::fabs(value);
    if (std::isinf(magnitude))
      return static_cast<uint8_t>(sign | infinity_code);
    const int last = num_finite - 1;
    if (magnitude >= decode[last]) return static_cast<uint8_t>(sign | last);
    // First code whose value is >= magnitude; then pick the nearer of it and
    // its predecessor, ties to the even code (even mantissa).
    int lo = 0;
    int hi = last;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (decode[mid] < magnitude) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    int code = lo;
    if (code > 0) {
      const double above = decode[code] - magnitude;
      const double below = magnitude - decode[code - 1];
      if (below < above || (below == above && ((code - 1) & 1) == 0)) {
        code = code - 1;
      }
    }
    return static_cast<uint8_t>(sign | code);
  }

  std::array<float, 256> decode;
  int num_finite;
  uint8_t nan_code;
  uint8_t infinity_code;
};

const F8Table& E4M3Table() {
  static const F8Table* table = new F8Table(kE4M3);
  return *table;
}
const F8Table& E5M2Table() {
  static const F8Table* table = new F8Table(kE5M2);
  return *table;
}

// ---------------------------------------------------------------------------
// Per-dtype codecs: storage type and conversion to/from double.

template <typename T>
struct IntCodec {
  using Storage = T;
  static double ToDouble(T v) { return static_cast<double>(v); }
  static T FromDouble(double value) {
    if (value != value) return 0;
    const double rounded = std::nearbyint(value);  // Ties to even.
    // 2^63 and 2^64 are exact doubles; the limits of smaller types too.
    constexpr double kMin = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double kMaxPlusOne =
        2.0 * static_cast<double>(std::numeric_limits<T>::max() / 2 + 1);
    if (rounded <= kMin) return std::numeric_limits<T>::min();
    if (rounded >= kMaxPlusOne) return std::numeric_limits<T>::max();
    return static_cast<T>(rounded);
  }
};
struct BoolCodec {
  using Storage = uint8_t;
  static double ToDouble(uint8_t v) { return v != 0 ? 1.0 : 0.0; }
  static uint8_t FromDouble(double value) { return value > 0.5 ? 1 : 0; }
};
struct F32Codec {
  using Storage = float;
  static double ToDouble(float v) { return v; }
  static float FromDouble(double value) { return static_cast<float>(value); }
};
struct F64Codec {
  using Storage = double;
  static double ToDouble(double v) { return v; }
  static double FromDouble(double value) { return value; }
};
struct F16Codec {
  using Storage = uint16_t;
  static double ToDouble(uint16_t v) { return F16ToF32(v); }
  static uint16_t FromDouble(double value) {
    return F32ToF16(RoundToOddF32(value));
  }
};
struct Bf16Codec {
  using Storage = uint16_t;
  static double ToDouble(uint16_t v) { return Bf16ToF32(v); }
  static uint16_t FromDouble(double value) {
    return F32ToBf16(RoundToOddF32(value));
  }
};
struct E4M3Codec {
  using Storage = uint8_t;
  static double ToDouble(uint8_t v) { return E4M3Table().decode[v]; }
  static uint8_t FromDouble(double value) { return E4M3Table().Encode(value); }
};
struct E5M2Codec {
  using Storage = uint8_t;
  static double ToDouble(uint8_t v) { return E5M2Table().decode[v]; }
  static uint8_t FromDouble(double value) { return E5M2Table().Encode(value); }
};

// Calls fn(Codec{}) with the codec of `dtype`; false for an unknown dtype.
template <typename Fn>
bool VisitDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case v1::DTYPE_F32:
      fn(F32Codec{});
      return true;
    case v1::DTYPE_F64:
      fn(F64Codec{});
      return true;
    case v1::DTYPE_F16:
      fn(F16Codec{});
      return true;
    case v1::DTYPE_BF16:
      fn(Bf16Codec{});
      return true;
    case v1::DTYPE_F8_E4M3:
      fn(E4M3Codec{});
      return true;
    case v1::DTYPE_F8_E5M2:
      fn(E5M2Codec{});
      return true;
    case v1::DTYPE_I8:
      fn(IntCodec<int8_t>{});
      return true;
    case v1::DTYPE_I16:
      fn(IntCodec<int16_t>{});
      return true;
    case v1::DTYPE_I32:
      fn(IntCodec<int32_t>{});
      return true;
    case v1::DTYPE_I64:
      fn(IntCodec<int64_t>{});
      return true;
    case v1::DTYPE_U8:
      fn(IntCodec<uint8_t>{});
      return true;
    case v1::DTYPE_U16:
      fn(IntCodec<uint16_t>{});
      return true;
    case v1::DTYPE_U32:
      fn(IntCodec<uint32_t>{});
      return true;
    case v1::DTYPE_U64:
      fn(IntCodec<uint64_t>{});
      return true;
    case v1::DTYPE_BOOL:
      fn(BoolCodec{});
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------
// Compensated F32 accumulation.
//
// Per element: p + pe == w * x exactly (pe from an FMA, or from the exact
// double product when FMA is unavailable); (s, e) = TwoSum(hi, p) so that
// s + e == hi + p exactly; the compensation t = lo + (e + pe) collects what
// the F32 head could not hold; a second TwoSum folds t back into the head
// (Fast2Sum) so |lo| stays below about half an ulp of hi. Only the final
// rounding of the new
// compensation to BF16 (8 significant bits, relative error <= 2^-9) loses
// information: at most 2^-10 ulp(hi) per added result, against up to
// 1/2 ulp(hi) for a plain F32 sum.

// The compensation term rounded to BF16 (nearest, ties to even). No NaN
// special case: the term is NaN only when the head is already non-finite,
// which then decides the value.
inline uint16_t CompensationToBf16(float value) {
  uint32_t bits = F32ToBits(value);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

template <bool kFma>
__attribute__((always_inline)) inline void CompensatedBody(
    const char* x, uint64_t n, float w, bool first, float* __restrict hi,
    uint16_t* __restrict lo) {
  if (first) {
    for (uint64_t i = 0; i < n; ++i) {
      const float value = LoadRaw<float>(x, i);
      const float p = w * value;
      float pe;
      if (kFma) {
        pe = __builtin_fmaf(w, value, -p);
      } else {
        pe = static_cast<float>(static_cast<double>(w) * value -
                                static_cast<double>(p));
      }
      const float h2 = p + pe;
      const float c2 = pe - (h2 - p);
      hi[i] = h2;
      lo[i] = CompensationToBf16(c2);
    }
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    const float value = LoadRaw<float>(x, i);
    const float h = hi[i];
    const float c = Bf16ToF32(lo[i]);
    const float p = w * value;
    float pe;
    if (kFma) {
      pe = __builtin_fmaf(w, value, -p);
    } else {
      pe = static_cast<float>(static_cast<double>(w) * value -
                              static_cast<double>(p));
    }
    // TwoSum(h, p).
    const float s = h + p;
    const float bp = s - h;
    const float e = (h - (s - bp)) + (p - bp);
    const float t = c + (e + pe);
    // Fast2Sum(s, t): renormalize. Exact when |s| >= |t|; |t| is at most
    // about an ulp of the larger operand, so otherwise s, t and the error
    // are all that small and nothing that matters is lost.
    const float h2 = s + t;
    const float c2 = t - (h2 - s);
    hi[i] = h2;
    lo[i] = CompensationToBf16(c2);
  }
}

__attribute__((target("avx2,fma"))) void CompensatedAvx2Fma(
    const char* x, uint64_t n, float w, bool first, float* hi, uint16_t* lo) {
  CompensatedBody<true>(x, n, w, first, hi, lo);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void
CompensatedAvx512Fma(const char* x, uint64_t n, float w, bool first, float* hi,
                     uint16_t* lo) {
  CompensatedBody<true>(x, n, w, first, hi, lo);
}

void CompensatedGeneric(const char* x, uint64_t n, float w, bool first,
                        float* hi, uint16_t* lo) {
  CompensatedBody<false>(x, n, w, first, hi, lo);
}

template <typename Codec, typename Acc>
void AccumulateTyped(const char* x, uint64_t n, Acc w, bool first, Acc* acc) {
  using T = typename Codec::Storage;
  if (first) {
    for (uint64_t i = 0; i < n; ++i) {
      acc[i] = w * static_cast<Acc>(Codec::ToDouble(LoadRaw<T>(x, i)));
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      acc[i] += w * static_cast<Acc>(Codec::ToDouble(LoadRaw<T>(x, i)));
    }
  }
}

// Decoding F16 through float (not double) keeps the loop vectorizable.
struct F16ToFloat {
  using Storage = uint16_t;
  static float ToDouble(uint16_t v) { return F16ToF32(v); }
};
struct Bf16ToFloat {
  using Storage = uint16_t;
  static float ToDouble(uint16_t v) { return Bf16ToF32(v); }
};

}  // namespace

float F8E4M3ToF32(uint8_t v) { return E4M3Table().decode[v]; }
float F8E5M2ToF32(uint8_t v) { return E5M2Table().decode[v]; }
uint8_t DoubleToF8E4M3(double value) { return E4M3Table().Encode(value); }
uint8_t DoubleToF8E5M2(double value) { return E5M2Table().Encode(value); }

double LoadAsDouble(DType dtype, const char* data, uint64_t i) {
  double out = 0;
  VisitDType(dtype, [&](auto codec) {
    using C = decltype(codec);
    out = C::ToDouble(LoadRaw<typename C::Storage>(data, i));
  });
  return out;
}

void StoreFromDouble(DType dtype, double value, char* data, uint64_t i) {
  VisitDType(dtype, [&](auto codec) {
    using C = decltype(codec);
    StoreRaw<typename C::Storage>(C::FromDouble(value), data, i);
  });
}

void LoadRangeAsDouble(DType dtype, const char* data, uint64_t n, double* out) {
  VisitDType(dtype, [&](auto codec) {
    using C = decltype(codec);
    for (uint64_t i = 0; i < n; ++i) {
      out[i] = C::ToDouble(LoadRaw<typename C::Storage>(data, i));
    }
  });
}

void StoreRangeFromDouble(DType dtype, const double* values, uint64_t n,
                          char* data) {
  VisitDType(dtype, [&](auto codec) {
    using C = decltype(codec);
    for (uint64_t i = 0; i < n; ++i) {
      StoreRaw<typename C::Storage>(C::FromDouble(values[i]), data, i);
    }
  });
}

void AccumulateF32Compensated(const char* x, uint64_t n, float w, bool first,
                              float* hi, uint16_t* lo) {
  AccumulateF32CompensatedVariant(static_cast<int>(DetectedIsa()), x, n, w,
                                  first, hi, lo);
}

void AccumulateF32CompensatedVariant(int variant, const char* x, uint64_t n,
                                     float w, bool first, float* hi,
                                     uint16_t* lo) {
  variant = std::min(variant, static_cast<int>(DetectedIsa()));
  if (variant >= static_cast<int>(Isa::kAvx512)) {
    CompensatedAvx512Fma(x, n, w, first, hi, lo);
  } else if (variant == static_cast<int>(Isa::kAvx2)) {
    CompensatedAvx2Fma(x, n, w, first, hi, lo);
  } else {
    CompensatedGeneric(x, n, w, first, hi, lo);
  }
}

void AccumulateToF64(DType dtype, const char* x, uint64_t n, double w,
                     bool first, double* acc) {
  VisitDType(dtype, [&](auto codec) {
    AccumulateTyped<decltype(codec), double>(x, n, w, first, acc);
  });
}

void AccumulateToF32(DType dtype, const char* x, uint64_t n, float w,
                     bool first, float* acc) {
  switch (dtype) {
    case v1::DTYPE_F16:
      AccumulateTyped<F16ToFloat, float>(x, n, w, first, acc);
      return;
    case v1::DTYPE_BF16:
      AccumulateTyped<Bf16ToFloat, float>(x, n, w, first, acc);
      return;
    default:
      VisitDType(dtype, [&](auto codec) {
        AccumulateTyped<decltype(codec), float>(x, n, w, first, acc);
      });
  }
}

namespace {

__attribute__((always_inline)) inline void FinishCompensatedBody(
    const float* hi, const uint16_t* lo, uint64_t n, double scale,
    const char* base, double base_scale, float* out) {
  if (base == nullptr || base_scale == 0) {
    for (uint64_t i = 0; i < n; ++i) {
      const double value =
          (static_cast<double>(hi[i]) + Bf16ToF32(lo[i])) * scale;
      out[i] = static_cast<float>(value);
    }
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    const double value =
        (static_cast<double>(hi[i]) + Bf16ToF32(lo[i])) * scale +
        base_scale * LoadRaw<float>(base, i);
    out[i] = static_cast<float>(value);
  }
}

void FinishCompensatedPortable(const float* hi, const uint16_t* lo, uint64_t n,
                               double scale, const char* base,
                               double base_scale, float* out) {
  FinishCompensatedBody(hi, lo, n, scale, base, base_scale, out);
}
__attribute__((target("avx2,fma"))) void FinishCompensatedAvx2(
    const float* hi, const uint16_t* lo, uint64_t n, double scale,
    const char* base, double base_scale, float* out) {
  FinishCompensatedBody(hi, lo, n, scale, base, base_scale, out);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void
FinishCompensatedAvx512(const float* hi, const uint16_t* lo, uint64_t n,
                        double scale, const char* base, double base_scale,
                        float* out) {
  FinishCompensatedBody(hi, lo, n, scale, base, base_scale, out);
}

}  // namespace

void FinishF32Compensated(const float* hi, const uint16_t* lo, uint64_t n,
                          double scale, const char* base, double base_scale,
                          float* out) {
  switch (DetectedIsa()) {
    case Isa::kAvx512:
      FinishCompensatedAvx512(hi, lo, n, scale, base, base_scale, out);
      return;
    case Isa::kAvx2:
      FinishCompensatedAvx2(hi, lo, n, scale, base, base_scale, out);
      return;
    default:
      FinishCompensatedPortable(hi, lo, n, scale, base, base_scale, out);
      return;
  }
}

namespace {

template <typename Acc>
void FinishWide(const Acc* acc, uint64_t n, double scale, const char* base,
                double base_scale, DType dtype, char* out) {
  constexpr uint64_t kStep = 1024;
  const uint64_t element_size = DTypeSize(dtype);
  double values[kStep];
  double base_values[kStep];
  for (uint64_t begin = 0; begin < n; begin += kStep) {
    const uint64_t count = std::min(kStep, n - begin);
    for (uint64_t i = 0; i < count; ++i) {
      values[i] = static_cast<double>(acc[begin + i]) * scale;
    }
    if (base != nullptr && base_scale != 0) {
      LoadRangeAsDouble(dtype, base + begin * element_size, count, base_values);
      for (uint64_t i = 0; i < count; ++i) {
        values[i] += base_scale * base_values[i];
      }
    }
    StoreRangeFromDouble(dtype, values, count, out + begin * element_size);
  }
}

}  // namespace

void FinishFromF64(const double* acc, uint64_t n, double scale,
                   const char* base, double base_scale, DType dtype,
                   char* out) {
  FinishWide(acc, n, scale, base, base_scale, dtype, out);
}

void FinishFromF32(const float* acc, uint64_t n, double scale, const char* base,
                   double base_scale, DType dtype, char* out) {
  FinishWide(acc, n, scale, base, base_scale, dtype, out);
}

namespace {

__attribute__((always_inline)) inline void SortRowsBody(
    const std::pair<uint32_t, uint32_t>* network, size_t size, double* rows,
    uint64_t stride, uint64_t count) {
  for (size_t k = 0; k < size; ++k) {
    double* __restrict a = rows + network[k].first * stride;
    double* __restrict b = rows + network[k].second * stride;
    for (uint64_t c = 0; c < count; ++c) {
      const double x = a[c];
      const double y = b[c];
      a[c] = std::min(x, y);
      b[c] = std::max(x, y);
    }
  }
}

void SortRowsPortable(const std::pair<uint32_t, uint32_t>* network, size_t size,
                      double* rows, uint64_t stride, uint64_t count) {
  SortRowsBody(network, size, rows, stride, count);
}
__attribute__((target("avx2"))) void SortRowsAvx2(
    const std::pair<uint32_t, uint32_t>* network, size_t size, double* rows,
    uint64_t stride, uint64_t count) {
  SortRowsBody(network, size, rows, stride, count);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void
SortRowsAvx512(const std::pair<uint32_t, uint32_t>* network, size_t size,
               double* rows, uint64_t stride, uint64_t count) {
  SortRowsBody(network, size, rows, stride, count);
}

}  // namespace

void SortRowsByNetwork(const std::pair<uint32_t, uint32_t>* network,
                       size_t size, double* rows, uint64_t stride,
                       uint64_t count) {
  switch (DetectedIsa()) {
    case Isa::kAvx512:
      SortRowsAvx512(network, size, rows, stride, count);
      return;
    case Isa::kAvx2:
      SortRowsAvx2(network, size, rows, stride, count);
      return;
    default:
      SortRowsPortable(network, size, rows, stride, count);
      return;
  }
}

}  // namespace agg_internal
}  // namespace swarm
