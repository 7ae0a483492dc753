// Step tests of the relay and hop protocol: inputs in, actions out, in
// virtual time (a plain absl::Time the test moves).
#include "controller/relay_protocol.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;
using Mode = RelayProtocol::Mode;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

v1::Reply OkReply(const std::string& message) {
  v1::Reply reply;
  reply.set_outcome(v1::OUTCOME_OK);
  reply.set_message(message);
  return reply;
}

// Carries the protocol's actions out against counters, as an adapter would,
// and checks the obligations (one read, one write at a time).
class Driver {
 public:
  Driver(Mode mode, RelayBudgets budgets)
      : protocol_(mode, budgets, "next", "test stream") {}

  void Start(size_t header_frames = 1) {
    for (size_t i = 0; i < header_frames; ++i) queue_.Push(-1);
    protocol_.Start(now_, header_frames);
    Apply();
  }
  // The pending read returns a frame that produces `produced` frames.
  void Read(int produced = 1) {
    ASSERT_EQ(reads_pending_, 1);
    reads_pending_ = 0;
    for (int i = 0; i < produced; ++i) queue_.Push(next_frame_++);
    protocol_.OnFrameRead(now_, produced);
    Apply();
  }
  void EndRead(absl::Status status, int produced = 0) {
    reads_pending_ = 0;
    for (int i = 0; i < produced; ++i) queue_.Push(next_frame_++);
    protocol_.OnReadEnd(now_, std::move(status), produced);
    Apply();
  }
  // The write in flight is taken by the next hop.
  void Take(bool ok = true) {
    ASSERT_EQ(writes_in_flight_, 1);
    writes_in_flight_ = 0;
    protocol_.OnWriteDone(now_, ok);
    Apply();
  }
  void OnwardEnd(absl::StatusOr<v1::Reply> reply) {
    protocol_.OnOnwardEnd(now_, std::move(reply));
    Apply();
  }
  void SiteReply(v1::Reply reply) {
    protocol_.OnSiteReply(std::move(reply));
    Apply();
  }
  // Moves time on to `when`, running the protocol's timer on the way.
  void AdvanceTo(absl::Time when) {
    while (protocol_.NextDeadline() <= when) {
      now_ = std::max(now_, protocol_.NextDeadline());
      protocol_.Tick(now_);
      Apply();
    }
    now_ = when;
  }
  void Advance(absl::Duration d) { AdvanceTo(now_ + d); }

  RelayProtocol& protocol() { return protocol_; }
  absl::Time now() const { return now_; }
  int reads_pending() const { return reads_pending_; }
  int writes_in_flight() const { return writes_in_flight_; }
  const std::vector<int>& written() const { return written_; }
  bool closed() const { return closed_; }
  bool onward_cancelled() const { return onward_cancelled_; }
  bool incoming_cancelled() const { return incoming_cancelled_; }
  const std::optional<absl::Status>& to_site() const { return to_site_; }
  const std::optional<v1::Reply>& answer() const { return answer_; }
  size_t queued_frames() const { return queue_.size(); }

 private:
  void Apply() {
    RelayProtocol::Actions actions = protocol_.TakeActions();
    std::optional<int> frame = queue_.Apply(actions);
    if (actions.read) {
      ++reads_pending_;
      EXPECT_EQ(reads_pending_, 1) << "two reads at once";
    }
    if (actions.write) {
      ASSERT_TRUE(frame.has_value());
      ++writes_in_flight_;
      EXPECT_EQ(writes_in_flight_, 1) << "two writes at once";
      EXPECT_FALSE(closed_) << "a write after the close";
      written_.push_back(*frame);
    }
    if (actions.close_onward) closed_ = true;
    if (actions.cancel_onward) {
      onward_cancelled_ = true;
      writes_in_flight_ = 0;  // Comes back late, if ever.
    }
    if (actions.cancel_incoming) incoming_cancelled_ = true;
    if (actions.to_site.has_value()) {
      EXPECT_FALSE(to_site_.has_value()) << "the site told twice";
      to_site_ = actions.to_site;
    }
    if (actions.answer.has_value()) {
      EXPECT_FALSE(answer_.has_value()) << "answered twice";
      answer_ = actions.answer;
    }
  }

