// Fashion-MNIST loading and the per-site split of the training set.
//
// The data comes from Debian's `dataset-fashion-mnist` package, in
// /usr/share/datasets/fashion-mnist:
//   {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
//
// Split of the training set among `sites` sites (PartitionDataset), computed
// from the labels and a seed only, so every site computes the same split and
// the shards are disjoint and cover the set:
//
//   iid        shuffle all indices (PortableRng stream "IID"), site s gets the
//              s-th of `sites` consecutive runs; sizes differ by at most one.
//   dirichlet  per class c = 0..C-1 in order (one PortableRng stream "DIRI"):
//              shuffle the class's indices; draw p ~ Dirichlet(alpha) over
//              the sites (log-gamma samples, normalised); every site gets one
//              sample of the class, and the other n_c - sites samples are
//              shared by p: floor(p_s * (n_c - sites)) each, the remainder
//              one by one to the largest fractional parts (ties: lower site).
//
// Rules (InvalidArgument before any training):
//   - sites >= 1; alpha > 0 and finite (dirichlet);
//   - dirichlet: every class present in the data has at least `sites`
//     samples (each site holds at least one sample of every class);
//   - every site ends with at least 2 samples when a validation share is held
//     out (one to train, one to validate), else at least 1;
//   - site_index < sites.
//
// Hold-out (HoldOut): a seeded shuffle of the site's shard (stream "HOLD",
// site index); the first round(fraction * n) samples, clamped to [1, n - 1]
// when fraction > 0, validate, the rest train. Both lists come back sorted.
#ifndef SWARM_LEARNER_FASHION_MNIST_H_
#define SWARM_LEARNER_FASHION_MNIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swarm {

inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";
inline constexpr char kFashionMnistPackage[] = "dataset-fashion-mnist";
inline constexpr uint32_t kFashionMnistPixels = 28 * 28;
inline constexpr uint32_t kFashionMnistClasses = 10;

// Labelled greyscale images, one row of `pixels_per_image` bytes each.
struct ImageDataset {
  uint32_t pixels_per_image = 0;
  uint32_t num_classes = 0;
  std::vector<uint8_t> pixels;  // size() * pixels_per_image bytes.
  std::vector<uint8_t> labels;  // Each < num_classes.

  size_t size() const { return labels.size(); }
  const uint8_t* image(size_t i) const {
    return pixels.data() + i * pixels_per_image;
  }
  // The examples at `indices`, in that order (indices must be < size()).
  ImageDataset Subset(absl::Span<const uint32_t> indices) const;
  // Samples per label.
  std::vector<uint64_t> ClassCounts() const;
};

enum class FashionMnistSplit { kTrain, kTest };

// The file names of a split inside the dataset directory.
std::string FashionMnistImagesFile(FashionMnistSplit split);
std::string FashionMnistLabelsFile(FashionMnistSplit split);

// Reads a split from `dir`. Missing files are NotFound naming the file and
// the package to install; corrupted files DataLoss naming the file (also for
// shapes other than [n, 28, 28] / [n], count mismatches, labels >= 10).
absl::StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir,
                                              FashionMnistSplit split);

enum class PartitionKind { kIid, kDirichlet };
// "iid" or "dirichlet" (case-insensitive).
absl::StatusOr<PartitionKind> ParsePartitionKind(absl::string_view text);
const char* PartitionKindName(PartitionKind kind);

struct PartitionOptions {
  uint32_t sites = 1;
  PartitionKind kind = PartitionKind::kDirichlet;
  double alpha = 0.5;
  uint64_t seed = 1;
  // Smallest shard allowed (2 when a validation share is held out).
  uint64_t min_shard_size = 1;
};

// Every site's shard: indices into `labels`, ascending. `num_classes` bounds
// the labels (a label >= num_classes is InvalidArgument).
absl::StatusOr<std::vector<std::vector<uint32_t>>> PartitionDataset(
    absl::Span<const uint8_t> labels, uint32_t num_classes,
    const PartitionOptions& options);

struct ShardSplit {
  std::vector<uint32_t> train;       // Ascending.
  std::vector<uint32_t> validation;  // Ascending.
};

// Holds out a seeded share `fraction` in [0, 1) of `shard` for validation
// (see the top of the file). fraction > 0 requires shard.size() >= 2.
absl::StatusOr<ShardSplit> HoldOut(absl::Span<const uint32_t> shard,
                                   double fraction, uint64_t seed,
                                   uint32_t site_index);

// `count` indices out of [0, n), seeded, ascending (all when count >= n).
std::vector<uint32_t> SampleSubset(uint64_t n, uint64_t count, uint64_t seed);

struct SiteShardOptions {
  PartitionOptions partition;
  uint32_t site_index = 0;
  double validation_fraction = 0.1;
  // Use only a seeded subset of this many training images (0: all), split
  // as above. For quick runs and tests.
  uint64_t max_samples = 0;
};

// This site's training and validation indices into a dataset with `labels`:
// SampleSubset (if max_samples), PartitionDataset, then HoldOut. Errors name
// the offending option.
absl::StatusOr<ShardSplit> SiteShard(absl::Span<const uint8_t> labels,
                                     uint32_t num_classes,
                                     const SiteShardOptions& options);

}  // namespace swarm

#endif  // SWARM_LEARNER_FASHION_MNIST_H_
