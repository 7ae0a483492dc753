#include "config/job_config.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "config/validation.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A scratch directory, removed with its contents at the end of the test.
class TempDir : public persist::testutil::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("swarm_job_config") {}
};

// Three sites, five rounds, everything else default.
v1::JobConfig BaseConfig() {
  v1::JobConfig config;
  config.set_job_id("job-1");
  const char* names[] = {"a", "b", "c"};
  const char* addresses[] = {"127.0.0.1:7001", "localhost:7002", "[::1]:7003"};
  for (int i = 0; i < 3; ++i) {
    v1::SiteInfo* site = config.add_sites();
    site->set_name(names[i]);
    site->set_address(addresses[i]);
  }
  config.set_num_rounds(5);
  return config;
}

std::string ErrorOf(const v1::JobConfig& config) {
  absl::Status status = ValidateJobConfig(config);
  EXPECT_FALSE(status.ok()) << config.ShortDebugString();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(ValidateJobConfigTest, BaseConfigIsValid) {
  EXPECT_TRUE(ValidateJobConfig(BaseConfig()).ok())
      << ValidateJobConfig(BaseConfig());
  EXPECT_TRUE(ValidateJobConfig(WithDefaults(BaseConfig())).ok());
}

TEST(ValidateJobConfigTest, UnknownSiteInTrainers) {
  v1::JobConfig config = BaseConfig();
  config.add_trainers("a");
  config.add_trainers("b");
  config.add_trainers("site-x");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("trainers[2]: \"site-x\" is not a site of the job"));
}

TEST(ValidateJobConfigTest, UnknownSiteInCandidates) {
  v1::JobConfig config = BaseConfig();
  config.add_aggregator_candidates("c");
  config.add_aggregator_candidates("zz");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("aggregator_candidates[1]: \"zz\" is not a site of "
                        "the job"));
}

TEST(ValidateJobConfigTest, DuplicateInTrainersAndCandidates) {
  v1::JobConfig config = BaseConfig();
  config.add_trainers("a");
  config.add_trainers("b");
  config.add_trainers("a");
  config.add_aggregator_candidates("c");
  config.add_aggregator_candidates("c");
  std::string error = ErrorOf(config);
  EXPECT_THAT(
      error,
      HasSubstr("trainers[2]: \"a\" is listed twice (also trainers[0])"));
  EXPECT_THAT(error, HasSubstr("aggregator_candidates[1]: \"c\" is listed "
                               "twice (also aggregator_candidates[0])"));
}

TEST(ValidateJobConfigTest, DuplicateSiteNames) {
  v1::JobConfig config = BaseConfig();
  config.mutable_sites(2)->set_name("a");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("sites[2].name: \"a\" is used twice (also sites[0])"));
}

TEST(ValidateJobConfigTest, DuplicateAddresses) {
  v1::JobConfig config = BaseConfig();
  config.mutable_sites(1)->set_address("127.0.0.1:7001");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("sites[1].address: \"127.0.0.1:7001\" is used twice "
                        "(also sites[0])"));
  // Host names compare case-insensitively.
  config = BaseConfig();
  config.mutable_sites(2)->set_address("LOCALHOST:7002");
  EXPECT_THAT(ErrorOf(config), HasSubstr("sites[2].address: \"LOCALHOST:7002\" "
                                         "is used twice (also sites[1])"));
}

TEST(ValidateJobConfigTest, NoTrainerWhenNoSites) {
  v1::JobConfig config = BaseConfig();
  config.clear_sites();
  std::string error = ErrorOf(config);
  EXPECT_THAT(error, HasSubstr("sites: at least one site is required"));
  EXPECT_THAT(error, HasSubstr("trainers: at least one trainer is required"));
}

TEST(ValidateJobConfigTest, NoCandidateWhenNoSites) {
  v1::JobConfig config = BaseConfig();
  config.clear_sites();
  config.add_trainers("a");  // Not a site either.
  std::string error = ErrorOf(config);
  EXPECT_THAT(error, HasSubstr("aggregator_candidates: at least one candidate "
                               "is required"));
  EXPECT_THAT(error, HasSubstr("trainers[0]: \"a\" is not a site of the job"));
}

TEST(ValidateJobConfigTest, RoundsMustBeAtLeastOne) {
  v1::JobConfig config = BaseConfig();
  config.set_num_rounds(0);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("num_rounds: rounds must be at least 1"));
}

