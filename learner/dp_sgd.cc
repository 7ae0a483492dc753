#include "learner/dp_sgd.h"

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"

namespace swarm {
namespace {

// One DP-SGD step's buffers: activations a[i] (a[0] the inputs), errors
// delta[i] of layer i's output, per-example clip scales.
struct DpBatch {
  std::vector<RowMatrixF> a;
  std::vector<RowMatrixF> delta;
  std::vector<uint8_t> labels;
  Eigen::VectorXf scale;
  std::vector<MlpLayer> grads;
  std::vector<MlpLayer> velocity;
};

// The OS-seeded generator of the sampling and the noise (see the header).
std::mt19937_64 SecretRng() {
  std::random_device device;
  std::seed_seq seq{device(), device(), device(), device(),
                    device(), device(), device(), device()};
  return std::mt19937_64(seq);
}

// Poisson sampling: each of `order` independently with probability q.
void SampleBatch(const ImageDataset& data, absl::Span<const uint32_t> order,
                 double q, std::mt19937_64& rng, DpBatch& b) {
  std::bernoulli_distribution take(q);
  std::vector<uint32_t> picked;
  for (uint32_t i : order) {
    if (take(rng)) picked.push_back(i);
  }
  const Eigen::Index cols = data.pixels_per_image;
  b.a.resize(1);
  b.a[0].resize(static_cast<Eigen::Index>(picked.size()), cols);
  b.labels.resize(picked.size());
  for (size_t r = 0; r < picked.size(); ++r) {
    b.a[0].row(static_cast<Eigen::Index>(r)) =
        Eigen::Map<const Eigen::Matrix<uint8_t, 1, Eigen::Dynamic>>(
            data.image(picked[r]), cols)
            .cast<float>() *
        (1.0f / 255.0f);
    b.labels[r] = data.labels[picked[r]];
  }
}

// Forward pass and per-example errors (softmax minus one-hot, not divided by
// the batch size). Returns the summed cross-entropy.
double ForwardAndErrors(const std::vector<MlpLayer>& layers, DpBatch& b) {
  const size_t n = layers.size();
  b.a.resize(n + 1);
  for (size_t i = 0; i < n; ++i) {
    b.a[i + 1].noalias() = b.a[i] * layers[i].weight.transpose();
    b.a[i + 1].rowwise() += layers[i].bias.transpose();
    if (i + 1 < n) b.a[i + 1] = b.a[i + 1].cwiseMax(0.0f);
  }
  RowMatrixF& logits = b.a[n];
  double loss = 0;
  b.delta.resize(n);
  RowMatrixF& out = b.delta[n - 1];
  out.resize(logits.rows(), logits.cols());
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    const float top = logits.row(r).maxCoeff();
    out.row(r) = (logits.row(r).array() - top).exp().matrix();
    const float sum = out.row(r).sum();
    loss += std::log(sum) + top - logits(r, b.labels[r]);
    out.row(r) /= sum;
    out(r, b.labels[r]) -= 1.0f;
  }
  for (size_t i = n - 1; i > 0; --i) {
    b.delta[i - 1].noalias() = b.delta[i] * layers[i].weight;
    b.delta[i - 1] =
        (b.a[i].array() > 0.0f).select(b.delta[i - 1].array(), 0.0f);
  }
  return loss;
}

// Per-example clip scales min(1, C / |g_r|); returns how many were clipped.
uint64_t ClipScales(const std::vector<MlpLayer>& layers, float clip,
                    DpBatch& b) {
  const Eigen::Index rows = b.a[0].rows();
  Eigen::VectorXf norm2 = Eigen::VectorXf::Zero(rows);
  for (size_t i = 0; i < layers.size(); ++i) {
    norm2.array() += b.delta[i].rowwise().squaredNorm().array() *
                     (b.a[i].rowwise().squaredNorm().array() + 1.0f);
  }
  uint64_t clipped = 0;
  b.scale.resize(rows);
  for (Eigen::Index r = 0; r < rows; ++r) {
    const float norm = std::sqrt(norm2(r));
    b.scale(r) = norm > clip ? clip / norm : 1.0f;
    clipped += norm > clip ? 1 : 0;
  }
  return clipped;
}

// The noisy clipped sum over q n, plus FedProx's proximal gradient when
// sgd.prox_mu > 0 (after the noise: it does not depend on the data), then a
// momentum step at rate `lr`.
void NoisyStep(std::vector<MlpLayer>& layers, const DpSgdOptions& dp,
               double expected_batch, const SgdOptions& sgd, float lr,
               std::mt19937_64& rng, DpBatch& b) {
  const float momentum = sgd.momentum;
  const bool prox = sgd.prox_mu > 0 && sgd.prox_anchor != nullptr;
  std::normal_distribution<float> noise(
      0.0f, static_cast<float>(dp.noise_multiplier * dp.clip_norm));
  const float inv = static_cast<float>(1.0 / expected_batch);
  b.grads.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    MlpLayer& g = b.grads[i];
    if (b.a[0].rows() == 0) {  // An empty Poisson batch: noise only.
      g.weight.setZero(layers[i].weight.rows(), layers[i].weight.cols());
      g.bias.setZero(layers[i].bias.size());
    } else {
      const RowMatrixF scaled = b.delta[i].array().colwise() * b.scale.array();
      g.weight.noalias() = scaled.transpose() * b.a[i];
      g.bias = scaled.colwise().sum().transpose();
    }
    for (Eigen::Index k = 0; k < g.weight.size(); ++k) {
      g.weight.data()[k] = (g.weight.data()[k] + noise(rng)) * inv;
    }
    for (Eigen::Index k = 0; k < g.bias.size(); ++k) {
      g.bias(k) = (g.bias(k) + noise(rng)) * inv;
    }
    if (prox) {
      const MlpLayer& anchor = (*sgd.prox_anchor)[i];
      g.weight += sgd.prox_mu * (layers[i].weight - anchor.weight);
      g.bias += sgd.prox_mu * (layers[i].bias - anchor.bias);
    }
    MlpLayer& v = b.velocity[i];
    v.weight = momentum * v.weight + g.weight;
    v.bias = momentum * v.bias + g.bias;
    layers[i].weight -= lr * v.weight;
    layers[i].bias -= lr * v.bias;
  }
}

}  // namespace

