// The built-in learner: an MLP classifier (mlp.h) trained on this site's
// shard of Fashion-MNIST (fashion_mnist.h). Learner kind "mlp".
//
// Parameters (learner params, all strings; each may be given per site as
// "<key>.<site name>", which wins over the plain key). Defaults are the
// tuned ones (4 non-IID sites, alpha 0.5, 1 epoch per round, 20-40 rounds):
//   data_dir             dataset directory
//                        default /usr/share/datasets/fashion-mnist
//   sites                sites sharing the data                     1
//   site_index           this site's shard, 0..sites-1; required if sites > 1
//   partition            "iid" or "dirichlet"                       dirichlet
//   alpha                Dirichlet concentration, > 0               0.5
//   data_seed            seed of the split and the hold-out         1
//   validation_fraction  share of the shard held out, [0, 0.9]      0.1
//   max_train_samples    split only a seeded subset of this many
//                        training images (0: all 60,000)            0
//   hidden               hidden layer sizes, "128" or "256,128"     128
//   lr                   SGD learning rate                          0.05
//   lr_decay             per-epoch factor in (0, 1]: epoch e of
//                        round r uses lr * lr_decay^(r * epochs + e) 0.95
//   momentum             SGD momentum, [0, 1)                       0.9
//   balanced_softmax     train on logits + log(local class
//                        frequencies) (see SgdOptions), true|false  true
//   batch_size           minibatch size                             64
//   epochs               local epochs per round                     1
//   seed                 seed of the initial model and of the
//                        minibatch order (mixed with round and
//                        site_index)                                1
//   prox_mu              FedProx (Li et al. 2020): every local step
//                        adds prox_mu * (w - w_global) to the
//                        gradient of every weight, w_global being
//                        the round's global model the site started
//                        from; keeps non-IID sites from drifting
//                        apart. Finite, >= 0; 0: plain local SGD     0
// Differential privacy (DP-SGD, dp_sgd.h; docs/privacy.md). Set one of
// dp_noise_multiplier or dp_target_epsilon to train privately:
//   dp_noise_multiplier  σ, noise std over the clip norm, > 0       off
//   dp_target_epsilon    ε the planned rounds may spend in total; σ
//                        is the smallest that keeps within it       off
//   dp_rounds            rounds planned, for dp_target_epsilon
//                        (the daemon sets the job's num_rounds)     -
//   dp_delta             δ for dp_target_epsilon, in (0, 0.1)       1e-5
//   dp_clip_norm         per-example gradient clip norm, > 0        1
//   dp_sampling_rate     Poisson sampling rate q, in (0, 1]
//                        (default batch_size / training samples)
// Each round then takes ceil(epochs / q) steps and reports its cost with
// the result; the balanced softmax is off (its priors are not private).
// prox_mu composes with DP-SGD: the proximal gradient is added after the
// per-example clipping and the noise, since it depends on no training
// example (only on the weights and the global model): no extra privacy
// cost (dp_sgd.h).
//
// Every site of a job must use the same sites, partition, alpha, data_seed,
// max_train_samples and validation_fraction (so the shards are disjoint and
// cover the data), and the same hidden and seed (so the models agree); only
// site_index differs (e.g. "site_index.site-b": "1").
//
// Create loads the training set and computes the shard, so a missing dataset
// or an impossible split fails before any training. Train starts from the
// global model's weights, runs `epochs` epochs of SGD with momentum (the
// momentum starts at zero each round; with prox_mu > 0 the proximal term
// pulls towards that global model) over the shard's training part and
// returns full weights with sample_count = training samples. Validate
// returns {"accuracy", "loss"} on the held-out part.
#ifndef SWARM_LEARNER_MLP_LEARNER_H_
#define SWARM_LEARNER_MLP_LEARNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "learner/dp_sgd.h"
#include "learner/fashion_mnist.h"
#include "learner/learner.h"
#include "learner/mlp.h"