TEST(ValidateJobConfigTest, NegativeRoundsFailAtParsing) {
  absl::StatusOr<v1::JobConfig> parsed =
      ParseJobConfigJson(R"({"job_id": "j", "num_rounds": -3})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("num_rounds: invalid value -3"));
}

TEST(ValidateJobConfigTest, RoundsPastTheLastRoundNumber) {
  v1::JobConfig config = BaseConfig();
  config.set_start_round(std::numeric_limits<uint32_t>::max());
  config.set_num_rounds(1);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_num_rounds(2);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("num_rounds: start_round 4294967295 + num_rounds 2"));
}

TEST(ValidateJobConfigTest, MinResponsesMoreThanTrainers) {
  v1::JobConfig config = BaseConfig();
  config.add_trainers("a");
  config.add_trainers("b");
  config.set_min_responses_required(3);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("min_responses_required: 3 is more than the number of "
                        "trainers (2)"));
  config.set_min_responses_required(2);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
}

TEST(ValidateJobConfigTest, NegativeTimeFailsAtParsingNamingTheField) {
  absl::StatusOr<v1::JobConfig> parsed = ParseJobConfigJson(
      R"({"job_id": "j", "num_rounds": 1, "round_timeout_ms": -5})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(),
              AllOf(HasSubstr("round_timeout_ms: invalid value -5"),
                    HasSubstr("unsigned integer milliseconds")));
  // Quoted (proto3 JSON writes 64-bit integers as strings) and camelCase.
  parsed = ParseJobConfigJson(R"({"waitAfterMinResponsesMs": "-1"})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("wait_after_min_responses_ms: invalid value \"-1\""));
  // Not an integer either.
  parsed = ParseJobConfigJson(R"({"learn_task_ack_timeout_ms": 1.5})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("learn_task_ack_timeout_ms: invalid value 1.5"));
}

TEST(ValidateJobConfigTest, NegativeTimeInFileNamesPathAndField) {
  TempDir dir;
  std::string path = dir.Write("job.json", R"({"job_id": "j", "num_rounds": 1,
                      "sites": [{"name": "a", "address": "h:1"}],
                      "request_to_submit_interval_ms": -1000})");
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr(path),
                    HasSubstr("request_to_submit_interval_ms: invalid value "
                              "-1000")));
}

TEST(ValidateJobConfigTest, AbsurdDuration) {
  v1::JobConfig config = BaseConfig();
  config.set_final_result_ack_timeout_ms(kMaxDurationMs);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_final_result_ack_timeout_ms(kMaxDurationMs + 1);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("final_result_ack_timeout_ms: 2592000001 ms is more "
                        "than 30 days"));
  config = BaseConfig();
  config.set_round_timeout_ms(std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(ErrorOf(config), HasSubstr("round_timeout_ms: "));
}

TEST(ValidateJobConfigTest, UnreadableFile) {
  TempDir dir;
  std::string missing = dir.path() + "/missing.json";
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(missing);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      loaded.status().message(),
      AllOf(HasSubstr(missing), HasSubstr("No such file or directory")));

  // A directory opens but does not read.
  loaded = LoadJobConfig(dir.path());
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr(dir.path()), HasSubstr("Is a directory")));

  if (geteuid() != 0) {  // root reads anything.
    std::string locked = dir.Write("locked.json", "{}");
    ASSERT_EQ(chmod(locked.c_str(), 0), 0);
    loaded = LoadJobConfig(locked);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(loaded.status().message(),
                AllOf(HasSubstr(locked), HasSubstr("Permission denied")));
  }
}

TEST(ValidateJobConfigTest, UnknownFields) {
  absl::StatusOr<v1::JobConfig> parsed =
      ParseJobConfigJson(R"({"job_id": "j", "num_round": 5})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("unknown field \"num_round\""));

  parsed = ParseJobConfigJson(
      R"({"sites": [{"name": "a", "address": "h:1"},
                    {"name": "b", "adress": "h:2"}]})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("unknown field \"sites[1].adress\""));

  parsed = ParseJobConfigJson(R"({"aggregation_method": "AGGREGATION_MEAN"})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("aggregation_method: invalid value"));

  parsed = ParseJobConfigJson(R"({"job_id": "j",)");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("malformed JSON"));
}

TEST(ValidateJobConfigTest, BadJobId) {
  for (const char* bad : {"", ".", "..", "a/b", "job 1", "job\n", "jöb"}) {
    v1::JobConfig config = BaseConfig();
    config.set_job_id(bad);
    EXPECT_THAT(ErrorOf(config), HasSubstr("job_id: ")) << bad;
  }
  v1::JobConfig config = BaseConfig();
  config.set_job_id(std::string(65, 'x'));
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("job_id: \"xxxxxxxxxxxxxxxx...\" is 65 characters"));
  config.set_job_id(std::string(64, 'x'));
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_job_id("A.b_c-9");
  EXPECT_TRUE(ValidateJobConfig(config).ok());
}

