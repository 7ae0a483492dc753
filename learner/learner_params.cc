#include "learner/learner_params.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace swarm {

std::optional<LearnerParam> LookupLearnerParam(
    const std::map<std::string, std::string>& params, absl::string_view key,
    absl::string_view site) {
  std::string site_key = absl::StrCat(key, ".", site);
  auto it = params.find(site_key);
  if (it != params.end()) return LearnerParam{site_key, it->second};
  it = params.find(std::string(key));
  if (it != params.end()) return LearnerParam{it->first, it->second};
  return std::nullopt;
}

absl::Status BadLearnerParam(const LearnerParam& param, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "learner param \"%s\": \"%s\" %s", param.key, param.value, why));
}

absl::StatusOr<uint64_t> ParseUintParam(const LearnerParam& param, uint64_t min,
                                        uint64_t max) {
  return ParseUintParam(param, param.value, min, max);
}

absl::StatusOr<uint64_t> ParseUintParam(const LearnerParam& param,
                                        absl::string_view text, uint64_t min,
                                        uint64_t max) {
  uint64_t value;
  absl::string_view stripped = absl::StripAsciiWhitespace(text);
  if (stripped.empty() || stripped[0] == '-' || stripped[0] == '+' ||
      !absl::SimpleAtoi(stripped, &value)) {
    return BadLearnerParam(param, "is not a non-negative integer");
  }
  if (value < min || value > max) {
    return BadLearnerParam(param,
                           absl::StrFormat("is not in [%d, %d]", min, max));
  }
  return value;
}

std::set<std::string> UnknownLearnerParams(
    const std::map<std::string, std::string>& params,
    absl::Span<const char* const> known) {
  std::set<std::string> unknown;
  for (const auto& [key, value] : params) {
    bool found = false;
    for (const char* k : known) {
      absl::string_view rest = key;
      if (absl::ConsumePrefix(&rest, k) &&
          (rest.empty() || (rest.size() > 1 && rest[0] == '.'))) {
        found = true;
        break;
      }
    }
    if (!found) unknown.insert(key);
  }
  return unknown;
}

}  // namespace swarm
