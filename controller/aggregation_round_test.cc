// Step tests of one aggregation round: permission, result header, result
// body, closing, and the verdict, with the time passed in.
#include "controller/aggregation_round.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "config/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kRound = 2;
constexpr uint64_t kElements = 16;
const absl::Time kOpen = absl::FromUnixSeconds(1000);

JobView MakeJob(uint32_t max_concurrent,
               v1::ServerOptimizer optimizer = v1::SERVER_OPTIMIZER_NONE) {
  v1::JobConfig job;
  job.set_server_optimizer(optimizer);
  job.set_job_id("round-job");
  for (const char* name : {"agg", "t1", "t2"}) {
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
    site->set_address("127.0.0.1:" + std::to_string(7000 + job.sites_size()));
  }
  job.add_trainers("t1");
  job.add_trainers("t2");
  job.set_starting_site("agg");
  job.set_num_rounds(5);
  job.set_max_concurrent_submissions(max_concurrent);
  job.set_round_timeout_ms(60'000);
  job.set_wait_after_min_responses_ms(10'000);
  job = WithDefaults(job);
  EXPECT_TRUE(ValidateJobConfig(job).ok()) << ValidateJobConfig(job);
  return JobView(job);
}

std::shared_ptr<const Model> FilledModel(float value, bool nan = false) {
  absl::StatusOr<Model> model = Model::Create(
      {TensorSpec{"w", v1::DTYPE_F32, {kElements}, kElements * sizeof(float)}});
  EXPECT_TRUE(model.ok()) << model.status();
  absl::Span<char> data = model->mutable_tensor_data(0);
  for (uint64_t i = 0; i < kElements; ++i) {
    const float v =
        nan && i == 3 ? std::numeric_limits<float>::quiet_NaN() : value;
    std::memcpy(data.data() + i * sizeof(float), &v, sizeof(float));
  }
  return std::make_shared<const Model>(std::move(*model));
}

float First(const Model& model) {
  float v;
  std::memcpy(&v, model.tensor_data(0).data(), sizeof(float));
  return v;
}

class AggregationRoundTest : public ::testing::Test {
 protected:
  void Open(uint32_t max_concurrent, double best_metric = -1,
            std::shared_ptr<const Model> base = FilledModel(1.0f),
            v1::ServerOptimizer optimizer = v1::SERVER_OPTIMIZER_NONE) {
    job_ = std::make_unique<JobView>(MakeJob(max_concurrent, optimizer));
    v1::ModelHeader task;
    task.set_round(kRound);
    task.add_expected_trainers("t1");
    task.add_expected_trainers("t2");
    if (best_metric >= 0) {
      task.mutable_best()->set_present(true);
      task.mutable_best()->set_metric(best_metric);
      task.mutable_best()->set_site("t1");
      task.mutable_best()->set_round(0);
    }
    absl::StatusOr<std::unique_ptr<AggregationRound>> round =
        AggregationRound::Open(*job_, "agg", task, std::move(base), "", kOpen);
    ASSERT_TRUE(round.ok()) << round.status();
    round_ = std::move(*round);
  }

  v1::ModelHeader Result(const std::string& trainer, uint64_t samples,
                         double metric) {
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_RESULT);
    header.set_round(kRound);
    header.set_sender(trainer);
    header.set_sample_count(samples);
    (*header.mutable_metrics())["accuracy"] = metric;
    return header;
  }

  // Permission, header, body: the whole submission of one trainer.
  AggregationRound::ResultEnd Submit(const v1::ModelHeader& header,
                                     std::shared_ptr<const Model> model,
                                     absl::Time now) {
    EXPECT_EQ(
        round_->RequestToSubmit(header.sender(), kRound, now).decision.outcome,
        v1::OUTCOME_OK);
    AggregationRound::ResultStart start = round_->BeginResult(header, now);
    EXPECT_TRUE(start.refused.ok()) << start.refused;
    EXPECT_NE(start.sink, nullptr);
    return round_->CompleteResult(header, model, now);
  }

  std::unique_ptr<JobView> job_;
  std::unique_ptr<AggregationRound> round_;
};

TEST_F(AggregationRoundTest, LastExpectedResultClosesTheRoundWithTheAverage) {
  Open(/*max_concurrent=*/1);
  AggregationRound::ResultEnd first =
      Submit(Result("t1", 1, 0.5), FilledModel(2.0f), kOpen);
  EXPECT_EQ(first.reply.outcome(), v1::OUTCOME_OK) << first.reply.message();
  EXPECT_FALSE(first.report.done);
  AggregationRound::ResultEnd second =
      Submit(Result("t2", 3, 0.7), FilledModel(6.0f), kOpen + absl::Seconds(1));
  EXPECT_EQ(second.reply.outcome(), v1::OUTCOME_OK);
  ASSERT_TRUE(second.report.done);
  EXPECT_EQ(second.report.reason, DoneReason::kAllResponded);
  EXPECT_TRUE(round_->closed());

  const AggregationRound::Verdict verdict = round_->Judge();
  EXPECT_EQ(verdict.results, 2u);
  ASSERT_TRUE(verdict.input_score.has_value());
  EXPECT_DOUBLE_EQ(*verdict.input_score, (0.5 * 1 + 0.7 * 3) / 4);
  EXPECT_TRUE(verdict.base_is_new_best);  // No record before.
  EXPECT_EQ(verdict.best.site(), "agg");
  absl::StatusOr<std::shared_ptr<const Model>> next = round_->Aggregate();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FLOAT_EQ(First(**next), (2.0f * 1 + 6.0f * 3) / 4);

  const RoundCounters& counters = round_->counters();
  EXPECT_EQ(counters.granted, 2u);
  EXPECT_EQ(counters.accepted, 2u);
  EXPECT_EQ(counters.rejected, 0u);
  EXPECT_EQ(counters.in_flight, 0u);
  EXPECT_EQ(counters.max_in_flight, 1u);
}

TEST_F(AggregationRoundTest, SlotsAreCountedWhereTheLimitApplies) {
  Open(/*max_concurrent=*/1);
  EXPECT_EQ(round_->RequestToSubmit("t1", kRound, kOpen).decision.code,
            PermissionCode::kGranted);
  const AggregationRound::Permission busy =
      round_->RequestToSubmit("t2", kRound, kOpen);
  EXPECT_EQ(busy.decision.outcome, v1::OUTCOME_RETRY);
  EXPECT_EQ(busy.decision.code, PermissionCode::kSlotsBusy);
  EXPECT_EQ(round_->counters().in_flight, 1u);
  // t1's upload fails in the middle: its slot frees at once.
  AggregationRound::ResultStart start =
      round_->BeginResult(Result("t1", 1, 0.5), kOpen);
  ASSERT_TRUE(start.refused.ok());
  AggregationRound::ResultEnd cut = round_->CompleteResult(
      Result("t1", 1, 0.5), absl::DataLossError("stream cut"), kOpen);
  EXPECT_EQ(cut.refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(round_->counters().rejected, 1u);
  EXPECT_EQ(round_->counters().in_flight, 0u);
  EXPECT_EQ(round_->RequestToSubmit("t2", kRound, kOpen).decision.code,
            PermissionCode::kGranted);
  EXPECT_EQ(round_->counters().max_in_flight, 1u);
}

TEST_F(AggregationRoundTest, BadResultIsRefusedAndLeavesTheAggregateUntouched) {
  Open(/*max_concurrent=*/2);
  AggregationRound::ResultEnd nan =
      Submit(Result("t1", 1, 0.5), FilledModel(2.0f, /*nan=*/true), kOpen);
  EXPECT_FALSE(nan.refused.ok());
  EXPECT_THAT(nan.refused.message(), HasSubstr("NaN"));
  EXPECT_FALSE(nan.report.done);
  // The trainer may try again while the round is open; the good result is
  // the only one in the aggregate.
  EXPECT_EQ(
      Submit(Result("t1", 1, 0.5), FilledModel(4.0f), kOpen).reply.outcome(),
      v1::OUTCOME_OK);
  EXPECT_TRUE(
      Submit(Result("t2", 1, 0.5), FilledModel(8.0f), kOpen).report.done);
  absl::StatusOr<std::shared_ptr<const Model>> next = round_->Aggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ(First(**next), 6.0f);
  EXPECT_EQ(round_->counters().accepted, 2u);
  EXPECT_EQ(round_->counters().rejected, 1u);
}

TEST_F(AggregationRoundTest, FailedTrainerIsNotWaitedFor) {
  Open(/*max_concurrent=*/2);
  v1::ModelHeader failed = Result("t1", 0, 0);
  failed.set_failed(true);
  failed.set_failure("out of memory");
  ASSERT_EQ(round_->RequestToSubmit("t1", kRound, kOpen).decision.outcome,
            v1::OUTCOME_OK);
  AggregationRound::ResultStart start = round_->BeginResult(failed, kOpen);
  EXPECT_TRUE(start.refused.ok());
  EXPECT_TRUE(start.header_only);
  EXPECT_EQ(start.sink, nullptr);
  EXPECT_FALSE(start.report.done);
  AggregationRound::ResultEnd last =
      Submit(Result("t2", 1, 0.5), FilledModel(3.0f), kOpen);
  ASSERT_TRUE(last.report.done);
  EXPECT_EQ(last.report.dropped, std::vector<std::string>{"t1"});
  EXPECT_EQ(round_->Judge().results, 1u);
}

TEST_F(AggregationRoundTest, ResultAfterTheCloseIsRejected) {
  Open(/*max_concurrent=*/2);
  ASSERT_EQ(round_->RequestToSubmit("t1", kRound, kOpen).decision.outcome,
            v1::OUTCOME_OK);
  AggregationRound::ResultStart start =
      round_->BeginResult(Result("t1", 1, 0.5), kOpen);
  ASSERT_TRUE(start.refused.ok());
  // The round times out while the upload is under way.
  const RoundReport timeout = round_->Check(kOpen + absl::Seconds(60));
  ASSERT_TRUE(timeout.done);
  EXPECT_EQ(timeout.reason, DoneReason::kTimeout);
  EXPECT_EQ(timeout.uploads_cut_off, std::vector<std::string>{"t1"});
  AggregationRound::ResultEnd late = round_->CompleteResult(
      Result("t1", 1, 0.5), FilledModel(9.0f), kOpen + absl::Seconds(61));
  EXPECT_EQ(late.reply.outcome(), v1::OUTCOME_REJECTED);
  EXPECT_THAT(late.reply.message(),
              HasSubstr("round 2 closed before the result was complete"));
  // Nothing arrived in time: the base model carries over.
  absl::StatusOr<std::shared_ptr<const Model>> next = round_->Aggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ(First(**next), 1.0f);
  EXPECT_EQ(round_->counters().rejected, 1u);
}

TEST_F(AggregationRoundTest, TimerDeadlineIsTheRoundTimeoutUntilTheMinimum) {
  Open(/*max_concurrent=*/2);
  EXPECT_EQ(round_->NextDeadline(), kOpen + absl::Seconds(60));
  EXPECT_FALSE(round_->Check(kOpen + absl::Seconds(59)).done);
  EXPECT_TRUE(round_->Check(kOpen + absl::Seconds(60)).done);
  EXPECT_EQ(round_->NextDeadline(), absl::InfiniteFuture());
}

TEST_F(AggregationRoundTest, BaseThatDoesNotBeatTheRecordIsNotTheNewBest) {
  Open(/*max_concurrent=*/2, /*best_metric=*/0.9);
  Submit(Result("t1", 1, 0.5), FilledModel(2.0f), kOpen);
  ASSERT_TRUE(
      Submit(Result("t2", 1, 0.6), FilledModel(2.0f), kOpen).report.done);
  const AggregationRound::Verdict verdict = round_->Judge();
  EXPECT_FALSE(verdict.base_is_new_best);
  EXPECT_EQ(verdict.best.site(), "t1");
  EXPECT_DOUBLE_EQ(verdict.best.metric(), 0.9);
}

// Chain reduction: a partial sum of t1 (1 sample) and t2 (3 samples) is
// both their results: no permission, one body, the round's score from
// each contributor's metric.
v1::ModelHeader PartialSum(
    std::vector<std::tuple<std::string, uint64_t, double>> contributions) {
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_PARTIAL_SUM);
  header.set_round(kRound);
  header.set_sender(contributions.empty() ? std::string("t1")
                                          : std::get<0>(contributions.back()));
  uint64_t total = 0;
  for (const auto& [site, samples, metric] : contributions) {
    v1::Contribution* contribution = header.add_contributions();
    contribution->set_site(site);
    contribution->set_sample_count(samples);
    (*contribution->mutable_metrics())["accuracy"] = metric;
    total += samples;
  }
  header.set_sample_count(total);
  return header;
}

TEST_F(AggregationRoundTest, APartialSumCountsAsEachContributorsResult) {
  Open(/*max_concurrent=*/1);
  const v1::ModelHeader header = PartialSum({{"t1", 1, 0.5}, {"t2", 3, 0.7}});
  AggregationRound::ResultStart start = round_->BeginResult(header, kOpen);
  ASSERT_TRUE(start.refused.ok()) << start.refused;
  ASSERT_NE(start.sink, nullptr);
  // 1 * 2.0 + 3 * 6.0, as the chain's hops add them.
  AggregationRound::ResultEnd end =
      round_->CompleteResult(header, FilledModel(20.0f), kOpen);
  EXPECT_EQ(end.reply.outcome(), v1::OUTCOME_OK) << end.reply.message();
  ASSERT_TRUE(end.report.done);
  EXPECT_EQ(end.report.reason, DoneReason::kAllResponded);
  const AggregationRound::Verdict verdict = round_->Judge();
  EXPECT_EQ(verdict.results, 2u);
  ASSERT_TRUE(verdict.input_score.has_value());
  EXPECT_DOUBLE_EQ(*verdict.input_score, (0.5 * 1 + 0.7 * 3) / 4);
  absl::StatusOr<std::shared_ptr<const Model>> next = round_->Aggregate();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FLOAT_EQ(First(**next), (2.0f * 1 + 6.0f * 3) / 4);
  EXPECT_EQ(round_->counters().accepted, 2u);
  EXPECT_EQ(round_->counters().granted, 0u);
}

TEST_F(AggregationRoundTest, APartialSumThatDoesNotAddUpIsRefusedWhole) {
  Open(/*max_concurrent=*/1);
  v1::ModelHeader header = PartialSum({{"t1", 1, 0.5}, {"t2", 3, 0.7}});
  header.set_sample_count(5);
  EXPECT_THAT(round_->BeginResult(header, kOpen).refused.message(),
              HasSubstr("sample_count: 5 is not the sum of the "
                        "contributions' sample counts (4)"));
  header = PartialSum({{"t1", 1, 0.5}, {"t1", 3, 0.7}});
  EXPECT_THAT(round_->BeginResult(header, kOpen).refused.message(),
              HasSubstr("contributions: t1 is named twice"));
  header = PartialSum({});
  EXPECT_THAT(round_->BeginResult(header, kOpen).refused.message(),
              HasSubstr("a partial sum must name its contributors"));
  header = PartialSum({{"t1", 1, 0.5}, {"z", 3, 0.7}});
  EXPECT_THAT(round_->BeginResult(header, kOpen).refused.message(),
              HasSubstr("the partial sum's contributor z: z is not an "
                        "expected trainer"));
  // t1, begun before z was refused, is free again: it submits directly.
  AggregationRound::ResultEnd direct =
      Submit(Result("t1", 1, 0.5), FilledModel(2.0f), kOpen);
  EXPECT_EQ(direct.reply.outcome(), v1::OUTCOME_OK);
}

TEST_F(AggregationRoundTest, APartialSumOverlappingAnAcceptedResultIsRefused) {
  Open(/*max_concurrent=*/1);
  Submit(Result("t1", 1, 0.5), FilledModel(2.0f), kOpen);
  const v1::ModelHeader header = PartialSum({{"t2", 3, 0.7}, {"t1", 1, 0.5}});
  AggregationRound::ResultStart start = round_->BeginResult(header, kOpen);
  EXPECT_EQ(start.refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(start.refused.message(),
              HasSubstr("the partial sum's contributor t1: the result of t1 "
                        "for round 2 is already in"));
  // t2's part was let go: it may still submit, and the aggregate has t1
  // once.
  EXPECT_THAT(round_->IdleTrainers(), ::testing::ElementsAre("t2"));
  AggregationRound::ResultEnd direct =
      Submit(Result("t2", 3, 0.7), FilledModel(6.0f), kOpen);
  ASSERT_TRUE(direct.report.done);
  absl::StatusOr<std::shared_ptr<const Model>> next = round_->Aggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ(First(**next), (2.0f * 1 + 6.0f * 3) / 4);
}

TEST(RoundCountersTest, SumsAndKeepsTheMaximum) {
  RoundCounters a{1, 2, 3, 0, 2};
  a.Add(RoundCounters{4, 5, 6, 1, 1});
  EXPECT_EQ(a.granted, 5u);
  EXPECT_EQ(a.accepted, 7u);
  EXPECT_EQ(a.rejected, 9u);
  EXPECT_EQ(a.in_flight, 1u);
  EXPECT_EQ(a.max_in_flight, 2u);
  v1::SiteCounters counters;
  a.CopyTo(&counters);
  EXPECT_EQ(counters.max_submissions_in_flight(), 2u);
  EXPECT_EQ(counters.submissions_granted(), 5u);
}

// The job's sample-count cap applies to FedAvg's weights and to the score,
// and a clipped claim is counted, not refused.
TEST_F(AggregationRoundTest, SampleCountCapClipsAndCounts) {
  v1::JobConfig config = MakeJob(1).config();
  config.set_max_claimed_samples(10);
  job_ = std::make_unique<JobView>(config);
  v1::ModelHeader task;
  task.set_round(kRound);
  task.add_expected_trainers("t1");
  task.add_expected_trainers("t2");
  absl::StatusOr<std::unique_ptr<AggregationRound>> round =
      AggregationRound::Open(*job_, "agg", task, FilledModel(1.0f), "", kOpen);
  ASSERT_TRUE(round.ok()) << round.status();
  round_ = std::move(*round);
  EXPECT_EQ(
      Submit(Result("t1", 10, 0.5), FilledModel(2.0f), kOpen).reply.outcome(),
      v1::OUTCOME_OK);
  // Claims 50 times the honest count: weighs as 10.
  EXPECT_EQ(
      Submit(Result("t2", 500, 0.9), FilledModel(6.0f), kOpen).reply.outcome(),
      v1::OUTCOME_OK);
  ASSERT_TRUE(round_->closed());
  const AggregationRound::Verdict verdict = round_->Judge();
  ASSERT_TRUE(verdict.input_score.has_value());
  EXPECT_DOUBLE_EQ(*verdict.input_score, 0.7);
  absl::StatusOr<std::shared_ptr<const Model>> next = round_->Aggregate();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FLOAT_EQ(First(**next), 4.0f);
  EXPECT_EQ(round_->counters().claims_clipped, 1u);
  v1::SiteCounters counters;
  round_->counters().CopyTo(&counters);
  EXPECT_EQ(counters.sample_claims_clipped(), 1u);
}

// Server momentum (beta1 0.5, lr 1): the round's aggregate is the base
// stepped by the momentum of the mean's update, and the momentum travels in
// the next global model as state tensors that results never carry. Two
// rounds: the second starts from the first's output, state included.
TEST_F(AggregationRoundTest, ServerMomentumStepsAndCarriesItsState) {
  Open(/*max_concurrent=*/2, -1, FilledModel(1.0f),
       v1::SERVER_OPTIMIZER_MOMENTUM);
  Submit(Result("t1", 1, 0.5), FilledModel(2.0f), kOpen);
  Submit(Result("t2", 3, 0.5), FilledModel(6.0f), kOpen);
  ASSERT_TRUE(round_->closed());
  absl::StatusOr<std::shared_ptr<const Model>> first = round_->Aggregate();
  ASSERT_TRUE(first.ok()) << first.status();
  // Mean 5, update 4: m = 4, x = 1 + 4.
  EXPECT_FLOAT_EQ(First(**first), 5.0f);
  ASSERT_EQ((*first)->num_tensors(), 3u);
  EXPECT_EQ((*first)->spec(1).name, "swarm.server_optimizer.m/w");
  EXPECT_EQ((*first)->spec(2).name, "swarm.server_optimizer.step");

  Open(/*max_concurrent=*/2, -1, *first, v1::SERVER_OPTIMIZER_MOMENTUM);
  // Trainers see and send the model's tensors only.
  EXPECT_EQ(round_->base().num_tensors(), 1u);
  EXPECT_EQ(round_->shared_base()->num_tensors(), 3u);
  Submit(Result("t1", 1, 0.5), FilledModel(7.0f), kOpen);
  Submit(Result("t2", 1, 0.5), FilledModel(7.0f), kOpen);
  absl::StatusOr<std::shared_ptr<const Model>> second = round_->Aggregate();
  ASSERT_TRUE(second.ok()) << second.status();
  // Update 2: m = 0.5 * 4 + 2 = 4, x = 5 + 4.
  EXPECT_FLOAT_EQ(First(**second), 9.0f);
  float m;
  std::memcpy(&m, (*second)->tensor_data(1).data(), sizeof(m));
  EXPECT_FLOAT_EQ(m, 4.0f);
}

// A round no result reached carries its base over, state included.
TEST_F(AggregationRoundTest, ServerOptimizerStateCarriesOverAnEmptyRound) {
  Open(/*max_concurrent=*/2, -1, FilledModel(1.0f),
       v1::SERVER_OPTIMIZER_MOMENTUM);
  Submit(Result("t1", 1, 0.5), FilledModel(3.0f), kOpen);
  Submit(Result("t2", 1, 0.5), FilledModel(3.0f), kOpen);
  absl::StatusOr<std::shared_ptr<const Model>> first = round_->Aggregate();
  ASSERT_TRUE(first.ok()) << first.status();
  Open(/*max_concurrent=*/2, -1, *first, v1::SERVER_OPTIMIZER_MOMENTUM);
  round_->Check(kOpen + absl::Hours(1));  // The round times out empty.
  ASSERT_TRUE(round_->closed());
  absl::StatusOr<std::shared_ptr<const Model>> carried = round_->Aggregate();
  ASSERT_TRUE(carried.ok()) << carried.status();
  EXPECT_EQ(carried->get(), first->get());
}

}  // namespace
}  // namespace swarm
