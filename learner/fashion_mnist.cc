#include "learner/fashion_mnist.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "learner/idx_reader.h"
#include "learner/random.h"

namespace swarm {
namespace {

// Stream purposes ("IID", "DIRI", "HOLD", "SUBS" in ASCII).
constexpr uint64_t kStreamIid = 0x494944;
constexpr uint64_t kStreamDirichlet = 0x44495249;
constexpr uint64_t kStreamHoldOut = 0x484f4c44;
constexpr uint64_t kStreamSubset = 0x53554253;

absl::StatusOr<IdxArray> ReadDatasetFile(const std::string& path) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  if (array.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrFormat(
        "%s. The Fashion-MNIST dataset is missing: install the Debian package "
        "%s (apt-get install %s), or set data_dir to a directory holding its "
        "four IDX files",
        array.status().message(), kFashionMnistPackage, kFashionMnistPackage));
  }
  return array;
}

std::string DimsString(const std::vector<uint32_t>& dims) {
  return absl::StrFormat("[%s]", absl::StrJoin(dims, ", "));
}

}  // namespace

ImageDataset ImageDataset::Subset(absl::Span<const uint32_t> indices) const {
  ImageDataset out;
  out.pixels_per_image = pixels_per_image;
  out.num_classes = num_classes;
  out.pixels.resize(indices.size() * size_t{pixels_per_image});
  out.labels.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    std::copy_n(image(indices[i]), pixels_per_image,
                out.pixels.data() + i * pixels_per_image);
    out.labels[i] = labels[indices[i]];
  }
  return out;
}

std::vector<uint64_t> ImageDataset::ClassCounts() const {
  std::vector<uint64_t> counts(num_classes, 0);
  for (uint8_t label : labels) {
    if (label < counts.size()) ++counts[label];
  }
  return counts;
}

std::string FashionMnistImagesFile(FashionMnistSplit split) {
  return split == FashionMnistSplit::kTrain ? "train-images-idx3-ubyte.gz"
                                            : "t10k-images-idx3-ubyte.gz";
}

std::string FashionMnistLabelsFile(FashionMnistSplit split) {
  return split == FashionMnistSplit::kTrain ? "train-labels-idx1-ubyte.gz"
                                            : "t10k-labels-idx1-ubyte.gz";
}

absl::StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir,
                                              FashionMnistSplit split) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  const std::string images_path = base + FashionMnistImagesFile(split);
  const std::string labels_path = base + FashionMnistLabelsFile(split);
  SWARM_ASSIGN_OR_RETURN(IdxArray images, ReadDatasetFile(images_path));
  SWARM_ASSIGN_OR_RETURN(IdxArray labels, ReadDatasetFile(labels_path));
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28) {
    return absl::DataLossError(
        absl::StrFormat("%s: images have shape %s, expected [n, 28, 28]",
                        images_path, DimsString(images.dims)));
  }
  if (labels.dims.size() != 1) {
    return absl::DataLossError(
        absl::StrFormat("%s: labels have shape %s, expected [n]", labels_path,
                        DimsString(labels.dims)));
  }
  if (labels.dims[0] != images.dims[0]) {
    return absl::DataLossError(
        absl::StrFormat("%s has %d labels but %s has %d images", labels_path,
                        labels.dims[0], images_path, images.dims[0]));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kFashionMnistClasses) {
      return absl::DataLossError(absl::StrFormat(
          "%s: label %d of example %d is not in 0..%d", labels_path,
          labels.data[i], i, kFashionMnistClasses - 1));
    }
  }
  ImageDataset out;
  out.pixels_per_image = kFashionMnistPixels;
  out.num_classes = kFashionMnistClasses;
  out.pixels = std::move(images.data);
  out.labels = std::move(labels.data);
  return out;
}

absl::StatusOr<PartitionKind> ParsePartitionKind(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "iid") return PartitionKind::kIid;
  if (lower == "dirichlet") return PartitionKind::kDirichlet;
  return absl::InvalidArgumentError(absl::StrFormat(
      "partition \"%s\" is not \"iid\" or \"dirichlet\"", text));
}

const char* PartitionKindName(PartitionKind kind) {
  return kind == PartitionKind::kIid ? "iid" : "dirichlet";
}

namespace {

// The iid split: a seeded shuffle of all indices, cut into `sites`
// consecutive runs whose sizes differ by at most one.
absl::StatusOr<std::vector<std::vector<uint32_t>>> PartitionIid(
    size_t num_examples, uint32_t sites, uint64_t min_shard, uint64_t seed) {
  if (num_examples < sites * min_shard) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot split %d examples among %d sites: every site needs at least "
        "%d",
        num_examples, sites, min_shard));
  }
  std::vector<uint32_t> order(num_examples);
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  PortableRng rng = PortableRng::ForStream(seed, kStreamIid, sites);
  rng.Shuffle(order);
  std::vector<std::vector<uint32_t>> shards(sites);
  const size_t base = order.size() / sites;
  const size_t extra = order.size() % sites;
  size_t begin = 0;
  for (uint32_t s = 0; s < sites; ++s) {
    const size_t count = base + (s < extra ? 1 : 0);
    shards[s].assign(order.begin() + begin, order.begin() + begin + count);
    std::sort(shards[s].begin(), shards[s].end());
    begin += count;
  }
  return shards;
}

