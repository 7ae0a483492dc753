#include "streaming/digest.h"

#include <xxhash.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace swarm {
namespace {

class Xxh3Digest final : public StreamDigest {
 public:
  Xxh3Digest() : state_(XXH3_createState()) { XXH3_128bits_reset(state_); }
  ~Xxh3Digest() override { XXH3_freeState(state_); }
  std::string Finish() override {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state_));
    return std::string(reinterpret_cast<const char*>(canonical.digest),
                       sizeof(canonical.digest));
  }

 protected:
  void Update(const void* data, size_t size) override {
    XXH3_128bits_update(state_, data, size);
  }

 private:
  XXH3_state_t* state_;
};

// The registered implementations, by algorithm value (DIGEST_SHA256 only,
// today; see RegisterStreamDigest).
std::atomic<StreamDigestMaker> registered_sha256{nullptr};

}  // namespace

absl::StatusOr<std::unique_ptr<StreamDigest>> StreamDigest::Create(
    v1::DigestAlgorithm algorithm) {
  switch (algorithm) {
    case v1::DIGEST_XXH3_128:
      return std::unique_ptr<StreamDigest>(new Xxh3Digest);
    case v1::DIGEST_SHA256: {
      const StreamDigestMaker maker = registered_sha256.load();
      if (maker == nullptr) {
        return absl::FailedPreconditionError(
            "digest algorithm DIGEST_SHA256 has no implementation in this "
            "program: it lives in security/ and the program must register it "
            "at start (security::RegisterSha256StreamDigest)");
      }
      return maker();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown digest algorithm ", static_cast<int>(algorithm)));
  }
}

absl::Status RegisterStreamDigest(v1::DigestAlgorithm algorithm,
                                  StreamDigestMaker maker) {
  if (algorithm != v1::DIGEST_SHA256) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest algorithm ", v1::DigestAlgorithm_Name(algorithm),
                     " (value ", static_cast<int>(algorithm),
                     ") cannot be registered: only DIGEST_SHA256 is (XXH3-128 "
                     "is built in)"));
  }
  registered_sha256.store(maker);
  return absl::OkStatus();
}

std::string ModelContentDigest(const Model& model) {
  Xxh3Digest digest;
  for (size_t i = 0; i < model.num_tensors(); ++i) {
    const TensorSpec& spec = model.spec(i);
    std::string table = absl::StrCat(spec.name, "\n", DTypeName(spec.dtype));
    for (uint64_t dim : spec.shape) absl::StrAppend(&table, ",", dim);
    const uint32_t index = static_cast<uint32_t>(i);
    digest.AddChunk(index, 0, table);
    digest.AddChunk(index, 1, model.tensor_data(i));
  }
  return digest.Finish();
}

void StreamDigest::AddChunk(uint32_t tensor_index, uint64_t offset,
                            absl::string_view data) {
  BeginChunk(tensor_index, offset, data.size());
  Update(data.data(), data.size());
}

void StreamDigest::BeginChunk(uint32_t tensor_index, uint64_t offset,
                              uint64_t length) {
  unsigned char prefix[20];
  for (int i = 0; i < 4; ++i) prefix[i] = (tensor_index >> (8 * i)) & 0xff;
  for (int i = 0; i < 8; ++i) prefix[4 + i] = (offset >> (8 * i)) & 0xff;
  for (int i = 0; i < 8; ++i) prefix[12 + i] = (length >> (8 * i)) & 0xff;
  Update(prefix, sizeof(prefix));
}

}  // namespace swarm
