#include "learner/fashion_mnist.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

// 10 classes with `per_class[c]` examples each, interleaved.
std::vector<uint8_t> Labels(const std::vector<size_t>& per_class) {
  std::vector<uint8_t> labels;
  std::vector<size_t> left = per_class;
  bool any = true;
  while (any) {
    any = false;
    for (size_t c = 0; c < left.size(); ++c) {
      if (left[c] > 0) {
        labels.push_back(static_cast<uint8_t>(c));
        --left[c];
        any = true;
      }
    }
  }
  return labels;
}

// Checks that `shards` are sorted, disjoint and cover 0..n-1.
void ExpectPartition(const std::vector<std::vector<uint32_t>>& shards,
                     size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& shard : shards) {
    EXPECT_TRUE(std::is_sorted(shard.begin(), shard.end()));
    for (uint32_t i : shard) {
      ASSERT_LT(i, n);
      ++seen[i];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(seen[i], 1) << "example " << i;
  }
}

PartitionOptions Dirichlet(uint32_t sites, double alpha, uint64_t seed) {
  PartitionOptions o;
  o.sites = sites;
  o.kind = PartitionKind::kDirichlet;
  o.alpha = alpha;
  o.seed = seed;
  return o;
}

TEST(PartitionTest, DirichletShardsAreDisjointCoveringAndDeterministic) {
  const std::vector<uint8_t> labels = Labels(std::vector<size_t>(10, 600));
  for (uint32_t sites : {1u, 2u, 4u, 7u}) {
    auto shards = PartitionDataset(labels, 10, Dirichlet(sites, 0.5, 42));
    ASSERT_TRUE(shards.ok()) << shards.status();
    ASSERT_EQ(shards->size(), sites);
    ExpectPartition(*shards, labels.size());
    // Every site holds at least one example of every class.
    for (const auto& shard : *shards) {
      std::set<uint8_t> classes;
      for (uint32_t i : shard) classes.insert(labels[i]);
      EXPECT_EQ(classes.size(), 10u);
    }
    auto again = PartitionDataset(labels, 10, Dirichlet(sites, 0.5, 42));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*shards, *again);
  }
  auto a = PartitionDataset(labels, 10, Dirichlet(4, 0.5, 1));
  auto b = PartitionDataset(labels, 10, Dirichlet(4, 0.5, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

// The split is a function of the labels, sites, alpha and seed only: pin one
// result so that a change of the algorithm (which would break a job whose
// sites run different builds) does not go unnoticed.
TEST(PartitionTest, DirichletSplitIsPinned) {
  const std::vector<uint8_t> labels = Labels(std::vector<size_t>(10, 100));
  auto shards = PartitionDataset(labels, 10, Dirichlet(3, 0.5, 7));
  ASSERT_TRUE(shards.ok());
  std::vector<size_t> sizes;
  uint64_t hash = 0;
  for (const auto& shard : *shards) {
    sizes.push_back(shard.size());
    for (uint32_t i : shard) hash = hash * 1000003 + i;
  }
  // Recorded from this implementation.
  EXPECT_EQ(sizes, (std::vector<size_t>{356, 454, 190}));
  EXPECT_EQ(hash, 17264195166318088042ull);
}

TEST(PartitionTest, SmallAlphaIsSkewedLargeAlphaIsEven) {
  const std::vector<uint8_t> labels = Labels(std::vector<size_t>(10, 1000));
  auto skew = [&](double alpha) {
    auto shards = PartitionDataset(labels, 10, Dirichlet(4, alpha, 3));
    EXPECT_TRUE(shards.ok());
    // Mean over sites and classes of |share of class c at site s - 1/4|.
    double total = 0;
    for (const auto& shard : *shards) {
      std::vector<double> per_class(10, 0);
      for (uint32_t i : shard) per_class[labels[i]] += 1;
      for (double count : per_class) total += std::abs(count / 1000 - 0.25);
    }
    return total / 40;
  };
  EXPECT_GT(skew(0.1), 0.15);
  EXPECT_LT(skew(1000), 0.02);
  // Tiny alphas do not underflow: every share stays well defined.
  auto tiny = PartitionDataset(labels, 10, Dirichlet(4, 1e-4, 3));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  ExpectPartition(*tiny, labels.size());
}

TEST(PartitionTest, IidShardsAreEvenDisjointAndCovering) {
  const std::vector<uint8_t> labels = Labels(std::vector<size_t>(10, 101));
  PartitionOptions o;
  o.kind = PartitionKind::kIid;
  o.sites = 4;
  o.seed = 9;
  auto shards = PartitionDataset(labels, 10, o);
  ASSERT_TRUE(shards.ok()) << shards.status();
  ExpectPartition(*shards, labels.size());
  for (const auto& shard : *shards) {
    EXPECT_GE(shard.size(), 252u);
    EXPECT_LE(shard.size(), 253u);
  }
  auto again = PartitionDataset(labels, 10, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*shards, *again);
}

TEST(PartitionTest, RefusesBadAlpha) {
  const std::vector<uint8_t> labels = Labels(std::vector<size_t>(10, 10));
  for (double alpha : {0.0, -0.5, std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::infinity()}) {
    auto shards = PartitionDataset(labels, 10, Dirichlet(2, alpha, 1));
    EXPECT_EQ(shards.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(shards.status().message(), HasSubstr("alpha"));
  }
}

TEST(PartitionTest, RefusesImpossibleSplits) {
  // Class 3 has 2 examples: 3 sites cannot each get one.
  std::vector<size_t> per_class(10, 50);
  per_class[3] = 2;
  const std::vector<uint8_t> labels = Labels(per_class);
  auto shards = PartitionDataset(labels, 10, Dirichlet(3, 0.5, 1));
  EXPECT_EQ(shards.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shards.status().message(), HasSubstr("class 3"));
  EXPECT_THAT(shards.status().message(), HasSubstr("2 samples"));
  // Two sites are fine; an absent class is fine too.
  EXPECT_TRUE(PartitionDataset(labels, 10, Dirichlet(2, 0.5, 1)).ok());
  per_class[3] = 0;
  EXPECT_TRUE(
      PartitionDataset(Labels(per_class), 10, Dirichlet(3, 0.5, 1)).ok());
  // One class of 3 examples, 3 sites, a validation share to hold out: each
  // site would get 1 example, fewer than the 2 it needs.
  PartitionOptions o = Dirichlet(3, 0.5, 1);
  o.min_shard_size = 2;
  shards = PartitionDataset(std::vector<uint8_t>(3, 0), 10, o);
  EXPECT_EQ(shards.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shards.status().message(), HasSubstr("site 0 would get 1"));
  // IID: 5 examples for 3 sites needing 2 each.
  o.kind = PartitionKind::kIid;
  shards = PartitionDataset(std::vector<uint8_t>(5, 0), 10, o);
  EXPECT_EQ(shards.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shards.status().message(), HasSubstr("5 examples among 3"));
  // Zero sites; a label beyond the classes.
  EXPECT_FALSE(PartitionDataset(labels, 10, Dirichlet(0, 0.5, 1)).ok());
  EXPECT_FALSE(
      PartitionDataset(std::vector<uint8_t>{0, 11}, 10, Dirichlet(1, 0.5, 1))
          .ok());
}

TEST(HoldOutTest, HoldsOutATenthDeterministically) {
  std::vector<uint32_t> shard(1000);
  std::iota(shard.begin(), shard.end(), 5000);
  auto split = HoldOut(shard, 0.1, 3, 2);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->validation.size(), 100u);
  EXPECT_EQ(split->train.size(), 900u);
  std::vector<uint32_t> all = split->train;
  all.insert(all.end(), split->validation.begin(), split->validation.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, shard);
  auto again = HoldOut(shard, 0.1, 3, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(split->validation, again->validation);
  auto other_site = HoldOut(shard, 0.1, 3, 1);
  ASSERT_TRUE(other_site.ok());
  EXPECT_NE(split->validation, other_site->validation);
  // At least one example each side; none held out at fraction 0.
  auto tiny = HoldOut(std::vector<uint32_t>{1, 2}, 0.1, 3, 0);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->validation.size(), 1u);
  EXPECT_EQ(tiny->train.size(), 1u);
  auto none = HoldOut(shard, 0, 3, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->validation.empty());
  EXPECT_EQ(none->train, shard);
  EXPECT_FALSE(HoldOut(std::vector<uint32_t>{1}, 0.1, 3, 0).ok());
  EXPECT_FALSE(HoldOut(shard, 1.0, 3, 0).ok());
}

TEST(SiteShardTest, SitesShareTheSetAndIndexIsChecked) {
  const std::vector<uint8_t> labels = Labels(std::vector<size_t>(10, 300));
  SiteShardOptions o;
  o.partition = Dirichlet(4, 0.5, 11);
  o.max_samples = 2000;
  std::vector<std::vector<uint32_t>> parts;
  for (uint32_t s = 0; s < 4; ++s) {
    o.site_index = s;
    auto split = SiteShard(labels, 10, o);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_FALSE(split->validation.empty());
    parts.push_back(split->train);
    parts.push_back(split->validation);
  }
  // Disjoint, and together exactly the seeded subset.
  std::vector<uint32_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, SampleSubset(labels.size(), 2000, 11));
  o.site_index = 4;
  auto bad = SiteShard(labels, 10, o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("site_index 4 is out of range for 4 sites"));
}

TEST(SampleSubsetTest, SeededSortedDistinct) {
  std::vector<uint32_t> a = SampleSubset(1000, 100, 5);
  EXPECT_EQ(a.size(), 100u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<uint32_t>(a.begin(), a.end()).size(), 100u);
  EXPECT_EQ(a, SampleSubset(1000, 100, 5));
  EXPECT_NE(a, SampleSubset(1000, 100, 6));
  EXPECT_EQ(SampleSubset(10, 20, 5).size(), 10u);
}

TEST(PartitionKindTest, Parses) {
  EXPECT_EQ(*ParsePartitionKind("IID"), PartitionKind::kIid);
  EXPECT_EQ(*ParsePartitionKind("dirichlet"), PartitionKind::kDirichlet);
  EXPECT_FALSE(ParsePartitionKind("label-skew").ok());
}

class FakeDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fashion_mnist_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  void Write(const std::string& name, const std::vector<uint32_t>& dims,
             const std::vector<uint8_t>& data) {
    std::vector<uint8_t> bytes = {0, 0, 8, static_cast<uint8_t>(dims.size())};
    for (uint32_t d : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) {
        bytes.push_back(static_cast<uint8_t>(d >> shift));
      }
    }
    bytes.insert(bytes.end(), data.begin(), data.end());
    gzFile f = gzopen((dir_ + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()),
              static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  }

  void WriteTest(uint32_t n, std::vector<uint8_t> labels) {
    std::vector<uint8_t> pixels(n * 784);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = i % 251;
    Write(FashionMnistImagesFile(FashionMnistSplit::kTest), {n, 28, 28},
          pixels);
    Write(FashionMnistLabelsFile(FashionMnistSplit::kTest),
          {static_cast<uint32_t>(labels.size())}, labels);
  }

  std::string dir_;
};

