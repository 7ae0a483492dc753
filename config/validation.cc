#include "config/validation.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"

namespace swarm {
namespace {

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '_' || c == '-';
}

bool IsIpv6Char(char c) {
  return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' ||
         c == '.';
}

constexpr size_t kMaxHostLength = 253;

absl::Status ErrnoStatus(int err, absl::string_view what,
                         const std::string& path, absl::string_view op) {
  std::string message =
      absl::StrFormat("%s %s: %s: %s", what, path, op, strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::FailedPreconditionError(message);
  }
}

// Collapses protobuf's multi-line syntax errors onto one line.
std::string OneLine(absl::string_view text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

// Rewrites protobuf 3.21's JSON parse messages so that they start with the
// field path:
//   "(round_timeout_ms): invalid value -5 for type TYPE_UINT64"
//   "bogus: Cannot find field."
//   "(sites[0]) adress: Cannot find field."
std::string RewriteJsonError(absl::string_view raw) {
  std::string message = OneLine(raw);
  absl::string_view m = message;
  constexpr absl::string_view kCannotFind = ": Cannot find field.";
  if (absl::EndsWith(m, kCannotFind)) {
    absl::string_view path = m.substr(0, m.size() - kCannotFind.size());
    std::string full;
    if (absl::ConsumePrefix(&path, "(")) {
      size_t close = path.find(") ");
      if (close != absl::string_view::npos) {
        full = absl::StrCat(path.substr(0, close), ".", path.substr(close + 2));
      }
    }
    if (full.empty()) full = std::string(path);
    return absl::StrFormat("unknown field \"%s\"", full);
  }
  if (absl::StartsWith(m, "(")) {
    size_t close = m.find("): ");
    if (close != absl::string_view::npos) {
      absl::string_view path = m.substr(1, close - 1);
      absl::string_view rest = m.substr(close + 3);
      std::string out = absl::StrCat(path, ": ", rest);
      if (absl::EndsWith(path, "_ms")) {
        absl::StrAppend(&out, " (durations are unsigned integer milliseconds)");
      }
      return out;
    }
  }
  return absl::StrCat("malformed JSON: ", message);
}

}  // namespace

absl::Status ValidateName(absl::string_view field, absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: \"%s...\" is %d characters long, the limit is %d", field,
        name.substr(0, 16), name.size(), kMaxNameLength));
  }
  for (char c : name) {
    if (!IsNameChar(c)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: \"%s\" has a character outside [A-Za-z0-9._-]",
                          field, absl::CHexEscape(name)));
    }
  }
  if (name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: \"%s\" is not allowed", field, name));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "\"%s\" is not host:port (%s)", absl::CHexEscape(address), why));
  };
  if (address.empty()) return absl::InvalidArgumentError("empty");
  if (address.find("://") != absl::string_view::npos ||
      absl::StartsWith(address, "unix:")) {
    return fail("no scheme such as dns:// or unix: is allowed");
  }
  HostPort out;
  absl::string_view port_text;
  if (address.front() == '[') {
    size_t close = address.find(']');
    if (close == absl::string_view::npos) return fail("missing \"]\"");
    absl::string_view host = address.substr(1, close - 1);
    absl::string_view zone;
    size_t percent = host.find('%');
    if (percent != absl::string_view::npos) {
      zone = host.substr(percent + 1);
      host = host.substr(0, percent);
      if (zone.empty()) return fail("empty IPv6 zone");
      for (char c : zone) {
        if (!IsNameChar(c)) return fail("bad character in IPv6 zone");
      }
    }
    if (host.empty()) return fail("empty IPv6 address");
    if (host.find(':') == absl::string_view::npos) {
      return fail("an IPv6 address in brackets needs a \":\"");
    }
    for (char c : host) {
      if (!IsIpv6Char(c)) return fail("bad character in IPv6 address");
    }
    absl::string_view after = address.substr(close + 1);
    if (!absl::ConsumePrefix(&after, ":")) return fail("missing \":port\"");
    out.host = std::string(address.substr(1, close - 1));
    port_text = after;
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return fail("missing \":port\"");
    absl::string_view host = address.substr(0, colon);
    if (host.empty()) return fail("empty host");
    if (host.find(':') != absl::string_view::npos) {
      return fail("write an IPv6 address in brackets, e.g. [::1]:7001");
    }
    if (host.size() > kMaxHostLength) return fail("host name too long");
    for (char c : host) {
      if (!IsNameChar(c)) return fail("bad character in host");
    }
    out.host = std::string(host);
    port_text = address.substr(colon + 1);
  }
  if (port_text.empty()) return fail("empty port");
  if (port_text.size() > 5) return fail("port must be in 1..65535");
  uint32_t port = 0;
  for (char c : port_text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return fail("port is not a decimal number");
    }
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port < 1 || port > 65535) return fail("port must be in 1..65535");
  out.port = static_cast<uint16_t>(port);
  return out;
}

absl::Status ValidateHostPort(absl::string_view field,
                              absl::string_view address) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", parsed.status().message()));
}

absl::StatusOr<std::string> ReadConfigFile(const std::string& path,
                                           absl::string_view what) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  }
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, what, path, "cannot open");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, what, path, "cannot stat");
  }
  if (S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) > kMaxConfigFileBytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %s: %d bytes, more than the %d bytes allowed", what,
                        path, st.st_size, kMaxConfigFileBytes));
  }
  std::string contents;
  char buffer[65536];
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoStatus(err, what, path, "cannot read");
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
    if (contents.size() > kMaxConfigFileBytes) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s: more than the %d bytes allowed", what, path,
                          kMaxConfigFileBytes));
    }
  }
  close(fd);
  return contents;
}

absl::Status ParseJsonConfig(absl::string_view json,
                             google::protobuf::Message* message) {
  message->Clear();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  options.case_insensitive_enum_parsing = false;
  google::protobuf::util::Status status =
      google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(json.data(), json.size()), message,
          options);
  if (status.ok()) return absl::OkStatus();
  auto raw = status.message();
  message->Clear();
  return absl::InvalidArgumentError(
      RewriteJsonError(absl::string_view(raw.data(), raw.size())));
}

}  // namespace swarm
