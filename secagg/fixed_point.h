// FixedPointCodec: model values as integers mod 2^32 for secure aggregation
// (design section 10). Masks are added mod 2^32, so the values they hide
// must be integers in the same ring: each value is clipped to [-clip, clip],
// scaled, rounded, and multiplied by its trainer's integer weight (FedAvg's
// sample count, capped); the sum of every trainer's encoding is then the
// integer weighted sum, which decodes to the weighted mean. Four bytes per
// value: the bytes of an F32 upload.
//
// Exact as long as the true sum stays inside the signed 32-bit range: Create
// refuses parameters under which it could leave it (max_trainers trainers of
// max_weight, every value at the clip). The decoded mean is within MaxError()
// of the weighted mean of the clipped inputs.
#ifndef SWARM_SECAGG_FIXED_POINT_H_
#define SWARM_SECAGG_FIXED_POINT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace swarm::secagg {

class FixedPointCodec {
 public:
  // `clip` > 0 and `scale` > 0 (values become round(x * scale)); weights
  // 1..max_weight; sums of at most max_trainers encodings. INVALID_ARGUMENT
  // naming the rule when round(clip * scale) * max_weight * max_trainers
  // reaches 2^31.
  static absl::StatusOr<FixedPointCodec> Create(double clip, double scale,
                                                uint32_t max_weight,
                                                uint32_t max_trainers);

  // out[i] = weight * round(clamp(values[i]) * scale) mod 2^32. Returns how
  // many values were clipped; INVALID_ARGUMENT on a non-finite value or a
  // weight outside 1..max_weight. REQUIRES: out.size() == values.size().
  absl::StatusOr<size_t> Encode(absl::Span<const float> values, uint32_t weight,
                                absl::Span<uint32_t> out) const;

  // The weighted mean from `sum`, the sum mod 2^32 of encodings whose
  // weights add up to `total_weight` (> 0). REQUIRES: out.size() ==
  // sum.size().
  void DecodeMean(absl::Span<const uint32_t> sum, uint64_t total_weight,
                  absl::Span<float> out) const;

  // The largest difference between a decoded mean and the weighted mean of
  // the clipped inputs (rounding: half a step), before the F32 rounding of
  // the output.
  double MaxError() const { return 0.5 / scale_; }

  double clip() const { return clip_; }
  double scale() const { return scale_; }

 private:
  FixedPointCodec(double clip, double scale, uint32_t max_weight)
      : clip_(clip), scale_(scale), max_weight_(max_weight) {}

  double clip_;
  double scale_;
  uint32_t max_weight_;
};

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_FIXED_POINT_H_
