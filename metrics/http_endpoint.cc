#include "metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace swarm {
namespace {

constexpr char kField[] = "metrics_listen";
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A scraper that opens a connection and sends nothing is dropped after this.
constexpr unsigned kConnectionTimeoutSeconds = 10;
constexpr unsigned kConnectionLimit = 32;

absl::Status BadAddress(absl::string_view address, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(kField, ": \"", address, "\" is not host:port (", why, ")"));
}

struct HostAndPort {
  std::string host;
  int port = 0;
};

absl::StatusOr<HostAndPort> SplitAddress(absl::string_view address) {
  HostAndPort out;
  absl::string_view port_text;
  if (address.empty()) return BadAddress(address, "empty");
  if (address.front() == '[') {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) {
      return BadAddress(address, "missing \"]\"");
    }
    if (close + 1 >= address.size() || address[close + 1] != ':') {
      return BadAddress(address, "missing \":port\"");
    }
    out.host = std::string(address.substr(1, close - 1));
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return BadAddress(address, "missing \":port\"");
    }
    out.host = std::string(address.substr(0, colon));
    if (out.host.find(':') != std::string::npos) {
      return BadAddress(address,
                        "write an IPv6 address in brackets, e.g. [::1]:9464");
    }
    port_text = address.substr(colon + 1);
  }
  if (out.host.empty()) return BadAddress(address, "empty host");
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &out.port) ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos ||
      out.port < 0 || out.port > 65535) {
    return BadAddress(address, "the port must be 0..65535");
  }
  return out;
}

// The body of one answer, copied by libmicrohttpd.
MHD_Result Respond(MHD_Connection* connection, unsigned status,
                   const std::string& body, const char* content_type) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  const MHD_Result result = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return result;
}

MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url,
                         const char* method, const char* /*version*/,
                         const char* /*upload_data*/,
                         size_t* /*upload_data_size*/, void** /*con_cls*/) {
  const auto* registry = static_cast<const MetricsRegistry*>(cls);
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                   std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (std::strcmp(url, "/metrics") != 0) {
    return Respond(connection, MHD_HTTP_NOT_FOUND,
                   "not found: the metrics are at /metrics\n",
                   "text/plain; charset=utf-8");
  }
  if (!get) {
    return Respond(connection, MHD_HTTP_METHOD_NOT_ALLOWED,
                   "method not allowed: use GET\n",
                   "text/plain; charset=utf-8");
  }
  return Respond(connection, MHD_HTTP_OK, registry->Exposition(), kContentType);
}

std::string FormatAddress(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(v6->sin6_port));
  }
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
  inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(v4->sin_port));
}

}  // namespace

MetricsHttpEndpoint::MetricsHttpEndpoint(const MetricsRegistry* registry)
    : registry_(registry) {}

MetricsHttpEndpoint::~MetricsHttpEndpoint() { Stop(); }

absl::Status MetricsHttpEndpoint::Start(absl::string_view address) {
  if (daemon_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kField, ": the endpoint already serves ", bound_address_));
  }
  absl::StatusOr<HostAndPort> parsed = SplitAddress(address);
  if (!parsed.ok()) return parsed.status();

  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(parsed->port);
  const int resolved =
      getaddrinfo(parsed->host.c_str(), port.c_str(), &hints, &found);
  if (resolved != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": cannot resolve host \"", parsed->host,
                     "\" of \"", address, "\": ", gai_strerror(resolved)));
  }
  // The first address that binds (a host name may resolve to several).
  int fd = -1;
  int bind_errno = 0;
  for (addrinfo* candidate = found; candidate != nullptr;
       candidate = candidate->ai_next) {
    fd = socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC,
                candidate->ai_protocol);
    if (fd < 0) {
      bind_errno = errno;
      continue;
    }
    // Lets a restarted daemon bind again while old connections linger in
    // TIME_WAIT; a port with a live listener still fails (EADDRINUSE).
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, candidate->ai_addr, candidate->ai_addrlen) == 0 &&
        listen(fd, 64) == 0) {
      break;
    }
    bind_errno = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    const std::string why = std::strerror(bind_errno);
    if (bind_errno == EADDRINUSE) {
      return absl::UnavailableError(
          absl::StrCat(kField, ": ", address, " is in use (", why,
                       "); choose another port or stop what listens there"));
    }
    return absl::UnavailableError(
        absl::StrCat(kField, ": cannot listen on ", address, " (", why, ")"));
  }
  sockaddr_storage bound = {};
  socklen_t bound_size = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_size);

  // libmicrohttpd owns the socket from here and closes it when stopped.
  daemon_ = MHD_start_daemon(
      MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD, 0, nullptr, nullptr,
      &HandleRequest, const_cast<MetricsRegistry*>(registry_),
      MHD_OPTION_LISTEN_SOCKET, static_cast<MHD_socket>(fd),
      MHD_OPTION_CONNECTION_TIMEOUT, kConnectionTimeoutSeconds,
      MHD_OPTION_CONNECTION_LIMIT, kConnectionLimit, MHD_OPTION_END);
  if (daemon_ == nullptr) {
    return absl::InternalError(
        absl::StrCat(kField, ": cannot start the HTTP server on ", address));
  }
  bound_address_ = FormatAddress(bound);
  port_ = bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return absl::OkStatus();
}

void MetricsHttpEndpoint::Stop() {
  if (daemon_ == nullptr) return;
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
}

}  // namespace swarm
