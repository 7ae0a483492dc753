#include "streaming/partial_sum_sink.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace swarm {

absl::Status CheckPartialSumLayout(const std::vector<TensorSpec>& specs) {
  for (const TensorSpec& spec : specs) {
    if (spec.dtype != v1::DTYPE_F32) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", spec.name, " is ", v1::DType_Name(spec.dtype),
                       ": a partial sum carries F32 tensors only"));
    }
  }
  return absl::OkStatus();
}

PartialSumSink::PartialSumSink(std::shared_ptr<const Model> own,
                               double own_weight, Emit emit)
    : own_(std::move(own)), own_weight_(own_weight), emit_(std::move(emit)) {}

absl::Status PartialSumSink::Begin(const v1::ModelHeader& header,
                                   const std::vector<TensorSpec>& specs) {
  if (own_ == nullptr) {
    return absl::FailedPreconditionError("this site holds no result to add");
  }
  if (specs.size() != own_->num_tensors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the partial sum has ", specs.size(),
                     " tensors, this site's result ", own_->num_tensors()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i] != own_->spec(i)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the partial sum's tensor ", i, " (", specs[i].name,
          ") differs from this site's result's (", own_->spec(i).name, ")"));
    }
  }
  if (absl::Status layout = CheckPartialSumLayout(specs); !layout.ok()) {
    return layout;
  }
  scale_ = header.partial_scale() == 0 ? 1 : header.partial_scale();
  return absl::OkStatus();
}

absl::StatusOr<char*> PartialSumSink::WritableRange(uint32_t, uint64_t,
                                                    uint64_t size) {
  if (scratch_.size() < size) scratch_.resize(size);
  return scratch_.data();
}

absl::Status PartialSumSink::CommitRange(uint32_t index, uint64_t offset,
                                         uint64_t size) {
  if (offset % sizeof(float) != 0 || size % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a partial sum's chunk of tensor ", own_->spec(index).name,
                     " is not aligned to whole F32 values (offset ", offset,
                     ", size ", size, ")"));
  }
  const char* mine = own_->tensor_data(index).data() + offset;
  char* data = scratch_.data();
  const size_t n = size / sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    float in;
    float own;
    std::memcpy(&in, data + i * sizeof(float), sizeof(float));
    std::memcpy(&own, mine + i * sizeof(float), sizeof(float));
    const float out =
        static_cast<float>(scale_ * static_cast<double>(in) +
                           own_weight_ * static_cast<double>(own));
    std::memcpy(data + i * sizeof(float), &out, sizeof(float));
  }
  bytes_emitted_ += size;
  return emit_(index, offset, absl::string_view(data, size));
}

}  // namespace swarm
