// Step tests of one SiteMachine (design section 3): the scatter and the
// election, the trainer's side of a round, and the finish. The aggregator's
// side of a round is in site_machine_round_test.cc.
#include "controller/site_machine_fixture.h"
#include "streaming/digest.h"

namespace swarm {
namespace site_machine_testing {
namespace {

// --- Scatter and election (steps 1, 2).

TEST_F(SiteMachineTest, StartingSiteElectsAndScattersTheFirstRound) {
  const v1::JobConfig job = Job([](v1::JobConfig* j) {
    j->clear_trainers();  // Every site trains and may aggregate.
    j->clear_aggregator_candidates();
  });
  Make("a", job);
  const Effects fx = StartAndScatter();
  const std::vector<std::string> order = ElectionOrder(job, 0);
  const std::string& aggregator = order[0];
  std::vector<std::string> others = view_->trainers();
  others.erase(std::find(others.begin(), others.end(), aggregator));
  const auto tasks = FindSends(fx, CallKind::kLearnTask);
  EXPECT_THAT(Targets(tasks), ElementsAreArray(others));  // Not the aggregator.
  for (const effect::Send* t : tasks) {
    EXPECT_EQ(t->message.header.round(), 0u);
    EXPECT_EQ(t->message.header.sender(), "a");
    EXPECT_EQ(t->message.header.aggregator(), aggregator);
    EXPECT_THAT(t->message.header.backup_aggregators(),
                ElementsAreArray(order.begin() + 1, order.end()));
  }
  // One trainer refuses; then the aggregator's task names the others. a's
  // own task is a Send to a, like any other (the driver loops it back).
  const std::string refusing = others.back() == "a" ? others[0] : others.back();
  Effects last;
  for (const effect::Send* t : tasks) {
    last = Done(
        *t, t->to.name() == refusing ? v1::OUTCOME_REJECTED : v1::OUTCOME_OK);
  }
  const auto to_aggregator = FindSends(last, CallKind::kLearnTask);
  ASSERT_THAT(Targets(to_aggregator), ElementsAre(aggregator));
  std::vector<std::string> expected = view_->trainers();
  expected.erase(std::find(expected.begin(), expected.end(), refusing));
  std::sort(expected.begin(), expected.end());
  EXPECT_THAT(to_aggregator[0]->message.header.expected_trainers(),
              ElementsAreArray(expected));
  std::vector<std::string> all = Targets(tasks);
  all.push_back(aggregator);
  EXPECT_THAT(all, Contains("a"));
  EXPECT_THAT(Status().last_error(), HasSubstr("learn task to " + refusing));
  // The operator's Start is answered once the aggregator has its task,
  // naming the trainer the round's task did not reach.
  EXPECT_EQ(OutcomeOf(last, start_request_), std::nullopt);
  const Effects acked = Done(*to_aggregator[0]);
  const v1::Reply* started = Answer<v1::Reply>(acked, start_request_);
  ASSERT_NE(started, nullptr);
  EXPECT_EQ(started->outcome(), v1::OUTCOME_OK);
  EXPECT_THAT(started->message(), HasSubstr("aggregator " + aggregator));
  ASSERT_EQ(started->not_reached_size(), 1);
  EXPECT_THAT(started->not_reached(0), HasSubstr(refusing + ": "));
}

TEST_F(SiteMachineTest, StartRoundWithoutItsModelIsRefusedAndStaysConfigured) {
  const v1::JobConfig job =
      Job([](v1::JobConfig* j) { j->set_start_round(3); });
  Make("a", job);
  event::Start start{next_request_++, {}};
  start.start.set_job_id("step");
  const Effects started = Step(start);
  const auto loads = All<effect::LoadInitialModel>(started);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0]->kept_round, std::optional<uint32_t>(3));
  const Effects refused =
      Step(event::InitialModel{absl::FailedPreconditionError(
          "start_round 3: site a holds no global model of round 3")});
  EXPECT_EQ(OutcomeOf(refused, start.request), v1::OUTCOME_REJECTED);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_CONFIGURED);
  EXPECT_THAT(Status().last_error(), HasSubstr("no global model of round 3"));
  // A later start (the model now in place) goes ahead.
  event::Start again{next_request_++, start.start};
  EXPECT_EQ(OutcomeOf(Step(again), again.request), std::nullopt);
  const Effects scatter = Step(event::InitialModel{Shared(1)});
  EXPECT_FALSE(FindSends(scatter, CallKind::kLearnTask).empty());
}

