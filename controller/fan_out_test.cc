#include "controller/fan_out.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

FanOut To(std::initializer_list<const char*> targets) {
  FanOut fan_out;
  for (const char* target : targets) fan_out.Expect(target);
  return fan_out;
}

TEST(FanOutTest, AcknowledgementsInTheOrderTheyCame) {
  FanOut fan_out = To({"a", "b", "c"});
  EXPECT_TRUE(fan_out.NoteAnswer("c", absl::OkStatus(), false).counted);
  EXPECT_TRUE(fan_out.NoteAnswer("a", absl::OkStatus(), false).counted);
  EXPECT_FALSE(fan_out.done());
  EXPECT_TRUE(fan_out.NoteAnswer("b", absl::OkStatus(), false).counted);
  EXPECT_TRUE(fan_out.done());
  EXPECT_THAT(fan_out.acked(), ElementsAre("c", "a", "b"));
  EXPECT_THAT(fan_out.AckedByName(), ElementsAre("a", "b", "c"));
  EXPECT_TRUE(fan_out.first_error().ok());
  EXPECT_FALSE(fan_out.grace_started());
}

TEST(FanOutTest, AnAnswerNotWaitedForIsIgnored) {
  FanOut fan_out = To({"a"});
  EXPECT_FALSE(fan_out.NoteAnswer("z", absl::OkStatus()).counted);
  EXPECT_TRUE(fan_out.NoteAnswer("a", absl::OkStatus()).counted);
  EXPECT_FALSE(fan_out.NoteAnswer("a", absl::OkStatus()).counted);  // Again.
  EXPECT_THAT(fan_out.acked(), ElementsAre("a"));
}

TEST(FanOutTest, FailuresAreMissedAndTheFirstIsNamed) {
  FanOut fan_out = To({"a", "b", "c"});
  fan_out.NoteAnswer("b", absl::UnavailableError("down"));
  fan_out.NoteAnswer("c", absl::DeadlineExceededError("slow"));
  const FanOut::Noted noted = fan_out.NoteAnswer("a", absl::OkStatus());
  EXPECT_FALSE(noted.start_grace);  // Nobody left to wait for.
  EXPECT_THAT(fan_out.missed(), ElementsAre(Pair("b", "down"),
                                            Pair("c", "slow")));
  EXPECT_EQ(fan_out.first_error().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fan_out.first_error().message(), "b: down");
}

TEST(FanOutTest, TheFirstCountingAcknowledgementStartsTheGraceOnce) {
  FanOut fan_out = To({"self", "a", "b", "c"});
  // An answer that may not start it (the site's own) does not.
  EXPECT_FALSE(fan_out.NoteAnswer("self", absl::OkStatus(), false).start_grace);
  // Nor does a failure.
  EXPECT_FALSE(fan_out.NoteAnswer("c", absl::InternalError("x")).start_grace);
  EXPECT_TRUE(fan_out.NoteAnswer("a", absl::OkStatus()).start_grace);
  EXPECT_TRUE(fan_out.grace_started());
  EXPECT_FALSE(fan_out.NoteAnswer("b", absl::OkStatus()).start_grace);
}

TEST(FanOutTest, GivingUpMissesTheSilentOnes) {
  FanOut fan_out = To({"a", "b", "c"});
  fan_out.NoteAnswer("a", absl::OkStatus());
  EXPECT_THAT(fan_out.GiveUpWaiting("silent"), ElementsAre("b", "c"));
  EXPECT_TRUE(fan_out.done());
  EXPECT_TRUE(fan_out.grace_ended());
  EXPECT_THAT(fan_out.missed(), ElementsAre(Pair("b", "silent"),
                                            Pair("c", "silent")));
  // A late answer of a site given up on changes nothing.
  EXPECT_FALSE(fan_out.NoteAnswer("b", absl::OkStatus()).counted);
  EXPECT_THAT(fan_out.acked(), ElementsAre("a"));
}

TEST(FanOutTest, EndingTheGraceKeepsWaitingForTheRest) {
  FanOut fan_out = To({"a", "b"});
  fan_out.NoteAnswer("a", absl::OkStatus());
  EXPECT_TRUE(fan_out.EndGrace());
  EXPECT_FALSE(fan_out.EndGrace());  // Once.
  EXPECT_THAT(fan_out.waiting(), ElementsAre("b"));
  EXPECT_TRUE(fan_out.NoteAnswer("b", absl::OkStatus()).counted);
  EXPECT_TRUE(fan_out.done());
  EXPECT_THAT(fan_out.missed(), IsEmpty());
}

}  // namespace
}  // namespace swarm
