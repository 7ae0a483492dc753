#include "learner/mlp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "learner/random.h"

namespace swarm {
namespace {

// Stream purposes ("INIT", "SHUF" in ASCII).
constexpr uint64_t kStreamInit = 0x494e4954;
constexpr uint64_t kStreamShuffle = 0x53485546;

// Examples per forward pass in Evaluate.
constexpr size_t kEvalChunk = 1000;

using ByteRow = Eigen::Matrix<uint8_t, 1, Eigen::Dynamic>;

// Reusable buffers of one forward/backward pass.
struct Workspace {
  // out[i]: output of layer i (after ReLU for hidden layers; for the last
  // layer the logits, then the softmax probabilities).
  std::vector<RowMatrixF> out;
  RowMatrixF delta;
  RowMatrixF delta_prev;
  Eigen::VectorXf row_max;
  Eigen::VectorXf row_sum;
};

void Forward(const std::vector<MlpLayer>& layers, const RowMatrixF& x,
             Workspace& ws) {
  ws.out.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const RowMatrixF& in = i == 0 ? x : ws.out[i - 1];
    RowMatrixF& z = ws.out[i];
    z.noalias() = in * layers[i].weight.transpose();
    z.rowwise() += layers[i].bias.transpose();
    if (i + 1 < layers.size()) z = z.cwiseMax(0.0f);
  }
}

// Replaces the logits in ws.out.back() by softmax probabilities and returns
// the summed (not mean) cross-entropy; counts correct argmax predictions in
// `correct` if non-null.
double SoftmaxCrossEntropy(absl::Span<const uint8_t> labels, Workspace& ws,
                           uint64_t* correct) {
  RowMatrixF& logits = ws.out.back();
  const Eigen::Index rows = logits.rows();
  ws.row_max = logits.rowwise().maxCoeff();
  if (correct != nullptr) {
    for (Eigen::Index r = 0; r < rows; ++r) {
      Eigen::Index best;
      logits.row(r).maxCoeff(&best);
      if (best == labels[r]) ++*correct;
    }
  }
  double total = 0;
  // -log p_y = log(sum exp(z - max)) + max - z_y; z_y read before exp.
  std::vector<float> picked(rows);
  for (Eigen::Index r = 0; r < rows; ++r) picked[r] = logits(r, labels[r]);
  logits.colwise() -= ws.row_max;
  logits = logits.array().exp();
  ws.row_sum = logits.rowwise().sum();
  for (Eigen::Index r = 0; r < rows; ++r) {
    total += static_cast<double>(std::log(ws.row_sum(r)) + ws.row_max(r) -
                                 picked[r]);
  }
  logits.array().colwise() /= ws.row_sum.array();
  return total;
}

// Gradients of the mean loss, from the probabilities in ws.out.back().
void Backward(const std::vector<MlpLayer>& layers, const RowMatrixF& x,
              absl::Span<const uint8_t> labels, Workspace& ws,
              std::vector<MlpLayer>& grads) {
  const Eigen::Index rows = x.rows();
  grads.resize(layers.size());
  ws.delta = ws.out.back();
  for (Eigen::Index r = 0; r < rows; ++r) ws.delta(r, labels[r]) -= 1.0f;
  ws.delta *= 1.0f / static_cast<float>(rows);
  for (size_t i = layers.size(); i-- > 0;) {
    const RowMatrixF& in = i == 0 ? x : ws.out[i - 1];
    grads[i].weight.noalias() = ws.delta.transpose() * in;
    grads[i].bias = ws.delta.colwise().sum().transpose();
    if (i == 0) break;
    ws.delta_prev.noalias() = ws.delta * layers[i].weight;
    ws.delta_prev =
        (ws.out[i - 1].array() > 0.0f).select(ws.delta_prev.array(), 0.0f);
    std::swap(ws.delta, ws.delta_prev);
  }
}

// Rows data[indices[begin..end)] scaled to [0, 1], and their labels.
void Gather(const ImageDataset& data, absl::Span<const uint32_t> indices,
            size_t begin, size_t end, RowMatrixF& x,
            std::vector<uint8_t>& labels) {
  const Eigen::Index cols = data.pixels_per_image;
  x.resize(static_cast<Eigen::Index>(end - begin), cols);
  labels.resize(end - begin);
  for (size_t r = begin; r < end; ++r) {
    const uint32_t i = indices.empty() ? static_cast<uint32_t>(r) : indices[r];
    x.row(static_cast<Eigen::Index>(r - begin)) =
        Eigen::Map<const ByteRow>(data.image(i), cols).cast<float>() *
        (1.0f / 255.0f);
    labels[r - begin] = data.labels[i];
  }
}

absl::Status CheckData(const Mlp& net, const ImageDataset& data,
                       absl::Span<const uint32_t> indices) {
  if (data.pixels_per_image != net.sizes().front()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the data has %d inputs per example but the network takes %d",
        data.pixels_per_image, net.sizes().front()));
  }
  if (data.num_classes > net.sizes().back()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the data has %d classes but the network only %d",
                        data.num_classes, net.sizes().back()));
  }
  if (data.pixels.size() != data.size() * size_t{data.pixels_per_image}) {
    return absl::InvalidArgumentError("dataset pixels and labels disagree");
  }
  for (uint8_t label : data.labels) {
    if (label >= net.sizes().back()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("label %d is out of range for %d classes", label,
                          net.sizes().back()));
    }
  }
  for (uint32_t i : indices) {
    if (i >= data.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "example index %d is out of range for %d examples", i, data.size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void AddProximalGradient(const std::vector<MlpLayer>& layers,
                         const std::vector<MlpLayer>& anchor, float mu,
                         std::vector<MlpLayer>& grads) {
  for (size_t i = 0; i < layers.size(); ++i) {
    grads[i].weight += mu * (layers[i].weight - anchor[i].weight);
    grads[i].bias += mu * (layers[i].bias - anchor[i].bias);
  }
}

std::string MlpWeightName(size_t layer) {
  return absl::StrCat("fc", layer, ".weight");
}
std::string MlpBiasName(size_t layer) {
  return absl::StrCat("fc", layer, ".bias");
}

absl::StatusOr<std::vector<uint32_t>> ParseHiddenSizes(absl::string_view text) {
  std::vector<uint32_t> out;
  absl::string_view stripped = absl::StripAsciiWhitespace(text);
  if (stripped.empty() || absl::AsciiStrToLower(stripped) == "none") {
    return out;
  }
  for (absl::string_view part : absl::StrSplit(stripped, ',')) {
    part = absl::StripAsciiWhitespace(part);
    uint32_t size;
    if (part.empty() || part[0] == '+' || part[0] == '-' ||
        !absl::SimpleAtoi(part, &size) || size < 1 || size > kMaxMlpWidth) {
      return absl::InvalidArgumentError(
          absl::StrFormat("hidden layer size \"%s\" is not an integer in 1..%d",
                          part, kMaxMlpWidth));
    }
    out.push_back(size);
  }
  return out;
}

absl::StatusOr<Mlp> Mlp::Create(std::vector<uint32_t> sizes, uint64_t seed) {
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError(
        "an MLP needs at least an input and an output size");
  }
  for (uint32_t size : sizes) {
    if (size < 1 || size > kMaxMlpWidth) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "MLP layer size %d is not in 1..%d", size, kMaxMlpWidth));
    }
  }
  Mlp net;
  net.sizes_ = std::move(sizes);
  PortableRng rng = PortableRng::ForStream(seed, kStreamInit);
  const size_t num_layers = net.sizes_.size() - 1;
  net.layers_.resize(num_layers);
  for (size_t i = 0; i < num_layers; ++i) {
    const uint32_t in = net.sizes_[i];
    const uint32_t out = net.sizes_[i + 1];
    const bool last = i + 1 == num_layers;
    const float limit =
        std::sqrt(6.0f / static_cast<float>(last ? in + out : in));
    MlpLayer& layer = net.layers_[i];
    layer.weight.resize(out, in);
    for (uint32_t r = 0; r < out; ++r) {
      for (uint32_t c = 0; c < in; ++c) {
        layer.weight(r, c) = (2.0f * rng.UniformFloat() - 1.0f) * limit;
      }
    }
    layer.bias = Eigen::VectorXf::Zero(out);
  }
  return net;
}

