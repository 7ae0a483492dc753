// The checks a model upload's header passes in PeerService before the site
// sees it, and the signature check once its body is in.
#ifndef SWARM_RPC_UPLOAD_CHECKS_H_
#define SWARM_RPC_UPLOAD_CHECKS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "controller/site_driver.h"
#include "model/model.h"
#include "proto/swarm.pb.h"
#include "security/model_signature.h"

namespace swarm {

class UploadChecks {
 public:
  // `verifier` may be null. REQUIRES: `site` outlives the checks.
  UploadChecks(bool tls,
               std::shared_ptr<const security::ModelSignatureVerifier> verifier,
               SiteDriver* site);

  // A learn task whose sender is not the caller's certificate is accepted
  // only as a broadcast's forward: signed by its sender, whose certificate
  // is the job CA's and names it, and passed on by a site of the job.
  // Sets `caller` to the name the certificate must then carry.
  grpc::Status CheckForwarded(const v1::ModelHeader& header,
                              const std::string& what,
                              const grpc::ServerContextBase& context,
                              std::string* caller);
  // A forward list names each other site of the job at most once, and only
  // a learn task or a partial sum has one: a longer or looping list would
  // make the sites pass one stream around without end.
  grpc::Status CheckRelayList(const v1::ModelHeader& header) const;
  // The assembled model (`stream_digest`: its digest), or why the
  // signature of its header (CheckForwarded saw it) does not hold.
  absl::StatusOr<Model> Verified(absl::StatusOr<Model> model,
                                 const std::string& stream_digest) const;

 private:
  const bool tls_;
  const std::shared_ptr<const security::ModelSignatureVerifier> verifier_;
  SiteDriver* const site_;
  // A signed stream: its header, checked against the digest at the end.
  std::optional<v1::ModelHeader> signed_header_;
  // A broadcast's forward: the previous hop.
  std::string forwarded_by_;
};

}  // namespace swarm

#endif  // SWARM_RPC_UPLOAD_CHECKS_H_
