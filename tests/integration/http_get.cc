#include "tests/integration/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace swarm::testing {
namespace {

// Waits until `fd` is ready for `events`; false at `deadline`.
bool WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd poll_fd = {fd, events, 0};
    const int ready = poll(
        &poll_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(absl::string_view host_port,
                                     absl::string_view target,
                                     absl::Time deadline) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad address ", host_port));
  }
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  const std::string host(host_port.substr(0, colon));
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not IPv4: ", host));
  }
  Fd socket_fd{socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (socket_fd.fd < 0) return absl::InternalError("socket");
  if (connect(socket_fd.fd, reinterpret_cast<sockaddr*>(&address),
              sizeof(address)) != 0) {
    if (errno != EINPROGRESS) {
      return absl::UnavailableError(
          absl::StrCat("connect ", host_port, ": ", std::strerror(errno)));
    }
    if (!WaitFor(socket_fd.fd, POLLOUT, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("connect ", host_port));
    }
    int error = 0;
    socklen_t size = sizeof(error);
    getsockopt(socket_fd.fd, SOL_SOCKET, SO_ERROR, &error, &size);
    if (error != 0) {
      return absl::UnavailableError(
          absl::StrCat("connect ", host_port, ": ", std::strerror(error)));
    }
  }
  const std::string request = absl::StrCat(
      "GET ", target, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    if (!WaitFor(socket_fd.fd, POLLOUT, deadline)) {
      return absl::DeadlineExceededError("send");
    }
    const ssize_t n = send(socket_fd.fd, request.data() + sent,
                           request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("send: ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[8192];
  while (true) {
    if (!WaitFor(socket_fd.fd, POLLIN, deadline)) {
      return absl::DeadlineExceededError("recv");
    }
    const ssize_t n = recv(socket_fd.fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("recv: ", std::strerror(errno)));
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  // "HTTP/1.x NNN reason\r\n headers \r\n\r\n body"
  HttpResponse out;
  const size_t header_end = response.find("\r\n\r\n");
  if (response.size() < 12 || header_end == std::string::npos ||
      !absl::SimpleAtoi(response.substr(9, 3), &out.status)) {
    return absl::DataLossError(
        absl::StrCat("not an HTTP response: ", response.substr(0, 80)));
  }
  out.body = response.substr(header_end + 4);
  return out;
}

std::string UrlEncode(absl::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' ||
        c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, absl::StrFormat("%%%02X", c));
    }
  }
  return out;
}

absl::StatusOr<int> PickFreePort() {
  Fd socket_fd{socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (socket_fd.fd < 0) return absl::InternalError("socket");
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  if (bind(socket_fd.fd, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      getsockname(socket_fd.fd, reinterpret_cast<sockaddr*>(&address), &size) !=
          0) {
    return absl::UnavailableError(
        absl::StrCat("no free port: ", std::strerror(errno)));
  }
  return ntohs(address.sin_port);
}

}  // namespace swarm::testing
