// mTLS for the Peer service: gRPC credentials from a provisioned identity
// (security/identity.h), and the verified identity of the peer behind a call.
#ifndef SWARM_RPC_TLS_H_
#define SWARM_RPC_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "security/identity.h"

namespace swarm::security {

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
PeerIdentity IdentityOf(const grpc::ServerContextBase& context);

}  // namespace swarm::security

#endif  // SWARM_RPC_TLS_H_
