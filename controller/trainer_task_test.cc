#include "controller/trainer_task.h"

#include "gtest/gtest.h"

namespace swarm::site {
namespace {

using Phase = Training::Phase;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

Training Trained() {
  Training task;
  task.aggregator = "agg-0";
  task.BecomeAsking(kT0);
  return task;
}

TEST(TrainerTaskTest, ANewTaskTrainsAndProbes) {
  Training task;
  EXPECT_EQ(task.phase(), Phase::kTraining);
  EXPECT_FALSE(task.trained());
  EXPECT_TRUE(task.Probing());  // The aggregator is probed while it trains.
  EXPECT_FALSE(task.CanJoinPartialSum());
}

TEST(TrainerTaskTest, TrainedItAsksForASlotFromThen) {
  Training task = Trained();
  EXPECT_EQ(task.phase(), Phase::kAsking);
  EXPECT_TRUE(task.trained());
  EXPECT_FALSE(task.Probing());
  EXPECT_EQ(task.asking_since(), kT0);
  EXPECT_TRUE(task.CanJoinPartialSum());
  EXPECT_FALSE(task.direct());
}

TEST(TrainerTaskTest, AnUploadEitherEndsInOrAsksAgain) {
  Training task = Trained();
  task.BecomeUploading();
  EXPECT_FALSE(task.Probing());
  EXPECT_FALSE(task.CanJoinPartialSum());  // Its result is on its way.
  task.UploadEnded();
  EXPECT_EQ(task.phase(), Phase::kAsking);
  task.BecomeUploading();
  task.BecomeSubmitted(kT0 + absl::Seconds(3));
  EXPECT_TRUE(task.submitted());
  EXPECT_TRUE(task.Probing());
  EXPECT_EQ(task.confirmed, kT0 + absl::Seconds(3));
  task.UploadEnded();  // A late end of the upload changes nothing.
  EXPECT_TRUE(task.submitted());
}

TEST(TrainerTaskTest, AChainMemberWaitsThenContributesOrLeaves) {
  Training task = Trained();
  task.BecomeChainMember(kT0 + absl::Seconds(10));
  EXPECT_TRUE(task.InChain());
  EXPECT_TRUE(task.Probing());
  EXPECT_TRUE(task.CanJoinPartialSum());
  EXPECT_EQ(task.chain_until(), kT0 + absl::Seconds(10));
  task.BecomeContributing();
  EXPECT_FALSE(task.CanJoinPartialSum());  // A sum passes once.
  task.LeaveChain(kT0 + absl::Seconds(12));
  EXPECT_EQ(task.phase(), Phase::kAsking);
  EXPECT_TRUE(task.direct());
  EXPECT_FALSE(task.InChain());
  EXPECT_EQ(task.asking_since(), kT0 + absl::Seconds(12));
  EXPECT_EQ(task.chain_until(), absl::InfiniteFuture());
}

TEST(TrainerTaskTest, AResultTheAggregatorLacksGoesAgain) {
  Training task = Trained();
  task.BecomeChainHead();
  task.BecomeSubmitted(kT0);
  task.ResultLost();
  EXPECT_EQ(task.phase(), Phase::kAsking);
  // Only a submitted result is lost: a chain under way stays.
  task.BecomeChainMember(kT0 + absl::Seconds(5));
  task.ResultLost();
  EXPECT_EQ(task.phase(), Phase::kChainMember);
}

TEST(TrainerTaskTest, FollowingAnotherAggregatorForgetsTheOldOne) {
  Training task = Trained();
  task.task.set_aggregator("agg-0");
  task.BecomeUploading();
  task.BecomeSubmitted(kT0);
  task.failures = 2;
  task.failing_since = kT0;
  task.lacking_since = kT0;
  task.FollowAggregator("agg-1", 1);
  EXPECT_EQ(task.aggregator, "agg-1");
  EXPECT_EQ(task.attempt, 1u);
  EXPECT_EQ(task.task.aggregator(), "agg-1");
  EXPECT_EQ(task.task.attempt(), 1u);
  EXPECT_EQ(task.result_header.aggregator(), "agg-1");
  EXPECT_EQ(task.result_header.attempt(), 1u);
  EXPECT_EQ(task.phase(), Phase::kAsking);  // Submitted to agg-0 only.
  EXPECT_EQ(task.confirmed, absl::InfinitePast());
  EXPECT_EQ(task.failures, 0);
  EXPECT_EQ(task.failing_since, absl::InfiniteFuture());
  EXPECT_EQ(task.lacking_since, absl::InfiniteFuture());
}

TEST(TrainerTaskTest, AFailoverGivesUpWhatWasOnItsWay) {
  for (Phase before : {Phase::kUploading, Phase::kChainHead,
                       Phase::kChainMember, Phase::kContributing}) {
    Training task = Trained();
    task.LeaveChain(kT0);  // direct
    switch (before) {
      case Phase::kUploading:
        task.BecomeUploading();
        break;
      case Phase::kChainHead:
        task.BecomeChainHead();
        break;
      case Phase::kChainMember:
        task.BecomeChainMember(kT0 + absl::Seconds(1));
        break;
      case Phase::kContributing:
        task.BecomeContributing();
        break;
      case Phase::kTraining:
      case Phase::kAsking:
      case Phase::kSubmitted:
        break;
    }
    task.AskAfresh();
    EXPECT_EQ(task.phase(), Phase::kAsking) << Training::PhaseName(before);
    EXPECT_FALSE(task.direct()) << Training::PhaseName(before);
    EXPECT_EQ(task.chain_until(), absl::InfiniteFuture());
  }
  // A failover while it trains leaves it training.
  Training training;
  training.AskAfresh();
  EXPECT_EQ(training.phase(), Phase::kTraining);
}

}  // namespace
}  // namespace swarm::site