absl::StatusOr<Mlp> Mlp::FromModel(const Model& model) {
  Mlp net;
  for (size_t i = 0;; ++i) {
    const int w = model.FindTensor(MlpWeightName(i));
    const int b = model.FindTensor(MlpBiasName(i));
    if (w < 0 && b < 0) break;
    if (w < 0 || b < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model has \"%s\" without \"%s\"",
                          w < 0 ? MlpBiasName(i) : MlpWeightName(i),
                          w < 0 ? MlpWeightName(i) : MlpBiasName(i)));
    }
    const TensorSpec& ws = model.spec(w);
    const TensorSpec& bs = model.spec(b);
    for (const TensorSpec* spec : {&ws, &bs}) {
      if (spec->dtype != v1::DTYPE_F32) {
        return absl::InvalidArgumentError(
            absl::StrFormat("tensor \"%s\" is %s, expected F32", spec->name,
                            DTypeName(spec->dtype)));
      }
    }
    if (ws.shape.size() != 2 || ws.shape[0] < 1 || ws.shape[1] < 1 ||
        ws.shape[0] > kMaxMlpWidth || ws.shape[1] > kMaxMlpWidth) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor \"%s\" has shape [%s], expected [out, in] with sizes in "
          "1..%d",
          ws.name, absl::StrJoin(ws.shape, ", "), kMaxMlpWidth));
    }
    const uint32_t out = static_cast<uint32_t>(ws.shape[0]);
    const uint32_t in = static_cast<uint32_t>(ws.shape[1]);
    if (bs.shape != std::vector<uint64_t>{out}) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor \"%s\" has shape [%s], expected [%d]",
                          bs.name, absl::StrJoin(bs.shape, ", "), out));
    }
    if (i == 0) {
      net.sizes_.push_back(in);
    } else if (in != net.sizes_.back()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor \"%s\" takes %d inputs but layer %d has %d outputs", ws.name,
          in, i - 1, net.sizes_.back()));
    }
    net.sizes_.push_back(out);
    MlpLayer layer;
    layer.weight.resize(out, in);
    layer.bias.resize(out);
    std::memcpy(layer.weight.data(), model.tensor_data(w).data(), ws.byte_size);
    std::memcpy(layer.bias.data(), model.tensor_data(b).data(), bs.byte_size);
    net.layers_.push_back(std::move(layer));
  }
  if (net.layers_.empty()) {
    return absl::InvalidArgumentError(
        "model has no \"fc0.weight\" tensor (not an MLP model)");
  }
  if (model.num_tensors() != 2 * net.layers_.size()) {
    for (size_t t = 0; t < model.num_tensors(); ++t) {
      bool ours = false;
      for (size_t i = 0; i < net.layers_.size(); ++i) {
        ours |= model.spec(t).name == MlpWeightName(i) ||
                model.spec(t).name == MlpBiasName(i);
      }
      if (!ours) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "model has an unexpected tensor \"%s\" (an MLP of %d layers has "
            "only fc0..fc%d)",
            model.spec(t).name, net.layers_.size(), net.layers_.size() - 1));
      }
    }
  }
  return net;
}

