// The one logging approach of the project: one line per event on stderr,
//   2026-11-30T06:13:50.123Z I site-a| message
// or, with SetLogFormat(LogFormat::kJson), one JSON object per line for a log
// shipper:
//   {"time":"2026-11-30T06:13:50.123Z","level":"info","site":"site-a",
//    "job":"demo-1","round":3,"msg":"round 3: learn task from site-b"}
// ("site" and "job" when set, "round" when the message starts "round N",
// "event" and "fields" when logged with LogEvent).
// Thread-safe. Debian's Abseil (20220623) has no absl/log, so this is ours.
#ifndef SWARM_COMMON_LOGGING_H_
#define SWARM_COMMON_LOGGING_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace swarm {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Lines below `severity` are dropped. Default kInfo; SWARM_LOG_LEVEL=debug
// in the environment lowers it.
void SetMinLogSeverity(LogSeverity severity);
// A short tag printed on every line (e.g. the site name).
void SetLogTag(absl::string_view tag);

enum class LogFormat { kText, kJson };

// kText (the default) or kJson.
void SetLogFormat(LogFormat format);
// "text" or "json"; InvalidArgument naming `flag` otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view flag,
                                         absl::string_view value);
// The job the process works on now ("" when none): the "job" key of JSON
// lines.
void SetLogJob(absl::string_view job);

void LogLine(LogSeverity severity, absl::string_view message);

// A line with a short event name (e.g. "metrics_listening") and fields;
// in text format the fields follow the message as key=value.
void LogEvent(LogSeverity severity, absl::string_view event,
              absl::string_view message,
              const std::map<std::string, std::string>& fields = {});

// Exposed for tests.
struct LogRecord {
  std::string time;  // RFC 3339, UTC, milliseconds.
  LogSeverity severity = LogSeverity::kInfo;
  std::string site;
  std::string job;
  std::string event;
  std::string message;
  std::map<std::string, std::string> fields;
};
// One line, without the newline.
std::string FormatLogRecord(LogFormat format, const LogRecord& record);
// `text` as the inside of a JSON string: `"`, `\` and control characters
// escaped, invalid UTF-8 replaced by U+FFFD.
std::string JsonEscape(absl::string_view text);

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
