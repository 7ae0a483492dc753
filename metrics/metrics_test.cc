#include "metrics/metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

// The value on the sample line that starts with `prefix` (name and labels).
double SampleValue(const std::string& text, absl::string_view prefix) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, prefix) && line.size() > prefix.size() &&
        line[prefix.size()] == ' ') {
      double value = NAN;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(prefix.size() + 1), &value))
          << line;
      return value;
    }
  }
  ADD_FAILURE() << "no sample " << prefix << " in\n" << text;
  return NAN;
}

TEST(MetricsTest, CounterAndGaugeExposition) {
  MetricsRegistry registry;
  absl::StatusOr<CounterFamily*> sent =
      registry.AddCounter("swarm_models_sent_total", "Models sent.", {"peer"});
  ASSERT_TRUE(sent.ok()) << sent.status();
  absl::StatusOr<Counter*> to_b = (*sent)->WithLabels({"site-b"});
  ASSERT_TRUE(to_b.ok()) << to_b.status();
  ASSERT_TRUE((*to_b)->Inc().ok());
  ASSERT_TRUE((*to_b)->Inc(2).ok());
  // The same child again.
  EXPECT_EQ(*(*sent)->WithLabels({"site-b"}), *to_b);

  absl::StatusOr<GaugeFamily*> round = registry.AddGauge("swarm_round", "");
  ASSERT_TRUE(round.ok()) << round.status();
  Gauge* gauge = *(*round)->WithLabels({});
  gauge->Set(7);
  gauge->Add(-2.5);

  EXPECT_EQ(registry.Exposition(),
            "# HELP swarm_models_sent_total Models sent.\n"
            "# TYPE swarm_models_sent_total counter\n"
            "swarm_models_sent_total{peer=\"site-b\"} 3\n"
            "# HELP swarm_round \n"
            "# TYPE swarm_round gauge\n"
            "swarm_round 4.5\n");
}

TEST(MetricsTest, EscapesHelpAndLabelValues) {
  MetricsRegistry registry;
  CounterFamily* family = *registry.AddCounter(
      "errors_total", "Errors in C:\\tmp\nper \"site\".", {"site", "reason"});
  ASSERT_TRUE((*family->WithLabels({"hospital \"A\"", "a\\b\nc"}))->Inc().ok());
  const std::string text = registry.Exposition();
  // In HELP only backslash and newline are escaped, not the quote.
  EXPECT_THAT(text, HasSubstr("# HELP errors_total Errors in C:\\\\tmp\\nper "
                              "\"site\".\n"));
  EXPECT_THAT(text, HasSubstr("errors_total{site=\"hospital \\\"A\\\"\","
                              "reason=\"a\\\\b\\nc\"} 1\n"));
  EXPECT_EQ(EscapeLabelValue("site-b"), "site-b");
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  MetricsRegistry registry;
  absl::StatusOr<HistogramFamily*> family = registry.AddHistogram(
      "round_seconds", "Round duration.", {"peer"}, {0.5, 1, 2.5});
  ASSERT_TRUE(family.ok()) << family.status();
  Histogram* h = *(*family)->WithLabels({"site-b"});
  for (double v : {0.1, 0.5, 0.7, 2.5, 3.0, 100.0}) h->Observe(v);

  EXPECT_EQ(registry.Exposition(),
            "# HELP round_seconds Round duration.\n"
            "# TYPE round_seconds histogram\n"
            "round_seconds_bucket{peer=\"site-b\",le=\"0.5\"} 2\n"
            "round_seconds_bucket{peer=\"site-b\",le=\"1\"} 3\n"
            "round_seconds_bucket{peer=\"site-b\",le=\"2.5\"} 4\n"
            "round_seconds_bucket{peer=\"site-b\",le=\"+Inf\"} 6\n"
            "round_seconds_sum{peer=\"site-b\"} 106.8\n"
            "round_seconds_count{peer=\"site-b\"} 6\n");
}

