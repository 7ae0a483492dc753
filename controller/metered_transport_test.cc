#include "controller/metered_transport.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"

namespace swarm {
namespace {

// Keeps every call; the test answers them (as a transport would, later and
// outside Send).
class RecordingTransport : public PeerTransport {
 public:
  struct Call {
    std::string to;
    PeerMessage message;
    Done done;
  };
  void Send(const v1::SiteInfo& to, PeerMessage message, Done done) override {
    calls.push_back({to.name(), std::move(message), std::move(done)});
  }
  std::vector<Call> calls;
};

double Sample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      return std::strtod(std::string(line.substr(series.size() + 1)).c_str(),
                         nullptr);
    }
  }
  return -1;
}

v1::SiteInfo Site(const std::string& name) {
  v1::SiteInfo site;
  site.set_name(name);
  site.set_address("127.0.0.1:1");
  return site;
}

PeerMessage ModelMessage(CallKind kind, uint64_t elements) {
  PeerMessage message;
  message.kind = kind;
  absl::StatusOr<Model> model = Model::Create(
      {TensorSpec{"w", v1::DTYPE_F32, {elements}, elements * sizeof(float)}});
  EXPECT_TRUE(model.ok()) << model.status();
  message.model = std::make_shared<const Model>(std::move(*model));
  return message;
}

PeerReply Answer(v1::Outcome outcome) {
  PeerReply reply;
  reply.reply.set_outcome(outcome);
  reply.permission.set_outcome(outcome);
  return reply;
}

TEST(MeteredTransportTest, CountsCallsModelsAndBytesPerPeer) {
  MetricsRegistry registry;
  RecordingTransport inner;
  absl::StatusOr<std::unique_ptr<MeteredTransport>> metered =
      MeteredTransport::Create(&inner, &registry, "site-a");
  ASSERT_TRUE(metered.ok()) << metered.status();

  int answered = 0;
  auto count = [&answered](absl::StatusOr<PeerReply>) { ++answered; };
  (*metered)->Send(Site("site-b"), ModelMessage(CallKind::kSubmitResult, 256),
                   count);
  (*metered)->Send(Site("site-b"), ModelMessage(CallKind::kLearnTask, 256),
                   count);
  (*metered)->Send(Site("site-c"), ModelMessage(CallKind::kLearnTask, 512),
                   count);
  PeerMessage ask;
  ask.kind = CallKind::kRequestToSubmit;
  (*metered)->Send(Site("site-b"), ask, count);
  ASSERT_EQ(inner.calls.size(), 4u);
  EXPECT_EQ(inner.calls[0].to, "site-b");
  EXPECT_EQ(inner.calls[2].message.model->total_bytes(), 2048u);

  inner.calls[0].done(Answer(v1::OUTCOME_OK));
  inner.calls[1].done(absl::UnavailableError("connection refused"));
  inner.calls[2].done(Answer(v1::OUTCOME_OK));
  inner.calls[3].done(Answer(v1::OUTCOME_RETRY));
  EXPECT_EQ(answered, 4);

  const std::string text = registry.Exposition();
  EXPECT_EQ(Sample(text,
                   "swarm_peer_calls_total{site=\"site-a\",peer=\"site-b\","
                   "kind=\"submit_result\",outcome=\"ok\"}"),
            1);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_calls_total{site=\"site-a\",peer=\"site-b\","
                   "kind=\"learn_task\",outcome=\"error\"}"),
            1);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_calls_total{site=\"site-a\",peer=\"site-b\","
                   "kind=\"request_to_submit\",outcome=\"retry\"}"),
            1);
  // Only delivered models count: the failed learn task to site-b does not.
  EXPECT_EQ(Sample(text,
                   "swarm_peer_models_sent_total{site=\"site-a\","
                   "peer=\"site-b\"}"),
            1);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_model_bytes_sent_total{site=\"site-a\","
                   "peer=\"site-b\"}"),
            1024);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_model_bytes_sent_total{site=\"site-a\","
                   "peer=\"site-c\"}"),
            2048);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_call_seconds_count{site=\"site-a\","
                   "peer=\"site-b\",kind=\"learn_task\"}"),
            1);
  EXPECT_EQ((*metered)->bytes_sent(), 1024u + 2048u);
  // site-b's last call was answered (retry): up; site-c answered too.
  EXPECT_EQ(Sample(text, "swarm_peer_up{site=\"site-a\",peer=\"site-b\"}"), 1);
  EXPECT_EQ(Sample(text, "swarm_peer_up{site=\"site-a\",peer=\"site-c\"}"), 1);
}

