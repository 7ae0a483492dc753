// Signatures over model streams: a model that reaches a site through other
// sites (the pipelined broadcast of a learn task, issue 13) carries its
// sender's signature, so that no site on the way can alter it undetected.
// mTLS only proves who the last hop was; this proves who made the model.
//
// The sender signs, with its certificate's key, SHA-256 over the bytes
// ModelSignatureMessage gives: a version prefix, the stream digest and every
// field of the model's header. The receiver checks the signer's certificate
// against the job's CA and the header's `sender`, then the signature, against
// the digest it computed itself over the chunks it received.
//
// What is signed, and why:
//   - kModelSignatureDomain ("swarm model digest v1"): a signature made for
//     this purpose cannot be passed off as one over some other message made
//     with the same key (the key also signs TLS handshakes), and a future
//     message layout gets a new prefix instead of colliding with this one.
//   - The stream digest (ModelTrailer.digest): pins every chunk's tensor
//     index, offset, length and bytes. It must be SHA-256: XXH3 is not
//     collision resistant, so a forwarder could craft other bytes with the
//     same XXH3 digest. Signing and verifying refuse DIGEST_XXH3_128.
//   - The header, whole but for the two signature fields (digest_signature,
//     signer_certificate_pem) and the forward list (relay_to), because the
//     receiver acts on all of it:
//       job_id: a model of another job of the same CA is not replayed here;
//       round, attempt, lineage: an old round's or a superseded attempt's
//         model is not replayed as this one;
//       kind, payload_kind: a learn task is not passed off as a BEST model,
//         a result, or a weight diff (or the reverse);
//       sender: binds the signature to the name the certificate must carry;
//       tensors, total_bytes: the digest covers bytes only; without the table
//         a forwarder could rename, reshape or retype tensors (F32 as I32);
//       digest_algorithm: no downgrade to XXH3;
//       aggregator, backup_aggregators, expected_trainers, best, resume,
//         handoff, final_round: a forwarder could otherwise redirect the
//         round's results to itself or rewrite the job's best record;
//       metrics, metadata, sample_count, failed, failure, chunk_size: what
//         the receiver stores or reports.
//     A field added to ModelHeader later is signed too: the encoding walks
//     the descriptor. Fields at their default add nothing, so adding a field
//     changes no existing signature. A field that a forwarder must set has
//     to be excluded explicitly in the .cc (so far one: relay_to, the next
//     hops); model_signature_test pins the list of exclusions.
//
// Every field is length-prefixed or of fixed width and tagged with its field
// number, so no two different (digest, header) pairs give the same message.
// A header with fields this build does not know (from a newer sender) cannot
// be encoded and is refused.
#ifndef SWARM_SECURITY_MODEL_SIGNATURE_H_
#define SWARM_SECURITY_MODEL_SIGNATURE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/swarm.pb.h"

namespace swarm::security {

inline constexpr char kModelSignatureDomain[] = "swarm model digest v1";

// The bytes a model's sender signs (the signature scheme hashes them with
// SHA-256): kModelSignatureDomain and `stream_digest`, each with a u64
// little-endian length before it, then the canonical encoding of `header`
// without digest_signature and signer_certificate_pem (see the .cc).
// InvalidArgument when `header` carries unknown fields. Exposed for tests.
absl::StatusOr<std::string> ModelSignatureMessage(
    const v1::ModelHeader& header, absl::string_view stream_digest);

// Signs the models this site sends. Holds the parsed private key and the
// certificate; immutable after Create, so one instance may be used from any
// number of threads at once. Copies share the key.
class ModelSigner {
 public:
  // `key_pem` and `cert_pem` as provisioned (security/identity.h): an EC or
  // RSA private key and its certificate. InvalidArgument for unreadable PEM
  // or another key type; FailedPrecondition when the key is not the
  // certificate's.
  static absl::StatusOr<ModelSigner> Create(absl::string_view key_pem,
                                            absl::string_view cert_pem);

  // The certificate's common name: the site name the signatures are valid
  // for.
  const std::string& name() const;
  // The certificate, to send in ModelHeader.signer_certificate_pem.
  const std::string& certificate_pem() const;

