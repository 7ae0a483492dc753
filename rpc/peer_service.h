// The Peer gRPC service of a site: a thin adapter. Each RPC is authorized
// from the caller's verified certificate, then becomes a call on the
// SiteDriver; model streams are assembled here (header first, so the
// controller can refuse a stream before its body arrives).
//
// Authorization (with TLS identities; see rpc/tls.h):
//   Configure, Start, Abort       admins only
//   Status, History               any authenticated peer
//   FetchModel                    admins and the job's sites
//   RequestToSubmit, ShareBest,   a site whose certificate name is the
//   LearnTask, SubmitResult,      request's sender; the controller then
//   FinalResult                   checks that site's role in the round
// A learn task forwarded along a broadcast (ModelHeader.relay_to) comes from
// the previous hop, a site of the job, and names the site that signed it as
// its sender: the signer's certificate is checked at the header, the
// signature over the digest computed here once the body is in. This site
// forwards the frames to the next hop as they arrive, and answers for
// itself and every later hop (Reply.relayed).
// Without TLS (--insecure) the sender named in the request is trusted.
// Every refusal is logged with the peer and the reason.
#ifndef SWARM_RPC_PEER_SERVICE_H_
#define SWARM_RPC_PEER_SERVICE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/site_driver.h"
#include "rpc/grpc_stream.h"
#include "rpc/peer_client.h"
#include "rpc/tls.h"
#include "security/model_signature.h"

namespace swarm {

// A model stream this site received: its body arrived whole (`status` OK)
// or broke (why; a digest mismatch is a DataLoss error), before the site
// judged it.
struct ReceivedModel {
  std::string peer;  // The sender named in the header (authorized).
  v1::ModelKind kind = v1::MODEL_KIND_UNSPECIFIED;
  uint64_t bytes = 0;  // The header's total_bytes.
  absl::Status status;
};

struct PeerServiceOptions {
  // Require and use certificate identities (false only with --insecure).
  bool tls = true;
  // Calls one peer may have in flight here (streams and held requests).
  int max_calls_per_peer = 16;
  // A model stream still running after this is cancelled.
  absl::Duration max_stream_time = absl::Hours(1);
  // Told of every model stream received (the daemon's per-peer metrics);
  // called on a gRPC thread, must not block. Optional.
  std::function<void(const ReceivedModel&)> on_model_received;
  // Answers History (the daemon's round recorder); unset: UNIMPLEMENTED.
  std::function<v1::HistoryReply(const v1::HistoryRequest&)> history;
  // Pipelined broadcast (ModelHeader.relay_to): the channels a received
  // learn task is forwarded on. Null: nothing is forwarded (the sender then
  // sends to the rest of its list itself).
  PeerChannels* forward_channels = nullptr;
  // Checks the signature of a learn task that reaches this site through
  // another site (security/model_signature.h). With TLS and no verifier,
  // such a task is refused.
  std::shared_ptr<const security::ModelSignatureVerifier> verifier;
  // Checked before the site takes a Configure (the daemon: not over a job
  // that finished in its workspace); a non-OK answer refuses it (REJECTED)
  // with its message. Optional.
  std::function<absl::Status(const v1::ConfigureRequest&)> check_configure;
};

class StreamWatchdog;

class PeerService final : public RawModelService {
 public:
  // `site` must outlive the service (shut the server down first).
  PeerService(SiteDriver* site, PeerServiceOptions options);
  ~PeerService() override;
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

 private:
  enum class Rule { kAdmin, kAnyPeer, kSender, kFetch };
  // One call counted against its peer's budget.
  class CallSlot {
   public:
    CallSlot(PeerService* service, std::string peer)
        : service_(service), peer_(std::move(peer)) {}
    ~CallSlot() { service_->ReleaseSlot(peer_); }
    CallSlot(const CallSlot&) = delete;
    CallSlot& operator=(const CallSlot&) = delete;

   private:
    PeerService* service_;
    std::string peer_;
  };

  class HeldCall;
  class PermissionCall;
  class UploadCall;

  // The methods, registered in the service's order (Configure to
  // SubmitResult, then ShareBest to Abort).
  void AddFirstMethods();
  void AddLastMethods();

  // Checks `rule` for the caller and takes one of its call slots (released
  // when `slot` goes away). The error is the gRPC status to return.
  grpc::Status Authorize(grpc::ServerContextBase* context,
                         absl::string_view method, Rule rule,
                         absl::string_view sender,
                         std::unique_ptr<CallSlot>* slot);
  void ReleaseSlot(const std::string& peer);

  // A model upload, on the callback API (see UploadCall).
  grpc::ServerReadReactor<grpc::ByteBuffer>* ReceiveModel(
      grpc::CallbackServerContext* context, v1::Reply* reply);
  // Held calls, on the callback API: a RETRY permission answer is held
  // until a slot frees or the round opens, a Status call with
  // wait_for_change_ms until the status changes, each up to the caller's
  // deadline, without a thread.
  grpc::ServerUnaryReactor* RequestToSubmit(
      grpc::CallbackServerContext* context,
      const v1::SubmitPermissionRequest* request,
      v1::SubmitPermissionReply* reply);
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusReply* reply);
  grpc::Status FetchModel(grpc::ServerContext* context,
                          const v1::FetchModelRequest* request,
                          grpc::ServerWriter<grpc::ByteBuffer>* writer);

  SiteDriver* const site_;
  const PeerServiceOptions options_;
  std::shared_ptr<StreamWatchdog> watchdog_;
  absl::Mutex mu_;
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace swarm

#endif  // SWARM_RPC_PEER_SERVICE_H_
