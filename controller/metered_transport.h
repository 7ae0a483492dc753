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
#ifndef SWARM_CONTROLLER_METERED_TRANSPORT_H_
#define SWARM_CONTROLLER_METERED_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/peer_transport.h"
#include "metrics/metrics.h"

namespace swarm {

// A running total of bytes with the times it grew, so the total as of a past
// moment can be read back: the round record credits each round with the
// model bytes moved between its start and end, which the status watcher
// learns of afterwards (cli/site_metrics.h). Keeps the last kKept growths.
// Thread-safe.
class ByteTally {
 public:
  static constexpr size_t kKept = 1024;

  // Grows the total by `bytes` now.
  void Add(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t Total() const ABSL_LOCKS_EXCLUDED(mu_);
  // The total as of `at` (growths later than `at` left out; before the
  // oldest kept growth, the total before it).
  uint64_t TotalAt(absl::Time at) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Growth {
    absl::Time at;
    uint64_t total;  // After it.
  };
  mutable absl::Mutex mu_;
  std::deque<Growth> growths_ ABSL_GUARDED_BY(mu_);
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t before_kept_ ABSL_GUARDED_BY(mu_) = 0;
};

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
  uint64_t bytes_sent() const { return bytes_sent_.Total(); }
  // The same as of `at`.
  uint64_t bytes_sent_at(absl::Time at) const {
    return bytes_sent_.TotalAt(at);
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
  ByteTally bytes_sent_;
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
  uint64_t bytes_received() const { return bytes_received_.Total(); }
  // The same as of `at`.
  uint64_t bytes_received_at(absl::Time at) const {
    return bytes_received_.TotalAt(at);
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
  ByteTally bytes_received_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_METERED_TRANSPORT_H_
