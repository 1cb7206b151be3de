#include "outbox/observe/metrics.h"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace outbox::observe {
namespace {

TEST(MetricsTest, CounterRendersHelpTypeAndValue) {
  Registry registry;
  registry.AddCounter("outbox_published_total", "Messages published.").Increment(3);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP outbox_published_total Messages published.\n"
            "# TYPE outbox_published_total counter\n"
            "outbox_published_total 3\n");
}

TEST(MetricsTest, LabelledSeriesShareOneHeaderInRegistrationOrder) {
  Registry registry;
  Counter& rejected = registry.AddCounter("failures_total", "Failures.", {{"reason", "rejected"}});
  registry.AddCounter("failures_total", "ignored: the first help wins",
                      {{"reason", "unavailable"}});
  rejected.Increment();
  EXPECT_EQ(&registry.AddCounter("failures_total", "", {{"reason", "rejected"}}), &rejected);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP failures_total Failures.\n"
            "# TYPE failures_total counter\n"
            "failures_total{reason=\"rejected\"} 1\n"
            "failures_total{reason=\"unavailable\"} 0\n");
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  Registry registry;
  registry.AddGauge("g", "a \\ back\nslash \"quoted\"", {{"a", "x\\y\"z\nw"}, {"b", "ü"}}).Set(1.5);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP g a \\\\ back\\nslash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g{a=\"x\\\\y\\\"z\\nw\",b=\"ü\"} 1.5\n");
}

TEST(MetricsTest, GaugeNumbersUsePrometheusSpellings) {
  Registry registry;
  Gauge& gauge = registry.AddGauge("g", "h");
  const auto render = [&] {
    const std::string text = registry.RenderPrometheus();
    return text.substr(text.rfind("\ng ") + 3);
  };
  gauge.Set(0.1);
  EXPECT_EQ(render(), "0.1\n");
  gauge.Set(-2);
  EXPECT_EQ(render(), "-2\n");
  gauge.Add(5);
  EXPECT_EQ(render(), "3\n");
  gauge.Set(std::numeric_limits<double>::infinity());
  EXPECT_EQ(render(), "+Inf\n");
  gauge.Set(-std::numeric_limits<double>::infinity());
  EXPECT_EQ(render(), "-Inf\n");
  gauge.Set(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(render(), "NaN\n");
  EXPECT_NE(registry.RenderJson().find("\"value\":null"), std::string::npos);
}

TEST(MetricsTest, HistogramRendersCumulativeBucketsSumAndCount) {
  Registry registry;
  Histogram& histogram = registry.AddHistogram("latency_seconds", "Latency.", {0.0625, 0.25, 1},
                                               {{"sink", "default"}});
  // Exact binary fractions, so that the sum is exact; a value on a bound counts in its bucket.
  for (const double value : {0.03125, 0.0625, 0.125, 0.5, 7.0}) histogram.Observe(value);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP latency_seconds Latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{sink=\"default\",le=\"0.0625\"} 2\n"
            "latency_seconds_bucket{sink=\"default\",le=\"0.25\"} 3\n"
            "latency_seconds_bucket{sink=\"default\",le=\"1\"} 4\n"
            "latency_seconds_bucket{sink=\"default\",le=\"+Inf\"} 5\n"
            "latency_seconds_sum{sink=\"default\"} 7.71875\n"
            "latency_seconds_count{sink=\"default\"} 5\n");
}

TEST(MetricsTest, UnlabelledHistogramHasOnlyTheLeLabel) {
  Registry registry;
  registry.AddHistogram("sizes", "Sizes.", {1, 10}).Observe(3);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP sizes Sizes.\n"
            "# TYPE sizes histogram\n"
            "sizes_bucket{le=\"1\"} 0\n"
            "sizes_bucket{le=\"10\"} 1\n"
            "sizes_bucket{le=\"+Inf\"} 1\n"
            "sizes_sum 3\n"
            "sizes_count 1\n");
}

