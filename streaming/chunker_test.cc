#include "streaming/chunker.h"

#include "gtest/gtest.h"
#include "model/test_models.h"
#include "streaming/digest.h"

namespace swarm {
namespace {

std::shared_ptr<const Model> TwoTensorModel() {
  std::vector<TensorSpec> specs = {*MakeTensorSpec("a", v1::DTYPE_U8, {10000}),
                                   *MakeTensorSpec("none", v1::DTYPE_F32, {0}),
                                   *MakeTensorSpec("b", v1::DTYPE_F32, {1000})};
  auto model = std::make_shared<Model>(*Model::Create(std::move(specs)));
  testing_models::FillRandom(model.get(), 1);
  return model;
}

TEST(ChunkerTest, SplitsTensorsAtChunkSizeAndSkipsEmptyOnes) {
  auto chunker = Chunker::Create(TwoTensorModel(), v1::ModelHeader(), 4096);
  ASSERT_TRUE(chunker.ok()) << chunker.status();
  EXPECT_EQ((*chunker)->header().tensors_size(), 3);
  EXPECT_EQ((*chunker)->header().total_bytes(), 14000u);
  std::vector<std::pair<uint32_t, uint64_t>> seen;
  std::vector<size_t> sizes;
  while (auto chunk = (*chunker)->NextChunk()) {
    seen.emplace_back(chunk->tensor_index, chunk->offset);
    sizes.push_back(chunk->data.size());
  }
  const std::vector<std::pair<uint32_t, uint64_t>> expected = {
      {0, 0}, {0, 4096}, {0, 8192}, {2, 0}};
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(sizes, (std::vector<size_t>{4096, 4096, 1808, 4000}));
  v1::ModelTrailer trailer = (*chunker)->Trailer();
  EXPECT_EQ(trailer.chunk_count(), 4u);
  EXPECT_EQ(trailer.digest().size(), 16u);  // XXH3-128
}

TEST(ChunkerTest, DigestDependsOnContentAndAlgorithm) {
  auto digest_of = [](std::shared_ptr<const Model> model,
                      v1::DigestAlgorithm algorithm) {
    v1::ModelHeader header;
    header.set_digest_algorithm(algorithm);
    auto chunker = *Chunker::Create(model, header, 4096);
    while (chunker->NextChunk()) {
    }
    return chunker->Trailer().digest();
  };
  auto model = TwoTensorModel();
  const std::string xxh = digest_of(model, v1::DIGEST_XXH3_128);
  EXPECT_EQ(xxh, digest_of(model, v1::DIGEST_XXH3_128));
  auto changed = std::make_shared<Model>(*model->Clone());
  changed->mutable_tensor_data(2)[3] ^= 1;
  EXPECT_NE(xxh, digest_of(changed, v1::DIGEST_XXH3_128));
}

TEST(ChunkerTest, RefusesChunkSizeOutOfRange) {
  EXPECT_FALSE(Chunker::Create(TwoTensorModel(), v1::ModelHeader(), 100).ok());
  EXPECT_FALSE(
      Chunker::Create(TwoTensorModel(), v1::ModelHeader(), kMaxChunkSize + 1)
          .ok());
  v1::ModelHeader header;
  header.set_digest_algorithm(static_cast<v1::DigestAlgorithm>(77));
  EXPECT_FALSE(Chunker::Create(TwoTensorModel(), header, 4096).ok());
}

// Digesting a chunk in pieces equals digesting it whole; a different split
// of the same bytes into chunks does not (SHA-256: security/).
TEST(StreamDigestTest, PiecesEqualTheWholeChunk) {
  const std::string data(100000, 'x');
  for (v1::DigestAlgorithm algorithm : {v1::DIGEST_XXH3_128}) {
    auto whole = *StreamDigest::Create(algorithm);
    whole->AddChunk(2, 4096, data);
    auto pieces = *StreamDigest::Create(algorithm);
    pieces->BeginChunk(2, 4096, data.size());
    for (size_t at = 0; at < data.size(); at += 8192) {
      pieces->AddChunkBytes(absl::string_view(data).substr(at, 8192));
    }
    auto split = *StreamDigest::Create(algorithm);
    split->AddChunk(2, 4096, absl::string_view(data).substr(0, 50000));
    split->AddChunk(2, 54096, absl::string_view(data).substr(50000));
    const std::string expected = whole->Finish();
    EXPECT_EQ(pieces->Finish(), expected);
    EXPECT_NE(split->Finish(), expected);
  }
}

}  // namespace
}  // namespace swarm
