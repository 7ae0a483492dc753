// A minimal HTTP/1.0 GET for the integration tests (a Prometheus server's
// API, a site's /metrics): one request per connection, every socket call
// bounded by the deadline.
#ifndef SWARM_TESTS_INTEGRATION_HTTP_GET_H_
#define SWARM_TESTS_INTEGRATION_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace swarm::testing {

struct HttpResponse {
  int status = 0;
  std::string body;
};

// GET http://`host_port``target` ("127.0.0.1:9090", "/api/v1/query?...").
// Unavailable when the connection is refused, DeadlineExceeded at `deadline`.
absl::StatusOr<HttpResponse> HttpGet(absl::string_view host_port,
                                     absl::string_view target,
                                     absl::Time deadline);

// `text` percent-encoded for a URL query value.
std::string UrlEncode(absl::string_view text);

// A port on 127.0.0.1 that was free a moment ago (bound to port 0, closed).
absl::StatusOr<int> PickFreePort();

}  // namespace swarm::testing

#endif  // SWARM_TESTS_INTEGRATION_HTTP_GET_H_