TEST_F(SiteMachineTest, TrainerWithoutALearnTaskLeavesAfterStartTimeout) {
  const v1::JobConfig job =
      Job([](v1::JobConfig* j) { j->set_start_timeout_ms(60000); });
  Make("b", job);
  ASSERT_TRUE(view_->IsTrainer("b"));
  const auto timers = All<effect::SetTimer>(configured_);
  ASSERT_EQ(timers.size(), 1u);
  EXPECT_EQ(timers[0]->when, kT0 + absl::Seconds(60));
  EXPECT_EQ(Status().state(), v1::SITE_STATE_CONFIGURED);
  Fire(*timers[0]);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_FAILED);
  EXPECT_THAT(Status().last_error(), HasSubstr("start_timeout_ms"));
  EXPECT_THAT(Status().end_reason(), HasSubstr("was not started"));
}

TEST_F(SiteMachineTest, ElectionIsReproducibleFromSeedAndRound) {
  std::set<std::string> elected;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const v1::JobConfig job = Job([seed](v1::JobConfig* j) {
      j->clear_aggregator_candidates();
      j->set_seed(seed);
    });
    std::set<std::string> named;  // By two fresh machines.
    for (int run = 0; run < 2; ++run) {
      Make("a", job);
      const Effects fx = StartAndScatter();
      for (const auto* t : FindSends(fx, CallKind::kLearnTask)) {
        named.insert(t->message.header.aggregator());
      }
    }
    EXPECT_THAT(named, ElementsAre(ElectionOrder(job, 0).at(0)));
    elected.insert(named.begin(), named.end());
  }
  EXPECT_GT(elected.size(), 1u) << "a draw, not a fixed choice";
}

TEST_F(SiteMachineTest, LearnTaskForAFinishedRoundIsRefused) {
  Make("b");
  Delivery one = Deliver(LearnTask(1), Shared(1));
  ASSERT_EQ(one.reply.outcome(), v1::OUTCOME_OK) << one.reply.message();
  ASSERT_EQ(All<effect::StartTraining>(one.effects).size(), 1u);
  Delivery old = Deliver(LearnTask(0), Shared(1));
  EXPECT_EQ(old.admitted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.admitted.message(), HasSubstr("learn task of round 1"));
  EXPECT_THAT(All<effect::StartTraining>(old.effects), IsEmpty());
  // The body alone (past the header check) is refused the same way.
  const Effects body = Step(event::MakeModelBody(99, LearnTask(0), Shared(1)));
  EXPECT_EQ(OutcomeOf(body, 99), v1::OUTCOME_REJECTED);
  EXPECT_THAT(All<effect::StartTraining>(body), IsEmpty());
  EXPECT_EQ(Status().round(), 1u);
}

// The learner's waiting (an external trainer not attached yet) is status, and
// a change of it wakes status watchers.
TEST_F(SiteMachineTest, LearnerWaitingShowsInStatus) {
  Make("c");
  EXPECT_EQ(Status().waiting_for(), "");
  const uint64_t before = machine_->status_version();
  const Effects fx = Step(event::LearnerWaiting{"waiting for trainer"});
  EXPECT_EQ(All<effect::StatusChanged>(fx).size(), 1u);
  EXPECT_EQ(fx.size(), 1u);
  EXPECT_EQ(Status().waiting_for(), "waiting for trainer");
  EXPECT_GT(machine_->status_version(), before);
  const uint64_t waiting = machine_->status_version();
  Step(event::LearnerWaiting{"waiting for trainer"});  // No change.
  EXPECT_EQ(machine_->status_version(), waiting);
  Step(event::LearnerWaiting{""});
  EXPECT_EQ(Status().waiting_for(), "");
  EXPECT_GT(machine_->status_version(), waiting);
}

// --- Train, ask, submit (steps 3 to 5): the trainer.

