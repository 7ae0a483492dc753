// The Peer gRPC service of a site: a thin adapter. Each RPC becomes a call
// on the SwarmController; model streams are assembled here (header first, so
// the controller can refuse a stream before its body arrives).
#ifndef SWARM_CONTROLLER_PEER_SERVICE_H_
#define SWARM_CONTROLLER_PEER_SERVICE_H_

#include "controller/swarm_controller.h"
#include "streaming/grpc_stream.h"

namespace swarm {

class PeerService final : public RawModelService {
 public:
  // `controller` must outlive the service (shut the server down first).
  explicit PeerService(SwarmController* controller);
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

 private:
  grpc::Status ReceiveModel(grpc::ServerContext* context,
                            grpc::ServerReader<grpc::ByteBuffer>* reader,
                            v1::Reply* reply);
  grpc::Status RequestToSubmit(grpc::ServerContext* context,
                               const v1::SubmitPermissionRequest* request,
                               v1::SubmitPermissionReply* reply);
  grpc::Status Status(grpc::ServerContext* context,
                      const v1::StatusRequest* request, v1::StatusReply* reply);
  grpc::Status FetchModel(grpc::ServerContext* context,
                          const v1::FetchModelRequest* request,
                          grpc::ServerWriter<grpc::ByteBuffer>* writer);

  SwarmController* const controller_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_PEER_SERVICE_H_