TEST(ValidateJobConfigTest, BadSiteName) {
  v1::JobConfig config = BaseConfig();
  config.mutable_sites(1)->set_name("b/../../etc");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("sites[1].name: \"b/../../etc\" has a character "
                        "outside [A-Za-z0-9._-]"));
  config.mutable_sites(1)->set_name("");
  EXPECT_THAT(ErrorOf(config), HasSubstr("sites[1].name: empty"));
}

TEST(ValidateJobConfigTest, BadAddress) {
  struct Case {
    const char* address;
    const char* why;
  } cases[] = {
      {"", "sites[1].address: empty"},
      {"localhost", "missing \":port\""},
      {"localhost:", "empty port"},
      {":7001", "empty host"},
      {"host:0", "port must be in 1..65535"},
      {"host:65536", "port must be in 1..65535"},
      {"host:123456", "port must be in 1..65535"},
      {"host:+80", "port is not a decimal number"},
      {"host:80x", "port is not a decimal number"},
      {"::1:7001", "write an IPv6 address in brackets"},
      {"[::1]", "missing \":port\""},
      {"[::1:7001", "missing \"]\""},
      {"[]:7001", "empty IPv6 address"},
      {"[1.2.3.4]:7001", "needs a \":\""},
      {"[::g]:7001", "bad character in IPv6 address"},
      {"ho st:7001", "bad character in host"},
      {"dns:///host:7001", "no scheme such as dns:// or unix:"},
      {"unix:/tmp/sock", "no scheme"},
      {"host:7001/", "port is not a decimal number"},
  };
  for (const Case& c : cases) {
    v1::JobConfig config = BaseConfig();
    config.mutable_sites(1)->set_address(c.address);
    std::string error = ErrorOf(config);
    EXPECT_THAT(error, HasSubstr("sites[1].address: ")) << c.address;
    EXPECT_THAT(error, HasSubstr(c.why)) << c.address;
  }
  for (const char* good :
       {"h:1", "h:65535", "10.0.0.1:80", "my-host.example.com:7001",
        "[::]:7001", "[fe80::1%eth0]:7001", "[::ffff:1.2.3.4]:9"}) {
    v1::JobConfig config = BaseConfig();
    config.mutable_sites(1)->set_address(good);
    EXPECT_TRUE(ValidateJobConfig(config).ok())
        << good << ": " << ValidateJobConfig(config);
  }
}

TEST(ParseHostPortTest, SplitsHostAndPort) {
  absl::StatusOr<HostPort> hp = ParseHostPort("[::1]:7001");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 7001);
  hp = ParseHostPort("example.org:65535");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "example.org");
  EXPECT_EQ(hp->port, 65535);
}

TEST(ValidateJobConfigTest, BadChunkSize) {
  v1::JobConfig config = BaseConfig();
  for (uint64_t good : {uint64_t{0}, kMinChunkSize, kMaxChunkSize}) {
    config.set_chunk_size(good);
    EXPECT_TRUE(ValidateJobConfig(config).ok()) << good;
  }
  config.set_chunk_size(kMinChunkSize - 1);
  EXPECT_THAT(ErrorOf(config), HasSubstr("chunk_size: 4095 is not in [4096, "
                                         "67108864] bytes"));
  config.set_chunk_size(kMaxChunkSize + 1);
  EXPECT_THAT(ErrorOf(config), HasSubstr("chunk_size: 67108865 is not in"));
}

TEST(ValidateJobConfigTest, ChainReductionOnlyWithFedAvg) {
  v1::JobConfig config = BaseConfig();
  config.set_reduce_results_in_chain(true);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_aggregation_method(v1::AGGREGATION_MEDIAN);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("reduce_results_in_chain: only with "
                        "AGGREGATION_FEDAVG (a chain passes on one running "
                        "sum; AGGREGATION_MEDIAN needs every result"));
  config.set_aggregation_method(v1::AGGREGATION_TRIMMED_MEAN);
  EXPECT_THAT(ErrorOf(config), HasSubstr("AGGREGATION_TRIMMED_MEAN needs"));
  config.set_reduce_results_in_chain(false);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
}

