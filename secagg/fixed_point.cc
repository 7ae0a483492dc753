#include "secagg/fixed_point.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace swarm::secagg {

absl::StatusOr<FixedPointCodec> FixedPointCodec::Create(double clip,
                                                        double scale,
                                                        uint32_t max_weight,
                                                        uint32_t max_trainers) {
  if (!(clip > 0) || !std::isfinite(clip)) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip: must be a finite number above 0, not ", clip));
  }
  if (!(scale > 0) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale: must be a finite number above 0, not ", scale));
  }
  if (max_weight == 0 || max_trainers == 0) {
    return absl::InvalidArgumentError(
        "max_weight and max_trainers: must be at least 1");
  }
  // The largest magnitude a sum can reach, in integers.
  const double step = std::round(clip * scale);
  const double largest = step * static_cast<double>(max_weight) *
                         static_cast<double>(max_trainers);
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip * scale: must round to at least 1 (", clip, " * ",
                     scale, "): every value would encode as 0"));
  }
  if (largest >= 2147483648.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the modulus 2^32 must exceed the largest possible sum: round(clip * "
        "scale) * max_weight * max_trainers = ",
        step, " * ", max_weight, " * ", max_trainers, " = ", largest,
        " reaches 2^31; lower the scale, the clip or the weight cap"));
  }
  return FixedPointCodec(clip, scale, max_weight);
}

absl::StatusOr<size_t> FixedPointCodec::Encode(absl::Span<const float> values,
                                               uint32_t weight,
                                               absl::Span<uint32_t> out) const {
  if (weight == 0 || weight > max_weight_) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight: must be 1..", max_weight_, ", not ", weight));
  }
  size_t clipped = 0;
  const double clip = clip_;
  const double scale = scale_;
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = values[i];
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("value ", i, " is not finite (", x, ")"));
    }
    const double kept = std::clamp(x, -clip, clip);
    clipped += kept != x;
    // Rounded half away from zero (a truncating conversion, not a libm
    // call: the loop stays cheap).
    const double scaled = kept * scale;
    const int64_t q =
        static_cast<int64_t>(scaled + std::copysign(0.5, scaled)) *
        static_cast<int64_t>(weight);
    out[i] = static_cast<uint32_t>(static_cast<uint64_t>(q));
  }
  return clipped;
}

void FixedPointCodec::DecodeMean(absl::Span<const uint32_t> sum,
                                 uint64_t total_weight,
                                 absl::Span<float> out) const {
  const double unit = 1.0 / (scale_ * static_cast<double>(total_weight));
  for (size_t i = 0; i < sum.size(); ++i) {
    // Two's complement: the sum is inside the signed 32-bit range (Create).
    const int64_t signed_sum = sum[i] >= 0x80000000u
                                   ? static_cast<int64_t>(sum[i]) - (1LL << 32)
                                   : static_cast<int64_t>(sum[i]);
    out[i] = static_cast<float>(static_cast<double>(signed_sum) * unit);
  }
}

}  // namespace swarm::secagg
