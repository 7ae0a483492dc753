#include "config/job_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/robust_requirements.h"
#include "config/validation.h"

namespace swarm {
namespace {

// Checks a list of site names (trainers, aggregator_candidates): each a site
// of the job, none twice.
void CheckSiteList(const v1::JobConfig& config, absl::string_view field,
                   const google::protobuf::RepeatedPtrField<std::string>& list,
                   std::vector<std::string>* errors) {
  absl::flat_hash_map<std::string, int> seen;
  for (int i = 0; i < list.size(); ++i) {
    const std::string& name = list[i];
    if (FindSite(config, name) == nullptr) {
      errors->push_back(
          absl::StrFormat("%s[%d]: \"%s\" is not a site of the job", field, i,
                          absl::CHexEscape(name)));
    }
    auto [it, inserted] = seen.emplace(name, i);
    if (!inserted) {
      errors->push_back(
          absl::StrFormat("%s[%d]: \"%s\" is listed twice (also %s[%d])", field,
                          i, absl::CHexEscape(name), field, it->second));
    }
  }
}

bool InList(const google::protobuf::RepeatedPtrField<std::string>& list,
            absl::string_view name) {
  for (const std::string& entry : list) {
    if (entry == name) return true;
  }
  return false;
}

void AddIfError(const absl::Status& status, std::vector<std::string>* errors) {
  if (!status.ok()) errors->push_back(std::string(status.message()));
}

}  // namespace

absl::StatusOr<v1::JobConfig> ParseJobConfigJson(absl::string_view json) {
  v1::JobConfig config;
  absl::Status status = ParseJsonConfig(json, &config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job config: ", status.message()));
  }
  return config;
}

absl::StatusOr<v1::JobConfig> ReadJobConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadConfigFile(path, "job config");
  if (!text.ok()) return text.status();
  v1::JobConfig config;
  absl::Status status = ParseJsonConfig(*text, &config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job config ", path, ": ", status.message()));
  }
  return config;
}

v1::JobConfig WithDefaults(v1::JobConfig c) {
  if (c.trainers().empty()) {
    for (const v1::SiteInfo& site : c.sites()) c.add_trainers(site.name());
  }
  if (c.aggregator_candidates().empty()) {
    for (const v1::SiteInfo& site : c.sites()) {
      c.add_aggregator_candidates(site.name());
    }
  }
  if (c.starting_site().empty() && !c.sites().empty()) {
    c.set_starting_site(c.sites(0).name());
  }
  if (c.min_responses_required() == 0) {
    c.set_min_responses_required(static_cast<uint32_t>(c.trainers_size()));
  }
  auto fill = [](uint64_t value, uint64_t fallback) {
    return value == 0 ? fallback : value;
  };
  c.set_wait_after_min_responses_ms(
      fill(c.wait_after_min_responses_ms(), kDefaultWaitAfterMinResponsesMs));
  c.set_round_timeout_ms(fill(c.round_timeout_ms(), kDefaultRoundTimeoutMs));
  if (c.max_concurrent_submissions() == 0) {
    c.set_max_concurrent_submissions(kDefaultMaxConcurrentSubmissions);
  }
  c.set_request_to_submit_interval_ms(fill(c.request_to_submit_interval_ms(),
                                           kDefaultRequestToSubmitIntervalMs));
  c.set_request_to_submit_max_wait_ms(fill(c.request_to_submit_max_wait_ms(),
                                           kDefaultRequestToSubmitMaxWaitMs));
  c.set_request_to_submit_message_timeout_ms(
      fill(c.request_to_submit_message_timeout_ms(),
           kDefaultRequestToSubmitMessageTimeoutMs));
  c.set_final_result_ack_timeout_ms(
      fill(c.final_result_ack_timeout_ms(), kDefaultFinalResultAckTimeoutMs));
  c.set_learn_task_ack_timeout_ms(
      fill(c.learn_task_ack_timeout_ms(), kDefaultLearnTaskAckTimeoutMs));
  c.set_failover_timeout_ms(
      fill(c.failover_timeout_ms(), kDefaultFailoverTimeoutMs));
  if (c.failover_attempts() == 0) {
    c.set_failover_attempts(kDefaultFailoverAttempts);
  }
  c.set_start_timeout_ms(
      fill(c.start_timeout_ms(),
           c.round_timeout_ms() + c.learn_task_ack_timeout_ms()));
  if (c.aggregation_method() == v1::AGGREGATION_TRIMMED_MEAN &&
      c.trim_fraction() == 0) {
    c.set_trim_fraction(kDefaultTrimFraction);
  }
  if (c.metric_name().empty()) c.set_metric_name(kDefaultMetricName);
  c.set_chunk_size(fill(c.chunk_size(), kDefaultChunkSize));
  c.set_max_model_bytes(fill(c.max_model_bytes(), kDefaultMaxModelBytes));
  if (!c.has_lean_memory_min_model_bytes()) {
    c.set_lean_memory_min_model_bytes(kDefaultLeanMemoryMinModelBytes);
  }
  if (!c.has_broadcast_learn_tasks()) {
    c.set_broadcast_learn_tasks(kDefaultBroadcastLearnTasks);
  }
  if (!c.has_reduce_results_in_chain()) {
    c.set_reduce_results_in_chain(kDefaultReduceResultsInChain);
  }
  return c;
}