TEST_F(SiteMachineTest, TrainerTrainsAsksRetriesAndSubmits) {
  Make("b");
  std::shared_ptr<const Model> global = Shared(1);
  const Delivery task = Deliver(LearnTask(0), global);
  const auto train = All<effect::StartTraining>(task.effects);
  ASSERT_EQ(train.size(), 1u);
  EXPECT_EQ(train[0]->round, 0u);
  EXPECT_EQ(train[0]->global, global);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_TRAINING);

  Effects fx = Trained();
  auto ask = FindSends(fx, CallKind::kRequestToSubmit);
  ASSERT_THAT(Targets(ask), ElementsAre("d"));
  EXPECT_EQ(ask[0]->message.permission.round(), 0u);
  EXPECT_EQ(ask[0]->message.permission.sender(), "b");
  EXPECT_EQ(Status().state(), v1::SITE_STATE_WAITING_FOR_PERMISSION);

  fx = Done(*ask[0], v1::OUTCOME_RETRY, /*retry_after_ms=*/250);
  EXPECT_THAT(All<effect::Send>(fx), IsEmpty());
  ASSERT_THAT(TimerTimes(fx), ElementsAre(kT0 + absl::Milliseconds(250)));
  fx = Fire(*All<effect::SetTimer>(fx)[0]);
  ask = FindSends(fx, CallKind::kRequestToSubmit);
  ASSERT_THAT(Targets(ask), ElementsAre("d"));

  fx = Done(*ask[0], v1::OUTCOME_OK);
  const auto submit = FindSends(fx, CallKind::kSubmitResult);
  ASSERT_THAT(Targets(submit), ElementsAre("d"));
  const v1::ModelHeader& result = submit[0]->message.header;
  EXPECT_EQ(result.kind(), v1::MODEL_KIND_RESULT);
  EXPECT_EQ(result.round(), 0u);
  EXPECT_EQ(result.sample_count(), 2u);
  EXPECT_DOUBLE_EQ(result.metrics().at("accuracy"), 0.5);
  EXPECT_FLOAT_EQ(First(*submit[0]->message.model), 3.0f);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_SUBMITTING);
  Done(*submit[0]);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_IDLE);
  EXPECT_EQ(Status().counters().rounds_trained(), 1u);
}

// Every change of state or round is journaled with the step's time and the
// counters and metrics after it, so a watcher that looks now and then still
// sees each phase; a step that changes nothing journals nothing.
TEST_F(SiteMachineTest, StateChangesAreJournaledWithTheirTimes) {
  Make("b");
  const std::vector<StateChange> before = machine_->StateChangesAfter(0);
  ASSERT_FALSE(before.empty());
  const uint64_t last = before.back().seq;
  now_ = kT0 + absl::Seconds(1);
  Deliver(LearnTask(0), Shared(1));
  now_ = kT0 + absl::Seconds(3);
  Trained();
  now_ = kT0 + absl::Seconds(4);
  Step(event::LearnerWaiting{"waiting for trainer"});  // Same state.
  const std::vector<StateChange> changes = machine_->StateChangesAfter(last);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].seq, last + 1);
  EXPECT_EQ(changes[0].state, v1::SITE_STATE_TRAINING);
  EXPECT_EQ(changes[0].round, 0u);
  EXPECT_EQ(changes[0].at, kT0 + absl::Seconds(1));
  EXPECT_EQ(changes[0].counters.rounds_trained(), 0u);
  EXPECT_EQ(changes[1].state, v1::SITE_STATE_WAITING_FOR_PERMISSION);
  EXPECT_EQ(changes[1].at, kT0 + absl::Seconds(3));
  EXPECT_EQ(changes[1].metrics.at("accuracy"), 0.5);
  EXPECT_THAT(machine_->StateChangesAfter(changes[1].seq), IsEmpty());
}