uint64_t Mlp::num_parameters() const {
  uint64_t n = 0;
  for (const MlpLayer& layer : layers_) {
    n += static_cast<uint64_t>(layer.weight.size() + layer.bias.size());
  }
  return n;
}

absl::StatusOr<std::vector<TensorSpec>> Mlp::Specs() const {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < layers_.size(); ++i) {
    SWARM_ASSIGN_OR_RETURN(TensorSpec weight,
                           MakeTensorSpec(MlpWeightName(i), v1::DTYPE_F32,
                                          {sizes_[i + 1], sizes_[i]}));
    SWARM_ASSIGN_OR_RETURN(
        TensorSpec bias,
        MakeTensorSpec(MlpBiasName(i), v1::DTYPE_F32, {sizes_[i + 1]}));
    specs.push_back(std::move(weight));
    specs.push_back(std::move(bias));
  }
  return specs;
}

absl::StatusOr<Model> Mlp::ToModel() const {
  SWARM_ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, Specs());
  SWARM_ASSIGN_OR_RETURN(
      Model model,
      Model::Create(std::move(specs), HeapStorage::Init::kUninitialized));
  SWARM_RETURN_IF_ERROR(WriteTo(&model));
  return model;
}

absl::Status Mlp::WriteTo(Model* model) const {
  if (!model->writable()) {
    return absl::InvalidArgumentError("model is read-only");
  }
  SWARM_ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, Specs());
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (int k = 0; k < 2; ++k) {
      const TensorSpec& want = specs[2 * i + k];
      const int t = model->FindTensor(want.name);
      if (t < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("model has no tensor \"%s\"", want.name));
      }
      if (model->spec(t) != want) {
        return absl::InvalidArgumentError(
            absl::StrFormat("model tensor \"%s\" is %s [%s], expected F32 [%s]",
                            want.name, DTypeName(model->spec(t).dtype),
                            absl::StrJoin(model->spec(t).shape, ", "),
                            absl::StrJoin(want.shape, ", ")));
      }
      const float* src =
          k == 0 ? layers_[i].weight.data() : layers_[i].bias.data();
      std::memcpy(model->mutable_tensor_data(t).data(), src, want.byte_size);
    }
  }
  return absl::OkStatus();
}

