#include "common/logging.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace swarm {
namespace {

struct LogState {
  absl::Mutex mu;
  LogSeverity min_severity ABSL_GUARDED_BY(mu) = LogSeverity::kInfo;
  LogFormat format ABSL_GUARDED_BY(mu) = LogFormat::kText;
  std::string tag ABSL_GUARDED_BY(mu);
  std::string job ABSL_GUARDED_BY(mu);
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

const char* SeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kDebug:
      return "debug";
    case LogSeverity::kInfo:
      return "info";
    case LogSeverity::kWarning:
      return "warning";
    case LogSeverity::kError:
      return "error";
  }
  return "unknown";
}

// The round a message is about when it starts "round N" (the controller's
// convention: "round 3: learn task from site-b").
bool RoundOf(absl::string_view message, uint32_t* round) {
  if (!absl::ConsumePrefix(&message, "round ")) return false;
  size_t digits = 0;
  while (digits < message.size() && digits < 10 &&
         absl::ascii_isdigit(static_cast<unsigned char>(message[digits]))) {
    ++digits;
  }
  if (digits == 0) return false;
  if (digits < message.size() && message[digits] != ':' &&
      message[digits] != ' ' && message[digits] != ',') {
    return false;
  }
  return absl::SimpleAtoi(message.substr(0, digits), round);
}

// Length of the valid UTF-8 sequence at the start of `text`, or 0.
size_t Utf8SequenceLength(absl::string_view text) {
  const auto byte = [&text](size_t i) {
    return static_cast<unsigned char>(text[i]);
  };
  const unsigned char lead = byte(0);
  size_t length;
  uint32_t code;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code = lead & 0x07;
  } else {
    return 0;  // A continuation byte, an overlong lead (C0, C1) or F5..FF.
  }
  if (text.size() < length) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i) & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and code points past U+10FFFF.
  if ((length == 3 && code < 0x800) || (length == 4 && code < 0x10000) ||
      (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
    return 0;
  }
  return length;
}

void AppendJsonString(absl::string_view key, absl::string_view value,
                      std::string* out) {
  absl::StrAppend(out, ",\"", key, "\":\"", JsonEscape(value), "\"");
}

void Emit(LogSeverity severity, absl::string_view event,
          absl::string_view message,
          const std::map<std::string, std::string>& fields) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  if (severity < state.min_severity) return;
  LogRecord record;
  record.time = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                 absl::UTCTimeZone());
  record.severity = severity;
  record.site = state.tag;
  record.job = state.job;
  record.event = std::string(event);
  record.message = std::string(message);
  record.fields = fields;
  const std::string line = FormatLogRecord(state.format, record);
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

std::string JsonEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  while (!text.empty()) {
    const unsigned char c = static_cast<unsigned char>(text.front());
    if (c >= 0x80) {
      const size_t length = Utf8SequenceLength(text);
      if (length == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD for one bad byte.
        text.remove_prefix(1);
      } else {
        out.append(text.data(), length);
        text.remove_prefix(length);
      }
      continue;
    }
    text.remove_prefix(1);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out;
}

std::string FormatLogRecord(LogFormat format, const LogRecord& record) {
  if (format == LogFormat::kText) {
    std::string line = absl::StrCat(
        record.time, " ", std::string(1, SeverityLetter(record.severity)), " ",
        record.site, record.site.empty() ? "" : "| ", record.message);
    for (const auto& [key, value] : record.fields) {
      absl::StrAppend(&line, " ", key, "=", value);
    }
    return line;
  }
  std::string line =
      absl::StrCat("{\"time\":\"", JsonEscape(record.time), "\",\"level\":\"",
                   SeverityName(record.severity), "\"");
  if (!record.site.empty()) AppendJsonString("site", record.site, &line);
  if (!record.job.empty()) AppendJsonString("job", record.job, &line);
  uint32_t round = 0;
  if (RoundOf(record.message, &round)) {
    absl::StrAppend(&line, ",\"round\":", round);
  }
  if (!record.event.empty()) AppendJsonString("event", record.event, &line);
  AppendJsonString("msg", record.message, &line);
  if (!record.fields.empty()) {
    line += ",\"fields\":{";
    bool first = true;
    for (const auto& [key, value] : record.fields) {
      absl::StrAppend(&line, first ? "" : ",", "\"", JsonEscape(key), "\":\"",
                      JsonEscape(value), "\"");
      first = false;
    }
    line += "}";
  }
  line += "}";
  return line;
}

void SetMinLogSeverity(LogSeverity severity) {
  absl::MutexLock lock(&State().mu);
  State().min_severity = severity;
}

void SetLogTag(absl::string_view tag) {
  absl::MutexLock lock(&State().mu);
  State().tag = std::string(tag);
}

void SetLogFormat(LogFormat format) {
  absl::MutexLock lock(&State().mu);
  State().format = format;
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view flag,
                                         absl::string_view value) {
  if (value == "text") return LogFormat::kText;
  if (value == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": \"", value, "\" is not a log format (text or json)"));
}

void SetLogJob(absl::string_view job) {
  absl::MutexLock lock(&State().mu);
  State().job = std::string(job);
}

void LogLine(LogSeverity severity, absl::string_view message) {
  Emit(severity, "", message, {});
}

void LogEvent(LogSeverity severity, absl::string_view event,
              absl::string_view message,
              const std::map<std::string, std::string>& fields) {
  Emit(severity, event, message, fields);
}

}  // namespace swarm
