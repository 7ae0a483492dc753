#include "security/secagg_crypto.h"

#include <openssl/core_names.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "security/openssl_owned.h"

namespace swarm::security {
namespace {

absl::Status OpenSslError(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, " failed: ", DrainOpenSslErrors()));
}

void AppendBigEndian32(std::string* out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((value >> shift) & 0xFF));
  }
}

constexpr size_t kKeyBytes = 32;
constexpr absl::string_view kPairSalt = "swarm secure aggregation v1";

}  // namespace

absl::Status SecureRandomBytes(absl::Span<uint8_t> out) {
  if (out.empty()) return absl::OkStatus();
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return OpenSslError("RAND_bytes");
  }
  return absl::OkStatus();
}

struct AgreementKey::Key {
  Owned<EVP_PKEY> pkey;
};

AgreementKey::AgreementKey(std::unique_ptr<Key> key) : key_(std::move(key)) {}
AgreementKey::AgreementKey(AgreementKey&&) noexcept = default;
AgreementKey& AgreementKey::operator=(AgreementKey&&) noexcept = default;
AgreementKey::~AgreementKey() = default;

absl::StatusOr<AgreementKey> AgreementKey::Generate() {
  Owned<EVP_PKEY> pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519"));
  if (pkey == nullptr) return OpenSslError("X25519 key generation");
  auto key = std::make_unique<Key>();
  key->pkey = std::move(pkey);
  return AgreementKey(std::move(key));
}

absl::StatusOr<AgreementKey> AgreementKey::FromPrivateKey(
    absl::string_view raw) {
  if (raw.size() != kKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an X25519 private key is ", kKeyBytes, " bytes, not ", raw.size()));
  }
  Owned<EVP_PKEY> pkey(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_X25519, nullptr,
      reinterpret_cast<const unsigned char*>(raw.data()), raw.size()));
  if (pkey == nullptr) return OpenSslError("loading the X25519 private key");
  auto key = std::make_unique<Key>();
  key->pkey = std::move(pkey);
  return AgreementKey(std::move(key));
}

std::string AgreementKey::private_key() const {
  return RawKey(/*private_half=*/true);
}

std::string AgreementKey::public_key() const {
  return RawKey(/*private_half=*/false);
}

std::string AgreementKey::RawKey(bool private_half) const {
  std::string raw(kKeyBytes, '\0');
  size_t length = raw.size();
  auto* out = reinterpret_cast<unsigned char*>(raw.data());
  if (private_half) {
    EVP_PKEY_get_raw_private_key(key_->pkey.get(), out, &length);
  } else {
    EVP_PKEY_get_raw_public_key(key_->pkey.get(), out, &length);
  }
  raw.resize(length);
  return raw;
}

absl::StatusOr<secagg::Seed> AgreementKey::PairSeed(
    absl::string_view peer_public_key, const PairContext& context) const {
  if (peer_public_key.size() != kKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an X25519 public key is ",
                                                   kKeyBytes, " bytes, not ",
                                                   peer_public_key.size()));
  }
  Owned<EVP_PKEY> peer(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_X25519, nullptr,
      reinterpret_cast<const unsigned char*>(peer_public_key.data()),
      peer_public_key.size()));
  if (peer == nullptr) return OpenSslError("loading the peer's X25519 key");
  Owned<EVP_PKEY_CTX> derive(EVP_PKEY_CTX_new(key_->pkey.get(), nullptr));
  std::array<unsigned char, kKeyBytes> shared{};
  size_t length = shared.size();
  if (derive == nullptr || EVP_PKEY_derive_init(derive.get()) != 1 ||
      EVP_PKEY_derive_set_peer(derive.get(), peer.get()) != 1) {
    return OpenSslError("X25519 key agreement");
  }
  if (EVP_PKEY_derive(derive.get(), shared.data(), &length) != 1 ||
      length != kKeyBytes) {
    // OpenSSL refuses the all-zero secret of a small-order point.
    return absl::InvalidArgumentError(absl::StrCat(
        "the peer's X25519 public key gives no usable shared secret (",
        DrainOpenSslErrors(), ")"));
  }
  std::string info = context.job_id;
  info.push_back('\0');
  AppendBigEndian32(&info, context.round);
  AppendBigEndian32(&info, context.attempt);
  const bool ordered = context.site_a < context.site_b;
  absl::StrAppend(&info, ordered ? context.site_a : context.site_b);
  info.push_back('\0');
  absl::StrAppend(&info, ordered ? context.site_b : context.site_a);
  absl::StatusOr<std::string> okm =
      HkdfSha256(absl::string_view(reinterpret_cast<const char*>(shared.data()),
                                   shared.size()),
                 kPairSalt, info, kKeyBytes);
  OPENSSL_cleanse(shared.data(), shared.size());
  if (!okm.ok()) return okm.status();
  secagg::Seed seed;
  std::memcpy(seed.data(), okm->data(), seed.size());
  return seed;
}

