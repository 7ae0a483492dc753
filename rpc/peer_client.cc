#include "rpc/peer_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/grpc_stream.h"
#include "streaming/chunker.h"

namespace swarm {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// Names the peer in a failed call's status.
absl::Status PeerError(const v1::SiteInfo& to, absl::string_view call,
                       const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(call, " to ", to.name(), " (", to.address(),
                                   "): ", status.message()));
}

}  // namespace

absl::Duration StreamDeadline(uint64_t bytes) {
  return absl::Seconds(30) + absl::Seconds(static_cast<double>(bytes) / 20e6);
}

PeerChannels::PeerChannels(
    std::shared_ptr<grpc::ChannelCredentials> credentials)
    : credentials_(std::move(credentials)) {}

std::shared_ptr<grpc::Channel> PeerChannels::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  grpc::ChannelArguments args;
  ApplyModelStreamArgs(&args, AssemblerLimits());
  auto channel = grpc::CreateCustomChannel(address, credentials_, args);
  channels_.emplace(address, channel);
  return channel;
}

GrpcPeerTransport::GrpcPeerTransport(PeerChannels* channels,
                                     absl::Duration unary_timeout)
    : channels_(channels), unary_timeout_(unary_timeout) {}

absl::StatusOr<v1::Reply> GrpcPeerTransport::StreamModel(
    const v1::SiteInfo& to, absl::string_view method,
    const v1::ModelHeader& header, std::shared_ptr<const Model> model,
    absl::Duration timeout) {
  if (model == nullptr) {
    // A header-only stream (a failed result): an empty model.
    model = std::make_shared<const Model>();
  }
  const uint64_t chunk_size =
      header.chunk_size() != 0 ? header.chunk_size() : kDefaultChunkSize;
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(model, header, chunk_size);
  if (!chunker.ok()) return chunker.status();
  grpc::ClientContext context;
  SetDeadline(&context,
              std::max(timeout, StreamDeadline(model->total_bytes())));
  absl::StatusOr<v1::Reply> reply = StreamModelToPeer(
      channels_->Get(to.address()).get(), method, &context, chunker->get());
  if (!reply.ok()) return PeerError(to, method, reply.status());
  return reply;
}

void GrpcPeerTransport::PrepareForJob(const v1::JobConfig& job) {
  for (const v1::SiteInfo& site : job.sites()) {
    // Starts connecting (and the TLS handshake) in the background.
    channels_->Get(site.address())->GetState(/*try_to_connect=*/true);
  }
}

absl::StatusOr<v1::Reply> GrpcPeerTransport::SendLearnTask(
    const v1::SiteInfo& to, const v1::ModelHeader& header,
    std::shared_ptr<const Model> model, absl::Duration timeout) {
  return StreamModel(to, "LearnTask", header, std::move(model), timeout);
}

absl::StatusOr<v1::SubmitPermissionReply> GrpcPeerTransport::RequestToSubmit(
    const v1::SiteInfo& to, const v1::SubmitPermissionRequest& request,
    absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  v1::SubmitPermissionReply reply;
  grpc::Status status = v1::Peer::NewStub(channels_->Get(to.address()))
                            ->RequestToSubmit(&context, request, &reply);
  if (!status.ok())
    return PeerError(to, "RequestToSubmit", ToAbslStatus(status));
  return reply;
}

absl::StatusOr<v1::Reply> GrpcPeerTransport::SubmitResult(
    const v1::SiteInfo& to, const v1::ModelHeader& header,
    std::shared_ptr<const Model> model) {
  return StreamModel(to, "SubmitResult", header, std::move(model),
                     unary_timeout_);
}

absl::StatusOr<v1::Reply> GrpcPeerTransport::ShareBest(
    const v1::SiteInfo& to, const v1::ShareBestRequest& request,
    absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  v1::Reply reply;
  grpc::Status status = v1::Peer::NewStub(channels_->Get(to.address()))
                            ->ShareBest(&context, request, &reply);
  if (!status.ok()) return PeerError(to, "ShareBest", ToAbslStatus(status));
  return reply;
}

absl::StatusOr<v1::Reply> GrpcPeerTransport::SendFinalResult(
    const v1::SiteInfo& to, const v1::ModelHeader& header,
    std::shared_ptr<const Model> model, absl::Duration timeout) {
  return StreamModel(to, "FinalResult", header, std::move(model), timeout);
}

}  // namespace swarm
