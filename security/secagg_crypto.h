// The cryptography of secure aggregation (design section 10), over OpenSSL:
// the X25519 key pair a site agrees on pairwise mask seeds with, the seed of
// one pair for one round and attempt (ECDH, then HKDF-SHA256 over the job,
// the round, the attempt and the two names), the mask PRG (AES-256-CTR
// keystream, read as little-endian 32-bit words), and random bytes. The
// arithmetic they feed is in secagg/ (no OpenSSL there).
#ifndef SWARM_SECURITY_SECAGG_CRYPTO_H_
#define SWARM_SECURITY_SECAGG_CRYPTO_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "secagg/masking.h"

namespace swarm::security {

// Random bytes from OpenSSL's CSPRNG (RAND_bytes); INTERNAL if it failed.
absl::Status SecureRandomBytes(absl::Span<uint8_t> out);

// Where a pairwise seed is used: one job, one round, one attempt of it, one
// pair of sites (the order of the two names does not matter).
struct PairContext {
  std::string job_id;
  uint32_t round = 0;
  uint32_t attempt = 0;
  std::string site_a;
  std::string site_b;
};

// A site's X25519 key-agreement key pair for one job.
class AgreementKey {
 public:
  static absl::StatusOr<AgreementKey> Generate();
  // From the 32 raw private-key bytes (as private_key() returns them).
  static absl::StatusOr<AgreementKey> FromPrivateKey(absl::string_view raw);
  AgreementKey(AgreementKey&&) noexcept;
  AgreementKey& operator=(AgreementKey&&) noexcept;
  ~AgreementKey();

  // 32 raw bytes each (RFC 7748).
  std::string private_key() const;
  std::string public_key() const;

  // The seed this site and the owner of `peer_public_key` share for
  // `context`: HKDF-SHA256 of their X25519 secret. INVALID_ARGUMENT for a
  // key that is not 32 bytes or gives the all-zero secret (a small-order
  // point: an attacker's key).
  absl::StatusOr<secagg::Seed> PairSeed(absl::string_view peer_public_key,
                                        const PairContext& context) const;

 private:
  struct Key;
  explicit AgreementKey(std::unique_ptr<Key> key);
  // One half of the key pair, raw.
  std::string RawKey(bool private_half) const;
  std::unique_ptr<Key> key_;
};

// HKDF (RFC 5869) with SHA-256: `length` bytes from `key`, `salt`, `info`.
absl::StatusOr<std::string> HkdfSha256(absl::string_view key,
                                       absl::string_view salt,
                                       absl::string_view info, size_t length);

// AES-256-CTR keystream XORed into `data` (encrypting or decrypting), the
// counter block starting at `iv` (16 bytes) and counting up big-endian.
absl::Status AesCtrXor(absl::string_view key, absl::string_view iv,
                       absl::Span<uint8_t> data);

// The mask PRG: word k of a seed's stream is bytes 4k..4k+3 (little-endian)
// of the AES-256-CTR keystream keyed by the seed, counter from 0.
class AesCtrMaskGenerator final : public secagg::MaskGenerator {
 public:
  absl::Status Apply(const secagg::Seed& seed, bool subtract, uint64_t offset,
                     absl::Span<uint32_t> values) const override;
};

}  // namespace swarm::security

#endif  // SWARM_SECURITY_SECAGG_CRYPTO_H_
