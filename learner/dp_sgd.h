// DP-SGD for the built-in MLP (Abadi et al. 2016): every step samples each
// training example independently with probability q (Poisson sampling),
// computes each sampled example's gradient exactly, clips it to L2 norm C,
// sums the clipped gradients, adds Gaussian noise N(0, (σ C)^2) to every
// coordinate, divides by the expected batch size q n and takes a momentum
// SGD step. The accountant (privacy/rdp.h) turns (q, σ, steps) into (ε, δ).
//
// Per-example gradients cost little here: the gradient of a fully connected
// layer for one example is the outer product of its back-propagated error
// and its input, so its squared norm is |δ|^2 (|a|^2 + 1) (weight and bias)
// and the clipped sum is one matrix product with the errors' rows scaled.
//
// The sampling and the noise draw from the operating system's randomness
// (std::random_device), never from the job's seed: a seed every site knows
// would let any of them subtract the noise. DP-SGD runs are therefore not
// reproducible, by design.
//
// The balanced softmax of SgdOptions is refused: its class priors come from
// the private labels without noise.
#ifndef SWARM_LEARNER_DP_SGD_H_
#define SWARM_LEARNER_DP_SGD_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "learner/fashion_mnist.h"
#include "learner/mlp.h"

namespace swarm {

struct DpSgdOptions {
  // Per-example L2 clip norm C, > 0.
  float clip_norm = 1.0f;
  // σ: noise standard deviation over C, > 0.
  double noise_multiplier = 1.0;
  // q: each example's probability of entering one step's batch, in (0, 1].
  double sampling_rate = 0.0;
  // Steps to take, >= 1 (DpSgdSteps turns epochs into steps).
  uint64_t steps = 0;
};

struct DpSgdReport {
  uint64_t steps = 0;
  // Examples drawn over all steps (about q n steps).
  uint64_t examples = 0;
  // Mean cross-entropy of the drawn examples before their step.
  double mean_loss = 0;
  // Share of the drawn examples whose gradient was clipped.
  double clipped_fraction = 0;
  double seconds = 0;
};

// ceil(epochs / q): the steps that take about `epochs` passes over the data.
uint64_t DpSgdSteps(uint32_t epochs, double sampling_rate);

// OK when `dp` is valid (each field's rule above); InvalidArgument naming
// the field otherwise.
absl::Status ValidateDpSgdOptions(const DpSgdOptions& dp);

// Trains `net` with DP-SGD on data[indices] (all of `data` when empty).
// From `sgd`: learning_rate, lr_decay and first_epoch (step s uses the rate
// of epoch floor(s q)), momentum, and FedProx's prox_mu and prox_anchor:
// the proximal gradient mu (w - w_anchor) is added to the step's noisy
// clipped mean gradient, after the clipping and the noise. It depends on
// no training example (only on the current weights and the global model
// every site was sent), so it is not clipped, needs no noise and costs no
// privacy: the accountant's (q, sigma, steps) are unchanged. batch_size,
// epochs and shuffle_seed are not used. balanced_softmax must be false. Checks `cancel` (may be null)
// between steps: Cancelled. A non-finite loss is FailedPrecondition.
absl::StatusOr<DpSgdReport> TrainDpSgd(Mlp& net, const ImageDataset& data,
                                       absl::Span<const uint32_t> indices,
                                       const SgdOptions& sgd,
                                       const DpSgdOptions& dp,
                                       const std::atomic<bool>* cancel);

}  // namespace swarm

#endif  // SWARM_LEARNER_DP_SGD_H_
