// libFuzzer target: the job config parser and validator on arbitrary text.
#include <cstddef>
#include <cstdint>

#include "config/election.h"
#include "config/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<swarm::v1::JobConfig> job = swarm::ParseJobConfigJson(json);
  if (!job.ok()) return 0;
  const swarm::v1::JobConfig defaulted = swarm::WithDefaults(*job);
  if (!swarm::ValidateJobConfig(defaulted).ok()) return 0;
  // A valid job can elect an aggregator for its rounds.
  for (uint32_t round = 0; round < 3; ++round) {
    if (swarm::ElectionOrder(defaulted, defaulted.start_round() + round)
            .empty()) {
      __builtin_trap();
    }
  }
  return 0;
}
