#include "controller/job_view.h"

#include "config/election.h"
#include "config/job_config.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

v1::JobConfig Job() {
  v1::JobConfig job;
  job.set_job_id("view");
  for (const char* name : {"s1", "s2", "s3", "s4"}) {
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
    site->set_address("127.0.0.1:" + std::to_string(7000 + job.sites_size()));
  }
  job.add_trainers("s3");
  job.add_trainers("s1");
  job.add_aggregator_candidates("s2");
  job.add_aggregator_candidates("s4");
  job.set_starting_site("s1");
  job.set_start_round(5);
  job.set_num_rounds(3);
  job.set_seed(99);
  job.set_round_timeout_ms(1500);
  return WithDefaults(job);
}

TEST(JobViewTest, RolesRoundsAndDurations) {
  const JobView view(Job());
  EXPECT_EQ(view.id(), "view");
  EXPECT_EQ(view.first_round(), 5u);
  EXPECT_EQ(view.last_round(), 7u);
  EXPECT_FALSE(view.HasRound(4));
  EXPECT_TRUE(view.HasRound(7));
  EXPECT_FALSE(view.HasRound(8));
  EXPECT_EQ(view.trainers(), (std::vector<std::string>{"s3", "s1"}));
  EXPECT_TRUE(view.IsTrainer("s1"));
  EXPECT_FALSE(view.IsTrainer("s2"));
  EXPECT_TRUE(view.IsCandidate("s4"));
  EXPECT_FALSE(view.IsCandidate("s1"));
  EXPECT_EQ(view.Site("s4")->name(), "s4");
  EXPECT_EQ(view.Site("nobody"), nullptr);
  EXPECT_EQ(view.round_timeout(), absl::Milliseconds(1500));
}

TEST(JobViewTest, WhoAggregatesAndWhoScattersEachRound) {
  const v1::JobConfig job = Job();
  const JobView view(job);
  for (uint32_t round = 5; round <= 7; ++round) {
    SCOPED_TRACE(round);
    EXPECT_EQ(view.ElectionOrder(round), ElectionOrder(job, round));
    const std::string aggregator = view.AggregatorOf(round);
    EXPECT_TRUE(aggregator == "s2" || aggregator == "s4") << aggregator;
    EXPECT_EQ(view.ScattererOf(round),
              round == 5 ? "s1" : view.AggregatorOf(round - 1));
  }
  EXPECT_EQ(view.LastRoundAggregator(), view.AggregatorOf(7));
}

}  // namespace
}  // namespace swarm
