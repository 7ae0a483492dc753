#include "model/weight_diff.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace swarm {
namespace {

template <typename T>
void Subtract(absl::string_view base, absl::Span<char> out) {
  for (size_t k = 0; k + sizeof(T) <= base.size(); k += sizeof(T)) {
    T a, b;
    std::memcpy(&a, out.data() + k, sizeof(T));
    std::memcpy(&b, base.data() + k, sizeof(T));
    a -= b;
    std::memcpy(out.data() + k, &a, sizeof(T));
  }
}

}  // namespace

absl::Status ToWeightDiff(const Model& global, Model* trained) {
  if (!trained->SameLayout(global) || !trained->writable()) {
    return absl::FailedPreconditionError(
        "the result cannot be turned into a diff");
  }
  for (size_t i = 0; i < global.num_tensors(); ++i) {
    const DType dtype = global.spec(i).dtype;
    if (dtype != v1::DTYPE_F32 && dtype != v1::DTYPE_F64) {
      return absl::UnimplementedError(
          absl::StrCat("weight diffs of ", DTypeName(dtype), " tensors (\"",
                       global.spec(i).name, "\")"));
    }
  }
  for (size_t i = 0; i < global.num_tensors(); ++i) {
    if (global.spec(i).dtype == v1::DTYPE_F32) {
      Subtract<float>(global.tensor_data(i), trained->mutable_tensor_data(i));
    } else {
      Subtract<double>(global.tensor_data(i), trained->mutable_tensor_data(i));
    }
  }
  return absl::OkStatus();
}

}  // namespace swarm