// The example indices of every class, ascending; InvalidArgument for a label
// >= num_classes.
absl::StatusOr<std::vector<std::vector<uint32_t>>> IndicesByClass(
    absl::Span<const uint8_t> labels, uint32_t num_classes) {
  std::vector<std::vector<uint32_t>> by_class(num_classes);
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("label %d of example %d is not below %d classes",
                          labels[i], i, num_classes));
    }
    by_class[labels[i]].push_back(static_cast<uint32_t>(i));
  }
  return by_class;
}

// InvalidArgument unless every present class has at least one sample per
// site.
absl::Status CheckClassesCoverSites(
    const std::vector<std::vector<uint32_t>>& by_class, uint32_t sites) {
  for (uint32_t c = 0; c < by_class.size(); ++c) {
    const size_t n = by_class[c].size();
    if (n > 0 && n < sites) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot split class %d among %d sites: it has %d samples, and the "
          "Dirichlet split gives every site at least one sample of every "
          "class (use fewer sites or more data)",
          c, sites, n));
    }
  }
  return absl::OkStatus();
}

// How many of a class's `spare` samples (those beyond one per site) each of
// the `sites` sites gets: p ~ Dirichlet(alpha) drawn from `rng`, then
// floor(p_s * spare) each, the remainder one by one to the largest
// fractional parts (ties: lower site).
std::vector<uint64_t> DirichletCounts(double alpha, uint32_t sites,
                                      uint64_t spare, PortableRng& rng) {
  std::vector<double> log_gamma(sites);
  std::vector<double> quota(sites);
  std::vector<uint64_t> count(sites);
  double max_log = -std::numeric_limits<double>::infinity();
  for (uint32_t s = 0; s < sites; ++s) {
    log_gamma[s] = rng.LogGamma(alpha);
    max_log = std::max(max_log, log_gamma[s]);
  }
  double sum = 0;
  for (uint32_t s = 0; s < sites; ++s) {
    quota[s] = std::exp(log_gamma[s] - max_log);  // The largest is 1.
    sum += quota[s];
  }
  uint64_t assigned = 0;
  for (uint32_t s = 0; s < sites; ++s) {
    const double share = quota[s] / sum * static_cast<double>(spare);
    count[s] =
        std::min<uint64_t>(static_cast<uint64_t>(std::floor(share)), spare);
    quota[s] = share - static_cast<double>(count[s]);  // Fractional part.
    assigned += count[s];
  }
  // Rounding can only leave samples over (never overshoot by more than the
  // floors' sum, which is <= spare up to rounding; clamp defensively).
  while (assigned > spare) {
    for (uint32_t s = sites; s-- > 0 && assigned > spare;) {
      if (count[s] > 0) {
        --count[s];
        --assigned;
      }
    }
  }
  std::vector<uint32_t> order(sites);
  for (uint32_t s = 0; s < sites; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return quota[a] > quota[b]; });
  for (uint64_t k = 0; assigned < spare; ++k, ++assigned) {
    ++count[order[k % sites]];
  }
  return count;
}

// Sorts every shard; InvalidArgument if one has fewer than `min_shard`
// samples.
absl::Status SortAndCheckShards(std::vector<std::vector<uint32_t>>& shards,
                                size_t num_examples, uint64_t min_shard) {
  const uint32_t sites = static_cast<uint32_t>(shards.size());
  for (uint32_t s = 0; s < sites; ++s) {
    std::sort(shards[s].begin(), shards[s].end());
    if (shards[s].size() < min_shard) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot split %d examples among %d sites: site %d would get %d, "
          "fewer than the %d it needs (use fewer sites or more data)",
          num_examples, sites, s, shards[s].size(), min_shard));
    }
  }
  return absl::OkStatus();
}