TEST(ValidateJobConfigTest, BadTrimFraction) {
  v1::JobConfig config = BaseConfig();
  config.set_aggregation_method(v1::AGGREGATION_TRIMMED_MEAN);
  config.set_trim_fraction(0.49);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_trim_fraction(0.5);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("trim_fraction: 0.5 is not in [0, 0.5)"));
  config.set_trim_fraction(-0.1);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("trim_fraction: -0.1 is not in [0, 0.5)"));
  config.set_trim_fraction(std::nan(""));
  EXPECT_THAT(ErrorOf(config), HasSubstr("trim_fraction: nan is not in"));
}

TEST(ValidateJobConfigTest, UnknownEnumValues) {
  // Proto3 JSON accepts an integer for an enum even when it names no value.
  absl::StatusOr<v1::JobConfig> parsed = ParseJobConfigJson(
      R"({"job_id": "j", "num_rounds": 1,
          "sites": [{"name": "a", "address": "h:1"}],
          "aggregation_method": 7, "metric_direction": 9,
          "digest_algorithm": 5})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::string error = ErrorOf(*parsed);
  EXPECT_THAT(error, HasSubstr("aggregation_method: unknown value 7"));
  EXPECT_THAT(error, HasSubstr("metric_direction: unknown value 9"));
  EXPECT_THAT(error, HasSubstr("digest_algorithm: unknown value 5"));
}

TEST(ValidateJobConfigTest, OtherRules) {
  v1::JobConfig config = BaseConfig();
  config.set_starting_site("nowhere");
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("starting_site: \"nowhere\" is not a site of the job"));

  config = BaseConfig();
  config.set_max_model_bytes(1023);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("max_model_bytes: 1023 is less than 1024 bytes"));
  config.set_max_model_bytes(1024);
  EXPECT_TRUE(ValidateJobConfig(config).ok());

  config = BaseConfig();
  config.mutable_sites(0)->add_extra_sans("");
  EXPECT_THAT(ErrorOf(config), HasSubstr("sites[0].extra_sans[0]: empty"));

  config = BaseConfig();
  (*config.mutable_learner_params())[""] = "x";
  EXPECT_THAT(ErrorOf(config), HasSubstr("learner_params: empty key"));
}

TEST(ValidateJobConfigTest, ReportsEveryViolationAtOnce) {
  v1::JobConfig config = BaseConfig();
  config.set_job_id("");
  config.set_num_rounds(0);
  config.set_chunk_size(1);
  std::string error = ErrorOf(config);
  EXPECT_THAT(error, HasSubstr("invalid job config: job_id: empty; "));
  EXPECT_THAT(error, HasSubstr("; num_rounds: rounds must be at least 1; "));
  EXPECT_THAT(error, HasSubstr("; chunk_size: 1 is not in"));
}

TEST(WithDefaultsTest, FillsEveryDefault) {
  v1::JobConfig config = WithDefaults(BaseConfig());
  EXPECT_THAT(config.trainers(), ::testing::ElementsAre("a", "b", "c"));
  EXPECT_THAT(config.aggregator_candidates(),
              ::testing::ElementsAre("a", "b", "c"));
  EXPECT_EQ(config.starting_site(), "a");
  EXPECT_EQ(config.start_round(), 0u);
  EXPECT_EQ(config.min_responses_required(), 3u);
  EXPECT_EQ(config.wait_after_min_responses_ms(), 10000u);
  EXPECT_EQ(config.round_timeout_ms(), 3600000u);
  EXPECT_EQ(config.max_concurrent_submissions(), 1u);
  EXPECT_EQ(config.request_to_submit_interval_ms(), 1000u);
  EXPECT_EQ(config.request_to_submit_max_wait_ms(), 600000u);
  EXPECT_EQ(config.request_to_submit_message_timeout_ms(), 5000u);
  EXPECT_EQ(config.final_result_ack_timeout_ms(), 600000u);
  EXPECT_EQ(config.learn_task_ack_timeout_ms(), 60000u);
  EXPECT_EQ(config.aggregation_method(), v1::AGGREGATION_FEDAVG);
  EXPECT_EQ(config.trim_fraction(), 0.0);
  EXPECT_EQ(config.metric_name(), "accuracy");
  EXPECT_EQ(config.metric_direction(), v1::METRIC_HIGHER_IS_BETTER);
  EXPECT_EQ(config.chunk_size(), 1u << 20);
  EXPECT_EQ(config.max_model_bytes(), 64ull << 30);
  EXPECT_EQ(config.lean_memory_min_model_bytes(), 128ull << 20);
  EXPECT_TRUE(config.has_broadcast_learn_tasks());
  EXPECT_FALSE(config.broadcast_learn_tasks());
  EXPECT_TRUE(config.has_reduce_results_in_chain());
  EXPECT_FALSE(config.reduce_results_in_chain());
  EXPECT_EQ(config.seed(), 0u);
  EXPECT_FALSE(config.disk_offload());
  EXPECT_FALSE(config.send_weight_diff());
  EXPECT_FALSE(config.allow_non_finite());
  EXPECT_EQ(config.digest_algorithm(), v1::DIGEST_XXH3_128);
}

