#include "controller/job_view.h"

#include <utility>

#include "config/election.h"
#include "config/job_config.h"

namespace swarm {
namespace {

// In the config's order (WithDefaults lists every site when it was empty).
std::vector<std::string> Trainers(const v1::JobConfig& job) {
  if (job.trainers().empty()) {
    std::vector<std::string> names;
    for (const v1::SiteInfo& site : job.sites()) names.push_back(site.name());
    return names;
  }
  return std::vector<std::string>(job.trainers().begin(), job.trainers().end());
}

std::vector<std::string> SiteNames(const v1::JobConfig& job) {
  std::vector<std::string> names;
  for (const v1::SiteInfo& site : job.sites()) names.push_back(site.name());
  return names;
}

std::set<std::string, std::less<>> Candidates(const v1::JobConfig& job) {
  std::set<std::string, std::less<>> names;
  for (const v1::SiteInfo& site : job.sites()) {
    if (swarm::IsCandidate(job, site.name())) names.insert(site.name());
  }
  return names;
}

}  // namespace

JobView::JobView(v1::JobConfig job)
    : job_(std::move(job)),
      trainers_(Trainers(job_)),
      site_names_(SiteNames(job_)),
      trainer_set_(trainers_.begin(), trainers_.end()),
      candidate_set_(Candidates(job_)) {}

const v1::SiteInfo* JobView::Site(absl::string_view name) const {
  return FindSite(job_, name);
}

bool JobView::IsTrainer(absl::string_view site) const {
  return trainer_set_.find(site) != trainer_set_.end();
}

bool JobView::IsCandidate(absl::string_view site) const {
  return candidate_set_.find(site) != candidate_set_.end();
}

std::vector<std::string> JobView::ElectionOrder(uint32_t round) const {
  return swarm::ElectionOrder(job_, round);
}

std::string JobView::AggregatorOf(uint32_t round) const {
  std::vector<std::string> order = ElectionOrder(round);
  return order.empty() ? std::string() : std::move(order[0]);
}

std::string JobView::AggregatorAt(uint32_t round, uint32_t attempt) const {
  std::vector<std::string> order = ElectionOrder(round);
  return attempt < order.size() ? std::move(order[attempt]) : std::string();
}

std::string JobView::ScattererOf(uint32_t round,
                                 uint32_t previous_attempt) const {
  return round <= first_round() ? job_.starting_site()
                                : AggregatorAt(round - 1, previous_attempt);
}

absl::Duration JobView::learn_task_ack_timeout() const {
  return Millis(job_.learn_task_ack_timeout_ms());
}
absl::Duration JobView::final_result_ack_timeout() const {
  return Millis(job_.final_result_ack_timeout_ms());
}
absl::Duration JobView::request_to_submit_interval() const {
  return Millis(job_.request_to_submit_interval_ms());
}
absl::Duration JobView::request_to_submit_max_wait() const {
  return Millis(job_.request_to_submit_max_wait_ms());
}
absl::Duration JobView::request_to_submit_message_timeout() const {
  return Millis(job_.request_to_submit_message_timeout_ms());
}
absl::Duration JobView::round_timeout() const {
  return Millis(job_.round_timeout_ms());
}
absl::Duration JobView::start_timeout() const {
  return Millis(job_.start_timeout_ms());
}

absl::Duration JobView::failover_timeout() const {
  return Millis(job_.failover_timeout_ms());
}
absl::Duration JobView::wait_after_min_responses() const {
  return Millis(job_.wait_after_min_responses_ms());
}

}  // namespace swarm
