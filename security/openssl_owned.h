// Owning pointers to OpenSSL objects and the error queue, for the .cc files
// of security/ (the only layer that sees OpenSSL). Internal: not for the
// layers above.
#ifndef SWARM_SECURITY_OPENSSL_OWNED_H_
#define SWARM_SECURITY_OPENSSL_OWNED_H_

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <string>

namespace swarm::security {

struct OpenSslDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
  void operator()(ASN1_TIME* p) const { ASN1_TIME_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
  void operator()(ECDSA_SIG* p) const { ECDSA_SIG_free(p); }
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
  void operator()(EVP_KDF* p) const { EVP_KDF_free(p); }
  void operator()(EVP_KDF_CTX* p) const { EVP_KDF_CTX_free(p); }
};

// An OpenSSL object freed with its own free function.
template <typename T>
using Owned = std::unique_ptr<T, OpenSslDeleter>;

// The OpenSSL error queue, emptied (so that it does not leak into the next
// caller's error on this thread) and joined for a message.
inline std::string DrainOpenSslErrors() {
  std::string detail;
  while (unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    if (!detail.empty()) detail += "; ";
    detail += buffer;
  }
  return detail;
}

}  // namespace swarm::security

#endif  // SWARM_SECURITY_OPENSSL_OWNED_H_