TEST(WithDefaultsTest, MinResponsesFollowsTheTrainers) {
  v1::JobConfig config = BaseConfig();
  config.add_trainers("c");
  config.add_trainers("a");
  config = WithDefaults(config);
  EXPECT_THAT(config.trainers(), ::testing::ElementsAre("c", "a"));
  EXPECT_EQ(config.min_responses_required(), 2u);
}

TEST(WithDefaultsTest, TrimFractionOnlyForTrimmedMean) {
  v1::JobConfig config = BaseConfig();
  config.set_aggregation_method(v1::AGGREGATION_MEDIAN);
  EXPECT_EQ(WithDefaults(config).trim_fraction(), 0.0);
  config.set_aggregation_method(v1::AGGREGATION_TRIMMED_MEAN);
  EXPECT_EQ(WithDefaults(config).trim_fraction(), 0.1);
  config.set_trim_fraction(0.25);
  EXPECT_EQ(WithDefaults(config).trim_fraction(), 0.25);
}

TEST(WithDefaultsTest, KeepsSetFieldsAndIsIdempotent) {
  v1::JobConfig config = BaseConfig();
  config.add_trainers("b");
  config.add_aggregator_candidates("c");
  config.set_starting_site("c");
  config.set_min_responses_required(1);
  config.set_wait_after_min_responses_ms(7);
  config.set_round_timeout_ms(8);
  config.set_max_concurrent_submissions(3);
  config.set_request_to_submit_interval_ms(9);
  config.set_request_to_submit_max_wait_ms(10);
  config.set_request_to_submit_message_timeout_ms(11);
  config.set_final_result_ack_timeout_ms(12);
  config.set_learn_task_ack_timeout_ms(13);
  config.set_failover_timeout_ms(14);
  config.set_failover_attempts(2);
  config.set_start_timeout_ms(21);
  config.set_metric_name("loss");
  config.set_chunk_size(8192);
  config.set_max_model_bytes(4096);
  config.set_lean_memory_min_model_bytes(0);  // Set, though zero.
  config.set_broadcast_learn_tasks(true);
  config.set_reduce_results_in_chain(true);
  v1::JobConfig defaulted = WithDefaults(config);
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(defaulted, config))
      << defaulted.ShortDebugString();
  v1::JobConfig twice = WithDefaults(WithDefaults(BaseConfig()));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      twice, WithDefaults(BaseConfig())));
}

constexpr char kFullConfig[] = R"({
  "job_id": "mnist-2026.01_a",
  "sites": [
    {"name": "a", "address": "10.0.0.1:7001", "extra_sans": ["a.local"]},
    {"name": "b", "address": "10.0.0.2:7001"},
    {"name": "c", "address": "[2001:db8::3]:7001"},
    {"name": "d", "address": "d.example.org:7001"}
  ],
  "trainers": ["a", "b", "c"],
  "aggregator_candidates": ["c", "d"],
  "starting_site": "d",
  "num_rounds": 20,
  "start_round": 3,
  "min_responses_required": 2,
  "wait_after_min_responses_ms": 2500,
  "round_timeout_ms": "600000",
  "max_concurrent_submissions": 2,
  "request_to_submit_interval_ms": 200,
  "request_to_submit_max_wait_ms": 60000,
  "request_to_submit_message_timeout_ms": 3000,
  "final_result_ack_timeout_ms": 120000,
  "learn_task_ack_timeout_ms": 10000,
  "failover_timeout_ms": 3000,
  "failover_attempts": 4,
  "stop_at_metric": 0.25,
  "stop_patience_rounds": 2,
  "start_timeout_ms": 900000,
  "lean_memory_min_model_bytes": "268435456",
  "broadcast_learn_tasks": true,
  "reduce_results_in_chain": false,
  "aggregation_method": "AGGREGATION_TRIMMED_MEAN",
  "trim_fraction": 0.2,
  "metric_name": "loss",
  "metric_direction": "METRIC_LOWER_IS_BETTER",
  "disk_offload": true,
  "chunk_size": 4194304,
  "seed": "12345678901234567890",
  "send_weight_diff": true,
  "allow_non_finite": false,
  "max_model_bytes": "1073741824",
  "digest_algorithm": "DIGEST_SHA256",
  "learner_params": {"lr": "0.01", "epochs": "2"}
})";

