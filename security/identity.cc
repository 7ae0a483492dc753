#include "security/identity.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "persist/atomic_file.h"
#include "security/certificates.h"

namespace swarm::security {
namespace {

// Verifies `cert_pem` against `ca_pem` with OpenSSL (chain and validity).
absl::Status VerifyAgainstCa(const std::string& cert_pem,
                             const std::string& ca_pem,
                             const std::string& where) {
  BIO* cert_bio =
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  BIO* ca_bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  X509* ca = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  BIO_free(ca_bio);
  absl::Status status;
  if (cert == nullptr || ca == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat(where, ": cert.pem or ca.crt is not a PEM certificate"));
  } else {
    X509_STORE* store = X509_STORE_new();
    X509_STORE_add_cert(store, ca);
    X509_STORE_CTX* context = X509_STORE_CTX_new();
    X509_STORE_CTX_init(context, store, cert, nullptr);
    if (X509_verify_cert(context) != 1) {
      status = absl::FailedPreconditionError(absl::StrCat(
          where, ": cert.pem does not verify against ca.crt: ",
          X509_verify_cert_error_string(X509_STORE_CTX_get_error(context))));
    }
    X509_STORE_CTX_free(context);
    X509_STORE_free(store);
  }
  X509_free(cert);
  X509_free(ca);
  return status;
}

// Checks that the private key in `key_pem` belongs to the certificate in
// `cert_pem` (a swapped or stale key.pem would otherwise only show as failed
// handshakes once peers call).
absl::Status CheckKeyMatchesCertificate(const std::string& key_pem,
                                        const std::string& cert_pem,
                                        const std::string& dir) {
  BIO* key_bio =
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  BIO* cert_bio =
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  BIO_free(cert_bio);
  absl::Status status;
  if (key == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat(dir, "/key.pem: not a PEM private key"));
  } else if (cert != nullptr && X509_check_private_key(cert, key) != 1) {
    status = absl::FailedPreconditionError(absl::StrCat(
        dir, "/key.pem does not match the certificate ", dir, "/cert.pem"));
  }
  ERR_clear_error();
  EVP_PKEY_free(key);
  X509_free(cert);
  return status;
}

}  // namespace

absl::StatusOr<TlsIdentity> LoadTlsIdentity(const std::string& dir) {
  TlsIdentity identity;
  SWARM_ASSIGN_OR_RETURN(identity.key_pem,
                         persist::ReadFileToString(dir + "/key.pem"));
  SWARM_ASSIGN_OR_RETURN(identity.cert_pem,
                         persist::ReadFileToString(dir + "/cert.pem"));
  SWARM_ASSIGN_OR_RETURN(identity.ca_pem,
                         persist::ReadFileToString(dir + "/ca.crt"));
  SWARM_RETURN_IF_ERROR(
      VerifyAgainstCa(identity.cert_pem, identity.ca_pem, dir));
  SWARM_RETURN_IF_ERROR(
      CheckKeyMatchesCertificate(identity.key_pem, identity.cert_pem, dir));
  SWARM_ASSIGN_OR_RETURN(CertInfo info, ParseCertificate(identity.cert_pem));
  identity.name = info.common_name;
  identity.role = info.role;
  return identity;
}

}  // namespace swarm::security
