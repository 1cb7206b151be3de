// envelope = "cloudevents" on the Redis sink (issue #43): entries added to the shared server, read
// back with XRANGE by the tests' own hiredis connection, rebuilt from the documented mapping (no
// CloudEvents binding exists for Redis: ce_<attribute> fields, the data in `data`;
// docs/cloudevents.md) and validated by the official CloudEvents SDK for JavaScript.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/sink/redis.h"
#include "redis_test_support.h"
#include "support/cloudevents_reader.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

class RedisCloudEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string problem = EnsureCloudEventsSdk(); !problem.empty()) FAIL() << problem;
  }
  void TearDown() override { client_.DeletePrefix(prefix_); }

  redis::SinkOptions Options() const {
    redis::SinkOptions options;
    options.url = RedisUrl();
    options.dedup_prefix = prefix_ + "dedup:";
    options.stream = prefix_ + "{topic}";
    options.envelope = EnvelopeStyle::kCloudEvents;
    options.cloudevents.source = "redis://outbox/{target}";
    return options;
  }

  std::string prefix_ = UniqueKey("ce") + ":";
  RedisClient client_;
};

TEST_F(RedisCloudEventsTest, EntryFieldsRebuildAValidCloudEvent) {
  auto sink = redis::OpenSink(Options());
  std::vector<Envelope> batch;
  batch.push_back(MakeEnvelope("orders", R"({"order":42})"));
  DecorateForCloudEvents(batch.back(), 3);
  batch.push_back(MakeEnvelope("orders", "plain text"));
  batch.back().content_type = "text/plain";
  for (const PublishOutcome& outcome : sink->Publish(batch, In(milliseconds{5000}))) {
    ASSERT_TRUE(outcome.published()) << outcome.failure->Describe();
  }
  const std::vector<StreamEntry> entries = client_.ReadStream(prefix_ + "orders");
  ASSERT_EQ(entries.size(), batch.size());
  nlohmann::json messages = nlohmann::json::array();
  for (const StreamEntry& entry : entries) {
    nlohmann::json fields = nlohmann::json::object();
    for (const auto& [name, value] : entry.fields) {
      EXPECT_TRUE(name.starts_with("ce_") || name == "data") << name;
      if (name != "data") fields[name] = value;
    }
    messages.push_back(DeliveredMessage("redis", fields, entry.Field("data").value_or("")));
  }
  const nlohmann::json results = ReadWithCloudEventsSdk(messages);
  ASSERT_EQ(results.size(), batch.size());
  ExpectCloudEventOf(results[0], batch[0], "redis://outbox/default", batch[0].payload);
  ExpectCloudEventOf(results[1], batch[1], "redis://outbox/default", "plain text");

  // Deduplication still keys on the message id: published again, nothing is added.
  for (const PublishOutcome& outcome : sink->Publish(batch, In(milliseconds{5000}))) {
    EXPECT_TRUE(outcome.published());
  }
  EXPECT_EQ(client_.Length(prefix_ + "orders"), 2);
}

TEST_F(RedisCloudEventsTest, EmptySourceIsPermanentAndBadOptionsAreRefused) {
  redis::SinkOptions options = Options();
  options.cloudevents.source = "{type}";
  auto sink = redis::OpenSink(options);
  const std::vector<Envelope> batch{MakeEnvelope("orders")};
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[0].failure->reason.find("empty source"), std::string::npos);
  EXPECT_EQ(client_.Length(prefix_ + "orders"), 0);
  options.cloudevents.source = "/x";
  options.cloudevents.mode = cloudevents::Mode::kStructured;
  EXPECT_THROW(redis::ValidateOptions(options), ConfigError);
}

}  // namespace
}  // namespace outbox::testing