TEST_F(FakeDatasetTest, MissingDatasetNamesThePackage) {
  auto data = LoadFashionMnist(dir_, FashionMnistSplit::kTrain);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(),
              HasSubstr("apt-get install dataset-fashion-mnist"));
  EXPECT_THAT(data.status().message(),
              HasSubstr(dir_ + "/train-images-idx3-ubyte.gz"));
}

TEST_F(FakeDatasetTest, LoadsASmallDataset) {
  WriteTest(3, {0, 9, 4});
  auto data = LoadFashionMnist(dir_, FashionMnistSplit::kTest);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 3u);
  EXPECT_EQ(data->pixels_per_image, 784u);
  EXPECT_EQ(data->labels, (std::vector<uint8_t>{0, 9, 4}));
  EXPECT_EQ(data->image(1)[0], 784 % 251);
  ImageDataset sub = data->Subset(std::vector<uint32_t>{2, 0});
  EXPECT_EQ(sub.labels, (std::vector<uint8_t>{4, 0}));
  EXPECT_EQ(sub.image(0)[0], data->image(2)[0]);
}

TEST_F(FakeDatasetTest, BadLabelsAndShapesNameTheFile) {
  WriteTest(3, {0, 12, 4});
  auto data = LoadFashionMnist(dir_, FashionMnistSplit::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(),
              HasSubstr("t10k-labels-idx1-ubyte.gz: label 12"));
  WriteTest(3, {0, 1});
  data = LoadFashionMnist(dir_, FashionMnistSplit::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(), HasSubstr("has 2 labels"));
  Write(FashionMnistImagesFile(FashionMnistSplit::kTest), {2, 28, 27},
        std::vector<uint8_t>(2 * 28 * 27));
  data = LoadFashionMnist(dir_, FashionMnistSplit::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(),
              HasSubstr("t10k-images-idx3-ubyte.gz: images have shape"));
}