TEST_F(SiteMachineTest, TrainerGivesUpAskingAfterMaxWait) {
  Make("b");
  Deliver(LearnTask(0), Shared(1));
  Effects fx = Trained();
  now_ = kT0 + absl::Seconds(29);  // Within request_to_submit_max_wait (30 s).
  fx = Done(*FindSends(fx, CallKind::kRequestToSubmit).at(0), v1::OUTCOME_RETRY,
            500);
  fx = Fire(*All<effect::SetTimer>(fx).at(0));
  const effect::Send ask = *FindSends(fx, CallKind::kRequestToSubmit).at(0);
  now_ += absl::Milliseconds(300);  // The next retry would end past it.
  fx = Done(ask, v1::OUTCOME_RETRY, 500);
  EXPECT_THAT(All<effect::Send>(fx), IsEmpty());
  EXPECT_THAT(All<effect::SetTimer>(fx), IsEmpty());
  EXPECT_THAT(Status().last_error(), HasSubstr("gave up asking d"));
  EXPECT_NE(Status().state(), v1::SITE_STATE_WAITING_FOR_PERMISSION);
}

TEST_F(SiteMachineTest, UnreachableAggregatorFailsOverToTheNextBackup) {
  // b trains round 0, whose aggregator is down: after failover_attempts
  // (3) failed asks, b hands the round (its learn task, attempt 1, with the
  // model) to the next site of the election order, then asks it.
  Make("b",
       Job([](v1::JobConfig* job) { job->add_aggregator_candidates("e"); }));
  const std::vector<std::string> order = view_->ElectionOrder(0);
  ASSERT_EQ(order.size(), 2u);
  const std::string dead = order[0];
  const std::string backup = order[1];
  Deliver(LearnTask(0), Shared(1));
  Effects fx = Trained();
  for (int failure = 1; failure <= 3; ++failure) {
    const std::vector<const effect::Send*> asks =
        FindSends(fx, CallKind::kRequestToSubmit);
    ASSERT_EQ(asks.size(), 1u) << "failure " << failure;
    EXPECT_EQ(asks[0]->to.name(), dead);
    fx = Step(event::CallDone{asks[0]->call, absl::UnavailableError("down")});
    if (failure < 3) {
      // After an error, the interval paces the retry.
      ASSERT_THAT(TimerTimes(fx), ElementsAre(now_ + absl::Milliseconds(100)));
      fx = Fire(*All<effect::SetTimer>(fx)[0]);
    }
  }
  const std::vector<const effect::Send*> handoff =
      FindSends(fx, CallKind::kLearnTask);
  ASSERT_EQ(handoff.size(), 1u);
  EXPECT_EQ(handoff[0]->to.name(), backup);
  const v1::ModelHeader& task = handoff[0]->message.header;
  EXPECT_TRUE(task.handoff());
  EXPECT_EQ(task.attempt(), 1u);
  EXPECT_EQ(task.aggregator(), backup);
  EXPECT_EQ(task.sender(), "b");
  ASSERT_NE(handoff[0]->message.model, nullptr);
  EXPECT_THAT(Status().last_error(),
              HasSubstr("giving up on aggregator " + dead));
  ASSERT_EQ(Status().failovers_size(), 1);
  EXPECT_EQ(Status().failovers(0).from(), dead);
  EXPECT_EQ(Status().failovers(0).to(), backup);
  EXPECT_EQ(Status().counters().failovers(), 1u);
  // Acknowledged: b asks the backup, at attempt 1, for a slot.
  fx = Done(*handoff[0]);
  const std::vector<const effect::Send*> ask =
      FindSends(fx, CallKind::kRequestToSubmit);
  ASSERT_EQ(ask.size(), 1u);
  EXPECT_EQ(ask[0]->to.name(), backup);
  EXPECT_EQ(ask[0]->message.permission.attempt(), 1u);
  EXPECT_FALSE(ask[0]->message.permission.probe());
}

TEST_F(SiteMachineTest, NoBackupLeftFailsTheJobNamingTheLast) {
  Make("b");
  Deliver(LearnTask(0), Shared(1));
  Effects fx = Trained();
  const size_t sites = view_->ElectionOrder(0).size();
  for (size_t steps = 0; steps < 10 * sites + 10; ++steps) {
    const std::vector<const effect::Send*> sends = All<effect::Send>(fx);
    if (sends.empty()) {
      const std::vector<const effect::SetTimer*> timers =
          All<effect::SetTimer>(fx);
      if (timers.empty()) break;
      fx = Fire(*timers.back());
      continue;
    }
    fx = Step(event::CallDone{sends[0]->call, absl::UnavailableError("down")});
  }
  EXPECT_EQ(Status().state(), v1::SITE_STATE_FAILED);
  EXPECT_THAT(Status().last_error(), HasSubstr("no aggregator reachable"));
  EXPECT_THAT(Status().end_reason(), HasSubstr("no aggregator reachable"));
}