TEST(LoadJobConfigTest, FullConfigRoundTrip) {
  TempDir dir;
  std::string path = dir.Write("job.json", kFullConfig);
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const v1::JobConfig& config = *loaded;
  EXPECT_EQ(config.job_id(), "mnist-2026.01_a");
  ASSERT_EQ(config.sites_size(), 4);
  EXPECT_EQ(config.sites(2).address(), "[2001:db8::3]:7001");
  EXPECT_THAT(config.sites(0).extra_sans(), ::testing::ElementsAre("a.local"));
  EXPECT_THAT(config.trainers(), ::testing::ElementsAre("a", "b", "c"));
  EXPECT_THAT(config.aggregator_candidates(), ::testing::ElementsAre("c", "d"));
  EXPECT_EQ(config.starting_site(), "d");
  EXPECT_EQ(config.num_rounds(), 20u);
  EXPECT_EQ(config.start_round(), 3u);
  EXPECT_EQ(config.min_responses_required(), 2u);
  EXPECT_EQ(config.wait_after_min_responses_ms(), 2500u);
  EXPECT_EQ(config.round_timeout_ms(), 600000u);
  EXPECT_EQ(config.max_concurrent_submissions(), 2u);
  EXPECT_EQ(config.request_to_submit_interval_ms(), 200u);
  EXPECT_EQ(config.request_to_submit_max_wait_ms(), 60000u);
  EXPECT_EQ(config.request_to_submit_message_timeout_ms(), 3000u);
  EXPECT_EQ(config.final_result_ack_timeout_ms(), 120000u);
  EXPECT_EQ(config.learn_task_ack_timeout_ms(), 10000u);
  EXPECT_EQ(config.failover_timeout_ms(), 3000u);
  EXPECT_EQ(config.failover_attempts(), 4u);
  EXPECT_EQ(config.stop_at_metric(), 0.25);
  EXPECT_EQ(config.stop_patience_rounds(), 2u);
  EXPECT_EQ(config.start_timeout_ms(), 900000u);
  EXPECT_EQ(config.lean_memory_min_model_bytes(), 256u << 20);
  EXPECT_TRUE(config.broadcast_learn_tasks());
  EXPECT_FALSE(config.reduce_results_in_chain());
  EXPECT_EQ(config.aggregation_method(), v1::AGGREGATION_TRIMMED_MEAN);
  EXPECT_EQ(config.trim_fraction(), 0.2);
  EXPECT_EQ(config.metric_name(), "loss");
  EXPECT_EQ(config.metric_direction(), v1::METRIC_LOWER_IS_BETTER);
  EXPECT_TRUE(config.disk_offload());
  EXPECT_EQ(config.chunk_size(), 4194304u);
  EXPECT_EQ(config.seed(), 12345678901234567890ull);
  EXPECT_TRUE(config.send_weight_diff());
  EXPECT_FALSE(config.allow_non_finite());
  EXPECT_EQ(config.max_model_bytes(), 1073741824u);
  EXPECT_EQ(config.digest_algorithm(), v1::DIGEST_SHA256);
  EXPECT_EQ(config.learner_params().at("lr"), "0.01");
  EXPECT_EQ(config.learner_params().at("epochs"), "2");

  // Nothing was left to default: the file says it all.
  v1::JobConfig raw = *ReadJobConfigFile(path);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(raw, config));

  // JSON out and back in gives the same message.
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(config, &json, print).ok());
  absl::StatusOr<v1::JobConfig> again = ParseJobConfigJson(json);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(*again, config))
      << json;
  EXPECT_TRUE(ValidateJobConfig(*again).ok());

  // lowerCamelCase names are accepted too.
  print.preserve_proto_field_names = false;
  json.clear();
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(config, &json, print).ok());
  EXPECT_THAT(json, HasSubstr("\"numRounds\""));
  again = ParseJobConfigJson(json);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(*again, config));
}

TEST(LoadJobConfigTest, MinimalConfigGetsDefaults) {
  TempDir dir;
  std::string path = dir.Write("job.json",
                               R"({"job_id": "j", "num_rounds": 2,
          "sites": [{"name": "a", "address": "h:1"},
                    {"name": "b", "address": "h:2"}]})");
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      *loaded, WithDefaults(*ReadJobConfigFile(path))));
  EXPECT_EQ(loaded->min_responses_required(), 2u);
}

