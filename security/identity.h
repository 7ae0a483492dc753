// A provisioned identity (key, certificate, CA) read from its folder: the
// OpenSSL half of mTLS. The gRPC credentials built from it are in rpc/tls.h.
#ifndef SWARM_SECURITY_IDENTITY_H_
#define SWARM_SECURITY_IDENTITY_H_

#include <string>

#include "absl/status/statusor.h"

namespace swarm::security {

// A provisioned identity: key.pem, cert.pem and ca.crt (see provision.h).
struct TlsIdentity {
  std::string key_pem;
  std::string cert_pem;
  std::string ca_pem;
  // From the certificate.
  std::string name;
  std::string role;
};

// Reads DIR/key.pem, DIR/cert.pem and DIR/ca.crt and checks that they fit
// together (the certificate is signed by the CA and currently valid, and the
// key is the certificate's). Errors name the file and the problem.
absl::StatusOr<TlsIdentity> LoadTlsIdentity(const std::string& dir);

}  // namespace swarm::security

#endif  // SWARM_SECURITY_IDENTITY_H_
