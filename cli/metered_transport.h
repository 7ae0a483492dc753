// MeteredTransport: a PeerTransport that counts this site's outgoing calls
// per peer into Prometheus metrics, then hands them to the real transport.
// It sits between the SiteDriver and the gRPC transport in the daemon, so
// neither the controller nor rpc/ changes for it.
//
//   swarm_peer_calls_total{site,peer,kind,outcome}      calls that ended
//   swarm_peer_call_seconds{site,peer,kind}             their duration
//   swarm_peer_models_sent_total{site,peer}             model streams delivered
//   swarm_peer_model_bytes_sent_total{site,peer}        their tensor bytes
//   swarm_peer_up{site,peer}                            1 when the last call
//                                                        reached the peer
//                                                        (whatever it
//                                                        answered), 0 when it
//                                                        could not (down,
//                                                        unreachable, no
//                                                        answer in time)
//
// kind: learn_task, request_to_submit, submit_result, share_best,
// final_result. outcome: ok, retry, rejected, bad_request, aborted (the
// peer's answer) or error (transport or authentication failure). Messages a
// site sends itself never reach a transport and are not counted. The
// models this site receives are counted by ReceivedModelMeter (below), which
// the daemon hands to its Peer service (PeerServiceOptions::
// on_model_received).
#ifndef SWARM_CLI_METERED_TRANSPORT_H_
#define SWARM_CLI_METERED_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/peer_transport.h"
#include "metrics/metrics.h"

namespace swarm {

class MeteredTransport : public PeerTransport {
 public:
  // Registers the families. REQUIRES: `inner` and `registry` outlive the
  // result.
  static absl::StatusOr<std::unique_ptr<MeteredTransport>> Create(
      PeerTransport* inner, MetricsRegistry* registry, std::string site);

  void PrepareForJob(const v1::JobConfig& job) override;
  // Thread-safe (as the inner transport).
  void Send(const v1::SiteInfo& to, PeerMessage message, Done done) override;

  // Tensor bytes of every model delivered so far (the sum of
  // swarm_peer_model_bytes_sent_total). Thread-safe.
  uint64_t bytes_sent() const {
    return bytes_sent_.load(std::memory_order_relaxed);
  }

 private:
  MeteredTransport(PeerTransport* inner, std::string site, CounterFamily* calls,
                   HistogramFamily* seconds, CounterFamily* models,
                   CounterFamily* bytes, GaugeFamily* up);

  PeerTransport* const inner_;
  const std::string site_;
  CounterFamily* const calls_;
  HistogramFamily* const seconds_;
  CounterFamily* const models_;
  CounterFamily* const bytes_;
  GaugeFamily* const up_;
  std::atomic<uint64_t> bytes_sent_{0};
};

// The models this site receives, per peer:
//   swarm_peer_models_received_total{site,peer}         streams that arrived
//                                                        whole
//   swarm_peer_model_bytes_received_total{site,peer}    their tensor bytes
//   swarm_peer_streams_broken_total{site,peer}          streams that broke
//                                                        (bad frame, cut)
//   swarm_digest_failures_total{site,peer}              of those, digest
//                                                        mismatches
// counted as the stream ends, before the site judges the model.
class ReceivedModelMeter {
 public:
  static absl::StatusOr<std::unique_ptr<ReceivedModelMeter>> Create(
      MetricsRegistry* registry, std::string site);

  // A model stream from `peer` announcing `bytes` ended with `status` (OK:
  // it arrived whole; DataLoss "digest mismatch...": a digest failure).
  // Thread-safe, does not block.
  void Observe(const std::string& peer, uint64_t bytes,
               const absl::Status& status);

  // Tensor bytes of every model received whole so far. Thread-safe.
  uint64_t bytes_received() const {
    return bytes_received_.load(std::memory_order_relaxed);
  }

 private:
  ReceivedModelMeter(std::string site, CounterFamily* models,
                     CounterFamily* bytes, CounterFamily* broken,
                     CounterFamily* digest_failures);

  const std::string site_;
  CounterFamily* const models_;
  CounterFamily* const bytes_;
  CounterFamily* const broken_;
  CounterFamily* const digest_failures_;
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace swarm

#endif  // SWARM_CLI_METERED_TRANSPORT_H_
