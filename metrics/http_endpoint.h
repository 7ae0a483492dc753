// MetricsHttpEndpoint: serves a MetricsRegistry's text exposition over plain
// HTTP for a Prometheus scraper, with Debian's libmicrohttpd (one internal
// polling thread; no HTTP parsing of ours).
//
//   GET /metrics (or HEAD)  200, text/plain; version=0.0.4
//   any other path          404
//   any other method        405
//
//   MetricsRegistry registry;
//   MetricsHttpEndpoint endpoint(&registry);
//   absl::Status started = endpoint.Start("127.0.0.1:0");
//   ... endpoint.bound_address() is "127.0.0.1:PORT" ...
//
// A scrape only reads the registry (each metric under its own short lock):
// it never waits for whatever updates the metrics. Plain HTTP without
// authentication: meant for a private interface.
//
// Start() and Stop() are called from one thread; scrapes are served on
// libmicrohttpd's own thread. Stop() (or the destructor) waits for a scrape
// in progress to finish.
#ifndef SWARM_METRICS_HTTP_ENDPOINT_H_
#define SWARM_METRICS_HTTP_ENDPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "metrics/metrics.h"

struct MHD_Daemon;

namespace swarm {

class MetricsHttpEndpoint {
 public:
  // REQUIRES: `registry` outlives the endpoint.
  explicit MetricsHttpEndpoint(const MetricsRegistry* registry);
  ~MetricsHttpEndpoint();
  MetricsHttpEndpoint(const MetricsHttpEndpoint&) = delete;
  MetricsHttpEndpoint& operator=(const MetricsHttpEndpoint&) = delete;

  // Listens on `address`: "host:port" (a numeric IPv4 address or a host
  // name) or "[IPv6]:port"; port 0 picks a free port. Errors name the site
  // config field `metrics_listen`: InvalidArgument for an unparsable address
  // or a host that does not resolve, Unavailable when the address is in use
  // or cannot be bound, FailedPrecondition when already started.
  absl::Status Start(absl::string_view address);

  // Stops serving (waits for a scrape in progress). Idempotent.
  void Stop();

  // "host:port" actually bound (the port filled in when it was 0); empty
  // before Start() succeeds.
  const std::string& bound_address() const { return bound_address_; }
  int port() const { return port_; }

 private:
  const MetricsRegistry* const registry_;
  MHD_Daemon* daemon_ = nullptr;
  std::string bound_address_;
  int port_ = 0;
};

}  // namespace swarm

#endif  // SWARM_METRICS_HTTP_ENDPOINT_H_