TEST(MeteredTransportTest, PeerUpFollowsTheLastCall) {
  MetricsRegistry registry;
  RecordingTransport inner;
  absl::StatusOr<std::unique_ptr<MeteredTransport>> metered =
      MeteredTransport::Create(&inner, &registry, "site-a");
  ASSERT_TRUE(metered.ok()) << metered.status();
  PeerMessage ask;
  ask.kind = CallKind::kRequestToSubmit;
  auto ignore = [](absl::StatusOr<PeerReply>) {};
  const std::string up = "swarm_peer_up{site=\"site-a\",peer=\"site-b\"}";
  (*metered)->Send(Site("site-b"), ask, ignore);
  inner.calls[0].done(absl::UnavailableError("connection refused"));
  EXPECT_EQ(Sample(registry.Exposition(), up), 0);
  (*metered)->Send(Site("site-b"), ask, ignore);
  inner.calls[1].done(Answer(v1::OUTCOME_REJECTED));  // Reached: it refused.
  EXPECT_EQ(Sample(registry.Exposition(), up), 1);
  (*metered)->Send(Site("site-b"), ask, ignore);
  inner.calls[2].done(absl::DeadlineExceededError("no answer"));
  EXPECT_EQ(Sample(registry.Exposition(), up), 0);
}

TEST(ReceivedModelMeterTest, CountsModelsBytesAndDigestFailuresPerPeer) {
  MetricsRegistry registry;
  absl::StatusOr<std::unique_ptr<ReceivedModelMeter>> meter =
      ReceivedModelMeter::Create(&registry, "site-a");
  ASSERT_TRUE(meter.ok()) << meter.status();
  (*meter)->Observe("site-b", 1000, absl::OkStatus());
  (*meter)->Observe("site-b", 500, absl::OkStatus());
  (*meter)->Observe("site-c", 300, absl::OkStatus());
  (*meter)->Observe("site-c", 300,
                    absl::DataLossError("digest mismatch: computed 00, "
                                        "trailer says 01"));
  (*meter)->Observe("site-c", 300,
                    absl::DataLossError("trailer counts 3 chunks, 2 arrived"));
  EXPECT_EQ((*meter)->bytes_received(), 1800u);
  const std::string text = registry.Exposition();
  EXPECT_EQ(Sample(text,
                   "swarm_peer_models_received_total{site=\"site-a\","
                   "peer=\"site-b\"}"),
            2);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_model_bytes_received_total{site=\"site-a\","
                   "peer=\"site-b\"}"),
            1500);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_model_bytes_received_total{site=\"site-a\","
                   "peer=\"site-c\"}"),
            300);
  EXPECT_EQ(Sample(text,
                   "swarm_peer_streams_broken_total{site=\"site-a\","
                   "peer=\"site-c\"}"),
            2);
  EXPECT_EQ(Sample(text,
                   "swarm_digest_failures_total{site=\"site-a\","
                   "peer=\"site-c\"}"),
            1);
}

// The total as of a past moment: what the round record credits a round
// with after the watcher learns of the round's end.
TEST(ByteTallyTest, TotalAtAPastMoment) {
  ByteTally tally;
  const absl::Time before = absl::Now();
  absl::SleepFor(absl::Milliseconds(2));
  tally.Add(100);
  absl::SleepFor(absl::Milliseconds(2));
  const absl::Time between = absl::Now();
  absl::SleepFor(absl::Milliseconds(2));
  tally.Add(50);
  EXPECT_EQ(tally.Total(), 150u);
  EXPECT_EQ(tally.TotalAt(before), 0u);
  EXPECT_EQ(tally.TotalAt(between), 100u);
  EXPECT_EQ(tally.TotalAt(absl::Now()), 150u);
}

TEST(ByteTallyTest, BeforeTheOldestKeptGrowthIsTheTotalBeforeIt) {
  ByteTally tally;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < ByteTally::kKept + 10; ++i) tally.Add(1);
  EXPECT_EQ(tally.Total(), ByteTally::kKept + 10);
  EXPECT_EQ(tally.TotalAt(start - absl::Seconds(1)), 10u);
  EXPECT_EQ(tally.TotalAt(absl::Now()), ByteTally::kKept + 10);
}

}  // namespace
}  // namespace swarm
