#include "common/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace swarm {
namespace {

struct LogState {
  absl::Mutex mu;
  LogSeverity min_severity ABSL_GUARDED_BY(mu) = LogSeverity::kInfo;
  std::string tag ABSL_GUARDED_BY(mu);
};

LogState& State() {
  static LogState* state = [] {
    auto* s = new LogState;
    const char* level = std::getenv("SWARM_LOG_LEVEL");
    if (level != nullptr && std::strcmp(level, "debug") == 0) {
      absl::MutexLock lock(&s->mu);
      s->min_severity = LogSeverity::kDebug;
    }
    return s;
  }();
  return *state;
}

char SeverityLetter(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kDebug:
      return 'D';
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
  }
  return '?';
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  absl::MutexLock lock(&State().mu);
  State().min_severity = severity;
}

void SetLogTag(absl::string_view tag) {
  absl::MutexLock lock(&State().mu);
  State().tag = std::string(tag);
}

void LogLine(LogSeverity severity, absl::string_view message) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  if (severity < state.min_severity) return;
  const std::string when = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                            absl::UTCTimeZone());
  std::fprintf(stderr, "%s %c %s%s%.*s\n", when.c_str(),
               SeverityLetter(severity), state.tag.c_str(),
               state.tag.empty() ? "" : "| ", static_cast<int>(message.size()),
               message.data());
}

}  // namespace swarm
