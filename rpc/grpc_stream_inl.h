// Template definitions for grpc_stream.h.
#ifndef SWARM_RPC_GRPC_STREAM_INL_H_
#define SWARM_RPC_GRPC_STREAM_INL_H_

#include <grpcpp/impl/codegen/server_callback_handlers.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/server_callback.h>

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
  AddCountedMethod(new grpc::internal::RpcServiceMethod(
      StoreName(method), grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler(
          [handler](RawModelService*, grpc::ServerContext* context,
                    const Request* request, Response* response) {
            return handler(context, request, response);
          },
          this)));
}

template <typename Request, typename Response>
void RawModelService::AddCallbackUnaryMethod(
    absl::string_view method,
    std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*,
                                            const Request*, Response*)>
        handler) {
  const int index = AddCountedMethod(new grpc::internal::RpcServiceMethod(
      StoreName(method), grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
  MarkMethodCallback(
      index, new grpc::internal::CallbackUnaryHandler<Request, Response>(
                 [handler](grpc::CallbackServerContext* context,
                           const Request* request, Response* response) {
                   return handler(context, request, response);
                 }));
}

}  // namespace swarm

#endif  // SWARM_RPC_GRPC_STREAM_INL_H_
