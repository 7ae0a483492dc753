#include "security/certificates.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "security/openssl_owned.h"

namespace swarm::security {
namespace {

// The OpenSSL error queue, emptied into a status.
absl::Status OpenSslError(absl::string_view what) {
  const std::string detail = DrainOpenSslErrors();
  return absl::InternalError(
      absl::StrCat(what, detail.empty() ? "" : ": ", detail));
}

absl::StatusOr<Owned<EVP_PKEY>> NewKey(
    KeyAlgorithm algorithm = KeyAlgorithm::kEcP256) {
  if (algorithm == KeyAlgorithm::kRsa2048) {
    Owned<EVP_PKEY> key(EVP_RSA_gen(2048));
    if (key == nullptr) return OpenSslError("generating an RSA 2048 key");
    return key;
  }
  Owned<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("generating an EC P-256 key");
  return key;
}

absl::StatusOr<std::string> KeyToPem(EVP_PKEY* key) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr,
                                nullptr)) {
    return OpenSslError("encoding a private key");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, size);
}

absl::StatusOr<std::string> CertToPem(X509* cert) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(bio.get(), cert)) {
    return OpenSslError("encoding a certificate");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, size);
}

absl::StatusOr<Owned<X509>> CertFromPem(absl::string_view pem) {
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Owned<X509> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return OpenSslError("reading a PEM certificate");
  return cert;
}

absl::StatusOr<Owned<EVP_PKEY>> KeyFromPem(absl::string_view pem) {
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Owned<EVP_PKEY> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) return OpenSslError("reading a PEM private key");
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid,
                          const std::string& value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> extension(
      X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str()));
  if (extension == nullptr || !X509_add_ext(cert, extension.get(), -1)) {
    return OpenSslError(
        absl::StrCat("adding extension ", OBJ_nid2sn(nid), "=", value));
  }
  return absl::OkStatus();
}

absl::Status SetTime(X509* cert, bool before, absl::Time when) {
  Owned<ASN1_TIME> time(ASN1_TIME_set(nullptr, absl::ToTimeT(when)));
  if (time == nullptr || !(before ? X509_set1_notBefore(cert, time.get())
                                  : X509_set1_notAfter(cert, time.get()))) {
    return OpenSslError("setting the validity period");
  }
  return absl::OkStatus();
}

absl::Status SetSubject(X509* cert, absl::string_view common_name,
                        absl::string_view role) {
  X509_NAME* name = X509_get_subject_name(cert);
  const std::string cn(common_name);
  const std::string ou(role);
  if (!X509_NAME_add_entry_by_txt(
          name, "O", MBSTRING_UTF8,
          reinterpret_cast<const unsigned char*>("swarm"), -1, -1, 0) ||
      !X509_NAME_add_entry_by_txt(
          name, "OU", MBSTRING_UTF8,
          reinterpret_cast<const unsigned char*>(ou.c_str()), -1, -1, 0) ||
      !X509_NAME_add_entry_by_txt(
          name, "CN", MBSTRING_UTF8,
          reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0)) {
    return OpenSslError(absl::StrCat("setting the subject CN=", common_name));
  }
  return absl::OkStatus();
}

absl::Status SetRandomSerial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return OpenSslError("drawing a serial number");
  }
  bytes[0] &= 0x7f;  // Positive.
  Owned<BIGNUM> number(BN_bin2bn(bytes, sizeof(bytes), nullptr));
  if (number == nullptr ||
      BN_to_ASN1_INTEGER(number.get(), X509_get_serialNumber(cert)) ==
          nullptr) {
    return OpenSslError("setting the serial number");
  }
  return absl::OkStatus();
}

std::string NameEntry(X509_NAME* name, int nid) {
  const int index = X509_NAME_get_index_by_NID(name, nid, -1);
  if (index < 0) return "";
  ASN1_STRING* data =
      X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  unsigned char* utf8 = nullptr;
  const int size = ASN1_STRING_to_UTF8(&utf8, data);
  if (size < 0) return "";
  std::string text(reinterpret_cast<char*>(utf8), size);
  OPENSSL_free(utf8);
  return text;
}

absl::Time FromAsn1(const ASN1_TIME* time) {
  struct tm parts = {};
  if (ASN1_TIME_to_tm(time, &parts) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&parts));
}

}  // namespace

bool IsIpAddress(absl::string_view host) {
  const std::string text(host);
  unsigned char buffer[16];
  return inet_pton(AF_INET, text.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, text.c_str(), buffer) == 1;
}

absl::StatusOr<KeyAndCert> CreateCa(absl::string_view name,
                                    absl::Duration validity) {
  SWARM_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, NewKey());
  Owned<X509> cert(X509_new());
  X509_set_version(cert.get(), 2);
  SWARM_RETURN_IF_ERROR(SetRandomSerial(cert.get()));
  const absl::Time start = absl::Now() - absl::Hours(1);
  SWARM_RETURN_IF_ERROR(SetTime(cert.get(), true, start));
  SWARM_RETURN_IF_ERROR(SetTime(cert.get(), false, start + validity));
  SWARM_RETURN_IF_ERROR(SetSubject(cert.get(), name, kCaRole));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  X509_set_pubkey(cert.get(), key.get());
  SWARM_RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(),
                                     NID_basic_constraints,
                                     "critical,CA:TRUE,pathlen:0"));
  SWARM_RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_key_usage,
                                     "critical,keyCertSign,cRLSign"));
  SWARM_RETURN_IF_ERROR(
      AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (!X509_sign(cert.get(), key.get(), EVP_sha256())) {
    return OpenSslError("signing the CA certificate");
  }
  KeyAndCert out;
  SWARM_ASSIGN_OR_RETURN(out.key_pem, KeyToPem(key.get()));
  SWARM_ASSIGN_OR_RETURN(out.cert_pem, CertToPem(cert.get()));
  return out;
}

