#include "trainerlink/model_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/dtype_kernels.h"
#include "persist/file_util.h"
#include "persist/safetensors.h"

namespace swarm::trainerlink {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::Status WriteHandoffFile(const Model& model, const std::string& path) {
  std::vector<persist::TensorDecl> decls;
  std::vector<absl::string_view> data;
  decls.reserve(model.num_tensors());
  for (size_t i = 0; i < model.num_tensors(); ++i) {
    const TensorSpec& spec = model.spec(i);
    decls.push_back({spec.name, spec.dtype, spec.shape});
    data.push_back(model.tensor_data(i));
  }
  SWARM_ASSIGN_OR_RETURN(persist::SafetensorsLayout layout,
                         persist::MakeSafetensorsLayout(decls, {}));
  SWARM_ASSIGN_OR_RETURN(std::string prefix,
                         persist::EncodeSafetensorsPrefix(layout));
  const std::string temp = absl::StrCat(path, ".part");
  const int fd =
      open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return persist::ErrnoError(errno, "create", temp);
  absl::Status status = persist::WriteFully(fd, prefix, temp);
  for (size_t i = 0; status.ok() && i < data.size(); ++i) {
    status = persist::WriteFully(fd, data[i], temp);
  }
  absl::Status closed = persist::CloseFd(fd, temp);
  if (status.ok()) status = closed;
  if (status.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    status = persist::ErrnoError(errno, "rename to " + path + ":", temp);
  }
  if (!status.ok()) unlink(temp.c_str());
  return status;
}

absl::StatusOr<Model> LoadResultFile(const std::string& path,
                                     const std::vector<TensorSpec>* expected,
                                     bool allow_non_finite) {
  absl::StatusOr<Model> loaded = Model::LoadSafetensors(path);
  unlink(path.c_str());
  if (!loaded.ok()) {
    if (absl::IsNotFound(loaded.status())) {
      return absl::NotFoundError(
          absl::StrCat("no result file ", path,
                       " (write the result there before submitting)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("result file is not a valid safetensors file: ",
                     loaded.status().message()));
  }
  Model result = std::move(*loaded);
  if (result.num_tensors() == 0) {
    return absl::InvalidArgumentError("result has no tensors");
  }
  if (expected != nullptr) {
    for (size_t i = 0; i < result.num_tensors(); ++i) {
      const std::string& name = result.spec(i).name;
      if (std::none_of(expected->begin(), expected->end(),
                       [&](const TensorSpec& s) { return s.name == name; })) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", result.spec(i).name,
            "\": not in the task's model (unexpected tensor name)"));
      }
    }
    std::vector<TensorSpec> specs;
    std::vector<uint64_t> offsets;
    const char* base = result.storage()->data();
    for (const TensorSpec& want : *expected) {
      const int at = result.FindTensor(want.name);
      if (at < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", want.name,
                         "\": missing from the result (the task's model has "
                         "it)"));
      }
      const TensorSpec& got = result.spec(at);
      if (got.dtype != want.dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", want.name, "\": dtype ", DTypeName(got.dtype),
            ", the task's model has ", DTypeName(want.dtype)));
      }
      if (got.shape != want.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", want.name, "\": shape ", ShapeString(got.shape),
            ", the task's model has ", ShapeString(want.shape)));
      }
      specs.push_back(got);
      offsets.push_back(
          static_cast<uint64_t>(result.tensor_data(at).data() - base));
    }
    SWARM_ASSIGN_OR_RETURN(
        Model ordered, Model::FromStorage(std::move(specs), std::move(offsets),
                                          result.storage()));
    ordered.metadata() = result.metadata();
    result = std::move(ordered);
  }
  if (!allow_non_finite) {
    for (size_t i = 0; i < result.num_tensors(); ++i) {
      const TensorSpec& spec = result.spec(i);
      const uint64_t n = spec.byte_size / DTypeSize(spec.dtype);
      const uint64_t bad =
          FindNonFinite(spec.dtype, result.tensor_data(i).data(), n);
      if (bad < n) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", spec.name, "\": element ", bad,
                         " is NaN or infinite (non-finite values are "
                         "refused)"));
      }
    }
  }
  return result;
}

}  // namespace swarm::trainerlink
