#include "metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A whole HTTP/1.0 exchange over a real socket to 127.0.0.1:`port`: sends
// `request_line` and reads until the server closes (every read bounded).
absl::StatusOr<std::string> HttpExchange(int port,
                                         const std::string& request_line) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval timeout = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return absl::UnavailableError("connect refused");
  }
  const std::string request =
      absl::StrCat(request_line, "\r\nHost: 127.0.0.1\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::InternalError("send");
  }
  std::string response;
  char buffer[4096];
  while (true) {
    const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got < 0) {
      close(fd);
      return absl::DeadlineExceededError("recv timed out");
    }
    if (got == 0) break;
    response.append(buffer, got);
  }
  close(fd);
  return response;
}

class HttpEndpointTest : public ::testing::Test {
 protected:
  HttpEndpointTest() {
    auto rounds =
        registry_.AddCounter("swarm_rounds_completed_total",
                             "Rounds this site aggregated.", {"site"});
    (*(*rounds)->WithLabels({"site-a"}))->Inc(3).IgnoreError();
  }
  MetricsRegistry registry_;
};

TEST_F(HttpEndpointTest, ServesTheExpositionOnGetMetrics) {
  MetricsHttpEndpoint endpoint(&registry_);
  ASSERT_TRUE(endpoint.Start("127.0.0.1:0").ok());
  ASSERT_GT(endpoint.port(), 0);
  EXPECT_EQ(endpoint.bound_address(),
            absl::StrCat("127.0.0.1:", endpoint.port()));

  absl::StatusOr<std::string> response =
      HttpExchange(endpoint.port(), "GET /metrics HTTP/1.0");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(*response, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(*response, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(*response, HasSubstr("\r\n\r\n" + registry_.Exposition()));
  EXPECT_THAT(*response,
              HasSubstr("swarm_rounds_completed_total{site=\"site-a\"} 3\n"));

  // A later scrape sees the change.
  (*(*registry_.AddCounter("swarm_rounds_completed_total",
                           "Rounds this site aggregated.", {"site"}))
        ->WithLabels({"site-a"}))
      ->Inc()
      .IgnoreError();
  response = HttpExchange(endpoint.port(), "GET /metrics HTTP/1.1");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(*response,
              HasSubstr("swarm_rounds_completed_total{site=\"site-a\"} 4\n"));
}

TEST_F(HttpEndpointTest, OtherPathsAre404AndOtherMethods405) {
  MetricsHttpEndpoint endpoint(&registry_);
  ASSERT_TRUE(endpoint.Start("127.0.0.1:0").ok());
  for (const char* path : {"/", "/metrics/", "/favicon.ico", "/metricsx"}) {
    absl::StatusOr<std::string> response =
        HttpExchange(endpoint.port(), absl::StrCat("GET ", path, " HTTP/1.0"));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_THAT(*response, StartsWith("HTTP/1.1 404")) << path;
    EXPECT_THAT(*response, ::testing::Not(HasSubstr("swarm_rounds")));
  }
  absl::StatusOr<std::string> post =
      HttpExchange(endpoint.port(), "POST /metrics HTTP/1.0");
  ASSERT_TRUE(post.ok()) << post.status();
  EXPECT_THAT(*post, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(*post, HasSubstr("Allow: GET, HEAD"));
}

TEST_F(HttpEndpointTest, AnAddressInUseNamesTheField) {
  // Something else listens on a port first.
  const int other = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(other, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&address), sizeof(address)),
            0);
  ASSERT_EQ(listen(other, 4), 0);
  socklen_t size = sizeof(address);
  getsockname(other, reinterpret_cast<sockaddr*>(&address), &size);
  const std::string taken = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));

  MetricsHttpEndpoint endpoint(&registry_);
  const absl::Status status = endpoint.Start(taken);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("metrics_listen"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(taken));
  EXPECT_THAT(std::string(status.message()), HasSubstr("in use"));
  EXPECT_TRUE(endpoint.bound_address().empty());
  close(other);

  // A second endpoint on the first one's port fails the same way.
  MetricsHttpEndpoint first(&registry_);
  ASSERT_TRUE(first.Start("127.0.0.1:0").ok());
  MetricsHttpEndpoint second(&registry_);
  EXPECT_THAT(std::string(second.Start(first.bound_address()).message()),
              HasSubstr("in use"));
}

TEST_F(HttpEndpointTest, AnUnparsableAddressNamesTheField) {
  for (const char* bad : {"", "9464", "127.0.0.1", "127.0.0.1:",
                          "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:-1",
                          "::1:9464", "[::1]9464", ":9464", "[::1"}) {
    MetricsHttpEndpoint endpoint(&registry_);
    const absl::Status status = endpoint.Start(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << bad << ": " << status;
    EXPECT_THAT(std::string(status.message()), StartsWith("metrics_listen: "))
        << bad;
  }
  MetricsHttpEndpoint endpoint(&registry_);
  const absl::Status status = endpoint.Start("no-such-host.invalid:9464");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("metrics_listen: cannot resolve"));
}

TEST_F(HttpEndpointTest, StartTwiceFailsAndStopClosesThePort) {
  MetricsHttpEndpoint endpoint(&registry_);
  ASSERT_TRUE(endpoint.Start("127.0.0.1:0").ok());
  EXPECT_EQ(endpoint.Start("127.0.0.1:0").code(),
            absl::StatusCode::kFailedPrecondition);
  const int port = endpoint.port();
  endpoint.Stop();
  endpoint.Stop();
  EXPECT_EQ(HttpExchange(port, "GET /metrics HTTP/1.0").status().code(),
            absl::StatusCode::kUnavailable);
  // The port can be taken again at once.
  MetricsHttpEndpoint again(&registry_);
  EXPECT_TRUE(again.Start(absl::StrCat("127.0.0.1:", port)).ok());
}

TEST_F(HttpEndpointTest, ServesIpv6Loopback) {
  MetricsHttpEndpoint endpoint(&registry_);
  const absl::Status status = endpoint.Start("[::1]:0");
  if (!status.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << status;
  EXPECT_THAT(endpoint.bound_address(), StartsWith("[::1]:"));
}

}  // namespace
}  // namespace swarm
