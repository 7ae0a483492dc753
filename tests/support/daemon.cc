#include "tests/support/daemon.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace swarm::testing {
namespace {

// The next line, which must be "<prefix>HOST:PORT": HOST:PORT.
absl::StatusOr<std::string> ReadAddressLine(const DaemonStart& start,
                                            Process& process,
                                            absl::string_view prefix) {
  absl::StatusOr<std::string> line =
      process.ReadLine(absl::Now() + start.timeout);
  auto with_log = [&start](absl::StatusCode code, absl::string_view what) {
    return absl::Status(
        code, absl::StrCat("site ", start.name, ": ", what, "\nlog:\n",
                           LastLines(ReadFileOrEmpty(start.log_path), 20)));
  };
  if (!line.ok()) {
    return with_log(line.status().code(),
                    absl::StrCat("no \"", prefix, "HOST:PORT\" line: ",
                                 line.status().message()));
  }
  absl::string_view address = *line;
  if (!absl::ConsumePrefix(&address, prefix) || address.empty()) {
    return with_log(
        absl::StatusCode::kInternal,
        absl::StrCat("printed \"", *line, "\", not \"", prefix, "HOST:PORT\""));
  }
  return std::string(address);
}

}  // namespace

absl::StatusOr<StartedDaemon> StartDaemon(const DaemonStart& start) {
  absl::StatusOr<std::unique_ptr<Process>> process =
      Process::Start(start.argv, "", start.log_path);
  if (!process.ok()) return process.status();
  StartedDaemon daemon;
  daemon.process = *std::move(process);
  absl::StatusOr<std::string> address =
      ReadAddressLine(start, *daemon.process, "listening on ");
  if (!address.ok()) return address.status();  // ~Process kills it.
  daemon.address = *std::move(address);
  if (start.expect_metrics) {
    absl::StatusOr<std::string> metrics =
        ReadAddressLine(start, *daemon.process, "metrics listening on ");
    if (!metrics.ok()) return metrics.status();
    daemon.metrics_address = *std::move(metrics);
  }
  return daemon;
}

}  // namespace swarm::testing
