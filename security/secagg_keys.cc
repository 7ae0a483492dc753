#include "security/secagg_keys.h"

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "persist/atomic_file.h"
#include "security/provision.h"

namespace swarm::security {
namespace {

void AppendField(std::string* out, absl::string_view field) {
  uint64_t length = field.size();
  for (int i = 0; i < 8; ++i) {
    out->push_back(static_cast<char>((length >> (8 * i)) & 0xFF));
  }
  out->append(field.data(), field.size());
}

std::string Describe(absl::string_view job_id, absl::string_view site) {
  return absl::StrCat("the secure-aggregation key of ", site, " for job ",
                      job_id);
}

}  // namespace

std::string AgreementKeyMessage(absl::string_view job_id,
                                absl::string_view site,
                                absl::string_view public_key) {
  std::string message;
  AppendField(&message, kAgreementKeyDomain);
  AppendField(&message, job_id);
  AppendField(&message, site);
  AppendField(&message, public_key);
  return message;
}

absl::StatusOr<SignedAgreementKey> SignAgreementKey(const ModelSigner& signer,
                                                    absl::string_view job_id,
                                                    const AgreementKey& key) {
  SignedAgreementKey signed_key;
  signed_key.site = signer.name();
  signed_key.public_key = key.public_key();
  absl::StatusOr<std::string> signature = signer.SignBytes(
      AgreementKeyMessage(job_id, signed_key.site, signed_key.public_key),
      Describe(job_id, signed_key.site));
  if (!signature.ok()) return signature.status();
  signed_key.signature = *std::move(signature);
  signed_key.certificate_pem = signer.certificate_pem();
  return signed_key;
}

absl::Status VerifyAgreementKey(const ModelSignatureVerifier& verifier,
                                absl::string_view job_id,
                                const SignedAgreementKey& key) {
  if (key.public_key.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(job_id, key.site), " is ", key.public_key.size(),
                     " bytes; an X25519 public key is 32"));
  }
  return verifier.VerifyBytes(
      [&]() -> absl::StatusOr<std::string> {
        return AgreementKeyMessage(job_id, key.site, key.public_key);
      },
      key.signature, key.certificate_pem, key.site, Describe(job_id, key.site),
      absl::StrCat("it is not the key ", key.site,
                   " signed for this job (substituted on the way?)"));
}

absl::StatusOr<AgreementKey> LoadOrCreateAgreementKey(const std::string& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error)) {
    absl::StatusOr<std::string> raw = persist::ReadFileToString(path);
    if (!raw.ok()) return raw.status();
    absl::StatusOr<AgreementKey> key = AgreementKey::FromPrivateKey(*raw);
    if (!key.ok()) {
      return absl::DataLossError(absl::StrCat(
          path, " is not a secure-aggregation key: ", key.status().message()));
    }
    return key;
  }
  absl::StatusOr<AgreementKey> key = AgreementKey::Generate();
  if (!key.ok()) return key.status();
  if (absl::Status written = WriteSecretFile(path, key->private_key());
      !written.ok()) {
    return written;
  }
  return key;
}

}  // namespace swarm::security
