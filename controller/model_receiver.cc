#include "controller/model_receiver.h"

#include <utility>

#include "common/logging.h"
#include "controller/replies.h"

namespace swarm {

absl::Status ModelReceiver::Begin(const v1::ModelHeader& header,
                                  uint64_t header_frame_bytes) {
  header_ = header;
  absl::StatusOr<ModelAdmission> admission = site_->AdmitModel(header);
  if (!admission.ok()) return admission.status();
  if (admission->header_only) {
    early_reply_ = OkReply(std::move(admission->reply_message));
    return absl::OkStatus();
  }
  sink_ = std::move(admission->sink);
  assembler_ =
      std::make_unique<Assembler>(sink_ != nullptr ? sink_.get() : &memory_,
                                  std::move(admission->assembler));
  header_error_ = assembler_->OnHeader(header, header_frame_bytes);
  return absl::OkStatus();
}

v1::Reply ModelReceiver::Receive(
    absl::FunctionRef<absl::StatusOr<Model>(Assembler*)> read_body) {
  absl::StatusOr<Model> model = header_error_.ok()
                                    ? read_body(assembler_.get())
                                    : absl::StatusOr<Model>(header_error_);
  if (!model.ok()) {
    SWARM_LOG_WARNING("bad %s stream from %s: %s",
                      v1::ModelKind_Name(header_.kind()), header_.sender(),
                      model.status().message());
  }
  return site_->OnModel(header_, std::move(model));
}

}  // namespace swarm
