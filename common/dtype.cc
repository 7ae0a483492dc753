#include "common/dtype.h"

#include "absl/strings/str_cat.h"

namespace swarm {
namespace {

struct DTypeRow {
  DType dtype;
  absl::string_view name;
  uint64_t size;
};

constexpr DTypeRow kDTypes[] = {
    {v1::DTYPE_F32, "F32", 4},         {v1::DTYPE_F16, "F16", 2},
    {v1::DTYPE_BF16, "BF16", 2},       {v1::DTYPE_F64, "F64", 8},
    {v1::DTYPE_I32, "I32", 4},         {v1::DTYPE_I64, "I64", 8},
    {v1::DTYPE_U8, "U8", 1},           {v1::DTYPE_BOOL, "BOOL", 1},
    {v1::DTYPE_I8, "I8", 1},           {v1::DTYPE_I16, "I16", 2},
    {v1::DTYPE_U16, "U16", 2},         {v1::DTYPE_U32, "U32", 4},
    {v1::DTYPE_U64, "U64", 8},         {v1::DTYPE_F8_E4M3, "F8_E4M3", 1},
    {v1::DTYPE_F8_E5M2, "F8_E5M2", 1},
};

const DTypeRow* Find(DType dtype) {
  for (const DTypeRow& row : kDTypes) {
    if (row.dtype == dtype) return &row;
  }
  return nullptr;
}

}  // namespace

uint64_t DTypeSize(DType dtype) {
  const DTypeRow* row = Find(dtype);
  return row == nullptr ? 0 : row->size;
}

absl::string_view DTypeName(DType dtype) {
  const DTypeRow* row = Find(dtype);
  return row == nullptr ? absl::string_view("?") : row->name;
}

absl::StatusOr<DType> ParseDTypeName(absl::string_view name) {
  for (const DTypeRow& row : kDTypes) {
    if (row.name == name) return row.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\""));
}

absl::StatusOr<uint64_t> ElementCount(absl::Span<const uint64_t> shape) {
  uint64_t count = 1;
  for (uint64_t dim : shape) {
    if (dim != 0 && count > UINT64_MAX / dim) {
      return absl::InvalidArgumentError(
          "shape's element count overflows 64 bits");
    }
    count *= dim;
  }
  return count;
}

absl::StatusOr<uint64_t> TensorByteSize(DType dtype,
                                        absl::Span<const uint64_t> shape) {
  const uint64_t element = DTypeSize(dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype value ", static_cast<int>(dtype)));
  }
  absl::StatusOr<uint64_t> count = ElementCount(shape);
  if (!count.ok()) return count.status();
  if (*count > UINT64_MAX / element) {
    return absl::InvalidArgumentError("tensor byte size overflows 64 bits");
  }
  return *count * element;
}

}  // namespace swarm
