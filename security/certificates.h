// X.509 certificates for the swarm's mTLS: a project CA, one certificate per
// site and per admin, made with the OpenSSL library (EC P-256, SHA-256).
//
// A certificate's common name is the site's (or admin's) name; its
// organizational unit carries the role: "swarm-site" or "swarm-admin". Sites
// get subject alternative names for the host names and IPs they serve on.
#ifndef SWARM_SECURITY_CERTIFICATES_H_
#define SWARM_SECURITY_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace swarm::security {

inline constexpr char kSiteRole[] = "swarm-site";
inline constexpr char kAdminRole[] = "swarm-admin";
inline constexpr char kCaRole[] = "swarm-ca";

// The key pair a certificate is issued for. Provisioning always makes EC
// P-256; RSA is for operators who bring their own PKI and for tests of code
// that must accept both (security/model_signature.h).
enum class KeyAlgorithm { kEcP256, kRsa2048 };

// A private key and its certificate, both PEM.
struct KeyAndCert {
  std::string key_pem;
  std::string cert_pem;
};

struct CertRequest {
  std::string common_name;
  // kSiteRole or kAdminRole.
  std::string role;
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;
  absl::Time not_before = absl::InfinitePast();  // default: now - 1 hour
  absl::Time not_after = absl::InfinitePast();  // default: not_before + 2 years
  KeyAlgorithm key_algorithm = KeyAlgorithm::kEcP256;
};

// A new self-signed CA called `name`, valid from an hour ago for `validity`.
absl::StatusOr<KeyAndCert> CreateCa(
    absl::string_view name, absl::Duration validity = absl::Hours(24 * 3650));

// A certificate for `request`, signed by `ca`. Usable for both TLS server
// and client authentication.
absl::StatusOr<KeyAndCert> IssueCertificate(const KeyAndCert& ca,
                                            const CertRequest& request);

// What a certificate says.
struct CertInfo {
  std::string common_name;
  std::string role;
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;
  absl::Time not_before;
  absl::Time not_after;
  bool is_ca = false;
};
absl::StatusOr<CertInfo> ParseCertificate(absl::string_view cert_pem);

// True when `host` is an IPv4 or IPv6 address literal (no brackets).
bool IsIpAddress(absl::string_view host);

}  // namespace swarm::security

#endif  // SWARM_SECURITY_CERTIFICATES_H_
