// Single-site step tests of Admission: one header in, one verdict out, for
// each rule of design sections 3 and 6 that an incoming stream must pass.
#include "controller/admission.h"

#include <string>
#include <vector>

#include "config/job_config.h"
#include "controller/replies.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "step-job";

// Three sites, "a" and "b" train, all three are candidates; rounds 0..3.
JobView MakeJob() {
  v1::JobConfig job;
  job.set_job_id(kJob);
  int port = 7000;
  for (const char* name : {"a", "b", "c"}) {
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
    site->set_address("127.0.0.1:" + std::to_string(++port));
  }
  job.add_trainers("a");
  job.add_trainers("b");
  job.set_starting_site("a");
  job.set_num_rounds(4);
  job.set_seed(11);
  job = WithDefaults(job);
  EXPECT_TRUE(ValidateJobConfig(job).ok()) << ValidateJobConfig(job);
  return JobView(job);
}

class AdmissionTest : public ::testing::Test {
 protected:
  // A learn task of `round` as its rightful scatterer sends it.
  v1::ModelHeader LearnTask(uint32_t round) const {
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_LEARN_TASK);
    header.set_job_id(kJob);
    header.set_round(round);
    header.set_sender(job_.ScattererOf(round));
    header.set_aggregator(job_.AggregatorOf(round));
    return header;
  }
  v1::ModelHeader Stream(v1::ModelKind kind, const std::string& sender,
                         uint32_t round) const {
    v1::ModelHeader header;
    header.set_kind(kind);
    header.set_job_id(kJob);
    header.set_round(round);
    header.set_sender(sender);
    if (kind == v1::MODEL_KIND_BEST || kind == v1::MODEL_KIND_LAST) {
      header.set_final_round(job_.last_round());
    }
    return header;
  }
  // The site record of `self` after it took part in the job.
  SiteRecord Started(const std::string& self) const {
    SiteRecord record;
    record.self = self;
    record.state = v1::SITE_STATE_IDLE;
    record.started = true;
    return record;
  }
  absl::StatusOr<Admitted> Admit(const SiteRecord& site,
                                 const v1::ModelHeader& header) const {
    return AdmitStream(&job_, site, header);
  }
  // A site that is neither the last round's aggregator nor `not_this`.
  std::string SomeoneElse(const std::string& not_this) const {
    for (const std::string& name : job_.site_names()) {
      if (name != job_.LastRoundAggregator() && name != not_this) return name;
    }
    return "";
  }

  const JobView job_ = MakeJob();
};

TEST_F(AdmissionTest, NoJobOrAnotherJobIsRefused) {
  SiteRecord site = Started("a");
  absl::StatusOr<Admitted> none = AdmitStream(nullptr, site, LearnTask(0));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("site a has no job"));

  v1::ModelHeader other = LearnTask(0);
  other.set_job_id("other");
  absl::StatusOr<Admitted> refused = Admit(site, other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("runs job \"step-job\", not \"other\""));
}

TEST_F(AdmissionTest, SenderMustBeASiteOfTheJob) {
  v1::ModelHeader header = LearnTask(0);
  header.set_sender("mallory");
  absl::StatusOr<Admitted> refused = Admit(Started("b"), header);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("sender \"mallory\" is not a site of job step-job"));
}

TEST_F(AdmissionTest, LearnTaskFromTheScattererIsReceived) {
  for (uint32_t round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    SiteRecord site = Started("a");
    if (round > 0) site.last_task_round = round - 1;
    absl::StatusOr<Admitted> admitted = Admit(site, LearnTask(round));
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    EXPECT_TRUE(admitted->receive_body);
  }
}

TEST_F(AdmissionTest, LearnTaskFromAnyoneButTheScattererIsRefused) {
  v1::ModelHeader header = LearnTask(2);
  const std::string scatterer = header.sender();
  header.set_sender(scatterer == "b" ? "c" : "b");
  absl::StatusOr<Admitted> refused = Admit(Started("a"), header);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(
      refused.status().message(),
      HasSubstr("learn task of round 2 must come from " + scatterer +
                " (the aggregator of round 1), not from " + header.sender()));
}

TEST_F(AdmissionTest, LearnTaskMustNameTheElectedAggregator) {
  v1::ModelHeader header = LearnTask(1);
  const std::string elected = header.aggregator();
  header.set_aggregator(elected == "a" ? "b" : "a");
  absl::StatusOr<Admitted> refused = Admit(Started("a"), header);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the election chose " + elected));
}

TEST_F(AdmissionTest, LearnTaskOutsideTheJobsRoundsIsABadRequest) {
  v1::ModelHeader header = LearnTask(3);
  header.set_round(4);
  absl::StatusOr<Admitted> refused = Admit(Started("a"), header);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("round 4 is outside the job's rounds 0..3"));
}