  // The signature (for ModelHeader.digest_signature) over
  // ModelSignatureMessage(header, stream_digest): ECDSA in DER for an EC key,
  // RSA-PSS (salt as long as the digest) for an RSA key.
  // REQUIRES: header.sender() == name() (else FailedPrecondition: receivers
  // would refuse it); header.digest_algorithm() == DIGEST_SHA256 and
  // `stream_digest` the 32-byte SHA-256 stream digest of exactly the chunks
  // that will be sent, in order (else InvalidArgument). The header's own
  // signature fields are ignored, so they may be set before or after.
  absl::StatusOr<std::string> Sign(const v1::ModelHeader& header,
                                   absl::string_view stream_digest) const;

  // The signature over `message` (SHA-256, as Sign), for other signed
  // messages of this site (security/secagg_keys.h). REQUIRES: `message`
  // starts with a domain string of its own purpose, so that a signature
  // made for one purpose is never taken for another. `what` names the
  // message in errors.
  absl::StatusOr<std::string> SignBytes(absl::string_view message,
                                        absl::string_view what) const;

 private:
  struct State;
  explicit ModelSigner(std::shared_ptr<const State> state);
  std::shared_ptr<const State> state_;
};

// Checks signed models against one job's CA. Holds the CA's trust store;
// immutable after Create and safe for concurrent use from any number of
// threads. Copies share the store.
//
// Errors name the rule and the claimed sender: InvalidArgument for what is
// missing or malformed (no signature, unreadable certificate, a digest that is
// not SHA-256, a signature that is not a signature of the key's type),
// PermissionDenied for what is well formed but not trusted (certificate not
// issued by the job's CA or outside its validity, a name other than the
// sender's, a role other than a site's, a signature that does not verify).
class ModelSignatureVerifier {
 public:
  // `ca_pem`: the job's CA certificate (ca.crt). InvalidArgument when it is
  // not a PEM CA certificate.
  static absl::StatusOr<ModelSignatureVerifier> Create(
      absl::string_view ca_pem);

  // The certificate part alone, for a receiver that wants to refuse a stream
  // as soon as its header arrives: `signer_certificate_pem` chains to the
  // CA, is valid now, its role is a site and its common name is
  // `claimed_sender`.
  absl::Status VerifySigner(absl::string_view signer_certificate_pem,
                            absl::string_view claimed_sender) const;

  // Everything: VerifySigner(signer_certificate_pem, header.sender()), the
  // digest algorithm, then `signature` over
  // ModelSignatureMessage(header, stream_digest) with the certificate's key.
  // REQUIRES: `stream_digest` is the digest this site computed over the
  // chunks it received (with header.digest_algorithm()), not a value taken
  // from the stream.
  absl::Status Verify(const v1::ModelHeader& header,
                      absl::string_view stream_digest,
                      absl::string_view signature,
                      absl::string_view signer_certificate_pem) const;

  // Verify with the signature and certificate the header carries
  // (digest_signature, signer_certificate_pem).
  absl::Status VerifyHeader(const v1::ModelHeader& header,
                            absl::string_view stream_digest) const {
    return Verify(header, stream_digest, header.digest_signature(),
                  header.signer_certificate_pem());
  }

  // A SignBytes signature: the certificate as VerifySigner(cert,
  // claimed_signer), then `signature` over `message()` (asked for only once
  // the certificate passed). Errors name `what`; a signature that does not
  // verify is PermissionDenied ending with `forged`.
  absl::Status VerifyBytes(
      const std::function<absl::StatusOr<std::string>()>& message,
      absl::string_view signature, absl::string_view signer_certificate_pem,
      absl::string_view claimed_signer, absl::string_view what,
      absl::string_view forged) const;

 private:
  struct State;
  explicit ModelSignatureVerifier(std::shared_ptr<const State> state);
  std::shared_ptr<const State> state_;
};

}  // namespace swarm::security

#endif  // SWARM_SECURITY_MODEL_SIGNATURE_H_
