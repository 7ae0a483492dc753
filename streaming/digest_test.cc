#include "streaming/digest.h"

#include <string>

#include "gtest/gtest.h"

namespace swarm {
namespace {

std::string Finish(StreamDigest* digest) { return digest->Finish(); }

// Each chunk's prefix is tensor_index (u32 LE), offset (u64 LE) and length
// (u64 LE): offsets and lengths past 4 GiB keep their high bits.
TEST(StreamDigestTest, ChunkPrefixKeepsAllSixtyFourBits) {
  for (v1::DigestAlgorithm algorithm :
       {v1::DIGEST_XXH3_128, v1::DIGEST_SHA256}) {
    auto framed = *StreamDigest::Create(algorithm);
    framed->BeginChunk(0x01020304, 0x0000000512345678ull,
                       0x0000000140000000ull);
    auto raw = *StreamDigest::Create(algorithm);
    const unsigned char prefix[20] = {
        0x04, 0x03, 0x02, 0x01,                          // tensor_index
        0x78, 0x56, 0x34, 0x12, 0x05, 0x00, 0x00, 0x00,  // offset
        0x00, 0x00, 0x00, 0x40, 0x01, 0x00, 0x00, 0x00,  // length
    };
    raw->AddChunkBytes(absl::string_view(reinterpret_cast<const char*>(prefix),
                                         sizeof(prefix)));
    EXPECT_EQ(Finish(framed.get()), Finish(raw.get()));
  }
}

TEST(StreamDigestTest, OffsetsFourGiBApartDiffer) {
  auto low = *StreamDigest::Create(v1::DIGEST_XXH3_128);
  low->AddChunk(0, 0, "chunk");
  auto high = *StreamDigest::Create(v1::DIGEST_XXH3_128);
  high->AddChunk(0, 1ull << 32, "chunk");
  EXPECT_NE(Finish(low.get()), Finish(high.get()));
}

}  // namespace
}  // namespace swarm