uint64_t DpSgdSteps(uint32_t epochs, double sampling_rate) {
  if (!(sampling_rate > 0.0)) return 0;
  return static_cast<uint64_t>(
      std::ceil(static_cast<double>(epochs) / sampling_rate - 1e-9));
}

absl::Status ValidateDpSgdOptions(const DpSgdOptions& dp) {
  if (!(dp.clip_norm > 0.0f) || !std::isfinite(dp.clip_norm)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dp clip norm must be positive and finite, got %g", dp.clip_norm));
  }
  if (!(dp.noise_multiplier > 0.0) || !std::isfinite(dp.noise_multiplier)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("dp noise multiplier must be positive and finite, "
                        "got %g",
                        dp.noise_multiplier));
  }
  if (!(dp.sampling_rate > 0.0 && dp.sampling_rate <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dp sampling rate must be in (0, 1], got %g", dp.sampling_rate));
  }
  if (dp.steps == 0) {
    return absl::InvalidArgumentError("dp steps must be at least 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<DpSgdReport> TrainDpSgd(Mlp& net, const ImageDataset& data,
                                       absl::Span<const uint32_t> indices,
                                       const SgdOptions& sgd,
                                       const DpSgdOptions& dp,
                                       const std::atomic<bool>* cancel) {
  if (absl::Status valid = ValidateDpSgdOptions(dp); !valid.ok()) return valid;
  if (sgd.balanced_softmax) {
    return absl::InvalidArgumentError(
        "DP-SGD cannot use the balanced softmax (its class priors are not "
        "private); set balanced_softmax to false");
  }
  if (absl::Status prox = CheckProximalTerm(net, sgd); !prox.ok()) {
    return prox;
  }
  if (data.pixels_per_image != net.sizes().front()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the data has %d inputs per example but the network takes %d",
        data.pixels_per_image, net.sizes().front()));
  }
  std::vector<uint32_t> order(indices.begin(), indices.end());
  if (order.empty()) {
    for (uint32_t i = 0; i < data.size(); ++i) order.push_back(i);
  }
  if (order.empty()) return absl::InvalidArgumentError("no training data");
  const auto start = std::chrono::steady_clock::now();
  std::vector<MlpLayer>& layers = net.mutable_layers();
  DpBatch b;
  b.velocity.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    b.velocity[i].weight =
        RowMatrixF::Zero(layers[i].weight.rows(), layers[i].weight.cols());
    b.velocity[i].bias = Eigen::VectorXf::Zero(layers[i].bias.size());
  }
  std::mt19937_64 rng = SecretRng();
  const double expected_batch = dp.sampling_rate * order.size();
  DpSgdReport report;
  double loss = 0;
  uint64_t clipped = 0;
  for (uint64_t step = 0; step < dp.steps; ++step) {
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      return absl::CancelledError(
          absl::StrFormat("DP-SGD cancelled at step %d of %d", step, dp.steps));
    }
    const auto epoch = static_cast<uint64_t>(step * dp.sampling_rate);
    const float lr = static_cast<float>(
        sgd.learning_rate *
        std::pow(static_cast<double>(sgd.lr_decay),
                 static_cast<double>(sgd.first_epoch + epoch)));
    SampleBatch(data, order, dp.sampling_rate, rng, b);
    if (b.a[0].rows() > 0) {
      loss += ForwardAndErrors(layers, b);
      if (!std::isfinite(loss)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "DP-SGD diverged (non-finite loss) at step %d; lower the "
            "learning rate (now %g)",
            step, lr));
      }
      clipped += ClipScales(layers, dp.clip_norm, b);
    }
    report.examples += static_cast<uint64_t>(b.a[0].rows());
    NoisyStep(layers, dp, expected_batch, sgd, lr, rng, b);
  }
  report.steps = dp.steps;
  if (report.examples > 0) {
    report.mean_loss = loss / static_cast<double>(report.examples);
    report.clipped_fraction =
        static_cast<double>(clipped) / static_cast<double>(report.examples);
  }
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return report;
}

}  // namespace swarm
