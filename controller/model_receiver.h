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
//   reply receiver.Receive([&](Assembler* a) { feed a; return a->Finish(); })
//
// Not thread-safe: one stream, one thread at a time.
#ifndef SWARM_CONTROLLER_MODEL_RECEIVER_H_
#define SWARM_CONTROLLER_MODEL_RECEIVER_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/swarm_controller.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"
#include "streaming/assembler.h"

namespace swarm {

class ModelReceiver {
 public:
  // REQUIRES: `site` outlives the receiver.
  explicit ModelReceiver(SwarmController* site) : site_(site) {}
  ModelReceiver(const ModelReceiver&) = delete;
  ModelReceiver& operator=(const ModelReceiver&) = delete;

  // The stream's header frame (`header_frame_bytes`: its encoded size, for
  // the header limit). Not OK: the site refused the stream (say so to the
  // sender as the call's status) or the header is malformed. OK: either
  // answered() (no body to read), or the assembler waits for the body.
  absl::Status Begin(const v1::ModelHeader& header,
                     uint64_t header_frame_bytes);

  // The site answered at the header (a failed result, a final model it
  // already stored).
  bool answered() const { return early_reply_.has_value(); }
  const v1::Reply& reply() const { return *early_reply_; }

  // Receives the body with `read_body` (which feeds the frames to the
  // assembler it is given and returns its Finish(); on a broken stream it
  // aborts the assembler first), unless the header already failed, and hands
  // the model, or why it failed, to the site. Returns the site's reply.
  // REQUIRES: Begin returned OK and !answered(); call once.
  v1::Reply Receive(
      absl::FunctionRef<absl::StatusOr<Model>(Assembler*)> read_body);

 private:
  SwarmController* const site_;
  v1::ModelHeader header_;
  std::optional<v1::Reply> early_reply_;
  std::unique_ptr<TensorSink> sink_;
  MemorySink memory_;
  std::unique_ptr<Assembler> assembler_;
  absl::Status header_error_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_MODEL_RECEIVER_H_
