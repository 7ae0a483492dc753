// One incoming model stream at a site, the same steps whoever carries its
// frames (the gRPC service, the fake network): the header goes through the
// site's admission; the body is assembled into the sink the admission names
// (an aggregator's checking sink, or memory); the assembled model, or why
// assembly failed, goes to the site, whose reply ends the stream.
//
//   ModelReceiver receiver(site);
//   absl::Status admitted = receiver.Begin(header, header_frame_bytes);
//   if (!admitted.ok()) -> refuse the stream with `admitted`
//   if (receiver.answered()) -> reply receiver.reply(), read no body
//   feed the body's frames to receiver.assembler(), then
//   receiver.Finish(assembler->Finish(), done)
//
// Not thread-safe: one stream, one thread at a time.
#ifndef SWARM_CONTROLLER_MODEL_RECEIVER_H_
#define SWARM_CONTROLLER_MODEL_RECEIVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/site_driver.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"
#include "streaming/partial_sum_sink.h"

namespace swarm {

class ModelReceiver {
 public:
  // REQUIRES: `site` outlives the receiver and its Finish's `done`.
  explicit ModelReceiver(SiteDriver* site) : site_(site) {}
  ModelReceiver(const ModelReceiver&) = delete;
  ModelReceiver& operator=(const ModelReceiver&) = delete;

  // The stream's header frame (`header_frame_bytes`: its encoded size, for
  // the header limit). Not OK: the site refused the stream (say so to the
  // sender as the call's status). OK: either answered() (no body to read),
  // or assembler() waits for the body.
  absl::Status Begin(const v1::ModelHeader& header,
                     uint64_t header_frame_bytes);

  // A partial sum passing through (chain reduction): where it goes on, or
  // null. The carrier streams `onward` to `next` with the ranges the sink
  // hands to the emit set here, then hands the next site's answer to
  // Finish (OK with an empty model when it took the sum).
  // REQUIRES for set_emit: before the first body frame.
  const ModelAdmission::ChainHop* chain_hop() const {
    return chain_hop_.has_value() ? &*chain_hop_ : nullptr;
  }
  void set_emit(PartialSumSink::Emit emit) { emit_ = std::move(emit); }
  // The relay protocol's budgets for the stream, as the site decided them
  // (ModelAdmission::relay). REQUIRES: Begin returned OK.
  const RelayBudgets& relay_budgets() const { return relay_; }

  // The site answered at the header (a failed result, a final model it
  // already stored).
  bool answered() const { return early_reply_.has_value(); }
  const v1::Reply& reply() const { return *early_reply_; }

  // Where the body's frames go; null when the header itself was malformed
  // (then call Finish with any status: the header's error wins).
  // REQUIRES: Begin returned OK and !answered().
  Assembler* assembler() {
    return header_error_.ok() ? assembler_.get() : nullptr;
  }

  // Hands the assembled model (`model`: the assembler's Finish(), or why
  // the stream broke) to the site; `done` gets its reply, now or later.
  // REQUIRES: Begin returned OK and !answered(); call once.
  void Finish(absl::StatusOr<Model> model, SiteDriver::ReplyDone done);

 private:
  absl::StatusOr<Model> Checked(absl::StatusOr<Model> model);

  SiteDriver* const site_;
  v1::ModelHeader header_;
  std::optional<v1::Reply> early_reply_;
  std::unique_ptr<TensorSink> sink_;
  std::optional<ModelAdmission::ChainHop> chain_hop_;
  RelayBudgets relay_;
  PartialSumSink::Emit emit_;
  MemorySink memory_;
  std::unique_ptr<Assembler> assembler_;
  absl::Status header_error_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_MODEL_RECEIVER_H_
