// MeteredTransport: a PeerTransport that counts this site's outgoing calls
// per peer into Prometheus metrics, then hands them to the real transport.
// It sits between the SiteDriver and the gRPC transport in the daemon, so
// neither the controller nor rpc/ changes for it.
//
//   swarm_peer_calls_total{site,peer,kind,outcome}      calls that ended
//   swarm_peer_call_seconds{site,peer,kind}             their duration
//   swarm_peer_models_sent_total{site,peer}             model streams delivered
//   swarm_peer_model_bytes_sent_total{site,peer}        their tensor bytes
//
// kind: learn_task, request_to_submit, submit_result, share_best,
// final_result. outcome: ok, retry, rejected, bad_request, aborted (the
// peer's answer) or error (transport or authentication failure). Messages a
// site sends itself never reach a transport and are not counted; nor are
// the models this site receives (the server side is not wrapped).
#ifndef SWARM_CLI_METERED_TRANSPORT_H_
#define SWARM_CLI_METERED_TRANSPORT_H_

#include <memory>
#include <string>

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

 private:
  MeteredTransport(PeerTransport* inner, std::string site, CounterFamily* calls,
                   HistogramFamily* seconds, CounterFamily* models,
                   CounterFamily* bytes);

  PeerTransport* const inner_;
  const std::string site_;
  CounterFamily* const calls_;
  HistogramFamily* const seconds_;
  CounterFamily* const models_;
  CounterFamily* const bytes_;
};

}  // namespace swarm

#endif  // SWARM_CLI_METERED_TRANSPORT_H_
