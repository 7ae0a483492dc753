#include "rpc/tls.h"

#include <grpcpp/security/auth_context.h>

#include "absl/strings/str_cat.h"
#include "security/certificates.h"

namespace swarm::security {

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TlsIdentity& identity) {
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = identity.ca_pem;
  options.pem_key_cert_pairs.push_back({identity.key_pem, identity.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(
    const TlsIdentity& identity) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = identity.ca_pem;
  options.pem_private_key = identity.key_pem;
  options.pem_cert_chain = identity.cert_pem;
  return grpc::SslCredentials(options);
}

PeerIdentity IdentityOf(const grpc::ServerContextBase& context) {
  PeerIdentity identity;
  identity.address = context.peer();
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return identity;
  for (const grpc::string_ref& value :
       auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    identity.name.assign(value.data(), value.size());
  }
  for (const grpc::string_ref& value :
       auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
    absl::StatusOr<CertInfo> info =
        ParseCertificate(absl::string_view(value.data(), value.size()));
    if (info.ok()) identity.role = info->role;
  }
  identity.authenticated = !identity.name.empty();
  return identity;
}

}  // namespace swarm::security