  RelayProtocol protocol_;
  RelayQueue<int> queue_;
  absl::Time now_ = kT0;
  int next_frame_ = 0;
  int reads_pending_ = 0;
  int writes_in_flight_ = 0;
  std::vector<int> written_;
  bool closed_ = false;
  bool onward_cancelled_ = false;
  bool incoming_cancelled_ = false;
  std::optional<absl::Status> to_site_;
  std::optional<v1::Reply> answer_;
};

RelayBudgets Budgets(size_t max_queued = 2) {
  RelayBudgets budgets;
  budgets.stall = absl::Seconds(10);
  budgets.idle = absl::Seconds(5);
  budgets.max_queued = max_queued;
  return budgets;
}

TEST(RelayBudgetTest, StallGrowsTowardTheHeadAndIdleIsOneFailover) {
  EXPECT_EQ(RelayStallBudget(absl::Seconds(5), 0), absl::Seconds(5));
  EXPECT_EQ(RelayStallBudget(absl::Seconds(5), 3), absl::Seconds(20));
  EXPECT_EQ(RelayStallBudget(absl::Milliseconds(10), 1), absl::Seconds(2));
  EXPECT_EQ(RelayIdleBudget(absl::Seconds(5)), absl::Seconds(5));
  EXPECT_EQ(RelayIdleBudget(absl::ZeroDuration()), absl::Seconds(1));
}

TEST(RelayProtocolTest, AReceivedStreamIsReadOneFrameAtATime) {
  RelayBudgets budgets;  // No idle watch.
  Driver d(Mode::kReceive, budgets);
  d.Start(0);
  for (int i = 0; i < 5; ++i) d.Read(0);
  EXPECT_EQ(d.reads_pending(), 1);
  d.Advance(absl::Hours(1));  // No timer without budgets.
  EXPECT_FALSE(d.incoming_cancelled());
  d.EndRead(absl::OkStatus());
  ASSERT_TRUE(d.to_site().has_value());
  EXPECT_TRUE(d.to_site()->ok());
  EXPECT_FALSE(d.answer().has_value());
  d.SiteReply(OkReply("thanks"));
  ASSERT_TRUE(d.answer().has_value());
  EXPECT_EQ(d.answer()->message(), "thanks");
  EXPECT_TRUE(d.protocol().finished());
}

TEST(RelayProtocolTest, ARelayForwardsInOrderUnderBackpressure) {
  Driver d(Mode::kRelay, Budgets(/*max_queued=*/2));
  d.Start();
  // The header is in flight; two frames fill the queue: reading pauses.
  d.Read();
  EXPECT_EQ(d.reads_pending(), 1);
  d.Read();
  EXPECT_EQ(d.reads_pending(), 0);
  EXPECT_TRUE(d.protocol().paused());
  // Room: one read, one write.
  d.Take();
  EXPECT_EQ(d.reads_pending(), 1);
  EXPECT_EQ(d.writes_in_flight(), 1);
  for (int i = 0; i < 20; ++i) {
    if (d.reads_pending() == 1) d.Read();
    d.Take();
  }
  d.EndRead(absl::OkStatus());
  EXPECT_TRUE(d.to_site()->ok());  // The site judges its copy at once.
  while (d.writes_in_flight() == 1) d.Take();
  EXPECT_TRUE(d.closed());
  std::vector<int> expected = {-1};
  for (size_t i = 0; i + 1 < d.written().size(); ++i) {
    expected.push_back(static_cast<int>(i));
  }
  EXPECT_EQ(d.written(), expected);
  // The site's reply waits for the next hop's, which joins it.
  d.SiteReply(OkReply("mine"));
  EXPECT_FALSE(d.answer().has_value());
  v1::Reply next = OkReply("next's");
  d.OnwardEnd(next);
  ASSERT_TRUE(d.answer().has_value());
  EXPECT_EQ(d.answer()->message(), "mine");
  ASSERT_EQ(d.answer()->relayed_size(), 1);
  EXPECT_EQ(d.answer()->relayed(0).site(), "next");
}