// The Dirichlet split by label (see the header): per class in order, a
// shuffle of its samples, one to every site and the rest by DirichletCounts.
absl::StatusOr<std::vector<std::vector<uint32_t>>> PartitionDirichlet(
    absl::Span<const uint8_t> labels, uint32_t num_classes,
    const PartitionOptions& options, uint64_t min_shard) {
  const uint32_t sites = options.sites;
  if (!(options.alpha > 0) || !std::isfinite(options.alpha)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "alpha must be a positive number (got %g)", options.alpha));
  }
  SWARM_ASSIGN_OR_RETURN(std::vector<std::vector<uint32_t>> by_class,
                         IndicesByClass(labels, num_classes));
  SWARM_RETURN_IF_ERROR(CheckClassesCoverSites(by_class, sites));
  PortableRng rng =
      PortableRng::ForStream(options.seed, kStreamDirichlet, sites);
  std::vector<std::vector<uint32_t>> shards(sites);
  for (std::vector<uint32_t>& members : by_class) {
    if (members.empty()) continue;
    rng.Shuffle(members);
    const std::vector<uint64_t> count =
        DirichletCounts(options.alpha, sites, members.size() - sites, rng);
    size_t begin = 0;
    for (uint32_t s = 0; s < sites; ++s) {
      const size_t take = static_cast<size_t>(count[s]) + 1;
      shards[s].insert(shards[s].end(), members.begin() + begin,
                       members.begin() + begin + take);
      begin += take;
    }
  }
  SWARM_RETURN_IF_ERROR(SortAndCheckShards(shards, labels.size(), min_shard));
  return shards;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<uint32_t>>> PartitionDataset(
    absl::Span<const uint8_t> labels, uint32_t num_classes,
    const PartitionOptions& options) {
  const uint32_t sites = options.sites;
  if (sites < 1) return absl::InvalidArgumentError("sites must be at least 1");
  if (labels.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("more than 2^32 - 1 examples");
  }
  const uint64_t min_shard = std::max<uint64_t>(options.min_shard_size, 1);
  if (options.kind == PartitionKind::kIid) {
    return PartitionIid(labels.size(), sites, min_shard, options.seed);
  }
  return PartitionDirichlet(labels, num_classes, options, min_shard);
}

absl::StatusOr<ShardSplit> HoldOut(absl::Span<const uint32_t> shard,
                                   double fraction, uint64_t seed,
                                   uint32_t site_index) {
  if (!(fraction >= 0 && fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("validation fraction %g is not in [0, 1)", fraction));
  }
  ShardSplit out;
  if (fraction == 0) {
    out.train.assign(shard.begin(), shard.end());
    std::sort(out.train.begin(), out.train.end());
    return out;
  }
  if (shard.size() < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a shard of %d samples cannot hold out validation data", shard.size()));
  }
  std::vector<uint32_t> order(shard.begin(), shard.end());
  PortableRng rng = PortableRng::ForStream(seed, kStreamHoldOut, site_index);
  rng.Shuffle(order);
  const double want = std::round(fraction * static_cast<double>(order.size()));
  const size_t validation =
      std::clamp<size_t>(static_cast<size_t>(want), 1, order.size() - 1);
  out.validation.assign(order.begin(), order.begin() + validation);
  out.train.assign(order.begin() + validation, order.end());
  std::sort(out.validation.begin(), out.validation.end());
  std::sort(out.train.begin(), out.train.end());
  return out;
}

std::vector<uint32_t> SampleSubset(uint64_t n, uint64_t count, uint64_t seed) {
  std::vector<uint32_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = static_cast<uint32_t>(i);
  if (count >= n) return all;
  PortableRng rng = PortableRng::ForStream(seed, kStreamSubset, n, count);
  // Partial Fisher–Yates: the first `count` positions.
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t j = i + rng.Bounded(n - i);
    std::swap(all[i], all[j]);
  }
  all.resize(count);
  std::sort(all.begin(), all.end());
  return all;
}

absl::StatusOr<ShardSplit> SiteShard(absl::Span<const uint8_t> labels,
                                     uint32_t num_classes,
                                     const SiteShardOptions& options) {
  const PartitionOptions& partition = options.partition;
  if (partition.sites < 1) {
    return absl::InvalidArgumentError("sites must be at least 1");
  }
  if (options.site_index >= partition.sites) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "site_index %d is out of range for %d sites (0..%d)",
        options.site_index, partition.sites, partition.sites - 1));
  }
  if (!(options.validation_fraction >= 0 && options.validation_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("validation_fraction %g is not in [0, 1)",
                        options.validation_fraction));
  }
  std::vector<uint32_t> subset;
  std::vector<uint8_t> subset_labels;
  absl::Span<const uint8_t> used = labels;
  if (options.max_samples > 0 && options.max_samples < labels.size()) {
    subset = SampleSubset(labels.size(), options.max_samples, partition.seed);
    subset_labels.reserve(subset.size());
    for (uint32_t i : subset) subset_labels.push_back(labels[i]);
    used = subset_labels;
  }
  PartitionOptions with_min = partition;
  with_min.min_shard_size = options.validation_fraction > 0 ? 2 : 1;
  SWARM_ASSIGN_OR_RETURN(std::vector<std::vector<uint32_t>> shards,
                         PartitionDataset(used, num_classes, with_min));
  std::vector<uint32_t> shard = std::move(shards[options.site_index]);
  if (!subset.empty()) {
    for (uint32_t& i : shard) i = subset[i];  // Back to dataset indices.
  }
  return HoldOut(shard, options.validation_fraction, partition.seed,
                 options.site_index);
}

}  // namespace swarm
