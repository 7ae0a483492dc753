#include "security/model_signature.h"

#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "security/certificates.h"
#include "security/openssl_owned.h"

namespace swarm::security {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr size_t kSha256Size = 32;

Owned<X509> CertFromPem(absl::string_view pem) {
  if (pem.empty()) return nullptr;
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Owned<X509> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  DrainOpenSslErrors();
  return cert;
}

// The only entry `nid` of `name` as UTF-8; empty when there is none or more
// than one (a certificate naming two sites names none).
std::string SingleNameEntry(const X509_NAME* name, int nid) {
  const int index = X509_NAME_get_index_by_NID(name, nid, -1);
  if (index < 0 || X509_NAME_get_index_by_NID(name, nid, index) >= 0) {
    return "";
  }
  const ASN1_STRING* data =
      X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  unsigned char* utf8 = nullptr;
  const int size = ASN1_STRING_to_UTF8(&utf8, data);
  if (size < 0) {
    DrainOpenSslErrors();
    return "";
  }
  std::string text(reinterpret_cast<char*>(utf8), size);
  OPENSSL_free(utf8);
  return text;
}

bool IsSupportedKey(const EVP_PKEY* key) {
  const int id = EVP_PKEY_get_base_id(key);
  return id == EVP_PKEY_EC || id == EVP_PKEY_RSA;
}

// RSA signs with PSS, its salt as long as the digest; EC needs no options.
// Signer and verifier call this alike.
bool ConfigureSignature(const EVP_PKEY* key, EVP_PKEY_CTX* context) {
  if (EVP_PKEY_get_base_id(key) != EVP_PKEY_RSA) return true;
  return EVP_PKEY_CTX_set_rsa_padding(context, RSA_PKCS1_PSS_PADDING) > 0 &&
         EVP_PKEY_CTX_set_rsa_pss_saltlen(context, RSA_PSS_SALTLEN_DIGEST) > 0;
}

absl::string_view KindPhrase(v1::ModelKind kind) {
  switch (kind) {
    case v1::MODEL_KIND_LEARN_TASK:
      return "learn task";
    case v1::MODEL_KIND_RESULT:
      return "result";
    case v1::MODEL_KIND_BEST:
      return "best model";
    case v1::MODEL_KIND_LAST:
      return "last model";
    case v1::MODEL_KIND_ROUND_GLOBAL:
      return "round global model";
    default:
      return "model";
  }
}

// "site-a's learn task for round 3", for messages.
std::string Describe(const v1::ModelHeader& header) {
  return absl::StrCat(header.sender(), "'s ", KindPhrase(header.kind()),
                      " for round ", header.round());
}

absl::Status CheckStreamDigest(const v1::ModelHeader& header,
                               absl::string_view stream_digest) {
  if (header.digest_algorithm() != v1::DIGEST_SHA256) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(header), " is signed over a ",
        v1::DigestAlgorithm_Name(header.digest_algorithm()),
        " stream digest; a signed model needs DIGEST_SHA256 (XXH3 is not "
        "collision resistant: it does not pin the bytes)"));
  }
  if (stream_digest.size() != kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the stream digest of ", Describe(header), " is ", stream_digest.size(),
        " bytes; a SHA-256 digest is ", kSha256Size));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The canonical encoding of a message: for every field that is set
// (Reflection::ListFields: non-default proto3 scalars, present messages,
// non-empty repeated fields), in field number order: the field number (u32),
// then for a singular field its value, for a repeated field the count (u64)
// and each value, for a map the count and each entry's key and value, the
// entries sorted by their encoding (a map's order is unspecified). Values:
// integers and enums as u32 or u64 (two's complement), bool as one byte,
// float and double as their bits, strings and bytes and messages (encoded
// alike) with a u64 length before them. All little-endian. Unlike the wire
// format this depends on no serializer's choices (field order, map order,
// packing, unknown fields), so the signer's and the receiver's builds agree.
// ---------------------------------------------------------------------------