RowMatrixF Mlp::Logits(const RowMatrixF& x) const {
  Workspace ws;
  Forward(layers_, x, ws);
  return std::move(ws.out.back());
}

float Mlp::LossAndGradients(const RowMatrixF& x,
                            absl::Span<const uint8_t> labels,
                            std::vector<MlpLayer>* grads) const {
  Workspace ws;
  Forward(layers_, x, ws);
  const double total = SoftmaxCrossEntropy(labels, ws, nullptr);
  if (grads != nullptr) Backward(layers_, x, labels, ws, *grads);
  return static_cast<float>(total / static_cast<double>(x.rows()));
}

namespace {

absl::Status CheckSgdOptions(const SgdOptions& options) {
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError("batch size must be at least 1");
  }
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    return absl::InvalidArgumentError("learning rate must be positive");
  }
  if (!(options.lr_decay > 0 && options.lr_decay <= 1)) {
    return absl::InvalidArgumentError("lr decay must be in (0, 1]");
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    return absl::InvalidArgumentError("momentum must be in [0, 1)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckProximalTerm(const Mlp& net, const SgdOptions& options) {
  if (!(options.prox_mu >= 0) || !std::isfinite(options.prox_mu)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the proximal term's mu must be finite and >= 0 (got %g)",
        options.prox_mu));
  }
  if (options.prox_mu == 0) return absl::OkStatus();
  const std::vector<MlpLayer>* anchor = options.prox_anchor;
  if (anchor == nullptr) {
    return absl::InvalidArgumentError(
        "the proximal term (mu > 0) needs the global model as its anchor");
  }
  bool same = anchor->size() == net.layers().size();
  for (size_t i = 0; same && i < anchor->size(); ++i) {
    const MlpLayer& a = (*anchor)[i];
    const MlpLayer& w = net.layers()[i];
    same = a.weight.rows() == w.weight.rows() &&
           a.weight.cols() == w.weight.cols() && a.bias.size() == w.bias.size();
  }
  if (!same) {
    return absl::InvalidArgumentError(
        "the proximal term's anchor is not a network of the trained one's "
        "sizes");
  }
  return absl::OkStatus();
}

