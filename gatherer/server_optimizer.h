// Server optimizers: the step an aggregator takes from the round's global
// model x towards the trainers' FedAvg mean (docs/server-optimizers.md).
//
// The round's pseudo-gradient is d = mean - x (the average update). Plain
// FedAvg sets x' = x + d = mean. The optimizers (Reddi et al. 2021,
// "Adaptive Federated Optimization"; Hsu et al. 2019 for momentum):
//   momentum: m = beta1 m + d;                        x' = x + lr m
//   adam:     m = beta1 m + (1 - beta1) d;
//             v = beta2 v + (1 - beta2) d^2;
//             x' = x + lr m^ / (sqrt(v^) + epsilon)
//   yogi:     as adam, but v = v - (1 - beta2) d^2 sign(v - d^2)
// where m^ = m / (1 - beta1^t), v^ = v / (1 - beta2^t) (bias correction)
// and t counts the steps taken, this one included.
//
// In a swarm the aggregator changes every round, so the optimizer's state
// cannot stay on "the server": it travels with the global model, as extra
// tensors after the model's own (a *stateful global model*):
//   "swarm.server_optimizer.m/<name>"  F32, per float tensor <name>
//   "swarm.server_optimizer.v/<name>"  F32, per float tensor (adam, yogi)
//   "swarm.server_optimizer.step"      I64 [1], the steps taken (t)
// so every place that keeps, sends, fails over or resumes the global model
// keeps its state too, with no protocol of its own. Whoever hands the model
// to a learner, or publishes it as BEST / LAST, takes the trainable view
// (TrainableView) first. Integer and bool tensors get no state: they take
// the mean, as under FedAvg.
//
// Pure: no I/O but the scratch files a file-backed output lives in, no
// threads kept, no clock.
#ifndef SWARM_GATHERER_SERVER_OPTIMIZER_H_
#define SWARM_GATHERER_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/model.h"
#include "proto/swarm.pb.h"

namespace swarm {

// Every state tensor's name starts with this; no model tensor may.
inline constexpr char kServerOptimizerPrefix[] = "swarm.server_optimizer.";

struct ServerOptimizerOptions {
  v1::ServerOptimizer kind = v1::SERVER_OPTIMIZER_NONE;
  double learning_rate = 1.0;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double epsilon = 1e-3;
  // Threads the step is spread over (a model of 4 MiB or more; cuts fall on
  // 64-element boundaries, so the result does not depend on the count);
  // 0: min(2, hardware threads), as the aggregators.
  int num_threads = 0;

  // The job's fields with their defaults (the proto documents them).
  static ServerOptimizerOptions FromJobConfig(const v1::JobConfig& config);
};

// "none", "momentum", "adam", "yogi".
absl::string_view ServerOptimizerName(v1::ServerOptimizer kind);

// Does `name` belong to the optimizer's state?
bool IsServerOptimizerTensor(absl::string_view name);

// The model without its optimizer state: a view over the same bytes (no
// copy) holding the tensors whose names do not start with
// kServerOptimizerPrefix, in their order, with `stateful`'s metadata.
// Returns `stateful` itself when it has no state.
std::shared_ptr<const Model> TrainableView(
    std::shared_ptr<const Model> stateful);
// The same for a model held by reference (always a new view). The view
// shares `stateful`'s storage, so it may outlive `stateful`.
Model TrainableViewOf(const Model& stateful);

// Bytes of state `kind` adds to a model of this layout (the step counter
// included): the extra bytes each learn task carries.
uint64_t ServerOptimizerStateBytes(const Model& trainable,
                                   v1::ServerOptimizer kind);

// One optimizer step. `base` is the round's global model, with or without
// state (none: the first step; every moment starts at zero); `mean` is the
// round's FedAvg mean, laid out like TrainableView(base). Returns the next
// global model: the trainable tensors stepped (float tensors; the others
// take the mean's values), then the new state, with `mean`'s metadata plus
// "server_optimizer" and "server_optimizer_step". In memory, or in unlinked
// files under `scratch_dir` when it is not empty (disk offload).
//
// InvalidArgument when kind is NONE, when `mean`'s layout differs from the
// trainable view's, or when `base`'s state does not fit its tensors (a
// state tensor for a tensor the model lacks or of another shape, a missing
// one, another optimizer's): the message names the tensor. `base` and
// `mean` are only read.
absl::StatusOr<Model> ApplyServerOptimizer(const ServerOptimizerOptions& opts,
                                           const Model& base, const Model& mean,
                                           const std::string& scratch_dir);

}  // namespace swarm

#endif  // SWARM_GATHERER_SERVER_OPTIMIZER_H_