TEST_F(AdmissionTest, LearnTaskForAFinishedRoundIsRefusedARepeatIsNot) {
  SiteRecord site = Started("a");
  site.last_task_round = 2;
  site.round_aggregator = job_.AggregatorOf(2);
  // The same task again (its acknowledgement was lost): received again.
  EXPECT_TRUE(Admit(site, LearnTask(2)).ok());
  // An older round: refused, and nothing in the record changes (pure).
  absl::StatusOr<Admitted> refused = Admit(site, LearnTask(1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("site a already has the learn task of round 2"));
  EXPECT_EQ(site.last_task_round, 2u);
}

TEST_F(AdmissionTest, LearnTaskAfterTheJobEndedIsRefused) {
  for (v1::SiteState state :
       {v1::SITE_STATE_DONE, v1::SITE_STATE_FAILED, v1::SITE_STATE_ABORTED}) {
    SiteRecord site = Started("a");
    site.state = state;
    absl::StatusOr<Admitted> refused = Admit(site, LearnTask(0));
    // A failed or aborted site answers CANCELLED (OUTCOME_ABORTED): its
    // senders pass it over for the round's next backup.
    EXPECT_EQ(refused.status().code(),
              state == v1::SITE_STATE_DONE
                  ? absl::StatusCode::kFailedPrecondition
                  : absl::StatusCode::kCancelled);
    EXPECT_EQ(ReplyFromStatus(refused.status()).outcome(),
              state == v1::SITE_STATE_DONE ? v1::OUTCOME_REJECTED
                                           : v1::OUTCOME_ABORTED);
    EXPECT_THAT(refused.status().message(),
                HasSubstr("job is " + v1::SiteState_Name(state) + " at a"));
  }
}

TEST_F(AdmissionTest, LearnTaskToANonTrainerThatDoesNotAggregateIsRefused) {
  // "c" is no trainer: it takes a learn task only for a round it aggregates.
  for (uint32_t round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    absl::StatusOr<Admitted> verdict = Admit(Started("c"), LearnTask(round));
    if (job_.AggregatorOf(round) == "c") {
      EXPECT_TRUE(verdict.ok()) << verdict.status();
    } else {
      EXPECT_EQ(verdict.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(verdict.status().message(),
                  HasSubstr("neither a trainer nor the round's aggregator"));
    }
  }
}

TEST_F(AdmissionTest, ResultsComeOnlyFromTrainers) {
  EXPECT_TRUE(Admit(Started("a"), Stream(v1::MODEL_KIND_RESULT, "b", 0)).ok());
  absl::StatusOr<Admitted> refused =
      Admit(Started("a"), Stream(v1::MODEL_KIND_RESULT, "c", 0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("sender c is not a trainer of job step-job"));
}

TEST_F(AdmissionTest, ForgedBestHolderIsRefused) {
  // The record names `holder` as the best model's holder; `forger`, a site
  // that is neither the holder nor the last round's aggregator, claims in
  // its header to hold a better model.
  std::vector<std::string> others;
  for (const std::string& name : job_.site_names()) {
    if (name != job_.LastRoundAggregator()) others.push_back(name);
  }
  ASSERT_EQ(others.size(), 2u);
  const std::string holder = others[0];
  const std::string forger = others[1];
  SiteRecord site = Started("a");
  site.best.set_present(true);
  site.best.set_site(holder);
  site.best.set_round(1);
  site.best.set_metric(0.5);
  v1::ModelHeader forged = Stream(v1::MODEL_KIND_BEST, forger, 3);
  forged.mutable_best()->set_present(true);
  forged.mutable_best()->set_site(forger);
  forged.mutable_best()->set_round(3);
  forged.mutable_best()->set_metric(1.0);
  absl::StatusOr<Admitted> refused = Admit(site, forged);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("MODEL_KIND_BEST from " + forger +
                        " refused: BEST comes only from the aggregator of "
                        "the final round 3 at attempt 0 (" +
                        job_.LastRoundAggregator() +
                        ") or from the best model's holder " + holder));
  // After the job the same forgery is still refused, by who sent it.
  site.state = v1::SITE_STATE_DONE;
  site.final_rounds[v1::MODEL_KIND_BEST] = 3;
  EXPECT_EQ(Admit(site, forged).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(AdmissionTest, BestFromTheRecordsHolderOrTheLastAggregator) {
  const std::string last = job_.LastRoundAggregator();
  const std::string holder = SomeoneElse("");
  SiteRecord site = Started("a");
  site.best.set_present(true);
  site.best.set_site(holder);
  site.best.set_round(1);
  // The holder, with the model of the recorded round.
  EXPECT_TRUE(Admit(site, Stream(v1::MODEL_KIND_BEST, holder, 1)).ok());
  // The holder, with another round's model: refused.
  absl::StatusOr<Admitted> other =
      Admit(site, Stream(v1::MODEL_KIND_BEST, holder, 2));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(),
              HasSubstr("this site's record names the model of round 1"));
  // The last round's aggregator: always (it may have found a new best).
  EXPECT_TRUE(Admit(site, Stream(v1::MODEL_KIND_BEST, last, 3)).ok());
  // LAST only from the last round's aggregator, never from the holder.
  EXPECT_TRUE(Admit(site, Stream(v1::MODEL_KIND_LAST, last, 3)).ok());
  absl::StatusOr<Admitted> last_from_holder =
      Admit(site, Stream(v1::MODEL_KIND_LAST, holder, 3));
  EXPECT_EQ(last_from_holder.status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(
      last_from_holder.status().message(),
      HasSubstr("LAST comes only from the aggregator of the final round 3 at "
                "attempt 0 (" +
                last + ")"));
}

// Trainers out of privacy budget end the job early: the final round's
// aggregator says so in the finals' end_reason, and only then is a LAST
// before the job's last round taken.
TEST_F(AdmissionTest, EarlyLastOnlyWithAStopReason) {
  SiteRecord site = Started("a");
  v1::ModelHeader last =
      Stream(v1::MODEL_KIND_LAST, job_.AggregatorAt(1, 0), 1);
  last.set_final_round(1);
  absl::StatusOr<Admitted> refused = Admit(site, last);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("meets no early-stop"));
  (*last.mutable_metadata())["end_reason"] = "early stop: done, trust me";
  EXPECT_EQ(Admit(site, last).status().code(),
            absl::StatusCode::kPermissionDenied);
  (*last.mutable_metadata())["end_reason"] =
      TooFewTrainersReason(job_, 1, 2, {"b"});
  EXPECT_TRUE(Admit(site, last).ok()) << Admit(site, last).status();
}

TEST(TooFewTrainersReasonTest, EndsTheJobBelowTheRoundsMinimum) {
  // Trainers a and b, rounds 0..3; min_responses_required by default both.
  JobView job = MakeJob();
  EXPECT_EQ(TooFewTrainersReason(job, 1, 2, {}), "");
  EXPECT_EQ(TooFewTrainersReason(job, 1, 2, {"b"}),
            "early stop: too few trainers remain after round 1: b stopped "
            "training at their privacy budget; 1 of 2 trainer(s) left, fewer "
            "than min_responses_required 2");
  // The last round ends the job anyway.
  EXPECT_EQ(TooFewTrainersReason(job, 3, 2, {"a", "b"}), "");
  // One trainer required: it goes on with one, not with none.
  v1::JobConfig config = job.config();
  config.set_min_responses_required(1);
  JobView lenient(config);
  EXPECT_EQ(TooFewTrainersReason(lenient, 1, 2, {"b"}), "");
  EXPECT_THAT(TooFewTrainersReason(lenient, 1, 2, {"a", "b"}),
              HasSubstr("a,b stopped training at their privacy budget; 0 of "
                        "2 trainer(s) left, fewer than "
                        "min_responses_required 1"));
}

TEST_F(AdmissionTest, FinalModelsOnlyWhileTheJobRuns) {
  const std::string last = job_.LastRoundAggregator();
  SiteRecord site;
  site.self = "a";
  site.state = v1::SITE_STATE_CONFIGURED;
  absl::StatusOr<Admitted> early =
      Admit(site, Stream(v1::MODEL_KIND_LAST, last, 3));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("has not started here"));

  site.started = true;
  site.state = v1::SITE_STATE_DONE;
  site.final_rounds[v1::MODEL_KIND_LAST] = 3;
  // An identical re-send: acknowledged, no body read, nothing written.
  absl::StatusOr<Admitted> again =
      Admit(site, Stream(v1::MODEL_KIND_LAST, last, 3));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->receive_body);
  EXPECT_THAT(again->message, HasSubstr("already stored"));
  // Anything else after done: refused.
  absl::StatusOr<Admitted> other =
      Admit(site, Stream(v1::MODEL_KIND_LAST, last, 2));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("is done here"));

  site.state = v1::SITE_STATE_ABORTED;
  EXPECT_EQ(Admit(site, Stream(v1::MODEL_KIND_LAST, last, 3)).status().code(),
            absl::StatusCode::kCancelled);
}

TEST_F(AdmissionTest, OtherKindsAreNeverSentToASite) {
  absl::StatusOr<Admitted> refused =
      Admit(Started("a"), Stream(v1::MODEL_KIND_ROUND_GLOBAL, "b", 0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("cannot be sent to a site"));
}

}  // namespace
}  // namespace swarm
