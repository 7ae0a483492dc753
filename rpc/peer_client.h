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
#include "streaming/assembler.h"

namespace swarm {

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
  GrpcPeerTransport(const GrpcPeerTransport&) = delete;
  GrpcPeerTransport& operator=(const GrpcPeerTransport&) = delete;

  void PrepareForJob(const v1::JobConfig& job) override;
  void Send(const v1::SiteInfo& to, PeerMessage message, Done done) override;

 private:
  PeerChannels* const channels_;
  TaskRunner* const runner_;
  const absl::Duration unary_timeout_;
};

}  // namespace swarm

#endif  // SWARM_RPC_PEER_CLIENT_H_
