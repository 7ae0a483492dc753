#include "controller/peer_service.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace swarm {
namespace {

// How much earlier than the caller's deadline a held RequestToSubmit answers,
// so the reply arrives in time.
constexpr absl::Duration kDeadlineMargin = absl::Milliseconds(200);

absl::Time CallDeadline(const grpc::ServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace

PeerService::PeerService(SwarmController* controller)
    : controller_(controller) {
  AddUnaryMethod<v1::ConfigureRequest, v1::Reply>(
      "Configure",
      [this](grpc::ServerContext*, const v1::ConfigureRequest* request,
             v1::Reply* reply) {
        *reply = controller_->Configure(*request);
        return grpc::Status::OK;
      });
  AddUnaryMethod<v1::StartRequest, v1::Reply>(
      "Start", [this](grpc::ServerContext*, const v1::StartRequest* request,
                      v1::Reply* reply) {
        *reply = controller_->Start(*request);
        return grpc::Status::OK;
      });
  auto receive = [this](grpc::ServerContext* context,
                        grpc::ServerReader<grpc::ByteBuffer>* reader,
                        v1::Reply* reply) {
    return ReceiveModel(context, reader, reply);
  };
  AddModelUploadMethod("LearnTask", receive);
  AddUnaryMethod<v1::SubmitPermissionRequest, v1::SubmitPermissionReply>(
      "RequestToSubmit", [this](grpc::ServerContext* context,
                                const v1::SubmitPermissionRequest* request,
                                v1::SubmitPermissionReply* reply) {
        return RequestToSubmit(context, request, reply);
      });
  AddModelUploadMethod("SubmitResult", receive);
  AddUnaryMethod<v1::ShareBestRequest, v1::Reply>(
      "ShareBest",
      [this](grpc::ServerContext*, const v1::ShareBestRequest* request,
             v1::Reply* reply) {
        *reply = controller_->ShareBest(*request);
        return grpc::Status::OK;
      });
  AddModelUploadMethod("FinalResult", receive);
  AddUnaryMethod<v1::StatusRequest, v1::StatusReply>(
      "Status",
      [this](grpc::ServerContext* context, const v1::StatusRequest* request,
             v1::StatusReply* reply) {
        return Status(context, request, reply);
      });
  AddModelDownloadMethod(
      "FetchModel",
      [this](grpc::ServerContext* context, const v1::FetchModelRequest* request,
             grpc::ServerWriter<grpc::ByteBuffer>* writer) {
        return FetchModel(context, request, writer);
      });
  AddUnaryMethod<v1::AbortRequest, v1::Reply>(
      "Abort", [this](grpc::ServerContext*, const v1::AbortRequest* request,
                      v1::Reply* reply) {
        *reply = controller_->Abort(*request);
        return grpc::Status::OK;
      });
}

grpc::Status PeerService::ReceiveModel(
    grpc::ServerContext* context, grpc::ServerReader<grpc::ByteBuffer>* reader,
    v1::Reply* reply) {
  grpc::ByteBuffer first;
  if (!reader->Read(&first)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "model stream ended before its header");
  }
  v1::ModelFrame frame;
  {
    grpc::ProtoBufferReader parse(&first);
    if (!frame.ParseFromZeroCopyStream(&parse) || !frame.has_header()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          "the first frame of a model stream must be its header");
    }
  }
  const v1::ModelHeader& header = frame.header();
  absl::StatusOr<ModelAdmission> admission = controller_->AdmitModel(header);
  if (!admission.ok()) {
    SWARM_LOG_WARNING("refused %s stream from %s (%s): %s",
                      v1::ModelKind_Name(header.kind()), header.sender(),
                      context->peer(), admission.status().message());
    return ToGrpcStatus(admission.status());
  }
  if (admission->header_only) {
    reply->set_outcome(v1::OUTCOME_OK);
    reply->set_message("failure noted");
    return grpc::Status::OK;
  }
  MemorySink memory;
  TensorSink* sink =
      admission->sink != nullptr ? admission->sink.get() : &memory;
  Assembler assembler(sink, std::move(admission->assembler));
  absl::Status fed = assembler.OnHeader(header, first.Length());
  absl::StatusOr<Model> model = fed.ok()
                                    ? ReceiveModelStream(reader, &assembler)
                                    : absl::StatusOr<Model>(fed);
  if (!model.ok()) {
    SWARM_LOG_WARNING("bad %s stream from %s: %s",
                      v1::ModelKind_Name(header.kind()), header.sender(),
                      model.status().message());
  }
  *reply = controller_->OnModel(header, std::move(model));
  return grpc::Status::OK;
}

grpc::Status PeerService::RequestToSubmit(
    grpc::ServerContext* context, const v1::SubmitPermissionRequest* request,
    v1::SubmitPermissionReply* reply) {
  // Hold a RETRY until a slot frees or the round opens (or the caller's
  // deadline is near), so no trainer sleeps while a slot is free.
  const absl::Time deadline = CallDeadline(context) - kDeadlineMargin;
  bool waited = false;
  while (true) {
    const uint64_t version = controller_->permission_version();
    *reply = controller_->RequestToSubmit(*request);
    if (reply->outcome() != v1::OUTCOME_RETRY || context->IsCancelled() ||
        absl::Now() >= deadline) {
      break;
    }
    controller_->WaitForPermissionChange(
        version, std::min(deadline, absl::Now() + absl::Seconds(30)));
    waited = true;
  }
  // The request was held as long as allowed: ask again at once.
  if (waited && reply->outcome() == v1::OUTCOME_RETRY)
    reply->set_retry_after_ms(0);
  return grpc::Status::OK;
}

grpc::Status PeerService::Status(grpc::ServerContext* context,
                                 const v1::StatusRequest* request,
                                 v1::StatusReply* reply) {
  if (request->wait_for_change_ms() > 0) {
    const absl::Time deadline = std::min(
        CallDeadline(context) - kDeadlineMargin,
        absl::Now() + absl::Milliseconds(request->wait_for_change_ms()));
    *reply =
        controller_->WaitForStatusChange(request->known_version(), deadline);
  } else {
    *reply = controller_->Status();
  }
  if (!request->job_id().empty() &&
      reply->status().job_id() != request->job_id()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("site runs job \"", reply->status().job_id(), "\", not \"",
                     request->job_id(), "\""));
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::FetchModel(
    grpc::ServerContext* context, const v1::FetchModelRequest* request,
    grpc::ServerWriter<grpc::ByteBuffer>* writer) {
  absl::StatusOr<std::shared_ptr<const Model>> model =
      controller_->ModelForFetch(*request);
  if (!model.ok()) return ToGrpcStatus(model.status());
  v1::ModelHeader header;
  header.set_kind(request->which() == v1::MODEL_SELECTOR_BEST
                      ? v1::MODEL_KIND_BEST
                  : request->which() == v1::MODEL_SELECTOR_LAST
                      ? v1::MODEL_KIND_LAST
                      : v1::MODEL_KIND_ROUND_GLOBAL);
  header.set_job_id(request->job_id());
  for (const auto& [key, value] : (*model)->metadata()) {
    (*header.mutable_metadata())[key] = value;
  }
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(*model, header);
  if (!chunker.ok()) return ToGrpcStatus(chunker.status());
  if (!SendModelStream(writer, chunker->get())) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away");
  }
  return grpc::Status::OK;
}

}  // namespace swarm
