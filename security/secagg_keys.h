// A site's secure-aggregation key for one job, as the other sites get it
// (design section 10): the X25519 public key (secagg_crypto.h), signed with
// the site's certificate key so that no site on the way, nor the job's
// aggregator, can substitute its own key and read the site's pairwise masks.
// The signed message is kAgreementKeyDomain, the job id, the site's name and
// the public key, each length-prefixed: a key signed for one job or one site
// is not taken for another, and the domain keeps these signatures apart from
// model signatures made with the same certificate key.
//
// The private key stays in the site's workspace, mode 0600, so that the key
// survives a restart and a resume of the job (LoadOrCreateAgreementKey).
#ifndef SWARM_SECURITY_SECAGG_KEYS_H_
#define SWARM_SECURITY_SECAGG_KEYS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "security/model_signature.h"
#include "security/secagg_crypto.h"

namespace swarm::security {

inline constexpr char kAgreementKeyDomain[] =
    "swarm secure aggregation public key v1";

struct SignedAgreementKey {
  std::string site;
  std::string public_key;  // 32 raw bytes.
  std::string signature;   // By the site's certificate key.
  std::string certificate_pem;
};

// The bytes signed for `site`'s `public_key` in `job_id`. Exposed for tests.
std::string AgreementKeyMessage(absl::string_view job_id,
                                absl::string_view site,
                                absl::string_view public_key);

// `key`'s public half for `job_id`, signed by `signer` (the site named in
// its certificate).
absl::StatusOr<SignedAgreementKey> SignAgreementKey(const ModelSigner& signer,
                                                    absl::string_view job_id,
                                                    const AgreementKey& key);

// Checks that `key` is `key.site`'s for `job_id`: its certificate chains to
// the job's CA and names the site, the key is 32 bytes, the signature
// verifies. PermissionDenied / InvalidArgument naming the site otherwise.
absl::Status VerifyAgreementKey(const ModelSignatureVerifier& verifier,
                                absl::string_view job_id,
                                const SignedAgreementKey& key);

// The site's key for a job, from `path` if the file exists (32 raw bytes),
// else a new one written there first (mode 0600, atomically). DataLoss for
// a file that is not a key.
absl::StatusOr<AgreementKey> LoadOrCreateAgreementKey(const std::string& path);

}  // namespace swarm::security

#endif  // SWARM_SECURITY_SECAGG_KEYS_H_