namespace {

// The parts of ValidateJobConfig: each appends "field: problem" messages.
// `c` has its defaults applied; `given` is the config as written.
void CheckSites(const v1::JobConfig& c, std::vector<std::string>* errors) {
  // Sites.
  if (c.sites().empty()) {
    errors->push_back("sites: at least one site is required");
  }
  absl::flat_hash_map<std::string, int> names;
  absl::flat_hash_map<std::string, int> addresses;
  for (int i = 0; i < c.sites_size(); ++i) {
    const v1::SiteInfo& site = c.sites(i);
    absl::Status name_status =
        ValidateName(absl::StrFormat("sites[%d].name", i), site.name());
    AddIfError(name_status, errors);
    if (name_status.ok()) {
      auto [it, inserted] = names.emplace(site.name(), i);
      if (!inserted) {
        errors->push_back(absl::StrFormat(
            "sites[%d].name: \"%s\" is used twice (also sites[%d])", i,
            site.name(), it->second));
      }
    }
    absl::Status address_status = ValidateHostPort(
        absl::StrFormat("sites[%d].address", i), site.address());
    AddIfError(address_status, errors);
    if (address_status.ok()) {
      auto [it, inserted] =
          addresses.emplace(absl::AsciiStrToLower(site.address()), i);
      if (!inserted) {
        errors->push_back(absl::StrFormat(
            "sites[%d].address: \"%s\" is used twice (also sites[%d])", i,
            site.address(), it->second));
      }
    }
    for (int j = 0; j < site.extra_sans_size(); ++j) {
      if (site.extra_sans(j).empty()) {
        errors->push_back(
            absl::StrFormat("sites[%d].extra_sans[%d]: empty", i, j));
      }
    }
  }
}

void CheckRoles(const v1::JobConfig& c, const v1::JobConfig& given,
                std::vector<std::string>* errors) {
  // Roles. A list that defaulted to all sites is not checked entry by entry:
  // problems with the sites themselves are reported above.
  if (c.trainers().empty()) {
    errors->push_back("trainers: at least one trainer is required");
  } else if (!given.trainers().empty()) {
    CheckSiteList(c, "trainers", c.trainers(), errors);
  }
  if (c.aggregator_candidates().empty()) {
    errors->push_back(
        "aggregator_candidates: at least one candidate is required");
  } else if (!given.aggregator_candidates().empty()) {
    CheckSiteList(c, "aggregator_candidates", c.aggregator_candidates(),
                  errors);
  }
  if (!c.starting_site().empty() && FindSite(c, c.starting_site()) == nullptr) {
    errors->push_back(
        absl::StrFormat("starting_site: \"%s\" is not a site of the job",
                        absl::CHexEscape(c.starting_site())));
  }
}

void CheckRoundsAndDurations(const v1::JobConfig& c,
                             std::vector<std::string>* errors) {
  // Rounds.
  if (c.num_rounds() < 1) {
    errors->push_back("num_rounds: rounds must be at least 1");
  } else if (static_cast<uint64_t>(c.start_round()) + c.num_rounds() - 1 >
             std::numeric_limits<uint32_t>::max()) {
    errors->push_back(absl::StrFormat(
        "num_rounds: start_round %d + num_rounds %d goes past the last round "
        "number %d",
        c.start_round(), c.num_rounds(), std::numeric_limits<uint32_t>::max()));
  }
  if (c.min_responses_required() > static_cast<uint32_t>(c.trainers_size())) {
    errors->push_back(absl::StrFormat(
        "min_responses_required: %d is more than the number of trainers (%d)",
        c.min_responses_required(), c.trainers_size()));
  }

  // Durations.
  const struct {
    const char* field;
    uint64_t value;
  } durations[] = {
      {"wait_after_min_responses_ms", c.wait_after_min_responses_ms()},
      {"round_timeout_ms", c.round_timeout_ms()},
      {"request_to_submit_interval_ms", c.request_to_submit_interval_ms()},
      {"request_to_submit_max_wait_ms", c.request_to_submit_max_wait_ms()},
      {"request_to_submit_message_timeout_ms",
       c.request_to_submit_message_timeout_ms()},
      {"final_result_ack_timeout_ms", c.final_result_ack_timeout_ms()},
      {"learn_task_ack_timeout_ms", c.learn_task_ack_timeout_ms()},
      {"failover_timeout_ms", c.failover_timeout_ms()},
      {"start_timeout_ms", c.start_timeout_ms()},
  };
  for (const auto& d : durations) {
    if (d.value > kMaxDurationMs) {
      errors->push_back(
          absl::StrFormat("%s: %d ms is more than 30 days (%d ms)", d.field,
                          d.value, kMaxDurationMs));
    }
  }
}

// Integrity (design section 11): f and what each method needs of the
// number of its inputs (checked on the fewest results a round may close
// with, in buckets when bucketing).
void CheckRobustness(const v1::JobConfig& c, std::vector<std::string>* errors) {
  const v1::AggregationMethod method = c.aggregation_method();
  const std::string name = v1::AggregationMethod_Name(method);
  const int f = static_cast<int>(c.tolerated_attackers());
  const bool fedavg = method == v1::AGGREGATION_FEDAVG;
  // The fewest results a round may close with, and the inputs they make.
  const int results = static_cast<int>(std::min<uint32_t>(
      c.min_responses_required(), static_cast<uint32_t>(c.trainers_size())));
  const int bucket =
      c.bucket_size() > 1 ? static_cast<int>(c.bucket_size()) : 1;
  const int inputs = (results + bucket - 1) / bucket;
  const std::string counted =
      bucket > 1 ? absl::StrFormat("%d buckets of %d of the %d results", inputs,
                                   bucket, results)
                 : absl::StrFormat("%d results", results);
  if (fedavg && f > 0) {
    errors->push_back(absl::StrFormat(
        "tolerated_attackers: %d with AGGREGATION_FEDAVG, which tolerates none "
        "(choose a robust aggregation_method)",
        f));
  } else if (!fedavg && inputs < RobustRequiredInputs(method, f)) {
    errors->push_back(absl::StrFormat(
        "tolerated_attackers: %s tolerating f = %d needs %s = %d inputs, but a "
        "round may close with %s (trainers, min_responses_required)",
        name, f, RobustRequirementText(method), RobustRequiredInputs(method, f),
        counted));
  }
  if (method == v1::AGGREGATION_TRIMMED_MEAN && f > 0) {
    const int trimmed =
        static_cast<int>(std::floor(c.trim_fraction() * inputs + 1e-9));
    if (trimmed < f) {
      errors->push_back(absl::StrFormat(
          "trim_fraction: %g trims %d of %d inputs at each end, fewer than "
          "tolerated_attackers (%d): AGGREGATION_TRIMMED_MEAN needs "
          "floor(trim_fraction * n) >= f",
          c.trim_fraction(), trimmed, inputs, f));
    }
  }
  if (c.krum_selected() > 0) {
    if (method != v1::AGGREGATION_MULTI_KRUM) {
      errors->push_back(absl::StrFormat(
          "krum_selected: only with AGGREGATION_MULTI_KRUM (not %s)", name));
    } else if (static_cast<int>(c.krum_selected()) > inputs - f) {
      errors->push_back(absl::StrFormat(
          "krum_selected: %d is more than n - f = %d (AGGREGATION_MULTI_KRUM "
          "with %s, f = %d)",
          c.krum_selected(), inputs - f, counted, f));
    }
  }
}

// The robust methods' own parameters, and the weights' options.
void CheckRobustParameters(const v1::JobConfig& c,
                           std::vector<std::string>* errors) {
  const bool fedavg = c.aggregation_method() == v1::AGGREGATION_FEDAVG;
  if (!(c.clipping_radius() >= 0) || !std::isfinite(c.clipping_radius())) {
    errors->push_back(
        absl::StrFormat("clipping_radius: %g is not a finite number >= 0",
                        c.clipping_radius()));
  }
  if (c.clipping_iterations() > 100) {
    errors->push_back(absl::StrFormat(
        "clipping_iterations: %d is not in [1, 100]", c.clipping_iterations()));
  }
  if (c.geometric_median_iterations() > 1000) {
    errors->push_back(
        absl::StrFormat("geometric_median_iterations: %d is not in [1, 1000]",
                        c.geometric_median_iterations()));
  }
  if (fedavg && c.bucket_size() > 1) {
    errors->push_back(
        "bucket_size: bucketing is for the robust aggregation methods (FedAvg "
        "of bucket means is FedAvg)");
  }
  if (c.reduce_results_in_chain() &&
      (c.max_claimed_samples() > 0 || c.equal_weights())) {
    errors->push_back(
        "reduce_results_in_chain: not with max_claimed_samples or "
        "equal_weights (a partial sum's weights are applied by its trainers, "
        "so the aggregator cannot cap them)");
  }
  if (!v1::ScoreStatistic_IsValid(c.best_score())) {
    errors->push_back(
        absl::StrFormat("best_score: unknown value %d", c.best_score()));
  }
}

void CheckAggregationAndTransfer(const v1::JobConfig& c,
                                 std::vector<std::string>* errors) {
  // Aggregation and metric.
  if (!v1::AggregationMethod_IsValid(c.aggregation_method())) {
    errors->push_back(absl::StrFormat("aggregation_method: unknown value %d",
                                      c.aggregation_method()));
  }
  if (c.has_stop_at_metric() && !std::isfinite(c.stop_at_metric())) {
    errors->push_back("stop_at_metric: must be a finite number");
  }
  if (c.stop_patience_rounds() > c.num_rounds()) {
    errors->push_back(
        absl::StrFormat("stop_patience_rounds: %d is more than num_rounds (%d)",
                        c.stop_patience_rounds(), c.num_rounds()));
  }
  if (c.reduce_results_in_chain() &&
      c.aggregation_method() != v1::AGGREGATION_FEDAVG) {
    errors->push_back(absl::StrFormat(
        "reduce_results_in_chain: only with AGGREGATION_FEDAVG (a chain "
        "passes on one running sum; %s needs every result on its own)",
        v1::AggregationMethod_Name(c.aggregation_method())));
  }
  if (!(c.trim_fraction() >= 0.0 && c.trim_fraction() < 0.5)) {
    errors->push_back(absl::StrFormat("trim_fraction: %g is not in [0, 0.5)",
                                      c.trim_fraction()));
  }
  if (c.metric_name().empty()) {
    errors->push_back("metric_name: empty");
  }
  if (!v1::MetricDirection_IsValid(c.metric_direction())) {
    errors->push_back(absl::StrFormat("metric_direction: unknown value %d",
                                      c.metric_direction()));
  }

  // Transfer.
  if (c.chunk_size() < kMinChunkSize || c.chunk_size() > kMaxChunkSize) {
    errors->push_back(absl::StrFormat(
        "chunk_size: %d is not in [%d, %d] bytes (4 KiB .. 64 MiB)",
        c.chunk_size(), kMinChunkSize, kMaxChunkSize));
  }
  if (c.max_model_bytes() < kMinMaxModelBytes) {
    errors->push_back(
        absl::StrFormat("max_model_bytes: %d is less than %d bytes (1 KiB)",
                        c.max_model_bytes(), kMinMaxModelBytes));
  }
  if (!v1::DigestAlgorithm_IsValid(c.digest_algorithm())) {
    errors->push_back(absl::StrFormat("digest_algorithm: unknown value %d",
                                      c.digest_algorithm()));
  }

  for (const auto& [key, value] : c.learner_params()) {
    if (key.empty()) errors->push_back("learner_params: empty key");
  }
}

// The server optimizer and its parameters (proto fields 71-75).
void CheckServerOptimizer(const v1::JobConfig& c,
                          std::vector<std::string>* errors) {
  if (!v1::ServerOptimizer_IsValid(c.server_optimizer())) {
    errors->push_back(absl::StrFormat("server_optimizer: unknown value %d",
                                      c.server_optimizer()));
    return;
  }
  const bool none = c.server_optimizer() == v1::SERVER_OPTIMIZER_NONE;
  if (!none && c.aggregation_method() != v1::AGGREGATION_FEDAVG) {
    errors->push_back(absl::StrFormat(
        "server_optimizer: %s only with AGGREGATION_FEDAVG (%s is a robust "
        "rule: its output is not the mean update the optimizer steps with, "
        "and momentum would carry what an attacker got through into every "
        "later round)",
        v1::ServerOptimizer_Name(c.server_optimizer()),
        v1::AggregationMethod_Name(c.aggregation_method())));
  }
  const bool adaptive = c.server_optimizer() == v1::SERVER_OPTIMIZER_ADAM ||
                        c.server_optimizer() == v1::SERVER_OPTIMIZER_YOGI;
  struct Field {
    const char* name;
    bool set;
    double value;
    bool used;  // By the job's optimizer.
  };
  const Field fields[] = {
      {"server_learning_rate", c.has_server_learning_rate(),
       c.server_learning_rate(), !none},
      {"server_beta1", c.has_server_beta1(), c.server_beta1(), !none},
      {"server_beta2", c.has_server_beta2(), c.server_beta2(), adaptive},
      {"server_epsilon", c.has_server_epsilon(), c.server_epsilon(), adaptive},
  };
  for (const Field& field : fields) {
    if (!field.set) continue;
    if (!field.used) {
      errors->push_back(absl::StrFormat(
          "%s: set, but server_optimizer %s does not use it", field.name,
          v1::ServerOptimizer_Name(c.server_optimizer())));
      continue;
    }
    const bool is_beta = absl::StartsWith(field.name, "server_beta");
    if (!std::isfinite(field.value) ||
        (is_beta ? !(field.value >= 0 && field.value < 1)
                 : !(field.value > 0))) {
      errors->push_back(absl::StrFormat("%s: %g is not %s", field.name,
                                        field.value,
                                        is_beta ? "in [0, 1)" : "> 0"));
    }
  }
}

}  // namespace

