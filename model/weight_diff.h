// Weight differences: what a trainer sends when the job asks for
// send_weight_diff (its result minus the round's global model).
#ifndef SWARM_MODEL_WEIGHT_DIFF_H_
#define SWARM_MODEL_WEIGHT_DIFF_H_

#include "absl/status/status.h"
#include "model/model.h"

namespace swarm {

// `trained` -= `global`, tensor by tensor, in the tensors' own precision.
// F32 and F64 tensors only. FAILED_PRECONDITION if the layouts differ or
// `trained` is not writable, UNIMPLEMENTED for another dtype (naming the
// tensor); `trained` is left as it was on any error.
absl::Status ToWeightDiff(const Model& global, Model* trained);

}  // namespace swarm

#endif  // SWARM_MODEL_WEIGHT_DIFF_H_
