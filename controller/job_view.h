// A configured job as the round logic reads it: the config resolved once into
// durations, role sets, and who aggregates and who scatters each round, so
// the rules read "job.AggregatorOf(round)" instead of re-deriving it from raw
// config fields at every use.
//
// Immutable and cheap to copy by pointer; pure (no clock, no I/O). An
// election order is computed on demand from (seed, round), as every site
// computes it.
#ifndef SWARM_CONTROLLER_JOB_VIEW_H_
#define SWARM_CONTROLLER_JOB_VIEW_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/swarm.pb.h"

namespace swarm {

class JobView {
 public:
  // REQUIRES: `job` has its defaults applied (WithDefaults) and passed
  // ValidateJobConfig.
  explicit JobView(v1::JobConfig job);

  const v1::JobConfig& config() const { return job_; }
  const std::string& id() const { return job_.job_id(); }

  // The job's rounds are first_round() .. last_round(), inclusive.
  uint32_t first_round() const { return job_.start_round(); }
  uint32_t last_round() const {
    return job_.start_round() + job_.num_rounds() - 1;
  }
  bool HasRound(uint32_t round) const {
    return round >= first_round() && round <= last_round();
  }

  // The site called `name`, or nullptr.
  const v1::SiteInfo* Site(absl::string_view name) const;
  bool IsTrainer(absl::string_view site) const;
  bool IsCandidate(absl::string_view site) const;
  // Every trainer, in the config's order.
  const std::vector<std::string>& trainers() const { return trainers_; }
  // Every site's name, in config order.
  const std::vector<std::string>& site_names() const { return site_names_; }

  // The election order of `round` (its first member aggregates); empty when
  // the job has no candidate.
  std::vector<std::string> ElectionOrder(uint32_t round) const;
  // The elected aggregator of `round`, or "" without a candidate.
  std::string AggregatorOf(uint32_t round) const;
  // The site at position `attempt` of `round`'s election order (0: the
  // elected aggregator, k: its k-th backup), or "" past its end.
  std::string AggregatorAt(uint32_t round, uint32_t attempt) const;
  // Who sends the learn tasks of `round`: the starting site for the first
  // round, the aggregator of the round before (at the attempt that
  // aggregated it) for the others.
  std::string ScattererOf(uint32_t round, uint32_t previous_attempt = 0) const;
  // The aggregator of the last round: it distributes LAST (and BEST when it
  // holds it) and asks the best model's holder to share.
  std::string LastRoundAggregator() const { return AggregatorOf(last_round()); }

  // The job's durations.
  absl::Duration learn_task_ack_timeout() const;
  absl::Duration final_result_ack_timeout() const;
  absl::Duration request_to_submit_interval() const;
  absl::Duration request_to_submit_max_wait() const;
  absl::Duration request_to_submit_message_timeout() const;
  absl::Duration round_timeout() const;
  absl::Duration wait_after_min_responses() const;
  absl::Duration failover_timeout() const;
  absl::Duration start_timeout() const;
  uint32_t failover_attempts() const { return job_.failover_attempts(); }

 private:
  const v1::JobConfig job_;
  const std::vector<std::string> trainers_;
  const std::vector<std::string> site_names_;
  const std::set<std::string, std::less<>> trainer_set_;
  const std::set<std::string, std::less<>> candidate_set_;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_JOB_VIEW_H_
