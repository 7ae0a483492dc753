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
  relay_ = admission->relay;
  if (admission->chain_hop.has_value()) {
    chain_hop_ = std::move(admission->chain_hop);
    sink_ = std::make_unique<PartialSumSink>(
        chain_hop_->own, chain_hop_->own_weight,
        [this](uint32_t index, uint64_t offset, absl::string_view data) {
          if (!emit_) {
            return absl::InternalError("the partial sum has nowhere to go");
          }
          return emit_(index, offset, data);
        });
  }
  assembler_ =
      std::make_unique<Assembler>(sink_ != nullptr ? sink_.get() : &memory_,
                                  std::move(admission->assembler));
  header_error_ = assembler_->OnHeader(header, header_frame_bytes);
  return absl::OkStatus();
}

absl::StatusOr<Model> ModelReceiver::Checked(absl::StatusOr<Model> model) {
  if (!header_error_.ok()) model = header_error_;
  if (!model.ok() && !chain_hop_.has_value()) {  // A hop's site says why.
    SWARM_LOG_WARNING("bad %s stream from %s: %s",
                      v1::ModelKind_Name(header_.kind()), header_.sender(),
                      model.status().message());
  }
  return model;
}

void ModelReceiver::Finish(absl::StatusOr<Model> model,
                           SiteDriver::ReplyDone done) {
  site_->OnModel(header_, Checked(std::move(model)), std::move(done));
}

}  // namespace swarm
