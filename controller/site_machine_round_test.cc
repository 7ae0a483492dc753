// Step tests of one SiteMachine as a round's aggregator (design section 3,
// steps 4 to 7): permission, results, gathering, the best record.
#include "controller/site_machine_fixture.h"

namespace swarm {
namespace site_machine_testing {
namespace {

// --- Permission (step 4): the aggregator.

TEST_F(SiteMachineTest, GrantsWhileSlotsAreFreeAndRetriesBeyond) {
  OpenAtD(0, {"a", "b", "c"}, {},
          Job([](v1::JobConfig* j) { j->set_max_concurrent_submissions(2); }));
  EXPECT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  EXPECT_EQ(AskNow("b", 0), v1::OUTCOME_OK);
  RequestId id;
  const Effects fx = Ask("c", 0, &id);
  const auto* retry = Answer<v1::SubmitPermissionReply>(fx, id);
  ASSERT_NE(retry, nullptr);
  EXPECT_EQ(retry->outcome(), v1::OUTCOME_RETRY);
  EXPECT_EQ(retry->retry_after_ms(), 100u);
  EXPECT_THAT(retry->message(), HasSubstr("busy"));
  EXPECT_EQ(Status().counters().submissions_in_flight(), 2u);
}

TEST_F(SiteMachineTest, HeldRequestIsGrantedWhenAResultCompletes) {
  OpenAtD(0);
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  RequestId short_hold, held;
  Effects fx = Ask("b", 0, &short_hold, now_ + absl::Seconds(5));
  EXPECT_EQ(OutcomeOf(fx, short_hold), std::nullopt);
  ASSERT_THAT(TimerTimes(fx), ElementsAre(kT0 + absl::Seconds(5)));
  Ask("c", 0, &held, now_ + absl::Seconds(9));
  EXPECT_EQ(machine_->held_requests(), 2u);
  // b's hold ends with no slot free: RETRY, to ask again at once.
  fx = Fire(*All<effect::SetTimer>(fx)[0]);
  const auto* retry = Answer<v1::SubmitPermissionReply>(fx, short_hold);
  ASSERT_NE(retry, nullptr);
  EXPECT_EQ(retry->outcome(), v1::OUTCOME_RETRY);
  EXPECT_EQ(retry->retry_after_ms(), 0u);
  // a's result completes: its slot goes to c in the same step.
  const Delivery result = Deliver(Result("a", 0), Shared(2));
  EXPECT_EQ(result.reply.outcome(), v1::OUTCOME_OK);
  EXPECT_EQ(OutcomeOf(result.effects, held), v1::OUTCOME_OK);
  EXPECT_EQ(machine_->held_requests(), 0u);
}

TEST_F(SiteMachineTest, HeldRequestIsGrantedWhenAnUploadIsCancelled) {
  OpenAtD(0);
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  RequestId gone, held;
  Ask("b", 0, &gone, now_ + absl::Seconds(5));
  Ask("c", 0, &held, now_ + absl::Seconds(5));
  Step(event::RequestCancelled{gone});  // b's caller went away.
  EXPECT_EQ(machine_->held_requests(), 1u);
  const Delivery cut = Deliver(Result("a", 0), absl::DataLossError("cut"));
  EXPECT_NE(cut.reply.outcome(), v1::OUTCOME_OK);
  EXPECT_EQ(OutcomeOf(cut.effects, held), v1::OUTCOME_OK);
  EXPECT_EQ(OutcomeOf(cut.effects, gone), std::nullopt);
}

TEST_F(SiteMachineTest, RejectsANonTrainerAndAClosedRound) {
  OpenAtD(0, {"a", "b"});
  EXPECT_EQ(AskNow("e", 0), v1::OUTCOME_REJECTED);  // Not a trainer.
  EXPECT_EQ(AskNow("c", 0), v1::OUTCOME_REJECTED);  // Not expected.
  Submit("a", 0);
  ASSERT_EQ(All<effect::RunAggregation>(Submit("b", 0).effects).size(), 1u);
  RequestId id;
  const Effects fx = Ask("a", 0, &id);
  EXPECT_EQ(OutcomeOf(fx, id), v1::OUTCOME_REJECTED);
  EXPECT_THAT(Answer<v1::SubmitPermissionReply>(fx, id)->message(),
              HasSubstr("closed"));
}

// As in the reference: once d has closed round 0 and opened round 1, a slow
// trainer's round-0 result goes into round 1 with a warning, but counts
// towards none of round 1's responses.
TEST_F(SiteMachineTest, LateResultGoesIntoTheNextOpenRound) {
  OpenAtD(0, {"a", "b"});
  Submit("a", 0);
  const Effects next = AckLearnTasks(Aggregated(Submit("b", 0).effects));
  const auto own = FindSends(next, CallKind::kLearnTask);
  ASSERT_THAT(Targets(own), ElementsAre("d"));
  Deliver(own[0]->message.header, own[0]->message.model);  // Round 1 opens.
  ASSERT_EQ(Status().round(), 1u);
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  const Delivery late = Deliver(Result("a", 0), Shared(2));
  EXPECT_EQ(late.reply.outcome(), v1::OUTCOME_OK) << late.reply.message();
  EXPECT_THAT(late.reply.message(), HasSubstr("late"));
  EXPECT_THAT(All<effect::RunAggregation>(late.effects), IsEmpty());
}

TEST_F(SiteMachineTest, RetriesARoundNotYetOpenAndGrantsWhenItOpens) {
  Make("d");
  EXPECT_EQ(AskNow("a", 0), v1::OUTCOME_RETRY);  // No learn task yet.
  Deliver(LearnTask(0, {"a", "b"}), Shared(1));
  EXPECT_EQ(AskNow("a", 1), v1::OUTCOME_RETRY);  // A fast trainer.
  RequestId held;
  Ask("a", 1, &held, now_ + absl::Minutes(5));
  Submit("a", 0);
  const Effects fx = Aggregated(Submit("b", 0).effects);
  EXPECT_EQ(machine_->held_requests(), 1u);  // Round 1 is not open yet.
  const Effects next = AckLearnTasks(fx);
  const auto own = FindSends(next, CallKind::kLearnTask);
  ASSERT_THAT(Targets(own), ElementsAre("d"));
  // The driver loops d's own task back; the round opens; a is granted.
  const Delivery task = Deliver(own[0]->message.header, own[0]->message.model);
  EXPECT_EQ(task.reply.outcome(), v1::OUTCOME_OK) << task.reply.message();
  EXPECT_EQ(OutcomeOf(task.effects, held), v1::OUTCOME_OK);
}

// --- Results (step 5).

TEST_F(SiteMachineTest, ResultForARoundAheadIsAnError) {
  OpenAtD(0);
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  const Delivery ahead = Deliver(Result("a", 1), Shared(2));
  EXPECT_EQ(ahead.admitted.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ahead.admitted.message(), HasSubstr("ahead"));
}

TEST_F(SiteMachineTest, ResultForAnEarlierRoundIsAcceptedAsLate) {
  OpenAtD(1);  // d gathers round 1; round 0 was never closed here.
  const Delivery late = Submit("a", 0);
  EXPECT_TRUE(late.admitted.ok()) << late.admitted;
  EXPECT_EQ(late.reply.outcome(), v1::OUTCOME_OK);
  EXPECT_THAT(late.reply.message(), HasSubstr("late"));
  EXPECT_THAT(All<effect::RunAggregation>(late.effects), IsEmpty());
  EXPECT_EQ(Status().counters().results_accepted(), 1u);
}

TEST_F(SiteMachineTest, ResultForAClosedRoundIsDropped) {
  const Effects open = OpenAtD(0);
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  const RequestId upload = next_request_++;
  Step(event::ModelHeader{upload, Result("a", 0)});        // Upload under way.
  Effects fx = Fire(*All<effect::SetTimer>(open).back());  // round_timeout.
  ASSERT_EQ(All<effect::RunAggregation>(fx).size(), 1u);
  fx = Step(event::MakeModelBody(upload, Result("a", 0), Shared(2)));
  EXPECT_EQ(OutcomeOf(fx, upload), v1::OUTCOME_REJECTED);
  EXPECT_THAT(Answer<v1::Reply>(fx, upload)->message(), HasSubstr("closed"));
  const Delivery after = Deliver(Result("b", 0), Shared(2));
  EXPECT_EQ(after.admitted.code(), absl::StatusCode::kFailedPrecondition);
}

// Design section 9: a result is added to the aggregate outside the step.
// A round that is over while one is being added closes once it is in: the
// trainer is told it counted, and the aggregate holds it.
TEST_F(SiteMachineTest, RoundOverWhileAResultIsAddedClosesOnceItIsIn) {
  const Effects open = OpenAtD(0, {"a", "b"});
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  const RequestId upload = next_request_++;
  Step(event::ModelHeader{upload, Result("a", 0)});
  const Effects body =
      Step(event::MakeModelBody(upload, Result("a", 0), Shared(2)));
  const auto adds = All<effect::AddResult>(body);
  ASSERT_EQ(adds.size(), 1u);
  EXPECT_EQ(OutcomeOf(body, upload), std::nullopt) << "answered once added";
  const effect::AddResult add = *adds[0];
  Effects fx = Fire(*All<effect::SetTimer>(open).back());  // round_timeout.
  EXPECT_THAT(All<effect::RunAggregation>(fx), IsEmpty())
      << "closed with an add pending";
  fx = Step(event::ResultAdded{add.request, add.round, add.header,
                               add.job.Run(), add.job_run});
  EXPECT_EQ(OutcomeOf(fx, upload), v1::OUTCOME_OK);
  const auto run = All<effect::RunAggregation>(fx);
  ASSERT_EQ(run.size(), 1u);
  EXPECT_EQ(run[0]->closed->Judge().results, 1u);
  EXPECT_EQ(Status().counters().results_accepted(), 1u);
}

// An add that ends after its round was dropped (here: the job was
// aborted) answers the trainer REJECTED and changes nothing.
TEST_F(SiteMachineTest, AddEndingAfterTheJobEndedIsDropped) {
  OpenAtD(0, {"a", "b"});
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  const RequestId upload = next_request_++;
  Step(event::ModelHeader{upload, Result("a", 0)});
  const Effects body =
      Step(event::MakeModelBody(upload, Result("a", 0), Shared(2)));
  ASSERT_EQ(All<effect::AddResult>(body).size(), 1u);
  const effect::AddResult add = *All<effect::AddResult>(body)[0];
  event::Abort abort{next_request_++, {}};
  abort.abort.set_job_id("step");
  const Effects aborted = Step(abort);
  EXPECT_EQ(All<effect::Release>(aborted).size(), 1u)
      << "the dropped round goes to the worker";
  const Effects late = Step(event::ResultAdded{
      add.request, add.round, add.header, add.job.Run(), add.job_run});
  EXPECT_EQ(OutcomeOf(late, upload), v1::OUTCOME_REJECTED);
  EXPECT_THAT(All<effect::RunAggregation>(late), IsEmpty());
}

// --- Gather (step 6), and what follows.

TEST_F(SiteMachineTest, LastExpectedResultClosesAggregatesAndScattersNext) {
  OpenAtD(0, {"a", "b"});
  const Delivery first = Submit("a", 0, /*samples=*/1, 0.5, /*value=*/2);
  EXPECT_THAT(All<effect::RunAggregation>(first.effects), IsEmpty());
  const Delivery last = Submit("b", 0, /*samples=*/3, 0.5, /*value=*/6);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_AGGREGATING);
  EXPECT_EQ(Status().counters().results_accepted(), 2u);
  EXPECT_EQ(Status().last_error(), "");
  const Effects fx = Aggregated(last.effects);
  // The global model first, then the state file that names it.
  EXPECT_THAT(PersistKinds(fx),
              ElementsAre(What::kGlobal, What::kClearOffload, What::kState));
  const effect::Persist* global = All<effect::Persist>(fx)[0];
  EXPECT_EQ(global->round, 1u);
  EXPECT_FLOAT_EQ(First(*global->model), (2.0f * 1 + 6.0f * 3) / 4);
  EXPECT_EQ(All<effect::Persist>(fx)[2]->state.last_completed_round(), 0);
  EXPECT_EQ(All<effect::Persist>(fx)[2]->state.global_round(), 1);
  const auto tasks = FindSends(fx, CallKind::kLearnTask);
  EXPECT_THAT(Targets(tasks), UnorderedElementsAre("a", "b", "c"));
  for (const effect::Send* t : tasks) {
    EXPECT_EQ(t->message.header.round(), 1u);
    EXPECT_EQ(t->message.model, global->model);
  }
}

TEST_F(SiteMachineTest, RoundClosesWaitAfterMinResponses) {
  OpenAtD(0, {"a", "b", "c"}, {},
          Job([](v1::JobConfig* j) { j->set_min_responses_required(1); }));
  now_ += absl::Seconds(1);
  const Delivery first = Submit("a", 0);
  EXPECT_THAT(All<effect::RunAggregation>(first.effects), IsEmpty());
  ASSERT_THAT(TimerTimes(first.effects), ElementsAre(kT0 + absl::Seconds(11)));
  const Effects fx = Fire(*All<effect::SetTimer>(first.effects)[0]);
  ASSERT_EQ(All<effect::RunAggregation>(fx).size(), 1u);
  EXPECT_THAT(Status().last_error(), HasSubstr("no result from b,c"));
}

TEST_F(SiteMachineTest, GraceDeadlineIsArmedAfterAnEarlierTimerFires) {
  // (A timer set for the moment it fires must not count as still to come.)
  // round_timeout 10 min; a's permission lease (1 min) arms the first timer.
  OpenAtD(0, {"a", "b", "c"}, {}, Job([](v1::JobConfig* j) {
            j->set_min_responses_required(1);
            j->set_round_timeout_ms(600'000);
          }));
  RequestId id;
  const Effects asked = Ask("a", 0, &id);
  ASSERT_THAT(TimerTimes(asked), ElementsAre(kT0 + absl::Minutes(1)));
  now_ = kT0 + absl::Seconds(55);
  Deliver(Result("a", 0), Shared(2));  // The minimum: grace ends at 65 s.
  const Effects fired = Fire(*All<effect::SetTimer>(asked)[0]);
  EXPECT_THAT(TimerTimes(fired), Contains(kT0 + absl::Seconds(65)))
      << "nothing wakes the round before its 10 min timeout";
}

TEST_F(SiteMachineTest, RoundClosesAtTimeoutRecordingMissingTrainers) {
  const Effects open = OpenAtD(0);
  // The round timeout, and the look for silent trainers (two failover
  // timeouts, 10 s; not fired here).
  ASSERT_THAT(TimerTimes(open),
              ElementsAre(kT0 + absl::Seconds(10), kT0 + absl::Seconds(60)));
  Submit("b", 0);
  ASSERT_EQ(AskNow("a", 0), v1::OUTCOME_OK);
  RequestId held;
  Ask("c", 0, &held, now_ + absl::Minutes(5));
  const Effects fx = Fire(*All<effect::SetTimer>(open).back());
  const auto agg = All<effect::RunAggregation>(fx);
  ASSERT_EQ(agg.size(), 1u);
  EXPECT_EQ(agg[0]->closed->Judge().results, 1u);
  EXPECT_THAT(Status().last_error(), HasSubstr("no result from a,c"));
  // The held request does not hang on: the round is closed.
  EXPECT_EQ(OutcomeOf(fx, held), v1::OUTCOME_REJECTED);
}

// --- Best (step 7): weighted mean 0.65 against a record of 0.62 (the plain
// mean, 0.6, would decide the other way in both directions).

class BestTest : public SiteMachineTest,
                 public ::testing::WithParamInterface<v1::MetricDirection> {};

TEST_P(BestTest, WeightedMeanIsComparedWithTheRecord) {
  const v1::MetricDirection direction = GetParam();
  OpenAtD(0, {"a", "b"}, Best("c", 0.62, 0), Job([direction](v1::JobConfig* j) {
            j->set_metric_direction(direction);
          }));
  Submit("a", 0, /*samples=*/1, /*metric=*/0.5);
  const Delivery last = Submit("b", 0, /*samples=*/3, /*metric=*/0.7);
  const v1::BestRecord expected = direction == v1::METRIC_HIGHER_IS_BETTER
                                      ? Best("d", 0.65, 0)
                                      : Best("c", 0.62, 0);
  EXPECT_EQ(Status().best().site(), expected.site());
  EXPECT_DOUBLE_EQ(Status().best().metric(), expected.metric());
  EXPECT_EQ(Status().best().round(), 0u);
  // The winning record travels with the next round's learn tasks.
  const Effects fx = Aggregated(last.effects);
  ASSERT_FALSE(FindSends(fx, CallKind::kLearnTask).empty());
  for (const auto* t : FindSends(fx, CallKind::kLearnTask)) {
    EXPECT_EQ(t->message.header.best().site(), expected.site());
    EXPECT_DOUBLE_EQ(t->message.header.best().metric(), expected.metric());
  }
}

INSTANTIATE_TEST_SUITE_P(Directions, BestTest,
                         ::testing::Values(v1::METRIC_HIGHER_IS_BETTER,
                                           v1::METRIC_LOWER_IS_BETTER));

}  // namespace
}  // namespace site_machine_testing
}  // namespace swarm
