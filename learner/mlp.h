// A multilayer perceptron classifier on Eigen: fully connected layers with
// ReLU between them, softmax cross-entropy, minibatch SGD with momentum.
//
// Layer i computes z = a W_i^T + b_i for a batch `a` (one example per row);
// W_i is [out, in] row-major, the layout of its model tensors:
//   "fc<i>.weight"  F32 [out, in]
//   "fc<i>.bias"    F32 [out]
// Inputs are pixels scaled to [0, 1] (byte / 255).
//
// Initial weights (Mlp::Create) come from PortableRng(seed): layer by layer,
// row-major, W ~ U(-limit, limit) with limit = sqrt(6 / in) (He, for the
// layers followed by ReLU) or sqrt(6 / (in + out)) (Glorot, the output
// layer); biases 0. Only exact float arithmetic, so every site computes the
// same initial model for the same seed.
//
// Training and evaluation are single-threaded (Eigen without OpenMP) with a
// fixed order of operations: the same inputs give bit-identical weights on
// one machine and build.
#ifndef SWARM_LEARNER_MLP_H_
#define SWARM_LEARNER_MLP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "learner/fashion_mnist.h"
#include "model/model.h"

namespace swarm {

using RowMatrixF =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct MlpLayer {
  RowMatrixF weight;     // [out, in]
  Eigen::VectorXf bias;  // [out]
};

// Largest width of any layer accepted.
inline constexpr uint32_t kMaxMlpWidth = 1u << 16;

class Mlp {
 public:
  // `sizes` = {inputs, hidden..., classes}: at least two entries, each in
  // 1..kMaxMlpWidth. Initialised from `seed` as above.
  static absl::StatusOr<Mlp> Create(std::vector<uint32_t> sizes, uint64_t seed);
  // Reads the "fc<i>.*" tensors of `model` (F32, consistent shapes, nothing
  // else); the sizes come from the shapes.
  static absl::StatusOr<Mlp> FromModel(const Model& model);

  Mlp(Mlp&&) = default;
  Mlp& operator=(Mlp&&) = default;

  // The tensor specs of this network, in layer order.
  absl::StatusOr<std::vector<TensorSpec>> Specs() const;
  // A new model holding the weights.
  absl::StatusOr<Model> ToModel() const;
  // Overwrites the "fc<i>.*" tensors of a writable `model` whose shapes
  // match (other tensor order is kept).
  absl::Status WriteTo(Model* model) const;

  const std::vector<uint32_t>& sizes() const { return sizes_; }
  size_t num_layers() const { return layers_.size(); }
  const std::vector<MlpLayer>& layers() const { return layers_; }
  std::vector<MlpLayer>& mutable_layers() { return layers_; }
  uint64_t num_parameters() const;

  // Logits [rows, classes] of the inputs `x` [rows, inputs].
  RowMatrixF Logits(const RowMatrixF& x) const;

  // Mean softmax cross-entropy of `x` against `labels` (one per row, each
  // < classes). With `grads` non-null, also its gradient with respect to
  // every weight and bias (resized as needed).
  float LossAndGradients(const RowMatrixF& x, absl::Span<const uint8_t> labels,
                         std::vector<MlpLayer>* grads) const;

 private:
  Mlp() = default;
  std::vector<uint32_t> sizes_;
  std::vector<MlpLayer> layers_;
};

std::string MlpWeightName(size_t layer);
std::string MlpBiasName(size_t layer);

// "128" or "256,128" -> {128} / {256, 128}; "" or "none" -> {} (a linear
// classifier). InvalidArgument for anything else.
absl::StatusOr<std::vector<uint32_t>> ParseHiddenSizes(absl::string_view text);

struct SgdOptions {
  // The learning rate of epoch k (0-based, counted from first_epoch) is
  //   learning_rate * lr_decay^(first_epoch + k).
  float learning_rate = 0.05f;
  float lr_decay = 1.0f;
  uint64_t first_epoch = 0;
  float momentum = 0.9f;
  uint32_t batch_size = 64;
  uint32_t epochs = 1;
  // Balanced softmax (logit adjustment): trains on logits + log(prior), the
  // prior being the class frequencies of the training data, so that a
  // skewed local label distribution does not bias the model towards its
  // frequent classes (Ren et al. 2020; Zhang et al. 2022, FedLC). Inference
  // and evaluation use the plain logits. No effect on balanced data.
  bool balanced_softmax = false;
  // Seeds the minibatch order (a fresh shuffle per epoch).
  uint64_t shuffle_seed = 0;
  // FedProx (Li et al. 2020): with prox_mu > 0, every step adds
  // prox_mu * (w - w_anchor) to the gradient of every weight and bias w,
  // where w_anchor is the same parameter in *prox_anchor (the round's global
  // model the training started from; same sizes as the network), i.e. it
  // minimises loss + prox_mu / 2 * |w - w_anchor|^2. The term enters before
  // the momentum, like the loss gradient. 0 (the default): plain SGD, bit for
  // bit the same as without these fields. prox_mu must be finite and >= 0;
  // prox_anchor is required when prox_mu > 0 and must outlive training.
  float prox_mu = 0.0f;
  const std::vector<MlpLayer>* prox_anchor = nullptr;
};

// FedProx's proximal gradient: grads[i] += mu * (layers[i] - anchor[i]) for
// every weight and bias (same sizes everywhere). Used by TrainSgd and, after
// the clipping and the noise, by DP-SGD (dp_sgd.h).
void AddProximalGradient(const std::vector<MlpLayer>& layers,
                         const std::vector<MlpLayer>& anchor, float mu,
                         std::vector<MlpLayer>& grads);

// OK when options.prox_mu is 0, or > 0 and finite with an anchor of `net`'s
// layer shapes; InvalidArgument otherwise.
absl::Status CheckProximalTerm(const Mlp& net, const SgdOptions& options);

struct EpochReport {
  uint32_t epoch = 0;  // 1-based.
  uint32_t epochs = 0;
  // Mean training loss over the epoch (of the shifted logits with
  // balanced_softmax).
  double mean_loss = 0;
  uint64_t samples = 0;
  double seconds = 0;
  float learning_rate = 0;  // The epoch's.
};

// Trains `net` on data[indices] (all of `data` when `indices` is empty) for
// options.epochs epochs. The momentum starts at zero. Checks `cancel` (may be
// null) between minibatches: Cancelled. A non-finite loss stops training
// with FailedPrecondition (the learning rate is too high). `on_epoch` (may
// be empty) runs after each epoch.
absl::Status TrainSgd(Mlp& net, const ImageDataset& data,
                      absl::Span<const uint32_t> indices,
                      const SgdOptions& options,
                      const std::atomic<bool>* cancel,
                      const std::function<void(const EpochReport&)>& on_epoch);

struct Evaluation {
  double accuracy = 0;
  double loss = 0;  // Mean cross-entropy.
  uint64_t samples = 0;
};

// Accuracy and loss of `net` on data[indices] (all of `data` when `indices`
// is empty). InvalidArgument if the shapes disagree or there is no data.
absl::StatusOr<Evaluation> Evaluate(const Mlp& net, const ImageDataset& data,
                                    absl::Span<const uint32_t> indices = {});

}  // namespace swarm

#endif  // SWARM_LEARNER_MLP_H_