TEST(MetricsTest, RenderJsonHoldsTheSameData) {
  Registry registry;
  registry.AddCounter("c_total", "C \"help\"", {{"reason", "rejected"}}).Increment(2);
  registry.AddGauge("g", "G").Set(0.25);
  registry.AddHistogram("h", "H", {1, 2}).Observe(1.5);
  registry.RecordError("rejected", "nacked: \"queue\" full\n\x01\xff");
  const std::string json = registry.RenderJson();
  EXPECT_EQ(json.substr(0, json.find("\"recent_errors\"")),
            "{\"metrics\":{"
            "\"c_total\":{\"type\":\"counter\",\"help\":\"C \\\"help\\\"\",\"series\":["
            "{\"labels\":{\"reason\":\"rejected\"},\"value\":2}]},"
            "\"g\":{\"type\":\"gauge\",\"help\":\"G\",\"series\":[{\"labels\":{},\"value\":0.25}]},"
            "\"h\":{\"type\":\"histogram\",\"help\":\"H\",\"series\":[{\"labels\":{},\"buckets\":["
            "{\"le\":1,\"count\":0},{\"le\":2,\"count\":1},{\"le\":\"+Inf\",\"count\":1}],"
            "\"sum\":1.5,\"count\":1}]}},");
  EXPECT_NE(json.find("\"kind\":\"rejected\",\"message\":\"nacked: \\\"queue\\\" "
                      "full\\n\\u0001\\ufffd\"}]}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"recent_errors\":[{\"time\":\"20"), std::string::npos) << json;
}

TEST(MetricsTest, RecentErrorsKeepTheLastFewAndCutLongMessages) {
  Registry registry;
  for (std::size_t i = 0; i < Registry::kMaxRecentErrors + 5; ++i) {
    registry.RecordError("store", "error " + std::to_string(i));
  }
  registry.RecordError("store", std::string(10000, 'x'));
  const auto errors = registry.RecentErrors();
  ASSERT_EQ(errors.size(), Registry::kMaxRecentErrors);
  EXPECT_EQ(errors.front().message, "error 6");
  EXPECT_EQ(errors.back().message.size(), Registry::kMaxErrorMessageBytes);
}