// --- Finish (step 8). The machine sends LAST before BEST on purpose (LAST
// carries the final record that sites check a holder's BEST against).

TEST_F(SiteMachineTest, LastAggregatorHoldingBestSendsLastThenBestAndIsDone) {
  OpenAtD(1, {"a", "b"});  // The last round; d scores it: d holds the best.
  Submit("a", 1);
  const Effects fx = Aggregated(Submit("b", 1).effects);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_DISTRIBUTING);
  const auto last = FindSends(fx, CallKind::kFinalResult);
  ASSERT_THAT(Targets(last), ElementsAre("a", "b", "c", "d", "e"));
  Effects then;
  for (const effect::Send* s : last) {
    EXPECT_EQ(s->message.header.kind(), v1::MODEL_KIND_LAST);
    if (s->to.name() == "d") {  // Looped back to d itself.
      EXPECT_EQ(Deliver(s->message.header, s->message.model).reply.outcome(),
                v1::OUTCOME_OK);
    }
    EXPECT_THAT(FindSends(then, CallKind::kFinalResult), IsEmpty());
    then = Done(*s);
  }
  const auto best = FindSends(then, CallKind::kFinalResult);
  ASSERT_THAT(Targets(best), ElementsAre("a", "b", "c", "d", "e"));
  EXPECT_EQ(best[0]->message.header.kind(), v1::MODEL_KIND_BEST);
  EXPECT_EQ(best[0]->message.header.best().site(), "d");
  EXPECT_FLOAT_EQ(First(*best[0]->message.model), 1.0f);  // Round 1's input.
  EXPECT_NE(Status().state(), v1::SITE_STATE_DONE);
  EXPECT_EQ(
      Deliver(best[3]->message.header, best[3]->message.model).reply.outcome(),
      v1::OUTCOME_OK);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_DONE);
}

TEST_F(SiteMachineTest, LastAggregatorAsksTheHolderToShareTheBest) {
  OpenAtD(1, {"a", "b"}, Best("c", 0.99, 0));  // c holds an unbeaten best.
  Submit("a", 1);
  const Effects fx = Aggregated(Submit("b", 1).effects);
  Effects then;
  for (const auto* s : FindSends(fx, CallKind::kFinalResult)) then = Done(*s);
  EXPECT_THAT(FindSends(then, CallKind::kFinalResult), IsEmpty());
  const auto share = FindSends(then, CallKind::kShareBest);
  ASSERT_THAT(Targets(share), ElementsAre("c"));
  EXPECT_EQ(share[0]->message.share_best.best().round(), 0u);
  EXPECT_THAT(share[0]->message.share_best.targets(),
              ElementsAre("a", "b", "c", "d", "e"));
  // c is gone or no longer holds it: every other site is asked in turn
  // (those that trained on round 0 hold a copy); the first to give it ends
  // the asking.
  const Effects refused_by_c = Done(*share[0], v1::OUTCOME_REJECTED);
  const auto next = FindSends(refused_by_c, CallKind::kShareBest);
  ASSERT_THAT(Targets(next), ElementsAre("a"));
  const Effects refused_by_a = Done(*next[0], v1::OUTCOME_REJECTED);
  const auto after_a = FindSends(refused_by_a, CallKind::kShareBest);
  ASSERT_THAT(Targets(after_a), ElementsAre("b"));
  const Effects given = Done(*after_a[0]);
  EXPECT_THAT(FindSends(given, CallKind::kShareBest), IsEmpty());
}