namespace {

// The examples to train on: `indices`, or all `num_examples` when empty.
std::vector<uint32_t> TrainingOrder(size_t num_examples,
                                    absl::Span<const uint32_t> indices) {
  std::vector<uint32_t> order;
  if (indices.empty()) {
    order.resize(num_examples);
    for (size_t i = 0; i < order.size(); ++i) {
      order[i] = static_cast<uint32_t>(i);
    }
  } else {
    order.assign(indices.begin(), indices.end());
  }
  return order;
}

// Balanced softmax: the log of the class frequencies of data[order], by
// which the training logits are shifted.
Eigen::VectorXf LogClassPriors(const ImageDataset& data,
                               absl::Span<const uint32_t> order,
                               uint32_t classes) {
  std::vector<uint64_t> counts(classes, 0);
  for (uint32_t i : order) ++counts[data.labels[i]];
  Eigen::VectorXf offsets(classes);
  for (uint32_t c = 0; c < classes; ++c) {
    // An absent class counts as half an example (a finite offset).
    const double count = counts[c] > 0 ? static_cast<double>(counts[c]) : 0.5;
    offsets(c) =
        static_cast<float>(std::log(count / static_cast<double>(order.size())));
  }
  return offsets;
}

// learning_rate * lr_decay^(first_epoch + epoch - 1) for the 1-based `epoch`.
float EpochLearningRate(const SgdOptions& options, uint32_t epoch) {
  return static_cast<float>(
      static_cast<double>(options.learning_rate) *
      std::pow(static_cast<double>(options.lr_decay),
               static_cast<double>(options.first_epoch + epoch - 1)));
}

// Minibatch SGD with momentum on a network's layers, reusing its buffers
// across batches. The velocity starts at zero.
class MomentumSgd {
 public:
  // `offsets` (empty for none) shift the training logits; `prox_anchor`
  // (null for none) is FedProx's anchor with weight `prox_mu`.
  MomentumSgd(std::vector<MlpLayer>& layers, float momentum,
              Eigen::VectorXf offsets, float prox_mu,
              const std::vector<MlpLayer>* prox_anchor)
      : layers_(layers),
        mu_(momentum),
        offsets_(std::move(offsets)),
        prox_mu_(prox_mu),
        prox_anchor_(prox_mu > 0 ? prox_anchor : nullptr) {
    velocity_.resize(layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i) {
      velocity_[i].weight =
          RowMatrixF::Zero(layers_[i].weight.rows(), layers_[i].weight.cols());
      velocity_[i].bias = Eigen::VectorXf::Zero(layers_[i].bias.size());
    }
  }

  // The forward pass of the batch data[order[begin..end)]: its summed
  // cross-entropy.
  double BatchLoss(const ImageDataset& data, absl::Span<const uint32_t> order,
                   size_t begin, size_t end) {
    Gather(data, order, begin, end, x_, labels_);
    Forward(layers_, x_, ws_);
    if (offsets_.size() > 0) ws_.out.back().rowwise() += offsets_.transpose();
    return SoftmaxCrossEntropy(labels_, ws_, nullptr);
  }

  // Backpropagates the last BatchLoss and steps with learning rate `lr`.
  void Update(float lr) {
    Backward(layers_, x_, labels_, ws_, grads_);
    if (prox_anchor_ != nullptr) {
      AddProximalGradient(layers_, *prox_anchor_, prox_mu_, grads_);
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      velocity_[i].weight = mu_ * velocity_[i].weight + grads_[i].weight;
      velocity_[i].bias = mu_ * velocity_[i].bias + grads_[i].bias;
      layers_[i].weight -= lr * velocity_[i].weight;
      layers_[i].bias -= lr * velocity_[i].bias;
    }
  }