// Chain hops put several frames out per frame read (one per chunk): a batch
// that fills the queue pauses reading once, and room resumes it once (the
// hop of 0eb4c64 read on from two places and fed a chunk twice).
TEST(RelayProtocolTest, ABatchThatFillsTheQueueResumesReadingOnce) {
  Driver d(Mode::kHop, Budgets(/*max_queued=*/2));
  d.Start();
  for (int batch = 0; batch < 50; ++batch) {
    ASSERT_EQ(d.reads_pending(), 1);
    d.Read(/*produced=*/3);
    EXPECT_EQ(d.reads_pending(), 0);
    while (d.reads_pending() == 0) d.Take();
  }
  EXPECT_EQ(d.reads_pending(), 1);
}

TEST(RelayProtocolTest, ANextHopThatTakesNothingIsGivenUpAfterTheStall) {
  Driver d(Mode::kRelay, Budgets(/*max_queued=*/2));
  d.Start();
  d.Read();
  d.Read();
  ASSERT_TRUE(d.protocol().paused());
  EXPECT_EQ(d.protocol().NextDeadline(), kT0 + absl::Seconds(10));
  d.Advance(absl::Seconds(9));
  EXPECT_FALSE(d.onward_cancelled());
  d.Advance(absl::Seconds(1));
  EXPECT_TRUE(d.onward_cancelled());
  // This site reads on for its own copy; frames go nowhere.
  EXPECT_EQ(d.reads_pending(), 1);
  EXPECT_EQ(d.queued_frames(), 0u);
  d.Read();
  EXPECT_EQ(d.queued_frames(), 0u);
  // A late completion of the cancelled write changes nothing.
  d.protocol().OnWriteDone(d.now(), true);
  EXPECT_TRUE(d.protocol().TakeActions().write == false);
  d.EndRead(absl::OkStatus());
  d.SiteReply(OkReply("mine"));
  ASSERT_TRUE(d.answer().has_value());
  ASSERT_EQ(d.answer()->relayed_size(), 1);
  EXPECT_THAT(d.answer()->relayed(0).message(),
              HasSubstr("no frame taken for 10s"));
  // The onward call's own end, later, is ignored.
  d.OnwardEnd(OkReply("late"));
  EXPECT_TRUE(d.protocol().finished());
}

