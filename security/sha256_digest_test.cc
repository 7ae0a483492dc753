#include "security/sha256_digest.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "streaming/chunker.h"

namespace swarm::security {
namespace {

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

// FIPS 180-2's "abc" vector, fed as raw bytes (no chunk prefix).
TEST(Sha256DigestTest, KnownAnswer) {
  std::unique_ptr<StreamDigest> digest = NewSha256StreamDigest();
  digest->AddChunkBytes("abc");
  EXPECT_EQ(Hex(digest->Finish()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Each chunk's prefix is tensor_index (u32 LE), offset (u64 LE) and length
// (u64 LE): offsets and lengths past 4 GiB keep their high bits.
TEST(Sha256DigestTest, ChunkPrefixKeepsAllSixtyFourBits) {
  std::unique_ptr<StreamDigest> framed = NewSha256StreamDigest();
  framed->BeginChunk(0x01020304, 0x0000000512345678ull, 0x0000000140000000ull);
  std::unique_ptr<StreamDigest> raw = NewSha256StreamDigest();
  const unsigned char prefix[20] = {
      0x04, 0x03, 0x02, 0x01,                          // tensor_index
      0x78, 0x56, 0x34, 0x12, 0x05, 0x00, 0x00, 0x00,  // offset
      0x00, 0x00, 0x00, 0x40, 0x01, 0x00, 0x00, 0x00,  // length
  };
  raw->AddChunkBytes(
      absl::string_view(reinterpret_cast<const char*>(prefix), sizeof(prefix)));
  EXPECT_EQ(framed->Finish(), raw->Finish());
}

// Digesting a chunk in pieces equals digesting it whole; a different split
// of the same bytes into chunks does not.
TEST(Sha256DigestTest, PiecesEqualTheWholeChunk) {
  const std::string data(100000, 'x');
  std::unique_ptr<StreamDigest> whole = NewSha256StreamDigest();
  whole->AddChunk(2, 4096, data);
  std::unique_ptr<StreamDigest> pieces = NewSha256StreamDigest();
  pieces->BeginChunk(2, 4096, data.size());
  for (size_t at = 0; at < data.size(); at += 8192) {
    pieces->AddChunkBytes(absl::string_view(data).substr(at, 8192));
  }
  std::unique_ptr<StreamDigest> split = NewSha256StreamDigest();
  split->AddChunk(2, 4096, absl::string_view(data).substr(0, 50000));
  split->AddChunk(2, 54096, absl::string_view(data).substr(50000));
  const std::string expected = whole->Finish();
  EXPECT_EQ(expected.size(), 32u);
  EXPECT_EQ(pieces->Finish(), expected);
  EXPECT_NE(split->Finish(), expected);
}

// Registered, it is what a SHA-256 stream's chunker digests with: the
// trailer changes with the model.
TEST(Sha256DigestTest, RegisteredForChunkers) {
  RegisterSha256StreamDigest();
  RegisterSha256StreamDigest();  // Idempotent.
  std::vector<TensorSpec> specs = {*MakeTensorSpec("w", v1::DTYPE_F32, {64})};
  auto model = std::make_shared<Model>(*Model::Create(std::move(specs)));
  auto digest_of = [](std::shared_ptr<const Model> m) {
    v1::ModelHeader header;
    header.set_digest_algorithm(v1::DIGEST_SHA256);
    absl::StatusOr<std::unique_ptr<Chunker>> chunker =
        Chunker::Create(m, header, 4096);
    EXPECT_TRUE(chunker.ok()) << chunker.status();
    if (!chunker.ok()) return std::string();
    while ((*chunker)->NextChunk()) {
    }
    return (*chunker)->Trailer().digest();
  };
  const std::string before = digest_of(model);
  EXPECT_EQ(before.size(), 32u);
  auto changed = std::make_shared<Model>(*model->Clone());
  changed->mutable_tensor_data(0)[3] ^= 1;
  EXPECT_NE(digest_of(changed), before);
}

}  // namespace
}  // namespace swarm::security
