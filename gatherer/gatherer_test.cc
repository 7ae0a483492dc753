#include "gatherer/gatherer.h"

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

// The fake clock: every time in a test is kOpen plus an offset.
const absl::Time kOpen = absl::FromUnixSeconds(1700000000);
constexpr uint32_t kRound = 5;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

absl::Duration S(double seconds) { return absl::Seconds(seconds); }
const absl::Duration kNs = absl::Nanoseconds(1);

// Per-case gatherer settings, with the defaults most cases use.
struct Config {
  std::vector<std::string> trainers = {"a", "b", "c"};
  uint32_t min = 0;
  absl::Duration grace = S(10);
  absl::Duration timeout = S(60);
  uint32_t max_concurrent = 1;
  absl::Duration lease = absl::Minutes(5);

  Config& Trainers(std::vector<std::string> v) {
    trainers = std::move(v);
    return *this;
  }
  Config& Min(uint32_t v) {
    min = v;
    return *this;
  }
  Config& Grace(absl::Duration v) {
    grace = v;
    return *this;
  }
  Config& Timeout(absl::Duration v) {
    timeout = v;
    return *this;
  }
  Config& MaxConcurrent(uint32_t v) {
    max_concurrent = v;
    return *this;
  }
  Config& Lease(absl::Duration v) {
    lease = v;
    return *this;
  }
};

GathererOptions MakeOptions(const Config& config) {
  GathererOptions options;
  options.round = kRound;
  options.expected_trainers = config.trainers;
  options.min_responses_required = config.min;
  options.wait_after_min_responses = config.grace;
  options.round_timeout = config.timeout;
  options.max_concurrent_submissions = config.max_concurrent;
  options.permission_lease = config.lease;
  options.self = "agg";
  options.metric_name = "accuracy";
  options.open_time = kOpen;
  return options;
}

std::unique_ptr<Gatherer> MakeGatherer(
    const Config& config,
    v1::MetricDirection direction = v1::METRIC_HIGHER_IS_BETTER,
    v1::BestRecord best = v1::BestRecord()) {
  GathererOptions options = MakeOptions(config);
  options.best_so_far = std::move(best);
  return std::make_unique<Gatherer>(std::move(options),
                                    MetricComparator(direction));
}

google::protobuf::Map<std::string, double> Metrics(
    std::optional<double> accuracy) {
  google::protobuf::Map<std::string, double> m;
  if (accuracy.has_value()) m["accuracy"] = *accuracy;
  return m;
}

// ---------------------------------------------------------------------------
// Scripted scenarios: a table of cases, each a config and a list of events at
// fake times with the answer expected for each.
// ---------------------------------------------------------------------------

enum class Op {
  kAsk,
  kBegin,
  kComplete,
  kFail,
  kDrop,
  kSubmit,
  kCheck,
  kDeadline,
  kBodyIn
};

struct Step {
  explicit Step(Op o) : op(o) {}

  Op op;
  absl::Duration at = absl::ZeroDuration();
  std::string trainer;
  uint32_t round = kRound;
  // kAsk.
  v1::Outcome outcome = v1::OUTCOME_OK;
  PermissionCode permission = PermissionCode::kGranted;
  // kBegin, kComplete.
  ResultCode result = ResultCode::kAccepted;
  // kFail, kDrop.
  bool released = true;
  // kCheck.
  bool done = false;
  DoneReason reason = DoneReason::kNotDone;
  std::optional<absl::Duration> closed_at;
  std::vector<std::string> missing;
  std::optional<int> responded;
  std::optional<std::vector<std::string>> cut_off;
  std::optional<std::vector<std::string>> dropped;
  // kDeadline: offset from kOpen; nullopt means absl::InfiniteFuture().
  std::optional<absl::Duration> deadline;

  Step& Responded(int n) {
    responded = n;
    return *this;
  }
  Step& CutOff(std::vector<std::string> v) {
    cut_off = std::move(v);
    return *this;
  }
  Step& Dropped(std::vector<std::string> v) {
    dropped = std::move(v);
    return *this;
  }
};

Step Ask(absl::Duration at, std::string trainer, v1::Outcome outcome,
         PermissionCode code, uint32_t round = kRound) {
  Step s(Op::kAsk);
  s.at = at;
  s.trainer = std::move(trainer);
  s.round = round;
  s.outcome = outcome;
  s.permission = code;
  return s;
}
Step Granted(absl::Duration at, std::string trainer, uint32_t round = kRound) {
  return Ask(at, std::move(trainer), v1::OUTCOME_OK, PermissionCode::kGranted,
             round);
}
Step Busy(absl::Duration at, std::string trainer) {
  return Ask(at, std::move(trainer), v1::OUTCOME_RETRY,
             PermissionCode::kSlotsBusy);
}
Step Begin(absl::Duration at, std::string trainer, ResultCode result,
           uint32_t round = kRound) {
  Step s(Op::kBegin);
  s.at = at;
  s.trainer = std::move(trainer);
  s.round = round;
  s.result = result;
  return s;
}
Step Complete(absl::Duration at, std::string trainer, ResultCode result) {
  Step s(Op::kComplete);
  s.at = at;
  s.trainer = std::move(trainer);
  s.result = result;
  return s;
}
Step Fail(absl::Duration at, std::string trainer, bool released) {
  Step s(Op::kFail);
  s.at = at;
  s.trainer = std::move(trainer);
  s.released = released;
  return s;
}
Step Drop(absl::Duration at, std::string trainer, bool dropped) {
  Step s(Op::kDrop);
  s.at = at;
  s.trainer = std::move(trainer);
  s.released = dropped;
  return s;
}
// Ask (granted), Begin, Complete for this round, all at `at`.
Step Submit(absl::Duration at, std::string trainer) {
  Step s(Op::kSubmit);
  s.at = at;
  s.trainer = std::move(trainer);
  return s;
}
Step Open(absl::Duration at, std::vector<std::string> missing) {
  Step s(Op::kCheck);
  s.at = at;
  s.done = false;
  s.missing = std::move(missing);
  return s;
}
Step Done(absl::Duration at, DoneReason reason, absl::Duration closed_at,
          std::vector<std::string> missing) {
  Step s(Op::kCheck);
  s.at = at;
  s.done = true;
  s.reason = reason;
  s.closed_at = closed_at;
  s.missing = std::move(missing);
  return s;
}
// The upload's body is whole (it is being added outside the lock).
Step BodyIn(absl::Duration at, std::string trainer) {
  Step s(Op::kBodyIn);
  s.at = at;
  s.trainer = std::move(trainer);
  return s;
}
Step Deadline(std::optional<absl::Duration> deadline) {
  Step s(Op::kDeadline);
  s.deadline = deadline;
  return s;
}

