#include "security/sha256_digest.h"

#include <openssl/evp.h>

#include "absl/status/status.h"
#include "common/logging.h"

namespace swarm::security {
namespace {

class Sha256Digest final : public StreamDigest {
 public:
  Sha256Digest() : ctx_(EVP_MD_CTX_new()) {
    EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
  }
  ~Sha256Digest() override { EVP_MD_CTX_free(ctx_); }
  Sha256Digest(const Sha256Digest&) = delete;
  Sha256Digest& operator=(const Sha256Digest&) = delete;

  std::string Finish() override {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(ctx_, out, &size);
    return std::string(reinterpret_cast<const char*>(out), size);
  }

 protected:
  void Update(const void* data, size_t size) override {
    EVP_DigestUpdate(ctx_, data, size);
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

std::unique_ptr<StreamDigest> NewSha256StreamDigest() {
  return std::make_unique<Sha256Digest>();
}

void RegisterSha256StreamDigest() {
  // Cannot fail: DIGEST_SHA256 is the one registrable algorithm.
  const absl::Status registered =
      RegisterStreamDigest(v1::DIGEST_SHA256, &NewSha256StreamDigest);
  if (!registered.ok()) {
    SWARM_LOG_ERROR("registering SHA-256: %s", registered.message());
  }
}

}  // namespace swarm::security
