// swarmctl provision: a project CA, a key and certificate per site and per
// admin, written as folders ready to copy to each machine:
//
//   DIR/ca/ca.key, ca.crt            the CA; ca.key never leaves this folder
//   DIR/sites/<site>/key.pem, cert.pem, ca.crt
//   DIR/admins/<admin>/key.pem, cert.pem, ca.crt
//
// Private keys are written with mode 0600. An existing CA in DIR is reused,
// so running it again issues new certificates under the same trust root
// (that is how a site's certificate is rotated).
#ifndef SWARM_SECURITY_PROVISION_H_
#define SWARM_SECURITY_PROVISION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/swarm.pb.h"
#include "security/certificates.h"

namespace swarm::security {

struct ProvisionOptions {
  // Admin client certificates to issue.
  std::vector<std::string> admins;
  // Issue only these sites (e.g. to rotate one); empty: every site.
  std::vector<std::string> only_sites;
  // Skip all sites (e.g. to add an admin only).
  bool no_sites = false;
  absl::Duration validity = absl::Hours(24 * 730);
};

struct ProvisionReport {
  bool created_ca = false;
  // Folders written (sites and admins).
  std::vector<std::string> folders;
};

// The subject alternative names for a site: the host of its address (as IP
// or DNS name) plus its extra_sans.
CertRequest SiteCertRequest(const v1::SiteInfo& site);

absl::StatusOr<ProvisionReport> Provision(const v1::JobConfig& job,
                                          const std::string& out_dir,
                                          const ProvisionOptions& options);

// Writes `contents` to `path` atomically with mode 0600.
absl::Status WriteSecretFile(const std::string& path,
                             absl::string_view contents);

}  // namespace swarm::security

#endif  // SWARM_SECURITY_PROVISION_H_