absl::StatusOr<std::string> HkdfSha256(absl::string_view key,
                                       absl::string_view salt,
                                       absl::string_view info, size_t length) {
  Owned<EVP_KDF> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (kdf == nullptr) return OpenSslError("fetching HKDF");
  Owned<EVP_KDF_CTX> context(EVP_KDF_CTX_new(kdf.get()));
  if (context == nullptr) return OpenSslError("HKDF context");
  OSSL_PARAM params[5];
  OSSL_PARAM* p = params;
  *p++ = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST,
                                          const_cast<char*>("SHA256"), 0);
  *p++ = OSSL_PARAM_construct_octet_string(
      OSSL_KDF_PARAM_KEY, const_cast<char*>(key.data()), key.size());
  if (!salt.empty()) {
    *p++ = OSSL_PARAM_construct_octet_string(
        OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()), salt.size());
  }
  if (!info.empty()) {
    *p++ = OSSL_PARAM_construct_octet_string(
        OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()), info.size());
  }
  *p = OSSL_PARAM_construct_end();
  std::string out(length, '\0');
  if (EVP_KDF_derive(context.get(),
                     reinterpret_cast<unsigned char*>(out.data()), out.size(),
                     params) != 1) {
    return OpenSslError("HKDF-SHA256");
  }
  return out;
}

absl::Status AesCtrXor(absl::string_view key, absl::string_view iv,
                       absl::Span<uint8_t> data) {
  if (key.size() != 32 || iv.size() != 16) {
    return absl::InvalidArgumentError(
        "AES-256-CTR takes a 32-byte key and a 16-byte counter block");
  }
  Owned<EVP_CIPHER_CTX> cipher(EVP_CIPHER_CTX_new());
  if (cipher == nullptr ||
      EVP_EncryptInit_ex(cipher.get(), EVP_aes_256_ctr(), nullptr,
                         reinterpret_cast<const unsigned char*>(key.data()),
                         reinterpret_cast<const unsigned char*>(iv.data())) !=
          1) {
    return OpenSslError("AES-256-CTR set-up");
  }
  int written = 0;
  if (!data.empty() &&
      EVP_EncryptUpdate(cipher.get(), data.data(), &written, data.data(),
                        static_cast<int>(data.size())) != 1) {
    return OpenSslError("AES-256-CTR");
  }
  return absl::OkStatus();
}

absl::Status AesCtrMaskGenerator::Apply(const secagg::Seed& seed, bool subtract,
                                        uint64_t offset,
                                        absl::Span<uint32_t> values) const {
  if (values.empty()) return absl::OkStatus();
  // Start at the 16-byte block holding word `offset`.
  const uint64_t first_byte = offset * 4;
  const uint64_t block = first_byte / 16;
  const size_t skip = static_cast<size_t>(first_byte % 16);
  std::array<unsigned char, 16> counter{};
  for (int i = 0; i < 8; ++i) {
    counter[15 - i] = static_cast<unsigned char>((block >> (8 * i)) & 0xFF);
  }
  Owned<EVP_CIPHER_CTX> cipher(EVP_CIPHER_CTX_new());
  if (cipher == nullptr ||
      EVP_EncryptInit_ex(cipher.get(), EVP_aes_256_ctr(), nullptr, seed.data(),
                         counter.data()) != 1) {
    return OpenSslError("the mask PRG's AES-256-CTR set-up");
  }
  constexpr size_t kChunkWords = 4096;
  static const std::array<unsigned char, kChunkWords * 4 + 16> kZeros{};
  std::array<unsigned char, kChunkWords * 4 + 16> stream;
  int written = 0;
  if (skip > 0 &&
      EVP_EncryptUpdate(cipher.get(), stream.data(), &written, kZeros.data(),
                        static_cast<int>(skip)) != 1) {
    return OpenSslError("the mask PRG's AES-256-CTR");
  }
  for (size_t done = 0; done < values.size();) {
    const size_t words = std::min(kChunkWords, values.size() - done);
    if (EVP_EncryptUpdate(cipher.get(), stream.data(), &written, kZeros.data(),
                          static_cast<int>(words * 4)) != 1) {
      return OpenSslError("the mask PRG's AES-256-CTR");
    }
    uint32_t* out = values.data() + done;
    for (size_t k = 0; k < words; ++k) {
      const unsigned char* b = stream.data() + 4 * k;
      const uint32_t word =
          static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
          static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
      out[k] = subtract ? out[k] - word : out[k] + word;
    }
    done += words;
  }
  return absl::OkStatus();
}

}  // namespace swarm::security