TEST(LoadJobConfigTest, ValidationErrorNamesPathAndField) {
  TempDir dir;
  std::string path = dir.Write("job.json", R"({"job_id": "j", "num_rounds": 2,
                      "sites": [{"name": "a", "address": "h:1"}],
                      "trainers": ["a", "site-x"]})");
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfig(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr(absl::StrCat("invalid job config ", path,
                                           ": trainers[1]: \"site-x\"")),
                    Not(HasSubstr("invalid job config: "))));
}

TEST(JobConfigHelpersTest, FindSiteAndRoles) {
  v1::JobConfig config = BaseConfig();
  ASSERT_NE(FindSite(config, "b"), nullptr);
  EXPECT_EQ(FindSite(config, "b")->address(), "localhost:7002");
  EXPECT_EQ(FindSite(config, "z"), nullptr);
  // Empty lists mean every site.
  EXPECT_TRUE(IsTrainer(config, "c"));
  EXPECT_TRUE(IsCandidate(config, "c"));
  EXPECT_FALSE(IsTrainer(config, "z"));
  EXPECT_FALSE(IsCandidate(config, "z"));
  config.add_trainers("a");
  config.add_aggregator_candidates("b");
  EXPECT_TRUE(IsTrainer(config, "a"));
  EXPECT_FALSE(IsTrainer(config, "b"));
  EXPECT_TRUE(IsCandidate(config, "b"));
  EXPECT_FALSE(IsCandidate(config, "a"));
}

TEST(JobConfigHelpersTest, Millis) {
  EXPECT_EQ(Millis(0), absl::ZeroDuration());
  EXPECT_EQ(Millis(1500), absl::Milliseconds(1500));
  EXPECT_EQ(Millis(kMaxDurationMs), absl::Hours(24 * 30));
  EXPECT_EQ(Millis(std::numeric_limits<uint64_t>::max()),
            absl::InfiniteDuration());
}
}  // namespace
}  // namespace swarm

namespace swarm {
namespace {

// Eight sites (the attack bench's shape).
v1::JobConfig EightSites() {
  v1::JobConfig config;
  config.set_job_id("job-8");
  for (int i = 0; i < 8; ++i) {
    v1::SiteInfo* site = config.add_sites();
    site->set_name(absl::StrCat("s", i));
    site->set_address(absl::StrCat("127.0.0.1:", 7100 + i));
  }
  config.set_num_rounds(3);
  return config;
}

TEST(ValidateJobConfigTest, RobustMethodsCheckNAndF) {
  v1::JobConfig config = EightSites();
  config.set_tolerated_attackers(2);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("tolerated_attackers: 2 with AGGREGATION_FEDAVG, which "
                        "tolerates none"));
  // Multi-Krum: 8 >= 2 * 2 + 3.
  config.set_aggregation_method(v1::AGGREGATION_MULTI_KRUM);
  EXPECT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  // Bulyan: 8 < 4 * 2 + 3.
  config.set_aggregation_method(v1::AGGREGATION_BULYAN);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("tolerated_attackers: AGGREGATION_BULYAN tolerating "
                        "f = 2 needs n >= 4f + 3 = 11 inputs, but a round may "
                        "close with 8 results"));
  config.set_tolerated_attackers(1);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  // A round may close with min_responses_required results.
  config.set_aggregation_method(v1::AGGREGATION_MULTI_KRUM);
  config.set_tolerated_attackers(2);
  config.set_min_responses_required(6);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("AGGREGATION_MULTI_KRUM tolerating f = 2 needs n >= "
                        "2f + 3 = 7 inputs, but a round may close with 6 "
                        "results"));
  config.set_min_responses_required(0);
  // Centered clipping and geometric median: a majority.
  for (v1::AggregationMethod method :
       {v1::AGGREGATION_CENTERED_CLIPPING, v1::AGGREGATION_GEOMETRIC_MEDIAN,
        v1::AGGREGATION_MEDIAN}) {
    config.set_aggregation_method(method);
    config.set_tolerated_attackers(3);
    EXPECT_TRUE(ValidateJobConfig(config).ok()) << method;
    config.set_tolerated_attackers(4);
    EXPECT_THAT(ErrorOf(config), HasSubstr("needs n >= 2f + 1 = 9 inputs"));
  }
}

TEST(ValidateJobConfigTest, BucketsCountAsInputs) {
  v1::JobConfig config = EightSites();
  config.set_aggregation_method(v1::AGGREGATION_CENTERED_CLIPPING);
  config.set_tolerated_attackers(2);
  config.set_bucket_size(2);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("needs n >= 2f + 1 = 5 inputs, but a round may close "
                        "with 4 buckets of 2 of the 8 results"));
  config.set_tolerated_attackers(1);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_aggregation_method(v1::AGGREGATION_FEDAVG);
  config.set_tolerated_attackers(0);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("bucket_size: bucketing is for the robust"));
}

