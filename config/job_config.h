// The job config (v1::JobConfig): reading it from JSON, its defaults, and its
// validation (design section 7: a malformed config names the field and the
// rule).
//
// The usual path is LoadJobConfig(path) = read + parse + WithDefaults +
// ValidateJobConfig. A config that arrives over the wire (Configure) goes
// through WithDefaults + ValidateJobConfig.
#ifndef SWARM_CONFIG_JOB_CONFIG_H_
#define SWARM_CONFIG_JOB_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/swarm.pb.h"
#include "streaming/chunker.h"

namespace swarm {

// Defaults applied by WithDefaults (also documented in swarm.proto).
inline constexpr uint64_t kDefaultWaitAfterMinResponsesMs = 10'000;
inline constexpr uint64_t kDefaultRoundTimeoutMs = 3'600'000;
inline constexpr uint32_t kDefaultMaxConcurrentSubmissions = 1;
inline constexpr uint64_t kDefaultRequestToSubmitIntervalMs = 1'000;
inline constexpr uint64_t kDefaultRequestToSubmitMaxWaitMs = 600'000;
inline constexpr uint64_t kDefaultRequestToSubmitMessageTimeoutMs = 5'000;
inline constexpr uint64_t kDefaultFinalResultAckTimeoutMs = 600'000;
inline constexpr uint64_t kDefaultLearnTaskAckTimeoutMs = 60'000;
inline constexpr uint64_t kDefaultFailoverTimeoutMs = 5'000;
inline constexpr uint32_t kDefaultFailoverAttempts = 3;
inline constexpr double kDefaultTrimFraction = 0.1;  // TRIMMED_MEAN only.
inline constexpr char kDefaultMetricName[] = "accuracy";
inline constexpr uint64_t kDefaultMaxModelBytes = 64ull << 30;
inline constexpr uint64_t kDefaultLeanMemoryMinModelBytes = 128ull << 20;
inline constexpr bool kDefaultBroadcastLearnTasks = false;
inline constexpr bool kDefaultReduceResultsInChain = false;

// Limits checked by ValidateJobConfig.
// kMinChunkSize, kMaxChunkSize, kDefaultChunkSize: streaming/chunker.h.
inline constexpr uint64_t kMinMaxModelBytes = 1024;
inline constexpr uint64_t kMaxDurationMs = 30ull * 24 * 3600 * 1000;  // 30 d

// Parses proto3 JSON (field names as in swarm.proto or lowerCamelCase;
// durations as unsigned integer milliseconds). Unknown fields are refused.
// InvalidArgument "job config: <field>: ..." (e.g. `job config: unknown field
// "bogus"`, `job config: round_timeout_ms: invalid value -5 ...`). No
// defaults, no validation.
absl::StatusOr<v1::JobConfig> ParseJobConfigJson(absl::string_view json);

// Reads and parses a JSON file. Errors name the path; an unreadable file also
// gives strerror: `job config /x/job.json: cannot open: No such file or
// directory` (NotFound / PermissionDenied / FailedPrecondition).
absl::StatusOr<v1::JobConfig> ReadJobConfigFile(const std::string& path);

// Fills every unset (zero / empty) field with its default: trainers and
// aggregator_candidates = all sites in order, starting_site = the first site,
// min_responses_required = number of trainers, the durations above,
// max_concurrent_submissions = 1, trim_fraction = 0.1 for TRIMMED_MEAN (other
// methods keep 0), metric_name = "accuracy", chunk_size = 1 MiB,
// max_model_bytes = 64 GiB. Idempotent. Set fields are kept even if invalid.
v1::JobConfig WithDefaults(v1::JobConfig config);

// Checks every rule and reports all violations in one InvalidArgument, each
// "<field>: <rule>", joined by "; ", after "invalid job config: ". The config
// is judged as WithDefaults would make it (so it need not have been defaulted
// first; an empty list and a zero field mean "the default").
//
// Rules: job_id is a name (1..64 of [A-Za-z0-9._-], not "." / ".."); at least
// one site; site names are names and unique; addresses are host:port (port
// 1..65535, IPv6 as [::1]:port) and unique (case-insensitively);
// extra_sans non-empty; trainers and aggregator_candidates name known sites,
// once each, and are non-empty; starting_site is a site; num_rounds >= 1 and
// start_round + num_rounds - 1 fits in uint32; min_responses_required <=
// number of trainers; every duration <= 30 days; trim_fraction in [0, 0.5);
// chunk_size in [4 KiB, 64 MiB]; max_model_bytes >= 1 KiB; enums hold known
// values; metric_name non-empty; learner_params keys non-empty.
absl::Status ValidateJobConfig(const v1::JobConfig& config);

// Read + parse + WithDefaults + ValidateJobConfig. Validation errors read
// "invalid job config <path>: <field>: <rule>; ...".
absl::StatusOr<v1::JobConfig> LoadJobConfig(const std::string& path);

// The site called `name`, or nullptr.
const v1::SiteInfo* FindSite(const v1::JobConfig& config,
                             absl::string_view name);

// Whether `site` trains / may aggregate. An empty list means all sites (the
// default), so these give the same answer before and after WithDefaults.
bool IsTrainer(const v1::JobConfig& config, absl::string_view site);
bool IsCandidate(const v1::JobConfig& config, absl::string_view site);

// A config duration. Values beyond int64 milliseconds are infinite (validated
// configs never get there).
absl::Duration Millis(uint64_t ms);

}  // namespace swarm

#endif  // SWARM_CONFIG_JOB_CONFIG_H_
