// envelope = "cloudevents" on the Kafka sink (issue #43): records produced to librdkafka's mock
// cluster, read back by an independent librdkafka consumer, and parsed by the official
// CloudEvents SDK for JavaScript through its own Kafka binding (Kafka.toEvent), in binary and in
// structured mode.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kafka_test_support.h"
#include "outbox/core/error.h"
#include "outbox/sink/kafka.h"
#include "support/cloudevents_reader.h"

namespace outbox::testing {
namespace {

using std::chrono::seconds;

class KafkaCloudEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string problem = EnsureCloudEventsSdk(); !problem.empty()) FAIL() << problem;
  }

  kafka::SinkOptions Options(cloudevents::Mode mode) const {
    kafka::SinkOptions options;
    options.brokers = cluster_.bootstraps();
    options.properties = {{"log_level", "2"}};
    options.envelope = EnvelopeStyle::kCloudEvents;
    options.cloudevents.mode = mode;
    options.cloudevents.source = "/shop/{target}/{topic}";
    return options;
  }

  // Publishes a JSON, a text and a binary message, reads them back, and has the SDK read them.
  void PublishAndRead(cloudevents::Mode mode) {
    const std::string topic = "orders";
    cluster_.CreateTopic(topic, 1);
    auto sink = kafka::OpenSink(Options(mode));
    std::vector<Envelope> batch;
    batch.push_back(MakeEnvelope(topic, R"({"order":42,"total":"9.90"})"));
    DecorateForCloudEvents(batch.back(), 7);
    batch.push_back(MakeEnvelope(topic, "plain text"));
    batch.back().content_type = "text/plain";
    batch.back().event_id = NewUuidV7();  // a copy of a message written to several targets
    batch.push_back(MakeEnvelope(topic, std::string("\x00\x01\xfe", 3)));
    batch.back().content_type = "application/octet-stream";
    for (const PublishOutcome& outcome : sink->Publish(batch, In(seconds{10}))) {
      ASSERT_TRUE(outcome.published()) << outcome.failure->Describe();
    }

    Consumer consumer(cluster_.bootstraps());
    const std::vector<Record> records = consumer.ReadAll(topic, batch.size());
    ASSERT_EQ(records.size(), batch.size());
    nlohmann::json messages = nlohmann::json::array();
    for (const Record& record : records) {
      nlohmann::json headers = nlohmann::json::object();
      for (const auto& [name, value] : record.headers) {
        headers[name] = value;
        // Binary mode: only ce_* headers and content-type; no outbox header.
        if (mode == cloudevents::Mode::kBinary) {
          EXPECT_TRUE(name.starts_with("ce_") || name == "content-type") << name;
        }
      }
      if (mode == cloudevents::Mode::kStructured) {
        EXPECT_EQ(headers.value("content-type", ""), "application/cloudevents+json");
        EXPECT_EQ(headers.size(), 1U) << headers.dump();
      }
      nlohmann::json message = DeliveredMessage("kafka", headers, record.value);
      if (record.key) message["key"] = *record.key;
      messages.push_back(message);
    }
    EXPECT_EQ(records[0].key, "order-42");
    const nlohmann::json results = ReadWithCloudEventsSdk(messages);
    ASSERT_EQ(results.size(), batch.size());
    ExpectCloudEventOf(results[0], batch[0], "/shop/default/orders",
                       nlohmann::json::parse(batch[0].payload));
    ExpectCloudEventOf(results[1], batch[1], "/shop/default/orders", "plain text");
    EXPECT_NE(results[1]["event"].value("eventid", ""), batch[1].id.ToString());
    if (mode == cloudevents::Mode::kStructured) {
      // Bytes that are not UTF-8: data_base64 in the JSON event.
      ASSERT_TRUE(results[2].value("ok", false)) << results[2].dump();
      EXPECT_EQ(results[2]["event"].value("data_base64", ""), "AAH+");
    } else {
      ASSERT_TRUE(results[2].value("ok", false)) << results[2].dump();
      EXPECT_EQ(results[2]["event"].value("id", ""), batch[2].id.ToString());
    }
  }

  MockCluster cluster_{1};
};

TEST_F(KafkaCloudEventsTest, BinaryModeIsReadByTheSdksKafkaBinding) {
  PublishAndRead(cloudevents::Mode::kBinary);
}

TEST_F(KafkaCloudEventsTest, StructuredModeIsReadByTheSdksKafkaBinding) {
  PublishAndRead(cloudevents::Mode::kStructured);
}

TEST_F(KafkaCloudEventsTest, EmptySourceIsPermanentAndBadOptionsAreRefused) {
  cluster_.CreateTopic("t", 1);
  kafka::SinkOptions options = Options(cloudevents::Mode::kBinary);
  options.cloudevents.source = "{type}";
  auto sink = kafka::OpenSink(options);
  std::vector<Envelope> batch{MakeEnvelope("t")};  // no type: the source is empty
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[0].failure->reason.find("empty source"), std::string::npos)
      << outcomes[0].failure->reason;

  options.cloudevents.source = "";
  EXPECT_THROW(kafka::ValidateOptions(options), ConfigError);
  options.cloudevents.source = "/x/{nope}";
  EXPECT_THROW(kafka::ValidateOptions(options), ConfigError);
  options.cloudevents.source = "/x";
  options.header_style = kafka::HeaderStyle::kDebezium;
  EXPECT_THROW(kafka::ValidateOptions(options), ConfigError);
}

}  // namespace
}  // namespace outbox::testing