TEST_F(SiteMachineTest, LastWithoutBestEndsFailedAfterTheFinalsBound) {
  const v1::BestRecord best = Best("c", 0.9, 0);
  Make("b");
  Deliver(LearnTask(1, {}, best), Shared(1));
  const Delivery last =
      Deliver(Header(v1::MODEL_KIND_LAST, 1, "d", best), Shared(6));
  EXPECT_EQ(last.reply.outcome(), v1::OUTCOME_OK);
  const auto timers = All<effect::SetTimer>(last.effects);
  ASSERT_EQ(timers.size(), 1u);
  EXPECT_EQ(timers[0]->when,
            now_ + 2 * absl::Milliseconds(
                           view_->config().final_result_ack_timeout_ms()));
  EXPECT_NE(Status().state(), v1::SITE_STATE_FAILED);
  Fire(*timers[0]);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_FAILED);
  EXPECT_THAT(Status().last_error(), HasSubstr("no BEST"));
  EXPECT_THAT(Status().last_error(), HasSubstr("scored by c"));
}

TEST_F(SiteMachineTest, BestFromAnotherHolderMustMatchTheRecordsDigest) {
  v1::BestRecord best = Best("c", 0.9, 0);
  best.set_digest(ModelContentDigest(*Shared(5)));
  Make("b");
  Deliver(LearnTask(1, {}, best), Shared(1));
  // a is neither the scorer (c) nor the last aggregator (d): its BEST is
  // taken only if it is the model the record's digest names.
  const Delivery wrong =
      Deliver(Header(v1::MODEL_KIND_BEST, 0, "a", best), Shared(7));
  EXPECT_TRUE(wrong.admitted.ok()) << wrong.admitted;
  EXPECT_EQ(wrong.reply.outcome(), v1::OUTCOME_BAD_REQUEST);
  EXPECT_THAT(wrong.reply.message(), HasSubstr("digest"));
  EXPECT_THAT(PersistKinds(wrong.effects), IsEmpty());
  const Delivery right =
      Deliver(Header(v1::MODEL_KIND_BEST, 0, "a", best), Shared(5));
  EXPECT_EQ(right.reply.outcome(), v1::OUTCOME_OK);
  EXPECT_THAT(PersistKinds(right.effects), ElementsAre(What::kFinal));
}

TEST_F(SiteMachineTest, TrainerKeepsItsCopyOfTheBestModelAndShares) {
  Make("b");
  // Round 0's task; round 1's then names round 0 as the best: b's round 0
  // model is the best model, and b gives it when asked.
  Deliver(LearnTask(0, {}), Shared(11));
  v1::BestRecord best = Best("d", 0.9, 0);
  best.set_digest(ModelContentDigest(*Shared(11)));
  const Delivery second = Deliver(LearnTask(1, {}, best), Shared(12));
  ASSERT_EQ(second.reply.outcome(), v1::OUTCOME_OK) << second.reply.message();
  v1::ShareBestRequest share;
  share.set_job_id("step");
  share.set_sender("d");
  *share.mutable_best() = best;
  share.set_final_round(1);
  share.add_targets("a");
  const RequestId id = next_request_++;
  const Effects shared = Step(event::ShareBest{id, share});
  const v1::Reply* answer = Answer<v1::Reply>(shared, id);
  ASSERT_NE(answer, nullptr);
  EXPECT_EQ(answer->outcome(), v1::OUTCOME_OK) << answer->message();
  const auto sends = FindSends(shared, CallKind::kFinalResult);
  ASSERT_THAT(Targets(sends), ElementsAre("a"));
  ASSERT_NE(sends[0]->message.model, nullptr);
  EXPECT_EQ(ModelContentDigest(*sends[0]->message.model), best.digest());
}