namespace swarm {

// The DP-SGD parameters above.
struct MlpDpOptions {
  double noise_multiplier = 0;
  double target_epsilon = 0;
  uint32_t rounds = 0;
  double delta = 1e-5;
  float clip_norm = 1.0f;
  double sampling_rate = 0;  // 0: batch_size / training samples.
  bool enabled() const { return noise_multiplier > 0 || target_epsilon > 0; }
};

struct MlpLearnerOptions {
  std::string site;
  std::string data_dir = kDefaultFashionMnistDir;
  uint32_t sites = 1;
  uint32_t site_index = 0;
  PartitionKind partition = PartitionKind::kDirichlet;
  double alpha = 0.5;
  uint64_t data_seed = 1;
  double validation_fraction = 0.1;
  uint64_t max_train_samples = 0;
  std::vector<uint32_t> hidden = {128};
  float lr = 0.05f;
  float lr_decay = 0.95f;
  float momentum = 0.9f;
  bool balanced_softmax = true;
  uint32_t batch_size = 64;
  uint32_t epochs = 1;
  uint64_t seed = 1;
  float prox_mu = 0.0f;  // FedProx; 0: off.
  MlpDpOptions dp;
};

// Reads the parameters above for `site`. A malformed or out-of-range value
// is InvalidArgument naming the key actually used:
//   learner param "alpha.site-b": "-1" must be > 0
// Keys this learner does not know are ignored; UnknownMlpLearnerParams lists
// them.
absl::StatusOr<MlpLearnerOptions> ParseMlpLearnerOptions(
    absl::string_view site, const std::map<std::string, std::string>& params);

std::set<std::string> UnknownMlpLearnerParams(
    const std::map<std::string, std::string>& params);

class MlpLearner final : public Learner {
 public:
  // Loads the training set from options.data_dir, or uses `train_data` if
  // given (e.g. loaded once for several learners in one process), and keeps
  // only this site's shard. Errors: the dataset's (NotFound naming the
  // package, DataLoss naming the file) and InvalidArgument for options and
  // impossible splits.
  static absl::StatusOr<std::unique_ptr<MlpLearner>> Create(
      MlpLearnerOptions options,
      std::shared_ptr<const ImageDataset> train_data = nullptr);

  MlpLearner(const MlpLearner&) = delete;
  MlpLearner& operator=(const MlpLearner&) = delete;

  // Mlp::Create(sizes, seed): the same on every site for the same seed.
  absl::StatusOr<Model> InitialModel() override;
  // FailedPrecondition when validation_fraction is 0; InvalidArgument when
  // `global` is not an MLP of this learner's sizes.
  absl::StatusOr<Metrics> Validate(const Model& global,
                                   uint32_t round) override;
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override;

  // Accuracy and loss of `model` on the 10,000 test images (loaded from
  // data_dir on first use), or on `test_data` if given.
  absl::StatusOr<Evaluation> EvaluateTest(
      const Model& model, const ImageDataset* test_data = nullptr);

  // Called after every local epoch of Train (for progress output).
  void set_epoch_callback(std::function<void(const EpochReport&)> callback) {
    epoch_callback_ = std::move(callback);
  }

  const MlpLearnerOptions& options() const { return options_; }
  // {inputs, hidden..., classes}.
  const std::vector<uint32_t>& sizes() const { return sizes_; }
  const ImageDataset& train_data() const { return train_; }
  const ImageDataset& validation_data() const { return validation_; }

 private:
  MlpLearner(MlpLearnerOptions options, std::vector<uint32_t> sizes,
             ImageDataset train, ImageDataset validation);

  // `model` as a network of this learner's sizes; errors name `what`.
  absl::StatusOr<Mlp> Load(const Model& model, absl::string_view what) const;
  // Train with DP-SGD (options_.dp enabled): `net` is the global model,
  // `anchor` its layers when prox_mu > 0 (FedProx); the output carries the
  // round's privacy cost.
  absl::StatusOr<TrainOutput> TrainPrivatelyOutput(
      const Model& global, Mlp& net, const std::vector<MlpLayer>& anchor,
      uint32_t round, const std::atomic<bool>& cancel);
  // The round's DP-SGD settings: q, steps, and σ (from dp_target_epsilon
  // on first use).
  absl::StatusOr<DpSgdOptions> DpSettings();
  std::string Describe() const;

  MlpLearnerOptions options_;
  std::vector<uint32_t> sizes_;
  ImageDataset train_;
  ImageDataset validation_;
  std::unique_ptr<ImageDataset> test_;  // Loaded on first EvaluateTest.
  std::function<void(const EpochReport&)> epoch_callback_;
  double dp_sigma_ = 0;  // σ found for dp_target_epsilon; 0: not yet.
};

}  // namespace swarm

#endif  // SWARM_LEARNER_MLP_LEARNER_H_
