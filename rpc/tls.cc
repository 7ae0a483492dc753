#include "rpc/tls.h"

#include <grpcpp/security/auth_context.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "security/certificates.h"

namespace swarm::security {
namespace {

// The role written in a verified peer certificate, by the certificate's PEM.
// Parsing a certificate costs OpenSSL 3 a fraction of a millisecond, which
// every call paid (several calls per site and round); a peer presents the
// same certificate on every call of a connection, so the parse is kept.
// Bounded: starts over beyond kMaxEntries certificates.
class RoleCache {
 public:
  std::string RoleOf(absl::string_view pem) {
    {
      absl::MutexLock lock(&mu_);
      auto it = roles_.find(pem);
      if (it != roles_.end()) return it->second;
    }
    // Outside the lock: parsing is the slow part.
    absl::StatusOr<CertInfo> info = ParseCertificate(pem);
    if (!info.ok()) return "";  // Not cached: the next call says why again.
    absl::MutexLock lock(&mu_);
    if (roles_.size() >= kMaxEntries) roles_.clear();
    roles_.emplace(std::string(pem), info->role);
    return info->role;
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> roles_ ABSL_GUARDED_BY(mu_);
};

RoleCache& Roles() {
  static RoleCache* const cache = new RoleCache;  // Never destroyed.
  return *cache;
}

}  // namespace

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
    identity.role =
        Roles().RoleOf(absl::string_view(value.data(), value.size()));
  }
  identity.authenticated = !identity.name.empty();
  return identity;
}

}  // namespace swarm::security