TEST_F(FakeDatasetTest, TruncatedImagesNameTheFile) {
  WriteTest(2, {1, 2});
  // Declares 3 images, holds 2.
  Write(FashionMnistImagesFile(FashionMnistSplit::kTest), {3, 28, 28},
        std::vector<uint8_t>(2 * 784));
  auto data = LoadFashionMnist(dir_, FashionMnistSplit::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(),
              HasSubstr(dir_ + "/t10k-images-idx3-ubyte.gz"));
  EXPECT_THAT(data.status().message(), HasSubstr("truncated"));
}

// The installed dataset (Debian package dataset-fashion-mnist). Fails with
// the install hint when it is missing.
TEST(RealFashionMnistTest, LoadsAndSplitsTheTrainingSet) {
  auto train =
      LoadFashionMnist(kDefaultFashionMnistDir, FashionMnistSplit::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size(), 60000u);
  EXPECT_EQ(train->ClassCounts(), std::vector<uint64_t>(10, 6000));
  auto test =
      LoadFashionMnist(kDefaultFashionMnistDir, FashionMnistSplit::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10000u);
  EXPECT_EQ(test->ClassCounts(), std::vector<uint64_t>(10, 1000));

  auto shards = PartitionDataset(train->labels, 10, Dirichlet(4, 0.5, 1));
  ASSERT_TRUE(shards.ok()) << shards.status();
  ExpectPartition(*shards, 60000);
}

}  // namespace
}  // namespace swarm
