#include "model/dtype_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace swarm {
namespace {

// This CPU's widest vector ISA (with FMA) among KernelIsa's.
KernelIsa DetectIsa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (fma && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    return KernelIsa::kAvx512;
  }
  if (fma && __builtin_cpu_supports("avx2")) return KernelIsa::kAvx2;
#endif
  return KernelIsa::kPortable;
}

std::atomic<int> g_isa_limit{static_cast<int>(KernelIsa::kAvx512)};

// ---------------------------------------------------------------------------
// Non-finite scan: a value is NaN or Inf when its exponent field is all
// ones. Adding one unit to the masked exponent carries into the sign bit
// exactly then, so a block is checked with and/add/or only (vectorizes with
// plain SSE2), and the element is located only when a block fails.

// True when any of the `n` elements at `data` has an all-ones exponent.
template <typename U, U kExponentMask, U kExponentUnit, U kSignBit>
__attribute__((always_inline)) inline bool AnyAllOnesBody(const char* data,
                                                          uint64_t n) {
  U any = 0;
  for (uint64_t i = 0; i < n; ++i) {
    any |=
        static_cast<U>((LoadRaw<U>(data, i) & kExponentMask) + kExponentUnit);
  }
  return (any & kSignBit) != 0;
}

template <typename U, U kExponentMask, U kExponentUnit, U kSignBit>
bool AnyAllOnesPortable(const char* data, uint64_t n) {
  return AnyAllOnesBody<U, kExponentMask, kExponentUnit, kSignBit>(data, n);
}
template <typename U, U kExponentMask, U kExponentUnit, U kSignBit>
__attribute__((target("avx2"))) bool AnyAllOnesAvx2(const char* data,
                                                    uint64_t n) {
  return AnyAllOnesBody<U, kExponentMask, kExponentUnit, kSignBit>(data, n);
}
template <typename U, U kExponentMask, U kExponentUnit, U kSignBit>
__attribute__((target("avx512f,avx512bw,avx512vl"))) bool AnyAllOnesAvx512(
    const char* data, uint64_t n) {
  return AnyAllOnesBody<U, kExponentMask, kExponentUnit, kSignBit>(data, n);
}

// Blocks are checked last to first: data just written (a chunk that has
// just arrived) is then read newest-first, while it is still in the nearer
// caches, instead of having the older lines pushed out by the reading
// itself. Only a block that holds a bad value is then searched, forwards.
template <typename U, U kExponentMask, U kExponentUnit, U kSignBit>
uint64_t FindAllOnesExponent(const char* data, uint64_t n) {
  constexpr uint64_t kBlock = 4096;
  const KernelIsa isa = DetectedKernelIsa();
  uint64_t first_bad_block = n;
  for (uint64_t end = n; end > 0;) {
    const uint64_t begin = end > kBlock ? end - kBlock : 0;
    const uint64_t count = end - begin;
    end = begin;
    const char* block = data + begin * sizeof(U);
    bool any;
    switch (isa) {
      case KernelIsa::kAvx512:
        any = AnyAllOnesAvx512<U, kExponentMask, kExponentUnit, kSignBit>(
            block, count);
        break;
      case KernelIsa::kAvx2:
        any = AnyAllOnesAvx2<U, kExponentMask, kExponentUnit, kSignBit>(block,
                                                                        count);
        break;
      default:
        any = AnyAllOnesPortable<U, kExponentMask, kExponentUnit, kSignBit>(
            block, count);
        break;
    }
    if (any) first_bad_block = begin;
  }
  for (uint64_t i = first_bad_block; i < n; ++i) {
    if ((LoadRaw<U>(data, i) & kExponentMask) == kExponentMask) return i;
  }
  return n;
}

uint64_t FindE4M3NaN(const char* data, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if ((static_cast<uint8_t>(data[i]) & 0x7fu) == 0x7fu) return i;
  }
  return n;
}

}  // namespace

KernelIsa DetectedKernelIsa() {
  static const KernelIsa isa = DetectIsa();
  return static_cast<KernelIsa>(std::min(
      static_cast<int>(isa), g_isa_limit.load(std::memory_order_relaxed)));
}

void LimitKernelIsaForTesting(int max_variant) {
  g_isa_limit.store(max_variant, std::memory_order_relaxed);
}

const char* KernelIsaName() {
  switch (DetectedKernelIsa()) {
    case KernelIsa::kAvx512:
      return "avx512";
    case KernelIsa::kAvx2:
      return "avx2";
    default:
      return "portable";
  }
}

bool IsFloatDType(DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
    case v1::DTYPE_F64:
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
    case v1::DTYPE_F8_E4M3:
    case v1::DTYPE_F8_E5M2:
      return true;
    default:
      return false;
  }
}

uint64_t FindNonFinite(DType dtype, const char* data, uint64_t n) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return FindAllOnesExponent<uint32_t, 0x7f800000u, 0x00800000u,
                                 0x80000000u>(data, n);
    case v1::DTYPE_F64:
      return FindAllOnesExponent<uint64_t, 0x7ff0000000000000ull,
                                 0x0010000000000000ull, 0x8000000000000000ull>(
          data, n);
    case v1::DTYPE_F16:
      return FindAllOnesExponent<uint16_t, 0x7c00u, 0x0400u, 0x8000u>(data, n);
    case v1::DTYPE_BF16:
      return FindAllOnesExponent<uint16_t, 0x7f80u, 0x0080u, 0x8000u>(data, n);
    case v1::DTYPE_F8_E5M2:
      return FindAllOnesExponent<uint8_t, 0x7cu, 0x04u, 0x80u>(data, n);
    case v1::DTYPE_F8_E4M3:
      return FindE4M3NaN(data, n);
    default:
      return n;
  }
}

}  // namespace swarm
