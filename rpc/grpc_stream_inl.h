// Template definitions for grpc_stream.h.
#ifndef SWARM_RPC_GRPC_STREAM_INL_H_
#define SWARM_RPC_GRPC_STREAM_INL_H_

#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

namespace swarm {

template <typename Request, typename Response>
void RawModelService::AddUnaryMethod(
    absl::string_view method,
    std::function<grpc::Status(grpc::ServerContext*, const Request*, Response*)>
        handler) {
  using Handler =
      grpc::internal::RpcMethodHandler<RawModelService, Request, Response,
                                       grpc::protobuf::MessageLite,
                                       grpc::protobuf::MessageLite>;
  AddMethod(new grpc::internal::RpcServiceMethod(
      StoreName(method), grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler(
          [handler](RawModelService*, grpc::ServerContext* context,
                    const Request* request, Response* response) {
            return handler(context, request, response);
          },
          this)));
}

}  // namespace swarm

#endif  // SWARM_RPC_GRPC_STREAM_INL_H_