absl::StatusOr<KeyAndCert> IssueCertificate(const KeyAndCert& ca,
                                            const CertRequest& request) {
  if (request.common_name.empty()) {
    return absl::InvalidArgumentError("a certificate needs a common name");
  }
  if (request.role != kSiteRole && request.role != kAdminRole) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown certificate role \"", request.role, "\""));
  }
  SWARM_ASSIGN_OR_RETURN(Owned<X509> ca_cert, CertFromPem(ca.cert_pem));
  SWARM_ASSIGN_OR_RETURN(Owned<EVP_PKEY> ca_key, KeyFromPem(ca.key_pem));
  SWARM_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, NewKey(request.key_algorithm));
  Owned<X509> cert(X509_new());
  X509_set_version(cert.get(), 2);
  SWARM_RETURN_IF_ERROR(SetRandomSerial(cert.get()));
  const absl::Time start = request.not_before == absl::InfinitePast()
                               ? absl::Now() - absl::Hours(1)
                               : request.not_before;
  const absl::Time end = request.not_after == absl::InfinitePast()
                             ? start + absl::Hours(24 * 730)
                             : request.not_after;
  SWARM_RETURN_IF_ERROR(SetTime(cert.get(), true, start));
  SWARM_RETURN_IF_ERROR(SetTime(cert.get(), false, end));
  SWARM_RETURN_IF_ERROR(
      SetSubject(cert.get(), request.common_name, request.role));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
  X509_set_pubkey(cert.get(), key.get());
  SWARM_RETURN_IF_ERROR(AddExtension(
      cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE"));
  // An EC key agrees on TLS keys (ECDHE); an RSA key may also encipher them.
  SWARM_RETURN_IF_ERROR(
      AddExtension(cert.get(), ca_cert.get(), NID_key_usage,
                   request.key_algorithm == KeyAlgorithm::kRsa2048
                       ? "critical,digitalSignature,keyEncipherment"
                       : "critical,digitalSignature,keyAgreement"));
  SWARM_RETURN_IF_ERROR(AddExtension(
      cert.get(), ca_cert.get(), NID_ext_key_usage, "serverAuth,clientAuth"));
  SWARM_RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(),
                                     NID_subject_key_identifier, "hash"));
  SWARM_RETURN_IF_ERROR(AddExtension(
      cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always"));
  std::vector<std::string> names;
  for (const std::string& dns : request.dns_names)
    names.push_back("DNS:" + dns);
  for (const std::string& ip : request.ip_addresses)
    names.push_back("IP:" + ip);
  if (!names.empty()) {
    SWARM_RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(),
                                       NID_subject_alt_name,
                                       absl::StrJoin(names, ",")));
  }
  if (!X509_sign(cert.get(), ca_key.get(), EVP_sha256())) {
    return OpenSslError(
        absl::StrCat("signing the certificate of ", request.common_name));
  }
  KeyAndCert out;
  SWARM_ASSIGN_OR_RETURN(out.key_pem, KeyToPem(key.get()));
  SWARM_ASSIGN_OR_RETURN(out.cert_pem, CertToPem(cert.get()));
  return out;
}

absl::StatusOr<CertInfo> ParseCertificate(absl::string_view cert_pem) {
  SWARM_ASSIGN_OR_RETURN(Owned<X509> cert, CertFromPem(cert_pem));
  CertInfo info;
  X509_NAME* subject = X509_get_subject_name(cert.get());
  info.common_name = NameEntry(subject, NID_commonName);
  info.role = NameEntry(subject, NID_organizationalUnitName);
  info.not_before = FromAsn1(X509_get0_notBefore(cert.get()));
  info.not_after = FromAsn1(X509_get0_notAfter(cert.get()));
  info.is_ca = X509_check_ca(cert.get()) > 0;
  Owned<GENERAL_NAMES> names(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
      if (name->type == GEN_DNS) {
        const ASN1_STRING* dns = name->d.dNSName;
        info.dns_names.emplace_back(
            reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
            ASN1_STRING_length(dns));
      } else if (name->type == GEN_IPADD) {
        const ASN1_OCTET_STRING* ip = name->d.iPAddress;
        char text[INET6_ADDRSTRLEN] = {};
        const int family = ASN1_STRING_length(ip) == 4 ? AF_INET : AF_INET6;
        if (inet_ntop(family, ASN1_STRING_get0_data(ip), text, sizeof(text))) {
          info.ip_addresses.emplace_back(text);
        }
      }
    }
  }
  return info;
}

}  // namespace swarm::security