TEST(MetricsTest, BadNamesAndInconsistentFamiliesAreRefused) {
  Registry registry;
  EXPECT_THROW(registry.AddCounter("1abc", "h"), std::invalid_argument);
  EXPECT_THROW(registry.AddCounter("a-b", "h"), std::invalid_argument);
  EXPECT_THROW(registry.AddCounter("ok", "h", {{"__reserved", "x"}}), std::invalid_argument);
  EXPECT_THROW(registry.AddCounter("ok", "h", {{"a", "x"}, {"a", "y"}}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("hist", "h", {1}, {{"le", "x"}}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("hist", "h", {2, 1}), std::invalid_argument);
  registry.AddCounter("c", "h", {{"reason", "a"}});
  EXPECT_THROW(registry.AddGauge("c", "h", {{"reason", "a"}}), std::invalid_argument);
  EXPECT_THROW(registry.AddCounter("c", "h", {{"other", "a"}}), std::invalid_argument);
  registry.AddHistogram("hist", "h", {1, 2});
  EXPECT_THROW(registry.AddHistogram("hist", "h", {1, 3}), std::invalid_argument);
}

TEST(MetricsTest, CardinalityIsBounded) {
  Registry registry;
  for (std::size_t i = 0; i < Registry::kMaxSeriesPerFamily; ++i) {
    registry.AddCounter("c", "h", {{"k", std::to_string(i)}});
  }
  EXPECT_THROW(registry.AddCounter("c", "h", {{"k", "one too many"}}), std::length_error);
}

// A family with one series per configured target holds as many as the configuration has: the
// rule SeriesPerTarget, granted by AllowSeries (outboxd with 65 sinks exited with "metric
// outbox_relay_target_paused has too many series").
TEST(MetricsTest, AFamilyPerTargetFollowsTheConfiguration) {
  EXPECT_EQ(SeriesPerTarget(1, 1), Registry::kMaxSeriesPerFamily);
  EXPECT_EQ(SeriesPerTarget(1, 65), 65U);
  EXPECT_EQ(SeriesPerTarget(3, 500), 1500U);
  EXPECT_EQ(SeriesPerTarget(0, 0), Registry::kMaxSeriesPerFamily);
  EXPECT_EQ(SeriesPerTarget(std::numeric_limits<std::size_t>::max(), 2),
            std::numeric_limits<std::size_t>::max());

  Registry registry;
  registry.AllowSeries("paused", SeriesPerTarget(1, 500));
  registry.AllowSeries("paused", 10);  // the largest grant holds
  for (std::size_t i = 0; i < 500; ++i) {
    registry.AddGauge("paused", "h", {{"target", "t" + std::to_string(i)}});
  }
  try {
    registry.AddGauge("paused", "h", {{"target", "one too many"}});
    ADD_FAILURE() << "no limit";
  } catch (const std::length_error& error) {
    EXPECT_STREQ(error.what(), "metric paused has too many series (at most 500)");
  }
  // Other families keep the fixed limit; a grant below it does not lower it.
  registry.AllowSeries("small", 3);
  for (std::size_t i = 0; i < Registry::kMaxSeriesPerFamily; ++i) {
    registry.AddCounter("small", "h", {{"k", std::to_string(i)}});
    registry.AddCounter("other", "h", {{"k", std::to_string(i)}});
  }
  EXPECT_THROW(registry.AddCounter("small", "h", {{"k", "x"}}), std::length_error);
  EXPECT_THROW(registry.AddCounter("other", "h", {{"k", "x"}}), std::length_error);
  // ReplaceGauges keeps to the same limits.
  std::vector<std::pair<Labels, double>> series;
  for (std::size_t i = 0; i < 200; ++i) series.push_back({{{"topic", std::to_string(i)}}, 1});
  EXPECT_THROW(registry.ReplaceGauges("replaced", "h", series), std::length_error);
  registry.AllowSeries("replaced", SeriesPerTarget(2, 100));
  registry.ReplaceGauges("replaced", "h", series);
  EXPECT_NE(registry.RenderPrometheus().find("replaced{topic=\"199\"} 1\n"), std::string::npos);
}

TEST(MetricsTest, ReplacedGaugesAreSwappedAsAWholeAndStayBounded) {
  Registry registry;
  registry.AddGauge("before", "h").Set(1);
  registry.ReplaceGauges("by_topic", "Counts.", {});
  registry.AddGauge("after", "h").Set(2);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP before h\n# TYPE before gauge\nbefore 1\n"
            "# HELP by_topic Counts.\n# TYPE by_topic gauge\n"
            "# HELP after h\n# TYPE after gauge\nafter 2\n");
  registry.ReplaceGauges("by_topic", "ignored", {{{{"topic", "a"}}, 3}, {{{"topic", "b"}}, 4}});
  EXPECT_NE(
      registry.RenderPrometheus().find(
          "# TYPE by_topic gauge\nby_topic{topic=\"a\"} 3\nby_topic{topic=\"b\"} 4\n# HELP after"),
      std::string::npos)
      << registry.RenderPrometheus();
  registry.ReplaceGauges("by_topic", "", {{{{"topic", "c"}}, 5}});
  const std::string text = registry.RenderPrometheus();
  EXPECT_NE(text.find("by_topic{topic=\"c\"} 5\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("topic=\"a\""), std::string::npos) << text;
  EXPECT_NE(registry.RenderJson().find("\"by_topic\":{\"type\":\"gauge\",\"help\":\"Counts.\","
                                       "\"series\":[{\"labels\":{\"topic\":\"c\"},\"value\":5}]}"),
            std::string::npos)
      << registry.RenderJson();

  std::vector<std::pair<Labels, double>> too_many;
  for (std::size_t i = 0; i <= Registry::kMaxSeriesPerFamily; ++i) {
    too_many.push_back({{{"topic", std::to_string(i)}}, 1});
  }
  EXPECT_THROW(registry.ReplaceGauges("by_topic", "", too_many), std::length_error);
  EXPECT_THROW(registry.ReplaceGauges("by_topic", "", {{{{"a", "1"}}, 1}, {{{"b", "1"}}, 1}}),
               std::invalid_argument);
  EXPECT_THROW(registry.ReplaceGauges("before", "", {}), std::invalid_argument);
  EXPECT_THROW(registry.AddGauge("by_topic", "h", {{"topic", "x"}}), std::invalid_argument);
  EXPECT_THROW(registry.ReplaceGauges("bad name", "", {}), std::invalid_argument);
  EXPECT_NE(registry.RenderPrometheus().find("by_topic{topic=\"c\"} 5\n"), std::string::npos);
}

TEST(MetricsTest, ConcurrentUpdatesAndRendersAreConsistent) {
  Registry registry;
  Counter& counter = registry.AddCounter("c_total", "h");
  Histogram& histogram = registry.AddHistogram("h", "h", LatencyBuckets());
  constexpr int kThreads = 4;
  constexpr int kEach = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        counter.Increment();
        histogram.Observe(0.002);
      }
    });
  }
  for (int i = 0; i < 50; ++i) {
    const Histogram::Snapshot snapshot = histogram.Read();
    EXPECT_EQ(snapshot.cumulative.back(), snapshot.count);
    (void)registry.RenderPrometheus();
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(counter.value(), std::uint64_t{kThreads} * kEach);
  EXPECT_EQ(histogram.Read().count, std::uint64_t{kThreads} * kEach);
  EXPECT_NEAR(histogram.Read().sum, 0.002 * kThreads * kEach, 1e-6);
}

}  // namespace
}  // namespace outbox::observe