absl::Status ValidateJobConfig(const v1::JobConfig& config) {
  const v1::JobConfig c = WithDefaults(config);
  std::vector<std::string> errors;
  AddIfError(ValidateName("job_id", c.job_id()), &errors);
  CheckSites(c, &errors);
  CheckRoles(c, config, &errors);
  CheckRoundsAndDurations(c, &errors);
  CheckAggregationAndTransfer(c, &errors);
  CheckRobustness(c, &errors);
  CheckRobustParameters(c, &errors);
  CheckServerOptimizer(c, &errors);
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid job config: ", absl::StrJoin(errors, "; ")));
}

absl::StatusOr<v1::JobConfig> LoadJobConfig(const std::string& path) {
  absl::StatusOr<v1::JobConfig> parsed = ReadJobConfigFile(path);
  if (!parsed.ok()) return parsed.status();
  v1::JobConfig config = WithDefaults(*std::move(parsed));
  absl::Status status = ValidateJobConfig(config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid job config ", path, ": ",
        absl::StripPrefix(status.message(), "invalid job config: ")));
  }
  return config;
}

const v1::SiteInfo* FindSite(const v1::JobConfig& config,
                             absl::string_view name) {
  for (const v1::SiteInfo& site : config.sites()) {
    if (site.name() == name) return &site;
  }
  return nullptr;
}

bool IsTrainer(const v1::JobConfig& config, absl::string_view site) {
  if (config.trainers().empty()) return FindSite(config, site) != nullptr;
  return InList(config.trainers(), site);
}

bool IsCandidate(const v1::JobConfig& config, absl::string_view site) {
  if (config.aggregator_candidates().empty()) {
    return FindSite(config, site) != nullptr;
  }
  return InList(config.aggregator_candidates(), site);
}

absl::Duration Millis(uint64_t ms) {
  if (ms > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InfiniteDuration();
  }
  return absl::Milliseconds(static_cast<int64_t>(ms));
}

}  // namespace swarm