 private:
  std::vector<MlpLayer>& layers_;
  const float mu_;
  const Eigen::VectorXf offsets_;
  const float prox_mu_;
  const std::vector<MlpLayer>* const prox_anchor_;
  std::vector<MlpLayer> velocity_;
  std::vector<MlpLayer> grads_;
  Workspace ws_;
  RowMatrixF x_;
  std::vector<uint8_t> labels_;
};

// One epoch over data[order] in minibatches of options.batch_size with
// learning rate `lr`: the summed training loss.
absl::StatusOr<double> RunEpoch(MomentumSgd& sgd, const ImageDataset& data,
                                absl::Span<const uint32_t> order,
                                const SgdOptions& options, uint32_t epoch,
                                float lr, const std::atomic<bool>* cancel) {
  double loss_sum = 0;
  for (size_t begin = 0; begin < order.size(); begin += options.batch_size) {
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      return absl::CancelledError(absl::StrFormat(
          "training cancelled in epoch %d of %d", epoch, options.epochs));
    }
    const size_t end = std::min(order.size(), begin + options.batch_size);
    const double batch_loss = sgd.BatchLoss(data, order, begin, end);
    if (!std::isfinite(batch_loss)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "training diverged (non-finite loss) in epoch %d; lower the "
          "learning rate (now %g)",
          epoch, lr));
    }
    loss_sum += batch_loss;
    sgd.Update(lr);
  }
  return loss_sum;
}

}  // namespace

absl::Status TrainSgd(Mlp& net, const ImageDataset& data,
                      absl::Span<const uint32_t> indices,
                      const SgdOptions& options,
                      const std::atomic<bool>* cancel,
                      const std::function<void(const EpochReport&)>& on_epoch) {
  SWARM_RETURN_IF_ERROR(CheckSgdOptions(options));
  SWARM_RETURN_IF_ERROR(CheckProximalTerm(net, options));
  SWARM_RETURN_IF_ERROR(CheckData(net, data, indices));
  std::vector<uint32_t> order = TrainingOrder(data.size(), indices);
  if (order.empty()) {
    return absl::InvalidArgumentError("no training data");
  }
  Eigen::VectorXf offsets;
  if (options.balanced_softmax) {
    offsets = LogClassPriors(data, order, net.sizes().back());
  }
  MomentumSgd sgd(net.mutable_layers(), options.momentum, std::move(offsets),
                  options.prox_mu, options.prox_anchor);
  for (uint32_t epoch = 1; epoch <= options.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    const float lr = EpochLearningRate(options, epoch);
    PortableRng rng =
        PortableRng::ForStream(options.shuffle_seed, kStreamShuffle, epoch);
    rng.Shuffle(order);
    SWARM_ASSIGN_OR_RETURN(
        const double loss_sum,
        RunEpoch(sgd, data, order, options, epoch, lr, cancel));
    if (on_epoch) {
      EpochReport report;
      report.epoch = epoch;
      report.epochs = options.epochs;
      report.learning_rate = lr;
      report.samples = order.size();
      report.mean_loss = loss_sum / static_cast<double>(order.size());
      report.seconds = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count();
      on_epoch(report);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Evaluation> Evaluate(const Mlp& net, const ImageDataset& data,
                                    absl::Span<const uint32_t> indices) {
  SWARM_RETURN_IF_ERROR(CheckData(net, data, indices));
  const size_t n = indices.empty() ? data.size() : indices.size();
  if (n == 0) return absl::InvalidArgumentError("no evaluation data");
  Workspace ws;
  RowMatrixF x;
  std::vector<uint8_t> labels;
  double loss = 0;
  uint64_t correct = 0;
  for (size_t begin = 0; begin < n; begin += kEvalChunk) {
    const size_t end = std::min(n, begin + kEvalChunk);
    Gather(data, indices, begin, end, x, labels);
    Forward(net.layers(), x, ws);
    loss += SoftmaxCrossEntropy(labels, ws, &correct);
  }
  Evaluation out;
  out.samples = n;
  out.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  out.loss = loss / static_cast<double>(n);
  return out;
}

}  // namespace swarm
