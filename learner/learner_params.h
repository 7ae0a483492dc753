// Learner parameters: string settings from the site config and the job,
// where "<key>.<site>" (for one site) wins over "<key>" (for every site).
#ifndef SWARM_LEARNER_LEARNER_PARAMS_H_
#define SWARM_LEARNER_LEARNER_PARAMS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swarm {

struct LearnerParam {
  std::string key;  // The key actually found, for error messages.
  std::string value;
};

// The value of `key` for `site`, or nullopt when neither form is given.
std::optional<LearnerParam> LookupLearnerParam(
    const std::map<std::string, std::string>& params, absl::string_view key,
    absl::string_view site);

// InvalidArgument: `learner param "<key>": "<value>" <why>`.
absl::Status BadLearnerParam(const LearnerParam& param, absl::string_view why);

// `param`'s value as an integer in [min, max] (surrounding whitespace
// ignored; no sign). InvalidArgument (BadLearnerParam) otherwise.
absl::StatusOr<uint64_t> ParseUintParam(const LearnerParam& param, uint64_t min,
                                        uint64_t max);

// The same for `text`, one entry of `param`'s value (e.g. of a
// comma-separated list); errors name the whole parameter.
absl::StatusOr<uint64_t> ParseUintParam(const LearnerParam& param,
                                        absl::string_view text, uint64_t min,
                                        uint64_t max);

// Keys of `params` that are none of `known` (plain or "<known>.<site>").
std::set<std::string> UnknownLearnerParams(
    const std::map<std::string, std::string>& params,
    absl::Span<const char* const> known);

}  // namespace swarm

#endif  // SWARM_LEARNER_LEARNER_PARAMS_H_
