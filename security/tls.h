// mTLS for the Peer service: credentials from a provisioned folder, and the
// verified identity of the peer behind a call.
#ifndef SWARM_SECURITY_TLS_H_
#define SWARM_SECURITY_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
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

// Serves with `identity` and requires a client certificate signed by its CA.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TlsIdentity& identity);

// Presents `identity` and verifies the server against its CA.
std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(
    const TlsIdentity& identity);

// Who called, from the verified certificate (empty name when the call came
// without TLS).
struct PeerIdentity {
  bool authenticated = false;
  std::string name;
  std::string role;
  std::string address;  // the transport peer, for logs
};
PeerIdentity IdentityOf(const grpc::ServerContext& context);

}  // namespace swarm::security

#endif  // SWARM_SECURITY_TLS_H_