struct ScenarioCase {
  std::string name;
  Config config;
  std::vector<Step> steps;
};

void RunStep(Gatherer& g, const Step& s) {
  const absl::Time now = kOpen + s.at;
  switch (s.op) {
    case Op::kAsk: {
      PermissionDecision d = g.RequestToSubmit(s.trainer, s.round, now);
      EXPECT_EQ(d.outcome, s.outcome) << d.message;
      EXPECT_EQ(PermissionCodeName(d.code), PermissionCodeName(s.permission))
          << d.message;
      EXPECT_FALSE(d.message.empty());
      break;
    }
    case Op::kBegin: {
      ResultDecision d = g.BeginResult(s.trainer, s.round, now);
      EXPECT_EQ(ResultCodeName(d.code), ResultCodeName(s.result)) << d.message;
      break;
    }
    case Op::kComplete: {
      ResultDecision d = g.CompleteResult(s.trainer, 10, Metrics(0.5), now);
      EXPECT_EQ(ResultCodeName(d.code), ResultCodeName(s.result)) << d.message;
      break;
    }
    case Op::kFail:
      EXPECT_EQ(g.FailResult(s.trainer, "upload failed", now), s.released);
      break;
    case Op::kDrop:
      EXPECT_EQ(g.DropTrainer(s.trainer, "unreachable", now), s.released);
      break;
    case Op::kSubmit: {
      PermissionDecision p = g.RequestToSubmit(s.trainer, kRound, now);
      ASSERT_EQ(p.outcome, v1::OUTCOME_OK) << p.message;
      ResultDecision b = g.BeginResult(s.trainer, kRound, now);
      ASSERT_EQ(b.code, ResultCode::kAccepted) << b.message;
      ResultDecision c = g.CompleteResult(s.trainer, 10, Metrics(0.5), now);
      ASSERT_EQ(c.code, ResultCode::kAccepted) << c.message;
      break;
    }
    case Op::kCheck: {
      RoundReport r = g.CheckDone(now);
      EXPECT_EQ(r.done, s.done);
      EXPECT_EQ(g.closed(), s.done);
      EXPECT_EQ(DoneReasonName(r.reason), DoneReasonName(s.reason));
      EXPECT_EQ(r.closed_at, s.closed_at.has_value() ? kOpen + *s.closed_at
                                                     : absl::InfiniteFuture());
      EXPECT_THAT(r.missing, ElementsAreArray(s.missing));
      if (s.responded.has_value()) {
        EXPECT_EQ(r.responded, *s.responded);
      }
      if (s.cut_off.has_value()) {
        EXPECT_THAT(r.uploads_cut_off, ElementsAreArray(*s.cut_off));
      }
      if (s.dropped.has_value()) {
        EXPECT_THAT(r.dropped, ElementsAreArray(*s.dropped));
      }
      break;
    }
    case Op::kBodyIn:
      g.BodyReceived(s.trainer);
      break;
    case Op::kDeadline:
      EXPECT_EQ(g.NextDeadline(), s.deadline.has_value()
                                      ? kOpen + *s.deadline
                                      : absl::InfiniteFuture());
      break;
  }
}

class ScenarioTest : public ::testing::TestWithParam<ScenarioCase> {};

