#include "rpc/upload_checks.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "config/job_config.h"
#include "rpc/tls.h"
#include "security/certificates.h"

namespace swarm {

UploadChecks::UploadChecks(
    bool tls, std::shared_ptr<const security::ModelSignatureVerifier> verifier,
    SiteDriver* site)
    : tls_(tls), verifier_(std::move(verifier)), site_(site) {}

grpc::Status UploadChecks::CheckForwarded(
    const v1::ModelHeader& header, const std::string& what,
    const grpc::ServerContextBase& context, std::string* caller) {
  const std::shared_ptr<const security::ModelSignatureVerifier>& verifier =
      verifier_;
  if (!header.digest_signature().empty() && verifier != nullptr) {
    signed_header_ = header;  // Checked once the body is in.
  }
  if (!tls_) return grpc::Status::OK;
  const security::PeerIdentity identity = security::IdentityOf(context);
  if (!identity.authenticated || identity.name == header.sender() ||
      header.kind() != v1::MODEL_KIND_LEARN_TASK ||
      header.digest_signature().empty()) {
    return grpc::Status::OK;  // Authorize judges it.
  }
  auto refuse = [&](grpc::StatusCode code, std::string reason) {
    SWARM_LOG_WARNING("refused %s forwarded by %s for %s (%s): %s", what,
                      identity.name, header.sender(), context.peer(), reason);
    return grpc::Status(code, reason);
  };
  if (verifier == nullptr) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                  "this site cannot check forwarded models (no CA loaded)");
  }
  const std::optional<v1::JobConfig> job = site_->job();
  if (!job.has_value() || FindSite(*job, identity.name) == nullptr) {
    return refuse(grpc::StatusCode::PERMISSION_DENIED,
                  absl::StrCat("a forwarded learn task must come from a "
                               "site of the job; ",
                               identity.name, " is not one"));
  }
  if (absl::Status signer = verifier->VerifySigner(
          header.signer_certificate_pem(), header.sender());
      !signer.ok()) {
    return refuse(grpc::StatusCode::PERMISSION_DENIED,
                  absl::StrCat("learn task forwarded by ", identity.name, ": ",
                               signer.message()));
  }
  forwarded_by_ = identity.name;
  *caller = identity.name;
  return grpc::Status::OK;
}

grpc::Status UploadChecks::CheckRelayList(const v1::ModelHeader& header) const {
  if (header.relay_to_size() == 0) return grpc::Status::OK;
  auto bad = [](std::string why) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("relay_to: ", why));
  };
  if (header.kind() != v1::MODEL_KIND_LEARN_TASK &&
      header.kind() != v1::MODEL_KIND_PARTIAL_SUM) {
    return bad("only a learn task or a partial sum is forwarded");
  }
  const std::optional<v1::JobConfig> job = site_->job();
  if (!job.has_value()) return bad("this site has no job");
  std::set<std::string> seen;
  for (const std::string& site : header.relay_to()) {
    if (FindSite(*job, site) == nullptr) {
      return bad(
          absl::StrCat("\"", site, "\" is not a site of job ", job->job_id()));
    }
    if (site == site_->site() || site == header.sender()) {
      return bad(
          absl::StrCat("names ", site, ", which already has the stream"));
    }
    if (!seen.insert(site).second) {
      return bad(absl::StrCat("names ", site, " twice"));
    }
  }
  return grpc::Status::OK;
}

absl::StatusOr<Model> UploadChecks::Verified(
    absl::StatusOr<Model> model, const std::string& stream_digest) const {
  if (!model.ok() || !signed_header_.has_value()) return model;
  absl::Status verified =
      verifier_->VerifyHeader(*signed_header_, stream_digest);
  if (verified.ok()) return model;
  const std::string by =
      forwarded_by_.empty()
          ? std::string("sent by ")
          : absl::StrCat("forwarded by ", forwarded_by_, " for ");
  SWARM_LOG_WARNING("refused a learn task %s%s: %s", by,
                    signed_header_->sender(), verified.message());
  return absl::Status(verified.code(),
                      absl::StrCat("learn task ", by, signed_header_->sender(),
                                   ": ", verified.message()));
}

}  // namespace swarm
