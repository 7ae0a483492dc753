#include "streaming/digest.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace swarm {
namespace {

std::string Finish(StreamDigest* digest) { return digest->Finish(); }

// Each chunk's prefix is tensor_index (u32 LE), offset (u64 LE) and length
// (u64 LE): offsets and lengths past 4 GiB keep their high bits (the same
// for SHA-256: security/sha256_digest_test.cc).
TEST(StreamDigestTest, ChunkPrefixKeepsAllSixtyFourBits) {
  for (v1::DigestAlgorithm algorithm : {v1::DIGEST_XXH3_128}) {
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

// A stand-in for a registered implementation: counts the bytes it saw.
class CountingDigest final : public StreamDigest {
 public:
  std::string Finish() override { return std::to_string(bytes_); }

 protected:
  void Update(const void* data, size_t size) override { bytes_ += size; }

 private:
  size_t bytes_ = 0;
};

std::unique_ptr<StreamDigest> NewCountingDigest() {
  return std::make_unique<CountingDigest>();
}

// The core has no SHA-256 of its own (it links no libcrypto): until a
// program registers one, asking for it fails and says where it lives.
TEST(StreamDigestTest, Sha256NeedsARegisteredImplementation) {
  absl::StatusOr<std::unique_ptr<StreamDigest>> missing =
      StreamDigest::Create(v1::DIGEST_SHA256);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("RegisterSha256StreamDigest"),
            std::string::npos)
      << missing.status();

  ASSERT_TRUE(RegisterStreamDigest(v1::DIGEST_SHA256, &NewCountingDigest).ok());
  absl::StatusOr<std::unique_ptr<StreamDigest>> counting =
      StreamDigest::Create(v1::DIGEST_SHA256);
  ASSERT_TRUE(counting.ok()) << counting.status();
  (*counting)->AddChunk(0, 0, "12345");
  EXPECT_EQ((*counting)->Finish(), "25");  // 20 bytes of prefix, 5 of data.
  ASSERT_TRUE(RegisterStreamDigest(v1::DIGEST_SHA256, nullptr).ok());
  EXPECT_FALSE(StreamDigest::Create(v1::DIGEST_SHA256).ok());
}

TEST(StreamDigestTest, OnlySha256CanBeRegistered) {
  EXPECT_EQ(
      RegisterStreamDigest(v1::DIGEST_XXH3_128, &NewCountingDigest).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegisterStreamDigest(static_cast<v1::DigestAlgorithm>(77),
                                 &NewCountingDigest)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swarm
