// The one logging approach of the project: one line per event on stderr,
//   2026-11-30T06:13:50.123Z I site-a| message
// Thread-safe. Debian's Abseil (20220623) has no absl/log, so this is ours.
#ifndef SWARM_COMMON_LOGGING_H_
#define SWARM_COMMON_LOGGING_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace swarm {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Lines below `severity` are dropped. Default kInfo; SWARM_LOG_LEVEL=debug
// in the environment lowers it.
void SetMinLogSeverity(LogSeverity severity);
// A short tag printed on every line (e.g. the site name).
void SetLogTag(absl::string_view tag);

void LogLine(LogSeverity severity, absl::string_view message);

template <typename... Args>
void LogF(LogSeverity severity, const absl::FormatSpec<Args...>& format,
          const Args&... args) {
  LogLine(severity, absl::StrFormat(format, args...));
}

}  // namespace swarm

#define SWARM_LOG_DEBUG(...) \
  ::swarm::LogF(::swarm::LogSeverity::kDebug, __VA_ARGS__)
#define SWARM_LOG_INFO(...) \
  ::swarm::LogF(::swarm::LogSeverity::kInfo, __VA_ARGS__)
#define SWARM_LOG_WARNING(...) \
  ::swarm::LogF(::swarm::LogSeverity::kWarning, __VA_ARGS__)
#define SWARM_LOG_ERROR(...) \
  ::swarm::LogF(::swarm::LogSeverity::kError, __VA_ARGS__)

#endif  // SWARM_COMMON_LOGGING_H_
