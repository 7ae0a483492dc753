// PeerTransport over gRPC: one channel per peer address, created on first
// use and reused; a deadline on every call.
#ifndef SWARM_RPC_PEER_CLIENT_H_
#define SWARM_RPC_PEER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/peer_transport.h"
#include "controller/task_runner.h"
#include "proto/swarm.grpc.pb.h"
#include "security/model_signature.h"
#include "streaming/assembler.h"

namespace swarm {

class StreamWatchdog;

// Deadline for streaming `bytes`: a base plus the time at a slow 20 MB/s.
absl::Duration StreamDeadline(uint64_t bytes);

// Channels by address, with the model-stream settings.
class PeerChannels {
 public:
  explicit PeerChannels(std::shared_ptr<grpc::ChannelCredentials> credentials =
                            grpc::InsecureChannelCredentials());
  PeerChannels(const PeerChannels&) = delete;
  PeerChannels& operator=(const PeerChannels&) = delete;
  std::shared_ptr<grpc::Channel> Get(const std::string& address);

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
};

class GrpcPeerTransport final : public PeerTransport {
 public:
  // Every call goes through gRPC's callback API (model streams as client
  // write reactors): no thread waits for a peer. `runner` only reports a
  // call that fails before it starts. `unary_timeout`: the least deadline
  // of any call.
  GrpcPeerTransport(PeerChannels* channels, TaskRunner* runner,
                    absl::Duration unary_timeout = absl::Seconds(10));
  ~GrpcPeerTransport() override;
  GrpcPeerTransport(const GrpcPeerTransport&) = delete;
  GrpcPeerTransport& operator=(const GrpcPeerTransport&) = delete;

  // Signs the learn tasks this site broadcasts (ModelHeader.relay_to set),
  // so that the sites that forward them cannot alter them undetected.
  // Without a signer a broadcast goes unsigned (fine without TLS; under
  // TLS its forwards are refused and the sender falls back to direct
  // sends). Call before the first Send.
  void set_signer(std::shared_ptr<const security::ModelSigner> signer) {
    signer_ = std::move(signer);
  }

  void PrepareForJob(const v1::JobConfig& job) override;
  void Send(const v1::SiteInfo& to, PeerMessage message, Done done) override;

 private:
  void SendStream(const v1::SiteInfo& to, PeerMessage message, Done done);
  void SendUnary(const v1::SiteInfo& to, PeerMessage message, Done done,
                 absl::Duration timeout);
  // Signs `message` (a broadcast learn task) and sends it, on the runner:
  // the digest reads the whole model.
  void SignAndSend(const v1::SiteInfo& to, PeerMessage message, Done done);
  // A broadcast's head: sent through a FrameRelay, so that a head that
  // stops reading is given up after the call's timeout (the chain behind it
  // then gets the task directly).
  void SendChainHead(const v1::SiteInfo& to, PeerMessage message, Done done);

  PeerChannels* const channels_;
  TaskRunner* const runner_;
  const absl::Duration unary_timeout_;
  std::shared_ptr<const security::ModelSigner> signer_;
  std::shared_ptr<StreamWatchdog> watchdog_;  // Stalled broadcast heads.
};

}  // namespace swarm

#endif  // SWARM_RPC_PEER_CLIENT_H_