TEST_P(ScenarioTest, Run) {
  const ScenarioCase& c = GetParam();
  std::unique_ptr<Gatherer> g = MakeGatherer(c.config);
  for (size_t i = 0; i < c.steps.size(); ++i) {
    SCOPED_TRACE(
        absl::StrCat("step ", i, " at +", absl::FormatDuration(c.steps[i].at)));
    RunStep(*g, c.steps[i]);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

using DR = DoneReason;
using PC = PermissionCode;
using RC = ResultCode;
const std::optional<absl::Duration> kNever = std::nullopt;

std::vector<ScenarioCase> Scenarios() {
  return {
      // --- When the round is done -------------------------------------
      {"AllRepliesDoneBeforeAnyTimeout",
       Config().Min(2).MaxConcurrent(3),
       {Deadline(S(60)), Submit(S(1), "a"), Open(S(1), {"b", "c"}),
        Deadline(S(60)), Submit(S(2), "b"), Open(S(2), {"c"}), Deadline(S(12)),
        Submit(S(3), "c"), Deadline(kNever),
        Done(S(3), DR::kAllResponded, S(3), {}).Responded(3),
        // The report does not change once closed.
        Done(S(100), DR::kAllResponded, S(3), {}).Responded(3)}},
      {"MinimumDoneExactlyAtGraceTime",
       Config().Min(2),
       {Submit(S(1), "a"), Submit(S(2), "b"), Deadline(S(12)),
        Open(S(12) - kNs, {"c"}), Deadline(S(12)),
        Done(S(12), DR::kGraceAfterMinimum, S(12), {"c"}).Responded(2)}},
      {"GraceNoticedLateReportsTheGraceTime",
       Config().Min(2),
       {Submit(S(1), "a"), Submit(S(2), "b"),
        Done(S(40), DR::kGraceAfterMinimum, S(12), {"c"})}},
      {"AllRepliesDuringGraceCloseAtOnce",
       Config().Min(1),
       {Submit(S(1), "a"), Deadline(S(11)), Submit(S(2), "b"), Deadline(S(11)),
        Submit(S(3), "c"), Done(S(3), DR::kAllResponded, S(3), {})}},
      {"NothingDoneAtTimeoutAllMissing",
       Config(),
       {Deadline(S(60)), Open(S(60) - kNs, {"a", "b", "c"}),
        Done(S(60), DR::kTimeout, S(60), {"a", "b", "c"}).Responded(0),
        Deadline(kNever)}},
      {"TimeoutBeforeGraceEnds",
       Config().Min(1).Grace(S(10)).Timeout(S(5)),
       {Submit(S(1), "a"), Deadline(S(5)), Open(S(5) - kNs, {"b", "c"}),
        Done(S(5), DR::kTimeout, S(5), {"b", "c"}).Responded(1)}},
      {"GraceAndTimeoutTieNamesGrace",
       Config().Min(1).Grace(S(9)).Timeout(S(10)),
       {Submit(S(1), "a"), Deadline(S(10)),
        Done(S(10), DR::kGraceAfterMinimum, S(10), {"b", "c"})}},
      {"ZeroGraceClosesOnTheMinimum",
       Config().Min(1).Grace(absl::ZeroDuration()),
       {Submit(S(1), "a"),
        Done(S(1), DR::kGraceAfterMinimum, S(1), {"b", "c"})}},
      {"InfiniteGraceWaitsForTimeout",
       Config().Min(1).Grace(absl::InfiniteDuration()),
       {Submit(S(1), "a"), Deadline(S(60)), Open(S(59), {"b", "c"}),
        Done(S(60), DR::kTimeout, S(60), {"b", "c"})}},
      {"NoTimeoutNoDeadline",
       Config().Timeout(absl::InfiniteDuration()),
       {Deadline(kNever), Open(S(1e6), {"a", "b", "c"})}},
      {"MinZeroMeansAll",
       Config().Min(0).Grace(S(1)).MaxConcurrent(3),
       {Submit(S(1), "a"), Submit(S(2), "b"), Open(S(30), {"c"}),
        Deadline(S(60)), Submit(S(31), "c"),
        Done(S(31), DR::kAllResponded, S(31), {})}},
      {"MinAboveTrainerCountClampedToAll",
       Config().Min(10).Grace(S(1)),
       {Submit(S(1), "a"), Submit(S(2), "b"), Open(S(30), {"c"}),
        Submit(S(31), "c"), Done(S(31), DR::kAllResponded, S(31), {})}},
      {"EmptyExpectedSetDoneAtOnce",
       Config().Trainers({}),
       {Done(S(0), DR::kNoTrainers, S(0), {}), Deadline(kNever),
        Ask(S(0), "a", v1::OUTCOME_REJECTED, PC::kNotTrainer)}},
      {"RepeatedTrainerNamesCountOnce",
       Config().Trainers({"a", "a", "b"}),
       {Submit(S(1), "a"), Open(S(1), {"b"}), Submit(S(2), "b"),
        Done(S(2), DR::kAllResponded, S(2), {})}},
      {"ClosedLazilyByALateEvent",
       Config().Timeout(S(10)),
       {Ask(S(10), "a", v1::OUTCOME_REJECTED, PC::kRoundClosed),
        Done(S(11), DR::kTimeout, S(10), {"a", "b", "c"})}},

      // --- Round relation -------------------------------------------------
      {"FutureRoundRetryThenError",
       Config(),
       {Ask(S(1), "a", v1::OUTCOME_RETRY, PC::kRoundNotOpen, kRound + 1),
        Begin(S(1), "a", RC::kError, kRound + 1),
        // Even while holding permission, a result ahead is an error.
        Granted(S(2), "a"), Begin(S(2), "a", RC::kError, kRound + 1),
        Begin(S(3), "a", RC::kAccepted), Complete(S(3), "a", RC::kAccepted)}},
      {"LateResultAcceptedWithWarningNotCounted",
       Config().MaxConcurrent(2),
       {Granted(S(1), "a", kRound - 1), Begin(S(1), "a", RC::kLate, kRound - 1),
        Complete(S(2), "a", RC::kLate),
        Open(S(2), {"a", "b", "c"}).Responded(0),
        // The same late result again is a duplicate.
        Ask(S(3), "a", v1::OUTCOME_REJECTED, PC::kAlreadySubmitted, kRound - 1),
        Begin(S(3), "a", RC::kDuplicate, kRound - 1),
        // Its result for this round still counts.
        Submit(S(4), "a"), Open(S(4), {"b", "c"}).Responded(1)}},
      {"LateResultFromTwoRoundsBack",
       Config(),
       {Granted(S(1), "b", kRound - 2), Begin(S(1), "b", RC::kLate, kRound - 2),
        Complete(S(1), "b", RC::kLate), Open(S(1), {"a", "b", "c"})}},
      {"AfterCloseEverythingRejected",
       Config().Timeout(S(10)),
       {Done(S(10), DR::kTimeout, S(10), {"a", "b", "c"}),
        Ask(S(11), "a", v1::OUTCOME_REJECTED, PC::kRoundClosed),
        Ask(S(11), "a", v1::OUTCOME_REJECTED, PC::kRoundClosed, kRound - 1),
        Begin(S(11), "a", RC::kRejected),
        Begin(S(11), "a", RC::kRejected, kRound - 1),
        Complete(S(11), "a", RC::kRejected),
        // A later round is not this gatherer's to refuse.
        Ask(S(11), "a", v1::OUTCOME_RETRY, PC::kRoundNotOpen, kRound + 1)}},
      {"BodyInBeforeTheTimeoutCountsAfterIt",
       Config().Timeout(S(10)).MaxConcurrent(2),
       {Granted(S(1), "a"), Begin(S(1), "a", RC::kAccepted),
        Granted(S(1), "b"), Begin(S(1), "b", RC::kAccepted),
        BodyIn(S(9), "a"), Done(S(10), DR::kTimeout, S(10), {"a", "b", "c"}),
        // a's body was whole before the timeout: its add counts; b's was
        // still streaming: kept out.
        Complete(S(11), "a", RC::kAccepted), Complete(S(11), "b", RC::kRejected),
        // Whole after the close: too late.
        BodyIn(S(11), "c"), Complete(S(11), "c", RC::kRejected)}},
      {"AfterAllRespondedLateResultRejected",
       Config().Trainers({"a"}),
       {Submit(S(1), "a"), Done(S(1), DR::kAllResponded, S(1), {}),
        Ask(S(2), "a", v1::OUTCOME_REJECTED, PC::kRoundClosed, kRound - 1)}},

      // --- Duplicates -----------------------------------------------------
      {"DuplicateNotCountedTwice",
       Config().MaxConcurrent(3),
       {Submit(S(1), "a"),
        Ask(S(2), "a", v1::OUTCOME_REJECTED, PC::kAlreadySubmitted),
        Begin(S(2), "a", RC::kDuplicate), Complete(S(2), "a", RC::kError),
        Open(S(2), {"b", "c"}).Responded(1)}},

      // --- Permissions and concurrency -----------------------------------
      {"RetryUntilCompletionFreesTheSlot",
       Config().MaxConcurrent(1),
       {Granted(S(1), "a"), Busy(S(1), "b"), Begin(S(2), "a", RC::kAccepted),
        Busy(S(2), "b"), Busy(S(3), "c"), Complete(S(4), "a", RC::kAccepted),
        Granted(S(4), "b"), Busy(S(4), "c")}},
      {"RetryUntilFailureFreesTheSlot",
       Config().MaxConcurrent(1),
       {Granted(S(1), "a"), Begin(S(1), "a", RC::kAccepted), Busy(S(2), "b"),
        Fail(S(3), "a", true), Granted(S(3), "b"), Busy(S(3), "a")}},
      {"FailedUploadFreesPermissionAndMayRetry",
       Config().MaxConcurrent(1),
       {Granted(S(1), "a"), Begin(S(1), "a", RC::kAccepted),
        Fail(S(2), "a", true), Fail(S(2), "a", false),
        Complete(S(2), "a", RC::kError), Begin(S(2), "a", RC::kError),
        Open(S(2), {"a", "b", "c"}).Responded(0), Granted(S(3), "a"),
        Begin(S(3), "a", RC::kAccepted), Complete(S(4), "a", RC::kAccepted),
        Open(S(4), {"b", "c"}).Responded(1)}},
      {"FailingAGrantedPermissionFreesIt",
       Config().MaxConcurrent(1),
       {Granted(S(1), "a"), Fail(S(2), "a", true), Granted(S(2), "b")}},
      {"ReAskWhileHoldingTakesNoSecondSlot",
       Config().MaxConcurrent(2),
       {Granted(S(1), "a"), Ask(S(1), "a", v1::OUTCOME_OK, PC::kAlreadyHeld),
        Ask(S(1), "a", v1::OUTCOME_OK, PC::kAlreadyHeld), Granted(S(2), "b"),
        Busy(S(2), "c"), Begin(S(3), "a", RC::kAccepted),
        Ask(S(3), "a", v1::OUTCOME_OK, PC::kAlreadyHeld), Busy(S(3), "c")}},
      {"MaxConcurrentZeroMeansOne",
       Config().MaxConcurrent(0),
       {Granted(S(1), "a"), Busy(S(1), "b")}},
      {"NonTrainerRejectedAndErrors",
       Config(),
       {Ask(S(1), "z", v1::OUTCOME_REJECTED, PC::kNotTrainer),
        Begin(S(1), "z", RC::kError), Complete(S(1), "z", RC::kError),
        Fail(S(1), "z", false),
        Ask(S(1), "", v1::OUTCOME_REJECTED, PC::kNotTrainer)}},
      {"ResultWithoutPermissionIsError",
       Config(),
       {Begin(S(1), "a", RC::kError), Complete(S(1), "a", RC::kError),
        Open(S(1), {"a", "b", "c"})}},
      {"SecondUploadWhileUploadingIsError",
       Config(),
       {Granted(S(1), "a"), Begin(S(1), "a", RC::kAccepted),
        Begin(S(2), "a", RC::kError), Begin(S(2), "a", RC::kError, kRound - 1),
        Complete(S(3), "a", RC::kAccepted)}},
      {"UnusedPermissionExpires",
       Config().MaxConcurrent(1).Lease(S(5)),
       {Granted(S(0), "a"), Deadline(S(5)), Busy(S(5) - kNs, "b"),
        Granted(S(5), "b"), Begin(S(6), "a", RC::kError),
        Begin(S(6), "b", RC::kAccepted), Deadline(S(60))}},
      {"ReAskRenewsTheLease",
       Config().MaxConcurrent(1).Lease(S(5)),
       {Granted(S(0), "a"), Ask(S(4), "a", v1::OUTCOME_OK, PC::kAlreadyHeld),
        Deadline(S(9)), Busy(S(8), "b"), Begin(S(8), "a", RC::kAccepted),
        // An upload in progress has no lease.
        Deadline(S(60)), Busy(S(30), "b"),
        Complete(S(30), "a", RC::kAccepted)}},

      // --- Cut-off uploads ------------------------------------------------
      {"UploadCutOffByTimeout",
       Config().Timeout(S(10)),
       {Granted(S(1), "a"), Begin(S(5), "a", RC::kAccepted),
        Done(S(10), DR::kTimeout, S(10), {"a", "b", "c"}).CutOff({"a"}),
        Complete(S(11), "a", RC::kRejected), Fail(S(11), "a", false)}},
      {"CompletedBeforeCloseCountsEvenPastTheDeadline",
       Config().Timeout(S(10)),
       {Granted(S(1), "a"), Begin(S(5), "a", RC::kAccepted),
        Complete(S(11), "a", RC::kAccepted),
        Done(S(11), DR::kTimeout, S(10), {"b", "c"}).Responded(1).CutOff({})}},
      {"LateUploadCutOffWhenLastResultArrives",
       Config().Trainers({"a", "b"}).MaxConcurrent(2),
       {Submit(S(1), "b"), Granted(S(2), "b", kRound - 1),
        Begin(S(2), "b", RC::kLate, kRound - 1), Open(S(2), {"a"}),
        Submit(S(3), "a"),
        Done(S(3), DR::kAllResponded, S(3), {}).CutOff({"b"}),
        Complete(S(4), "b", RC::kRejected)}},

      // --- Dropping dead trainers -----------------------------------------
      {"DropDeadTrainerClosesWhenTheRestAreIn",
       Config().MaxConcurrent(3),
       {Submit(S(1), "a"), Submit(S(2), "b"), Drop(S(3), "c", true),
        Done(S(3), DR::kAllResponded, S(3), {"c"}).Dropped({"c"}),
        Ask(S(4), "c", v1::OUTCOME_REJECTED, PC::kNotTrainer)}},
      {"DropRules",
       Config().MaxConcurrent(1),
       {Submit(S(1), "a"), Drop(S(2), "a", false), Drop(S(2), "z", false),
        Granted(S(2), "b"), Begin(S(2), "b", RC::kAccepted),
        // Dropping an uploading trainer frees its slot.
        Drop(S(3), "b", true), Drop(S(3), "b", false),
        Complete(S(3), "b", RC::kError), Granted(S(3), "c"),
        Open(S(3), {"b", "c"}).Dropped({"b"})}},
      {"DroppingEveryoneClosesWithNoTrainers",
       Config().Trainers({"a", "b"}),
       {Drop(S(1), "a", true), Open(S(1), {"a", "b"}), Drop(S(2), "b", true),
        Done(S(2), DR::kNoTrainers, S(2), {"a", "b"}).Dropped({"a", "b"}),
        Drop(S(3), "b", false)}},
      {"DropBelowMinimumStillCloses",
       Config().Trainers({"a", "b", "c", "d"}).Min(3).MaxConcurrent(4),
       {Submit(S(1), "a"), Drop(S(2), "c", true), Drop(S(2), "d", true),
        Open(S(2), {"b", "c", "d"}), Submit(S(3), "b"),
        Done(S(3), DR::kAllResponded, S(3), {"c", "d"})}},
  };
}

INSTANTIATE_TEST_SUITE_P(
    Table, ScenarioTest, ::testing::ValuesIn(Scenarios()),
    [](const ::testing::TestParamInfo<ScenarioCase>& info) {
      return info.param.name;
    });

// ---------------------------------------------------------------------------
// The best record after the round (design step 7).
// ---------------------------------------------------------------------------

struct Contribution {
  std::string trainer;
  uint64_t samples;
  std::optional<double> metric;
  bool late = false;  // Submitted for kRound - 1.
};

v1::BestRecord Record(double metric, uint32_t round = 2,
                      std::string site = "old") {
  v1::BestRecord r;
  r.set_present(true);
  r.set_site(std::move(site));
  r.set_metric(metric);
  r.set_round(round);
  return r;
}

struct BestCase {
  std::string name;
  v1::MetricDirection direction;
  v1::BestRecord prior;
  std::vector<Contribution> results;
  std::optional<double> score;  // Expected RoundScore().
  bool wins;
};

class BestRecordTest : public ::testing::TestWithParam<BestCase> {};

TEST_P(BestRecordTest, Table) {
  const BestCase& c = GetParam();
  std::vector<std::string> trainers;
  for (const Contribution& r : c.results) trainers.push_back(r.trainer);
  std::unique_ptr<Gatherer> g = MakeGatherer(
      Config().Trainers(trainers).MaxConcurrent(1), c.direction, c.prior);
  absl::Time now = kOpen;
  for (const Contribution& r : c.results) {
    now += S(1);
    const uint32_t round = r.late ? kRound - 1 : kRound;
    ASSERT_EQ(g->RequestToSubmit(r.trainer, round, now).outcome,
              v1::OUTCOME_OK);
    ASSERT_TRUE(g->BeginResult(r.trainer, round, now).ok());
    ASSERT_TRUE(
        g->CompleteResult(r.trainer, r.samples, Metrics(r.metric), now).ok());
  }
  g->CheckDone(kOpen + S(3600));
  ASSERT_TRUE(g->closed());

  const std::optional<double> score = g->RoundScore();
  ASSERT_EQ(score.has_value(), c.score.has_value());
  if (score.has_value()) {
    EXPECT_DOUBLE_EQ(*score, *c.score);
  }
  EXPECT_EQ(g->ScoreBeatsBest(), c.wins);

  const v1::BestRecord best = g->BestAfterRound();
  if (c.wins) {
    EXPECT_TRUE(best.present());
    EXPECT_EQ(best.site(), "agg");
    EXPECT_EQ(best.round(), kRound);
    EXPECT_DOUBLE_EQ(best.metric(), *c.score);
  } else {
    EXPECT_EQ(best.SerializeAsString(), c.prior.SerializeAsString());
  }
}

constexpr v1::MetricDirection kHigher = v1::METRIC_HIGHER_IS_BETTER;
constexpr v1::MetricDirection kLower = v1::METRIC_LOWER_IS_BETTER;

INSTANTIATE_TEST_SUITE_P(
    Table, BestRecordTest,
    ::testing::Values(
        // (100 * 0.9 + 300 * 0.5) / 400 = 0.6.
        BestCase{"FirstRoundWeightedMean",
                 kHigher,
                 v1::BestRecord(),
                 {{"a", 100, 0.9}, {"b", 300, 0.5}},
                 0.6,
                 true},
        BestCase{"HigherBeatsPrior",
                 kHigher,
                 Record(0.55),
                 {{"a", 100, 0.9}, {"b", 300, 0.5}},
                 0.6,
                 true},
        BestCase{"HigherLosesToPrior",
                 kHigher,
                 Record(0.7),
                 {{"a", 100, 0.9}, {"b", 300, 0.5}},
                 0.6,
                 false},
        BestCase{"TieKeepsPrior",
                 kHigher,
                 Record(0.6),
                 {{"a", 1, 0.6}, {"b", 1, 0.6}},
                 0.6,
                 false},
        // (1 * 0.2 + 3 * 0.6) / 4 = 0.5.
        BestCase{"LowerBeatsPrior",
                 kLower,
                 Record(0.55),
                 {{"a", 1, 0.2}, {"b", 3, 0.6}},
                 0.5,
                 true},
        BestCase{"LowerLosesToPrior",
                 kLower,
                 Record(0.4),
                 {{"a", 1, 0.2}, {"b", 3, 0.6}},
                 0.5,
                 false},
        BestCase{"LowerFirstRound",
                 kLower,
                 v1::BestRecord(),
                 {{"a", 5, 2.5}},
                 2.5,
                 true},
        BestCase{"NaNAndMissingMetricsLeftOut",
                 kHigher,
                 Record(0.7),
                 {{"a", 100, kNaN},
                  {"b", 100, std::nullopt},
                  {"c", 50, 0.8},
                  {"d", 50, kInf}},
                 0.8,
                 true},
        BestCase{"NoUsableMetricNeverWins",
                 kHigher,
                 Record(0.1),
                 {{"a", 100, kNaN}, {"b", 100, std::nullopt}},
                 std::nullopt,
                 false},
        BestCase{"NoUsableMetricFirstRoundStaysAbsent",
                 kLower,
                 v1::BestRecord(),
                 {{"a", 100, kNaN}},
                 std::nullopt,
                 false},
        BestCase{"ZeroSamplesLeftOut",
                 kHigher,
                 v1::BestRecord(),
                 {{"a", 0, 0.99}, {"b", 10, 0.5}},
                 0.5,
                 true},
        BestCase{"NaNPriorLosesToAnyScore",
                 kHigher,
                 Record(kNaN),
                 {{"a", 10, 0.01}},
                 0.01,
                 true},
        BestCase{"LateMetricLeftOut",
                 kHigher,
                 v1::BestRecord(),
                 {{"a", 1000, 1.0, /*late=*/true}, {"b", 10, 0.5}},
                 0.5,
                 true}),
    [](const ::testing::TestParamInfo<BestCase>& info) {
      return info.param.name;
    });

TEST(GathererBestTest, UsesTheConfiguredMetricName) {
  GathererOptions options = MakeOptions(Config().Trainers({"a", "b"}));
  options.metric_name = "loss";
  Gatherer g(std::move(options), MetricComparator(kLower));
  google::protobuf::Map<std::string, double> m;
  m["accuracy"] = 0.99;  // Not the ranking metric here.
  m["loss"] = 0.25;
  ASSERT_EQ(g.RequestToSubmit("a", kRound, kOpen).outcome, v1::OUTCOME_OK);
  ASSERT_TRUE(g.BeginResult("a", kRound, kOpen).ok());
  ASSERT_TRUE(g.CompleteResult("a", 10, m, kOpen).ok());
  m.erase("loss");
  ASSERT_EQ(g.RequestToSubmit("b", kRound, kOpen).outcome, v1::OUTCOME_OK);
  ASSERT_TRUE(g.BeginResult("b", kRound, kOpen).ok());
  ASSERT_TRUE(g.CompleteResult("b", 10, m, kOpen).ok());
  ASSERT_TRUE(g.closed());
  ASSERT_TRUE(g.RoundScore().has_value());
  EXPECT_DOUBLE_EQ(*g.RoundScore(), 0.25);
  EXPECT_EQ(g.BestAfterRound().metric(), 0.25);
}

TEST(GathererBestTest, EmptyMetricNameMeansAccuracy) {
  GathererOptions options = MakeOptions(Config().Trainers({"a"}));
  options.metric_name = "";
  Gatherer g(std::move(options), MetricComparator(kHigher));
  ASSERT_EQ(g.RequestToSubmit("a", kRound, kOpen).outcome, v1::OUTCOME_OK);
  ASSERT_TRUE(g.BeginResult("a", kRound, kOpen).ok());
  ASSERT_TRUE(g.CompleteResult("a", 10, Metrics(0.75), kOpen).ok());
  ASSERT_TRUE(g.RoundScore().has_value());
  EXPECT_DOUBLE_EQ(*g.RoundScore(), 0.75);
}

// Five trainers score 0.80, 0.82, 0.84, 0.86 and a liar 1.0 claiming many
// samples; `options` says how to score.
double ScoreWithLiar(GathererOptions options) {
  options.expected_trainers = {"a", "b", "c", "d", "liar"};
  Gatherer g(std::move(options), MetricComparator(kHigher));
  const std::vector<std::pair<std::string, double>> results = {
      {"a", 0.80}, {"b", 0.82}, {"c", 0.84}, {"d", 0.86}, {"liar", 1.0}};
  for (const auto& [name, metric] : results) {
    EXPECT_EQ(g.RequestToSubmit(name, kRound, kOpen).outcome, v1::OUTCOME_OK);
    EXPECT_TRUE(g.BeginResult(name, kRound, kOpen).ok());
    const uint64_t samples = name == "liar" ? 100000 : 100;
    EXPECT_TRUE(g.CompleteResult(name, samples, Metrics(metric), kOpen).ok());
  }
  const std::optional<double> score = g.RoundScore();
  EXPECT_TRUE(score.has_value());
  return score.value_or(kNaN);
}

TEST(GathererBestTest, RobustScoresIgnoreALiar) {
  const GathererOptions options = MakeOptions(Config());
  // Weighted by claims: (0.80 + 0.82 + 0.84 + 0.86) * 100 + 1.0 * 100000
  // over 100400.
  EXPECT_NEAR(ScoreWithLiar(options), (332.0 + 100000.0) / 100400.0, 1e-12);
  GathererOptions capped = options;
  capped.max_claimed_samples = 100;  // All weigh 100: the plain mean.
  EXPECT_NEAR(ScoreWithLiar(capped), 4.32 / 5, 1e-12);
  GathererOptions equal = options;
  equal.equal_weights = true;
  EXPECT_NEAR(ScoreWithLiar(equal), 4.32 / 5, 1e-12);
  GathererOptions median = options;
  median.score = v1::SCORE_MEDIAN;
  EXPECT_DOUBLE_EQ(ScoreWithLiar(median), 0.84);
  GathererOptions trimmed = options;
  trimmed.score = v1::SCORE_TRIMMED_MEAN;
  trimmed.score_trim_fraction = 0.2;  // Drops 0.80 and the liar's 1.0.
  EXPECT_NEAR(ScoreWithLiar(trimmed), 0.84, 1e-12);
}

TEST(GathererBestTest, MedianOfAnEvenCount) {
  GathererOptions options = MakeOptions(Config().Trainers({"a", "b"}));
  options.score = v1::SCORE_MEDIAN;
  Gatherer g(std::move(options), MetricComparator(kHigher));
  for (const auto& [name, metric] :
       std::vector<std::pair<std::string, double>>{{"a", 0.5}, {"b", 0.7}}) {
    ASSERT_EQ(g.RequestToSubmit(name, kRound, kOpen).outcome, v1::OUTCOME_OK);
    ASSERT_TRUE(g.BeginResult(name, kRound, kOpen).ok());
    ASSERT_TRUE(g.CompleteResult(name, 10, Metrics(metric), kOpen).ok());
  }
  EXPECT_DOUBLE_EQ(*g.RoundScore(), 0.6);
}

TEST(GathererBestTest, SetScoreOptionsDefaultsToMedianForRobustMethods) {
  v1::JobConfig config;
  GathererOptions options;
  SetScoreOptions(config, &options);
  EXPECT_EQ(options.score, v1::SCORE_WEIGHTED_MEAN);
  config.set_aggregation_method(v1::AGGREGATION_MULTI_KRUM);
  config.set_max_claimed_samples(500);
  config.set_equal_weights(true);
  SetScoreOptions(config, &options);
  EXPECT_EQ(options.score, v1::SCORE_MEDIAN);
  EXPECT_EQ(options.max_claimed_samples, 500u);
  EXPECT_TRUE(options.equal_weights);
  EXPECT_DOUBLE_EQ(options.score_trim_fraction, 0.1);
  config.set_best_score(v1::SCORE_WEIGHTED_MEAN);
  SetScoreOptions(config, &options);
  EXPECT_EQ(options.score, v1::SCORE_WEIGHTED_MEAN);
}

// ---------------------------------------------------------------------------
// Counters, clamping, names.
// ---------------------------------------------------------------------------

TEST(GathererTest, Counters) {
  std::unique_ptr<Gatherer> g =
      MakeGatherer(Config().MaxConcurrent(2).Lease(S(5)));
  EXPECT_EQ(g->RequestToSubmit("a", kRound, kOpen).code, PC::kGranted);
  EXPECT_EQ(g->RequestToSubmit("a", kRound, kOpen).code, PC::kAlreadyHeld);
  EXPECT_EQ(g->RequestToSubmit("b", kRound, kOpen).code, PC::kGranted);
  EXPECT_EQ(g->RequestToSubmit("c", kRound, kOpen).code, PC::kSlotsBusy);
  EXPECT_EQ(g->RequestToSubmit("z", kRound, kOpen).code, PC::kNotTrainer);
  EXPECT_EQ(g->counters().permissions_granted, 2u);
  EXPECT_EQ(g->counters().permission_retries, 1u);
  EXPECT_EQ(g->counters().in_flight, 2u);
  EXPECT_EQ(g->counters().max_in_flight, 2u);
  EXPECT_EQ(g->counters().rejected, 1u);

  EXPECT_TRUE(g->BeginResult("a", kRound, kOpen + S(1)).ok());
  EXPECT_TRUE(g->CompleteResult("a", 1, Metrics(0.5), kOpen + S(1)).ok());
  EXPECT_EQ(g->BeginResult("a", kRound, kOpen + S(1)).code, RC::kDuplicate);
  EXPECT_TRUE(g->FailResult("b", "broken stream", kOpen + S(1)));
  EXPECT_EQ(g->counters().accepted, 1u);
  EXPECT_EQ(g->counters().failed, 1u);
  EXPECT_EQ(g->counters().in_flight, 0u);
  EXPECT_EQ(g->counters().rejected, 2u);

  EXPECT_EQ(g->RequestToSubmit("c", kRound - 1, kOpen + S(2)).code,
            PC::kGranted);
  EXPECT_EQ(g->BeginResult("c", kRound - 1, kOpen + S(2)).code, RC::kLate);
  EXPECT_EQ(g->CompleteResult("c", 1, Metrics(0.5), kOpen + S(2)).code,
            RC::kLate);
  EXPECT_EQ(g->counters().late_accepted, 1u);
  EXPECT_EQ(g->counters().accepted, 1u);

  EXPECT_EQ(g->RequestToSubmit("b", kRound, kOpen + S(3)).code, PC::kGranted);
  EXPECT_EQ(g->counters().in_flight, 1u);
  g->CheckDone(kOpen + S(8));  // b's lease ran out at +8s.
  EXPECT_EQ(g->counters().expired, 1u);
  EXPECT_EQ(g->counters().in_flight, 0u);
  EXPECT_EQ(g->counters().permissions_granted, 4u);
  EXPECT_EQ(g->counters().max_in_flight, 2u);  // The most held at once.
}

TEST(GathererTest, ClampsSettings) {
  EXPECT_EQ(MakeGatherer(Config().Min(0))->min_responses_required(), 3);
  EXPECT_EQ(MakeGatherer(Config().Min(2))->min_responses_required(), 2);
  EXPECT_EQ(MakeGatherer(Config().Min(3))->min_responses_required(), 3);
  EXPECT_EQ(MakeGatherer(Config().Min(99))->min_responses_required(), 3);
  EXPECT_EQ(MakeGatherer(Config().Trainers({}))->min_responses_required(), 0);
  EXPECT_EQ(
      MakeGatherer(Config().MaxConcurrent(0))->max_concurrent_submissions(), 1);
  EXPECT_EQ(
      MakeGatherer(Config().MaxConcurrent(4))->max_concurrent_submissions(), 4);
}

TEST(GathererTest, NegativeDurationsCountAsZero) {
  // A negative timeout closes the round as it opens.
  std::unique_ptr<Gatherer> g = MakeGatherer(Config().Timeout(S(-1)));
  RoundReport r = g->CheckDone(kOpen);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.reason, DR::kTimeout);
  EXPECT_EQ(r.closed_at, kOpen);

  // A negative grace closes on the minimum.
  g = MakeGatherer(Config().Min(1).Grace(S(-5)));
  ASSERT_EQ(g->RequestToSubmit("a", kRound, kOpen + S(1)).outcome,
            v1::OUTCOME_OK);
  ASSERT_TRUE(g->BeginResult("a", kRound, kOpen + S(1)).ok());
  ASSERT_TRUE(g->CompleteResult("a", 1, Metrics(0.5), kOpen + S(1)).ok());
  EXPECT_TRUE(g->closed());
  EXPECT_EQ(g->CheckDone(kOpen + S(1)).reason, DR::kGraceAfterMinimum);
}

TEST(GathererTest, OpenReportListsOutstanding) {
  std::unique_ptr<Gatherer> g = MakeGatherer(Config());
  RoundReport r = g->CheckDone(kOpen + S(1));
  EXPECT_FALSE(r.done);
  EXPECT_EQ(r.expected, 3);
  EXPECT_EQ(r.responded, 0);
  EXPECT_THAT(r.missing, ElementsAre("a", "b", "c"));
  EXPECT_THAT(r.dropped, IsEmpty());
  EXPECT_THAT(r.uploads_cut_off, IsEmpty());
  EXPECT_FALSE(g->closed());
  EXPECT_EQ(g->round(), kRound);
  EXPECT_EQ(g->open_time(), kOpen);
}

TEST(GathererTest, ResultOutcomeOnTheWire) {
  EXPECT_EQ((ResultDecision{RC::kAccepted, ""}).outcome(), v1::OUTCOME_OK);
  EXPECT_EQ((ResultDecision{RC::kLate, ""}).outcome(), v1::OUTCOME_OK);
  EXPECT_EQ((ResultDecision{RC::kDuplicate, ""}).outcome(),
            v1::OUTCOME_REJECTED);
  EXPECT_EQ((ResultDecision{RC::kRejected, ""}).outcome(),
            v1::OUTCOME_REJECTED);
  EXPECT_EQ((ResultDecision{RC::kError, ""}).outcome(),
            v1::OUTCOME_BAD_REQUEST);
  EXPECT_TRUE((ResultDecision{RC::kLate, ""}).ok());
  EXPECT_FALSE((ResultDecision{RC::kDuplicate, ""}).ok());
}

TEST(GathererTest, Names) {
  EXPECT_EQ(DoneReasonName(DR::kGraceAfterMinimum), "grace_after_minimum");
  EXPECT_EQ(PermissionCodeName(PC::kSlotsBusy), "slots_busy");
  EXPECT_EQ(ResultCodeName(RC::kDuplicate), "duplicate");
}

// Keeps test output to failures; the gatherer logs every close and warning.
class QuietLogs : public ::testing::Environment {
 public:
  void SetUp() override { SetMinLogSeverity(LogSeverity::kError); }
};
const ::testing::Environment* const kQuietLogs =
    ::testing::AddGlobalTestEnvironment(new QuietLogs);

// ---------------------------------------------------------------------------
// Chain reduction: contributors to a partial sum.

TEST(GathererChainTest, ContributorsNeedNoPermissionAndAreNotAskedTwice) {
  std::unique_ptr<Gatherer> g = MakeGatherer(Config().MaxConcurrent(1));
  EXPECT_TRUE(g->CanJoinChain("a", kRound, kOpen));
  EXPECT_FALSE(g->CanJoinChain("a", kRound - 1, kOpen));  // Late: direct.
  EXPECT_FALSE(g->CanJoinChain("z", kRound, kOpen));      // Not a trainer.
  EXPECT_THAT(g->IdleTrainers(), ::testing::ElementsAre("a", "b", "c"));
  // c holds the only slot; a and b arrive in a partial sum regardless.
  EXPECT_EQ(g->RequestToSubmit("c", kRound, kOpen).code, PC::kGranted);
  EXPECT_FALSE(g->CanJoinChain("c", kRound, kOpen));
  EXPECT_THAT(g->IdleTrainers(), ::testing::ElementsAre("a", "b"));
  EXPECT_EQ(g->BeginResult("a", kRound, kOpen).code, RC::kError);
  EXPECT_TRUE(g->BeginResult("a", kRound, kOpen, false).ok());
  EXPECT_TRUE(g->BeginResult("b", kRound, kOpen, false).ok());
  EXPECT_TRUE(g->IdleTrainers().empty());
  // Asking while its result arrives in a partial sum: ask again later.
  const PermissionDecision again = g->RequestToSubmit("a", kRound, kOpen);
  EXPECT_EQ(again.outcome, v1::OUTCOME_RETRY);
  EXPECT_EQ(again.code, PC::kInPartialSum);
  EXPECT_EQ(g->counters().in_flight, 1u);  // c's slot only.
  // The partial sum failed: both are free to ask for a slot.
  EXPECT_TRUE(g->FailResult("a", "chain broke", kOpen));
  EXPECT_TRUE(g->FailResult("b", "chain broke", kOpen));
  EXPECT_TRUE(g->CanJoinChain("a", kRound, kOpen));
  EXPECT_EQ(g->RequestToSubmit("a", kRound, kOpen).code, PC::kSlotsBusy);
  EXPECT_EQ(g->counters().in_flight, 1u);
  // A second partial sum with a: counted like any result.
  EXPECT_TRUE(g->BeginResult("a", kRound, kOpen + S(1), false).ok());
  EXPECT_TRUE(g->CompleteResult("a", 4, Metrics(0.5), kOpen + S(1)).ok());
  EXPECT_FALSE(g->CanJoinChain("a", kRound, kOpen + S(1)));
  EXPECT_EQ(g->BeginResult("a", kRound, kOpen + S(1), false).code,
            RC::kDuplicate);
}

}  // namespace
}  // namespace swarm