TEST_F(SiteMachineTest, FinalModelsOnlyFromKnownSendersThenDone) {
  const v1::BestRecord best = Best("c", 0.9, 0);
  Make("b");
  Deliver(LearnTask(1, {}, best), Shared(1));
  // a is neither the best holder (c) nor the last aggregator (d).
  const Delivery forged =
      Deliver(Header(v1::MODEL_KIND_BEST, 0, "a", best), Shared(7));
  EXPECT_EQ(forged.admitted.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(PersistKinds(forged.effects), IsEmpty());
  EXPECT_EQ(Deliver(Header(v1::MODEL_KIND_LAST, 1, "c", best), Shared(7))
                .admitted.code(),
            absl::StatusCode::kPermissionDenied);  // LAST only from d.
  const Delivery from_holder =
      Deliver(Header(v1::MODEL_KIND_BEST, 0, "c", best), Shared(5));
  EXPECT_EQ(from_holder.reply.outcome(), v1::OUTCOME_OK);
  EXPECT_THAT(PersistKinds(from_holder.effects), ElementsAre(What::kFinal));
  EXPECT_NE(Status().state(), v1::SITE_STATE_DONE);
  const Delivery last =
      Deliver(Header(v1::MODEL_KIND_LAST, 1, "d", best), Shared(6));
  EXPECT_EQ(last.reply.outcome(), v1::OUTCOME_OK);
  EXPECT_THAT(PersistKinds(last.effects),
              ElementsAre(What::kFinal, What::kState));
  EXPECT_EQ(Status().state(), v1::SITE_STATE_DONE);
  // Done: the same LAST again is acknowledged unwritten; another is refused.
  EXPECT_TRUE(Deliver(Header(v1::MODEL_KIND_LAST, 1, "d", best), Shared(6))
                  .header_only);
  EXPECT_EQ(Deliver(Header(v1::MODEL_KIND_LAST, 0, "d", best), Shared(6))
                .admitted.code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Status().state(), v1::SITE_STATE_DONE);
}

// Design section 9: a completion of a job that is gone finds nothing. d
// aggregates round 0 of job "step" lean (its aggregate goes on once written
// and mapped); the job is aborted before the write ends, d is configured
// for a new job and starts it (its round 0 task); then the old write's end
// arrives. It must not scatter the old job's aggregate into the new job.
TEST_F(SiteMachineTest, ACompletionOfAnAbortedJobIsDroppedAndCounted) {
  const v1::JobConfig lean =
      Job([](v1::JobConfig* j) { j->set_lean_memory_min_model_bytes(0); });
  view_ = std::make_unique<JobView>(lean);
  machine_ = std::make_unique<SiteMachine>(SiteMachineOptions{"d", {}});
  Step(event::Configure{next_request_++, lean, "/ws/step/offload"});
  ASSERT_EQ(Deliver(LearnTask(0, {"a", "b", "c"}), Shared(1)).reply.outcome(),
            v1::OUTCOME_OK);
  Submit("a", 0);
  Submit("b", 0);
  const Effects aggregated = Aggregated(Submit("c", 0).effects);
  const effect::Persist* write = nullptr;
  for (const auto* p : All<effect::Persist>(aggregated)) {
    if (p->what == What::kGlobal && p->map_back) write = p;
  }
  ASSERT_NE(write, nullptr) << "the lean aggregate is not written";
  EXPECT_THAT(FindSends(aggregated, CallKind::kLearnTask), IsEmpty())
      << "a lean aggregate goes on only once written";
  const PersistId old_write = write->persist;

  event::Abort abort{next_request_++, {}};
  abort.abort.set_job_id("step");
  abort.abort.set_sender("admin");
  ASSERT_EQ(OutcomeOf(Step(abort), abort.request), v1::OUTCOME_OK);
  v1::JobConfig next = lean;
  next.set_job_id("step-2");
  bool already = false;
  ASSERT_EQ(machine_->CheckConfigure(next, &already), std::nullopt);
  Step(event::Configure{next_request_++, next, "/ws/step-2/offload"});
  v1::ModelHeader task = LearnTask(0, {"a", "b", "c"});
  task.set_job_id("step-2");
  ASSERT_EQ(Deliver(task, Shared(9)).reply.outcome(), v1::OUTCOME_OK);
  ASSERT_EQ(Status().state(), v1::SITE_STATE_GATHERING);

  const Effects stale = Step(
      event::PersistDone{old_write, absl::OkStatus(), "global", Shared(4)});
  EXPECT_THAT(FindSends(stale, CallKind::kLearnTask), IsEmpty())
      << "the aborted job's aggregate was scattered into the new job";
  EXPECT_THAT(PersistKinds(stale), IsEmpty());
  EXPECT_EQ(Status().state(), v1::SITE_STATE_GATHERING);
  EXPECT_EQ(Status().round(), 0u);
  EXPECT_EQ(Status().counters().stale_completions(), 1u);
}

}  // namespace
}  // namespace site_machine_testing
}  // namespace swarm