TEST(MetricsTest, HistogramWithoutLabelsOrBounds) {
  MetricsRegistry registry;
  HistogramFamily* family = *registry.AddHistogram("h", "", {}, {});
  (*family->WithLabels({}))->Observe(-1);
  EXPECT_THAT(registry.Exposition(),
              HasSubstr("h_bucket{le=\"+Inf\"} 1\nh_sum -1\nh_count 1\n"));
}

TEST(MetricsTest, FormatsNumbersAsPrometheusReadsThem) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-0.0), "0");
  EXPECT_EQ(FormatMetricValue(42), "42");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(123456789012), "123456789012");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
  // Round trip where %g (6 digits) would lose precision.
  for (double v : {1.0 / 3, 123456.789012345, 2.5e-7, 0.1 + 0.2, 1e17}) {
    const std::string text = FormatMetricValue(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
}

TEST(MetricsTest, RejectsInvalidNamesNamingTheFieldAndRule) {
  MetricsRegistry registry;
  for (const char* name : {"", "1abc", "a-b", "a b", "é"}) {
    absl::StatusOr<CounterFamily*> c = registry.AddCounter(name, "");
    ASSERT_FALSE(c.ok()) << name;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr("metric name"));
    EXPECT_THAT(c.status().message(), HasSubstr("[a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  EXPECT_TRUE(registry.AddGauge("ns:sub_name_2", "").ok());
  EXPECT_TRUE(registry.AddGauge("_x", "", {"_y", "Peer9"}).ok());

  absl::Status s = registry.AddGauge("g", "", {"a:b"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("label name \"a:b\""));
  EXPECT_THAT(s.message(), HasSubstr("[a-zA-Z_][a-zA-Z0-9_]*"));
  s = registry.AddGauge("g", "", {"__name"}).status();
  EXPECT_THAT(s.message(), HasSubstr("\"__\" are reserved"));
  s = registry.AddGauge("g", "", {"peer", "peer"}).status();
  EXPECT_THAT(s.message(), HasSubstr("more than once"));
  s = registry.AddHistogram("h", "", {"le"}, {1}).status();
  EXPECT_THAT(s.message(), HasSubstr("label name \"le\""));
  s = registry.AddHistogram("h", "", {}, {2, 1}).status();
  EXPECT_THAT(s.message(), HasSubstr("strictly increasing"));
  s = registry.AddHistogram("h", "", {}, {1, INFINITY}).status();
  EXPECT_THAT(s.message(), HasSubstr("not finite"));
}

TEST(MetricsTest, WrongNumberOfLabelValues) {
  MetricsRegistry registry;
  CounterFamily* family = *registry.AddCounter("c", "", {"peer", "reason"});
  absl::StatusOr<Counter*> child = family->WithLabels({"site-b"});
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(child.status().message(), HasSubstr("got 1, want 2"));
  EXPECT_THAT(child.status().message(), HasSubstr("peer, reason"));
  EXPECT_FALSE(family->WithLabels({"a", "b", "c"}).ok());
}

TEST(MetricsTest, DuplicateFamilies) {
  MetricsRegistry registry;
  CounterFamily* first = *registry.AddCounter("x_total", "X.", {"peer"});
  // The same family again: the same object.
  EXPECT_EQ(*registry.AddCounter("x_total", "X.", {"peer"}), first);

  absl::Status s = registry.AddGauge("x_total", "X.", {"peer"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("a counter, not a gauge"));
  s = registry.AddCounter("x_total", "X.", {"site"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("label names (peer)"));
  s = registry.AddCallback("x_total", "", MetricType::kCounter,
                           [] { return 1; });
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(registry.AddHistogram("h", "", {}, {1, 2}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "", {}, {1, 3}).ok());
}

TEST(MetricsTest, CounterRefusesNegativeIncrements) {
  Counter counter;
  ASSERT_TRUE(counter.Inc(1.5).ok());
  absl::Status s = counter.Inc(-1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("counter increment -1"));
  EXPECT_FALSE(counter.Inc(NAN).ok());
  EXPECT_TRUE(counter.Inc(0).ok());
  EXPECT_EQ(counter.Value(), 1.5);
}

TEST(MetricsTest, OrderIsDeterministic) {
  // Registered and labelled in a scrambled order; exposed sorted by family
  // name, then by label values.
  auto build = [](bool reversed) {
    MetricsRegistry registry;
    std::vector<std::string> names = {"b_total", "a_total", "c_total"};
    std::vector<std::string> peers = {"site-c", "site-a", "site-b"};
    if (reversed) {
      std::reverse(names.begin(), names.end());
      std::reverse(peers.begin(), peers.end());
    }
    for (const std::string& name : names) {
      CounterFamily* family = *registry.AddCounter(name, "", {"peer"});
      for (const std::string& peer : peers) {
        EXPECT_TRUE((*family->WithLabels({peer}))->Inc().ok());
      }
    }
    return registry.Exposition();
  };
  const std::string text = build(false);
  EXPECT_EQ(text, build(true));
  const size_t a = text.find("a_total{peer=\"site-a\"}");
  const size_t b = text.find("a_total{peer=\"site-b\"}");
  const size_t c = text.find("a_total{peer=\"site-c\"}");
  const size_t next = text.find("# HELP b_total");
  ASSERT_NE(c, std::string::npos);
  EXPECT_LT(text.find("# HELP a_total"), a);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_LT(c, next);
  EXPECT_LT(next, text.find("# HELP c_total"));
}

TEST(MetricsTest, LabelledFamilyWithoutChildrenIsLeftOut) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddCounter("unused_total", "", {"peer"}).ok());
  ASSERT_TRUE(registry.AddCounter("plain_total", "").ok());
  EXPECT_EQ(registry.Exposition(),
            "# HELP plain_total \n# TYPE plain_total counter\nplain_total 0\n");
}

TEST(MetricsTest, ProcessMetricsArePresentAndPlausible) {
  MetricsRegistry registry;
  ASSERT_TRUE(RegisterProcessMetrics(&registry).ok());
  EXPECT_FALSE(RegisterProcessMetrics(&registry).ok());  // Already there.
  const std::string text = registry.Exposition();
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_threads gauge\n"));

  EXPECT_GT(SampleValue(text, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(SampleValue(text, "process_cpu_seconds_total"), 0);
  EXPECT_GE(SampleValue(text, "process_threads"), 1);
  EXPECT_GE(SampleValue(text, "process_open_fds"), 3);  // stdin/out/err.
  const double start = SampleValue(text, "process_start_time_seconds");
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(start, now - 24 * 3600.0 * 365);
  EXPECT_LE(start, now + 1);

  // Computed at exposition time: a new thread shows up.
  std::thread idle(
      [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
  EXPECT_GE(SampleValue(registry.Exposition(), "process_threads"), 2);
  idle.join();
}

TEST(MetricsTest, ConcurrentIncrementsAreExact) {
  MetricsRegistry registry;
  CounterFamily* family = *registry.AddCounter("hits_total", "", {"peer"});
  HistogramFamily* sizes = *registry.AddHistogram("sizes", "", {}, {10});
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Every thread looks the child up (creation races included).
        EXPECT_TRUE((*family->WithLabels({"site-b"}))->Inc().ok());
        (*sizes->WithLabels({}))->Observe(t);
        if (i % 5000 == 0) registry.Exposition();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ((*family->WithLabels({"site-b"}))->Value(), kThreads * kPerThread);
  const std::string text = registry.Exposition();
  EXPECT_EQ(SampleValue(text, "hits_total{peer=\"site-b\"}"),
            kThreads * kPerThread);
  EXPECT_EQ(SampleValue(text, "sizes_count"), kThreads * kPerThread);
  EXPECT_EQ(SampleValue(text, "sizes_sum"), kPerThread * (0 + 1 + 2 + 3));
}

}  // namespace
}  // namespace swarm