TEST(ValidateJobConfigTest, TrimmedMeanMustTrimF) {
  v1::JobConfig config = EightSites();
  config.set_aggregation_method(v1::AGGREGATION_TRIMMED_MEAN);
  config.set_tolerated_attackers(2);
  // The default 0.1 trims nothing at 8.
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("trim_fraction: 0.1 trims 0 of 8 inputs at each end, "
                        "fewer than tolerated_attackers (2)"));
  config.set_trim_fraction(0.25);
  EXPECT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
}

TEST(ValidateJobConfigTest, RobustParameters) {
  v1::JobConfig config = EightSites();
  config.set_krum_selected(3);
  EXPECT_THAT(ErrorOf(config), HasSubstr("krum_selected: only with "
                                         "AGGREGATION_MULTI_KRUM (not "
                                         "AGGREGATION_FEDAVG)"));
  config.set_aggregation_method(v1::AGGREGATION_MULTI_KRUM);
  config.set_tolerated_attackers(2);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_krum_selected(7);
  EXPECT_THAT(ErrorOf(config), HasSubstr("krum_selected: 7 is more than n - "
                                         "f = 6"));
  config = EightSites();
  config.set_clipping_radius(-1);
  EXPECT_THAT(ErrorOf(config), HasSubstr("clipping_radius: -1 is not"));
  config.set_clipping_radius(std::nan(""));
  EXPECT_THAT(ErrorOf(config), HasSubstr("clipping_radius: nan is not"));
  config = EightSites();
  config.set_clipping_iterations(101);
  EXPECT_THAT(ErrorOf(config), HasSubstr("clipping_iterations: 101"));
  config = EightSites();
  config.set_geometric_median_iterations(1001);
  EXPECT_THAT(ErrorOf(config), HasSubstr("geometric_median_iterations: 1001"));
  config = EightSites();
  config.set_best_score(static_cast<v1::ScoreStatistic>(9));
  EXPECT_THAT(ErrorOf(config), HasSubstr("best_score: unknown value 9"));
}

TEST(ValidateJobConfigTest, CapAndEqualWeightsNotInChains) {
  v1::JobConfig config = EightSites();
  config.set_max_claimed_samples(1000);
  config.set_equal_weights(true);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_reduce_results_in_chain(true);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("reduce_results_in_chain: not with "
                        "max_claimed_samples or equal_weights"));
}

TEST(ValidateJobConfigTest, ServerOptimizerParameters) {
  v1::JobConfig config = EightSites();
  config.set_server_beta1(0.5);
  EXPECT_THAT(ErrorOf(config), HasSubstr("server_beta1: set, but "
                                         "server_optimizer "
                                         "SERVER_OPTIMIZER_NONE does not "
                                         "use it"));
  config.set_server_optimizer(v1::SERVER_OPTIMIZER_MOMENTUM);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_server_beta2(0.99);
  EXPECT_THAT(ErrorOf(config), HasSubstr("server_beta2: set, but "
                                         "server_optimizer "
                                         "SERVER_OPTIMIZER_MOMENTUM"));
  config.set_server_optimizer(v1::SERVER_OPTIMIZER_ADAM);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_server_beta1(1.0);
  EXPECT_THAT(ErrorOf(config), HasSubstr("server_beta1: 1 is not in [0, 1)"));
  config.set_server_beta1(0.9);
  config.set_server_learning_rate(0);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("server_learning_rate: 0 is not > 0"));
  config.set_server_learning_rate(std::nan(""));
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("server_learning_rate: nan is not > 0"));
  config.set_server_learning_rate(0.03);
  config.set_server_epsilon(-1e-3);
  EXPECT_THAT(ErrorOf(config), HasSubstr("server_epsilon: -0.001 is not > 0"));
  config.set_server_epsilon(1e-3);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_aggregation_method(v1::AGGREGATION_MEDIAN);
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("server_optimizer: SERVER_OPTIMIZER_ADAM only with "
                        "AGGREGATION_FEDAVG (AGGREGATION_MEDIAN is a robust "
                        "rule"));
  config.set_aggregation_method(v1::AGGREGATION_FEDAVG);
  config.set_server_optimizer(static_cast<v1::ServerOptimizer>(9));
  EXPECT_THAT(ErrorOf(config), HasSubstr("server_optimizer: unknown value 9"));
}

}  // namespace
}  // namespace swarm