TEST(RelayProtocolTest, AnIdleSenderIsGivenUpButAPausedReadIsNotIdle) {
  Driver d(Mode::kHop, Budgets(/*max_queued=*/1));
  d.Start();
  d.Read();  // The queue is full (header in flight, one frame queued).
  ASSERT_TRUE(d.protocol().paused());
  // Paused on purpose: only the stall runs.
  EXPECT_EQ(d.protocol().NextDeadline(), kT0 + absl::Seconds(10));
  d.Advance(absl::Seconds(4));
  d.Take();  // Room: reading resumes at +4 s.
  ASSERT_EQ(d.reads_pending(), 1);
  d.Take();
  EXPECT_EQ(d.protocol().NextDeadline(), kT0 + absl::Seconds(9));
  d.Advance(absl::Seconds(5));
  EXPECT_TRUE(d.incoming_cancelled());
  EXPECT_FALSE(d.to_site().has_value());
  // The cancelled read ends; the site hears why once the next hop answers.
  d.EndRead(absl::CancelledError("cancelled"));
  EXPECT_TRUE(d.onward_cancelled());
  ASSERT_TRUE(d.to_site().has_value());
  EXPECT_EQ(d.to_site()->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(d.to_site()->message(), HasSubstr("no frame from the sender"));
}

TEST(RelayProtocolTest, AHopTellsTheSiteOnceBothHalvesAreKnown) {
  {
    Driver d(Mode::kHop, Budgets());
    d.Start();
    d.Read();
    d.EndRead(absl::OkStatus(), /*produced=*/1);  // The trailer.
    EXPECT_FALSE(d.to_site().has_value());
    while (d.writes_in_flight() == 1) d.Take();
    EXPECT_TRUE(d.closed());
    EXPECT_EQ(d.written().size(), 3u);
    v1::Reply refused;
    refused.set_outcome(v1::OUTCOME_REJECTED);
    refused.set_message("round closed");
    d.OnwardEnd(refused);
    ASSERT_TRUE(d.to_site().has_value());
    EXPECT_EQ(d.to_site()->message(), "round closed");
  }
  {
    // The next hop answers first (it refused the header); the incoming
    // stream's failure wins.
    Driver d(Mode::kHop, Budgets());
    d.Start();
    d.OnwardEnd(absl::UnavailableError("gone"));
    EXPECT_EQ(d.reads_pending(), 1);
    d.Read();
    EXPECT_EQ(d.queued_frames(), 0u);
    EXPECT_FALSE(d.to_site().has_value());
    d.EndRead(absl::DataLossError("digest"));
    ASSERT_TRUE(d.to_site().has_value());
    EXPECT_EQ(d.to_site()->code(), absl::StatusCode::kDataLoss);
  }
}

TEST(RelayProtocolTest, ABrokenIncomingStreamCancelsTheForward) {
  Driver d(Mode::kRelay, Budgets());
  d.Start();
  d.Read();
  d.EndRead(absl::InvalidArgumentError("bad chunk"));
  EXPECT_TRUE(d.onward_cancelled());
  EXPECT_FALSE(d.closed());
  EXPECT_EQ(d.to_site()->code(), absl::StatusCode::kInvalidArgument);
  d.SiteReply(OkReply("refused"));
  ASSERT_TRUE(d.answer().has_value());
  EXPECT_EQ(d.answer()->relayed_size(), 1);
}

TEST(RelayProtocolTest, AFailedWriteStopsTheForwardButNotTheReads) {
  Driver d(Mode::kRelay, Budgets(/*max_queued=*/1));
  d.Start();
  d.Read();
  ASSERT_TRUE(d.protocol().paused());
  d.Take(/*ok=*/false);
  EXPECT_EQ(d.reads_pending(), 1);
  for (int i = 0; i < 5; ++i) d.Read();  // Not paused again.
  EXPECT_EQ(d.writes_in_flight(), 0);
  d.OnwardEnd(absl::UnavailableError("reset"));
  d.EndRead(absl::OkStatus());
  d.SiteReply(OkReply("mine"));
  ASSERT_TRUE(d.answer().has_value());
  EXPECT_FALSE(d.closed());
}

TEST(RelayProtocolTest, ASourceReportsTheNextHopsAnswer) {
  Driver d(Mode::kSource, Budgets(/*max_queued=*/2));
  d.Start();
  int produced = 0;
  while (produced < 10) {
    if (d.reads_pending() == 1) {
      d.Read();
      ++produced;
    } else {
      d.Take();
    }
  }
  d.EndRead(absl::OkStatus());
  while (d.writes_in_flight() == 1) d.Take();
  EXPECT_TRUE(d.closed());
  EXPECT_EQ(d.written().size(), 11u);
  d.OnwardEnd(OkReply("ok"));
  RelayProtocol::Actions none = d.protocol().TakeActions();
  EXPECT_FALSE(none.onward_done.has_value());  // Taken by the driver.
  EXPECT_TRUE(d.protocol().finished());
  EXPECT_FALSE(d.to_site().has_value());
}

}  // namespace
}  // namespace swarm
