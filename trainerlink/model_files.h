// The trainer link's model hand-off: safetensors files in the link folder.
//
// The daemon writes a task's global model with WriteHandoffFile (one copy:
// memory -> page cache; no fsync, the file only lives for the task) and the
// trainer maps it. The trainer writes its result file and the daemon maps it
// with LoadResultFile (no copy) and checks it against the task's model.
#ifndef SWARM_TRAINERLINK_MODEL_FILES_H_
#define SWARM_TRAINERLINK_MODEL_FILES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"

namespace swarm::trainerlink {

// Writes `model` as a safetensors file at `path` (mode 0600), through a
// temporary sibling renamed into place, without fsync. The file is
// complete when this returns OK.
absl::Status WriteHandoffFile(const Model& model, const std::string& path);

// Maps the safetensors file at `path` and removes it (the mapping stays
// valid). With `expected` (a TRAIN task's global model's table) the result
// must have exactly its tensors (names, dtypes, shapes; any file order): the returned
// model lists them in `expected`'s order. Without it (the initial model) any
// non-empty table is accepted. Values must be finite unless
// `allow_non_finite`. Errors are InvalidArgument naming the tensor and the
// rule, e.g. `tensor "fc.weight": shape [10, 4], the task's model has
// [10, 5]`; NotFound when there is no file.
// REQUIRES: nobody writes to or truncates the file once this is called (the
// trainer has closed it).
absl::StatusOr<Model> LoadResultFile(const std::string& path,
                                     const std::vector<TensorSpec>* expected,
                                     bool allow_non_finite = false);

}  // namespace swarm::trainerlink

#endif  // SWARM_TRAINERLINK_MODEL_FILES_H_