void PutU32(uint32_t value, std::string* out) {
  for (int i = 0; i < 4; ++i)
    out->push_back(static_cast<char>(value >> (8 * i)));
}
void PutU64(uint64_t value, std::string* out) {
  for (int i = 0; i < 8; ++i)
    out->push_back(static_cast<char>(value >> (8 * i)));
}
void PutBytes(absl::string_view bytes, std::string* out) {
  PutU64(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
}
template <typename To, typename From>
To BitsOf(From value) {
  static_assert(sizeof(To) == sizeof(From));
  To bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

absl::Status EncodeMessage(const Message& message, std::string* out);

// One value of `field` (index < 0: the singular field).
absl::Status EncodeValue(const Message& message, const FieldDescriptor* field,
                         int index, std::string* out) {
  const Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      PutU32(static_cast<uint32_t>(
                 repeated ? r->GetRepeatedInt32(message, field, index)
                          : r->GetInt32(message, field)),
             out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_UINT32:
      PutU32(repeated ? r->GetRepeatedUInt32(message, field, index)
                      : r->GetUInt32(message, field),
             out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_ENUM:
      PutU32(static_cast<uint32_t>(
                 repeated ? r->GetRepeatedEnumValue(message, field, index)
                          : r->GetEnumValue(message, field)),
             out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_INT64:
      PutU64(static_cast<uint64_t>(
                 repeated ? r->GetRepeatedInt64(message, field, index)
                          : r->GetInt64(message, field)),
             out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_UINT64:
      PutU64(repeated ? r->GetRepeatedUInt64(message, field, index)
                      : r->GetUInt64(message, field),
             out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL:
      out->push_back((repeated ? r->GetRepeatedBool(message, field, index)
                               : r->GetBool(message, field))
                         ? 1
                         : 0);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_FLOAT:
      PutU32(
          BitsOf<uint32_t>(repeated ? r->GetRepeatedFloat(message, field, index)
                                    : r->GetFloat(message, field)),
          out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_DOUBLE:
      PutU64(BitsOf<uint64_t>(repeated
                                  ? r->GetRepeatedDouble(message, field, index)
                                  : r->GetDouble(message, field)),
             out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& value =
          repeated
              ? r->GetRepeatedStringReference(message, field, index, &scratch)
              : r->GetStringReference(message, field, &scratch);
      PutBytes(value, out);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      std::string nested;
      SWARM_RETURN_IF_ERROR(
          EncodeMessage(repeated ? r->GetRepeatedMessage(message, field, index)
                                 : r->GetMessage(message, field),
                        &nested));
      PutBytes(nested, out);
      return absl::OkStatus();
    }
  }
  return absl::InternalError(
      absl::StrCat("field ", field->full_name(), " has an unknown type"));
}

// A map field: each entry's key and value (whether or not the entry message
// says they are set), the entries sorted.
absl::Status EncodeMap(const Message& message, const FieldDescriptor* field,
                       std::string* out) {
  const Reflection* r = message.GetReflection();
  const int count = r->FieldSize(message, field);
  std::vector<std::string> entries(count);
  for (int i = 0; i < count; ++i) {
    const Message& entry = r->GetRepeatedMessage(message, field, i);
    for (const FieldDescriptor* part : {field->message_type()->map_key(),
                                        field->message_type()->map_value()}) {
      SWARM_RETURN_IF_ERROR(EncodeValue(entry, part, -1, &entries[i]));
    }
  }
  std::sort(entries.begin(), entries.end());
  PutU64(entries.size(), out);
  for (const std::string& entry : entries) out->append(entry);
  return absl::OkStatus();
}

// True for the fields of ModelHeader that the signature does not cover:
// the signature itself, the certificate that checks it, and the forward
// list that each forwarder shortens (relay_to: where the stream goes next
// changes nothing the receiver stores or acts on).
bool IsExcludedHeaderField(const FieldDescriptor* field) {
  return field->containing_type() == v1::ModelHeader::descriptor() &&
         (field->number() == v1::ModelHeader::kDigestSignatureFieldNumber ||
          field->number() ==
              v1::ModelHeader::kSignerCertificatePemFieldNumber ||
          field->number() == v1::ModelHeader::kRelayToFieldNumber);
}

absl::Status EncodeMessage(const Message& message, std::string* out) {
  const Reflection* r = message.GetReflection();
  if (!r->GetUnknownFields(message).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        message.GetDescriptor()->full_name(),
        " carries fields this build does not know (from a newer sender?); "
        "they cannot be checked against the signature"));
  }
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(message, &fields);  // In field number order.
  for (const FieldDescriptor* field : fields) {
    if (IsExcludedHeaderField(field)) continue;
    PutU32(static_cast<uint32_t>(field->number()), out);
    if (field->is_map()) {
      SWARM_RETURN_IF_ERROR(EncodeMap(message, field, out));
    } else if (field->is_repeated()) {
      const int count = r->FieldSize(message, field);
      PutU64(count, out);
      for (int i = 0; i < count; ++i) {
        SWARM_RETURN_IF_ERROR(EncodeValue(message, field, i, out));
      }
    } else {
      SWARM_RETURN_IF_ERROR(EncodeValue(message, field, -1, out));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ModelSignatureMessage(
    const v1::ModelHeader& header, absl::string_view stream_digest) {
  std::string message;
  PutBytes(kModelSignatureDomain, &message);
  PutBytes(stream_digest, &message);
  std::string encoded_header;
  absl::Status status = EncodeMessage(header, &encoded_header);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the header of ", Describe(header), ": ", status.message()));
  }
  PutBytes(encoded_header, &message);
  return message;
}

// ---------------------------------------------------------------------------
// ModelSigner
// ---------------------------------------------------------------------------

struct ModelSigner::State {
  Owned<EVP_PKEY> key;
  std::string certificate_pem;
  std::string name;
};

ModelSigner::ModelSigner(std::shared_ptr<const State> state)
    : state_(std::move(state)) {}

absl::StatusOr<ModelSigner> ModelSigner::Create(absl::string_view key_pem,
                                                absl::string_view cert_pem) {
  auto state = std::make_shared<State>();
  if (!key_pem.empty()) {
    Owned<BIO> bio(
        BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
    state->key.reset(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    DrainOpenSslErrors();
  }
  if (state->key == nullptr) {
    return absl::InvalidArgumentError(
        "model signer: the key is not a PEM private key");
  }
  if (!IsSupportedKey(state->key.get())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model signer: the key is ", EVP_PKEY_get0_type_name(state->key.get()),
        "; model signatures use EC or RSA keys"));
  }
  Owned<X509> cert = CertFromPem(cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        "model signer: the certificate is not a PEM certificate");
  }
  if (X509_check_private_key(cert.get(), state->key.get()) != 1) {
    DrainOpenSslErrors();
    return absl::FailedPreconditionError(
        "model signer: the key is not the certificate's");
  }
  state->name =
      SingleNameEntry(X509_get_subject_name(cert.get()), NID_commonName);
  if (state->name.empty()) {
    return absl::InvalidArgumentError(
        "model signer: the certificate has no single common name");
  }
  state->certificate_pem = std::string(cert_pem);
  return ModelSigner(std::move(state));
}

const std::string& ModelSigner::name() const { return state_->name; }

const std::string& ModelSigner::certificate_pem() const {
  return state_->certificate_pem;
}

absl::StatusOr<std::string> ModelSigner::Sign(
    const v1::ModelHeader& header, absl::string_view stream_digest) const {
  if (header.sender() != state_->name) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot sign ", Describe(header), " with the key of ", state_->name,
        ": receivers check that the certificate names the sender"));
  }
  SWARM_RETURN_IF_ERROR(CheckStreamDigest(header, stream_digest));
  SWARM_ASSIGN_OR_RETURN(const std::string message,
                         ModelSignatureMessage(header, stream_digest));
  return SignBytes(message, Describe(header));
}

absl::StatusOr<std::string> ModelSigner::SignBytes(
    absl::string_view message, absl::string_view what) const {
  Owned<EVP_MD_CTX> context(EVP_MD_CTX_new());
  EVP_PKEY_CTX* key_context = nullptr;  // Owned by `context`.
  size_t size = 0;
  std::string signature;
  bool ok =
      context != nullptr &&
      EVP_DigestSignInit(context.get(), &key_context, EVP_sha256(), nullptr,
                         state_->key.get()) == 1 &&
      ConfigureSignature(state_->key.get(), key_context) &&
      // The first call gives the largest size, the second the actual.
      EVP_DigestSign(context.get(), nullptr, &size,
                     reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) == 1;
  if (ok) {
    signature.resize(size);
    ok = EVP_DigestSign(
             context.get(), reinterpret_cast<unsigned char*>(signature.data()),
             &size, reinterpret_cast<const unsigned char*>(message.data()),
             message.size()) == 1;
    signature.resize(size);
  }
  const std::string detail = DrainOpenSslErrors();
  if (!ok) {
    return absl::InternalError(absl::StrCat("signing ", what, ": ", detail));
  }
  return signature;
}

// ---------------------------------------------------------------------------
// ModelSignatureVerifier
// ---------------------------------------------------------------------------

struct ModelSignatureVerifier::State {
  // Holds only the job's CA: nothing else is trusted.
  Owned<X509_STORE> store;
};

ModelSignatureVerifier::ModelSignatureVerifier(
    std::shared_ptr<const State> state)
    : state_(std::move(state)) {}

absl::StatusOr<ModelSignatureVerifier> ModelSignatureVerifier::Create(
    absl::string_view ca_pem) {
  Owned<X509> ca = CertFromPem(ca_pem);
  if (ca == nullptr) {
    return absl::InvalidArgumentError(
        "model signature verifier: the job's CA is not a PEM certificate");
  }
  if (X509_check_ca(ca.get()) <= 0) {
    return absl::InvalidArgumentError(
        "model signature verifier: the job's CA certificate is not a CA");
  }
  auto state = std::make_shared<State>();
  state->store.reset(X509_STORE_new());
  if (state->store == nullptr ||
      X509_STORE_add_cert(state->store.get(), ca.get()) != 1) {
    return absl::InternalError(
        absl::StrCat("model signature verifier: building the trust store: ",
                     DrainOpenSslErrors()));
  }
  return ModelSignatureVerifier(std::move(state));
}

namespace {

// The certificate checks of VerifySigner on a parsed certificate.
absl::Status CheckSigner(X509_STORE* store, X509* cert,
                         absl::string_view claimed_sender) {
  Owned<X509_STORE_CTX> context(X509_STORE_CTX_new());
  if (context == nullptr ||
      X509_STORE_CTX_init(context.get(), store, cert, nullptr) != 1) {
    return absl::InternalError(absl::StrCat("verifying the certificate of ",
                                            claimed_sender, ": ",
                                            DrainOpenSslErrors()));
  }
  const int verified = X509_verify_cert(context.get());
  const int error = X509_STORE_CTX_get_error(context.get());
  DrainOpenSslErrors();
  if (verified != 1) {
    const std::string reason = X509_verify_cert_error_string(error);
    if (error == X509_V_ERR_CERT_HAS_EXPIRED) {
      return absl::PermissionDeniedError(
          absl::StrCat("certificate of the signer ", claimed_sender,
                       " has expired (", reason, ")"));
    }
    if (error == X509_V_ERR_CERT_NOT_YET_VALID) {
      return absl::PermissionDeniedError(
          absl::StrCat("certificate of the signer ", claimed_sender,
                       " is not valid yet (", reason, ")"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("certificate of the signer ", claimed_sender,
                     " is not issued by the job's CA (", reason, ")"));
  }
  const X509_NAME* subject = X509_get_subject_name(cert);
  const std::string name = SingleNameEntry(subject, NID_commonName);
  if (name.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("certificate of the signer has no single common name, "
                     "the header claims ",
                     claimed_sender));
  }
  if (name != claimed_sender) {
    return absl::PermissionDeniedError(absl::StrCat(
        "certificate names ", name, ", the header claims ", claimed_sender));
  }
  const std::string role = SingleNameEntry(subject, NID_organizationalUnitName);
  if (role != kSiteRole) {
    return absl::PermissionDeniedError(
        absl::StrCat("certificate of ", claimed_sender, " has role \"", role,
                     "\"; only a site (", kSiteRole, ") signs models"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelSignatureVerifier::VerifySigner(
    absl::string_view signer_certificate_pem,
    absl::string_view claimed_sender) const {
  Owned<X509> cert = CertFromPem(signer_certificate_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate of the signer ", claimed_sender,
        signer_certificate_pem.empty() ? " is missing"
                                       : " is not a PEM certificate"));
  }
  return CheckSigner(state_->store.get(), cert.get(), claimed_sender);
}

absl::Status ModelSignatureVerifier::Verify(
    const v1::ModelHeader& header, absl::string_view stream_digest,
    absl::string_view signature,
    absl::string_view signer_certificate_pem) const {
  if (signature.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(header), " carries no digest signature"));
  }
  SWARM_RETURN_IF_ERROR(CheckStreamDigest(header, stream_digest));
  return VerifyBytes(
      [&] { return ModelSignatureMessage(header, stream_digest); }, signature,
      signer_certificate_pem, header.sender(), Describe(header),
      absl::StrCat("the model or its header was altered after ",
                   header.sender(), " signed it"));
}

absl::Status ModelSignatureVerifier::VerifyBytes(
    const std::function<absl::StatusOr<std::string>()>& message,
    absl::string_view signature, absl::string_view signer_certificate_pem,
    absl::string_view claimed_signer, absl::string_view what,
    absl::string_view forged) const {
  if (signature.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " carries no signature"));
  }
  Owned<X509> cert = CertFromPem(signer_certificate_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate of the signer of ", what,
        signer_certificate_pem.empty() ? " is missing"
                                       : " is not a PEM certificate"));
  }
  SWARM_RETURN_IF_ERROR(
      CheckSigner(state_->store.get(), cert.get(), claimed_signer));
  const EVP_PKEY* key = X509_get0_pubkey(cert.get());
  if (key == nullptr || !IsSupportedKey(key)) {
    DrainOpenSslErrors();
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate of ", claimed_signer, " holds a ",
        key == nullptr ? "unreadable" : EVP_PKEY_get0_type_name(key),
        " key; signatures use EC or RSA keys"));
  }
  // A malformed signature is bad input, not a forgery: say which.
  const auto* signature_bytes =
      reinterpret_cast<const unsigned char*>(signature.data());
  if (EVP_PKEY_get_base_id(key) == EVP_PKEY_EC) {
    const unsigned char* cursor = signature_bytes;
    Owned<ECDSA_SIG> parsed(
        d2i_ECDSA_SIG(nullptr, &cursor, static_cast<long>(signature.size())));
    DrainOpenSslErrors();
    if (parsed == nullptr || cursor != signature_bytes + signature.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "signature of ", what, " is not a DER ECDSA signature"));
    }
  } else if (signature.size() != static_cast<size_t>(EVP_PKEY_get_size(key))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "signature of ", what, " is ", signature.size(),
        " bytes; an RSA signature with this key is ", EVP_PKEY_get_size(key)));
  }
  SWARM_ASSIGN_OR_RETURN(const std::string signed_bytes, message());
  Owned<EVP_MD_CTX> context(EVP_MD_CTX_new());
  EVP_PKEY_CTX* key_context = nullptr;  // Owned by `context`.
  // EVP_DigestVerifyInit takes a non-const key but does not change it.
  EVP_PKEY* mutable_key = const_cast<EVP_PKEY*>(key);
  if (context == nullptr ||
      EVP_DigestVerifyInit(context.get(), &key_context, EVP_sha256(), nullptr,
                           mutable_key) != 1 ||
      !ConfigureSignature(key, key_context)) {
    return absl::InternalError(
        absl::StrCat("verifying ", what, ": ", DrainOpenSslErrors()));
  }
  const int verified = EVP_DigestVerify(
      context.get(), signature_bytes, signature.size(),
      reinterpret_cast<const unsigned char*>(signed_bytes.data()),
      signed_bytes.size());
  DrainOpenSslErrors();
  if (verified != 1) {
    return absl::PermissionDeniedError(
        absl::StrCat("signature of ", what, " does not verify: ", forged));
  }
  return absl::OkStatus();
}

}  // namespace swarm::security
