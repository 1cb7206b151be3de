// envelope = "cloudevents" on the RabbitMQ sink (issue #43): messages published to the real
// broker, consumed back by the tests' own AMQP 0-9-1 connection, rebuilt from the documented
// mapping (the AMQP binding's cloudEvents_ application properties, here the headers table;
// datacontenttype as content_type) and validated by the official CloudEvents SDK for JavaScript;
// structured mode read as the JSON event format.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/sink/rabbitmq.h"
#include "rabbit_test_support.h"
#include "support/cloudevents_reader.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

class RabbitCloudEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string problem = EnsureCloudEventsSdk(); !problem.empty()) FAIL() << problem;
  }

  static rabbitmq::SinkOptions Options(cloudevents::Mode mode) {
    rabbitmq::SinkOptions options;
    options.url = AmqpUrl();
    options.envelope = EnvelopeStyle::kCloudEvents;
    options.cloudevents.mode = mode;
    options.cloudevents.source = "/rabbit/{topic}";
    return options;
  }

  void PublishAndRead(cloudevents::Mode mode) {
    Admin admin;
    const std::string queue = UniqueName("ce");
    admin.DeclareQueue(queue);
    auto sink = rabbitmq::OpenSink(Options(mode));
    std::vector<Envelope> batch;
    batch.push_back(MakeEnvelope(queue, R"({"order":42})"));
    DecorateForCloudEvents(batch.back(), 5);
    batch.push_back(MakeEnvelope(queue, "plain text"));
    batch.back().content_type = "text/plain";
    for (const PublishOutcome& outcome : sink->Publish(batch, In(milliseconds{5000}))) {
      ASSERT_TRUE(outcome.published()) << outcome.failure->Describe();
    }
    const std::vector<Received> received = admin.Consume(queue, batch.size());
    ASSERT_EQ(received.size(), batch.size());
    nlohmann::json messages = nlohmann::json::array();
    for (std::size_t i = 0; i < received.size(); ++i) {
      const Received& message = received[i];
      EXPECT_EQ(message.message_id, batch[i].id.ToString());
      EXPECT_TRUE(message.type.empty());
      nlohmann::json headers = nlohmann::json::object();
      for (const auto& [name, value] : message.headers) {
        EXPECT_TRUE(name.starts_with("cloudEvents_")) << name;
        EXPECT_EQ(message.header_kinds.at(name), 'S') << name;
        headers[name] = value;
      }
      if (mode == cloudevents::Mode::kStructured) {
        EXPECT_TRUE(message.headers.empty());
        EXPECT_EQ(message.content_type, "application/cloudevents+json");
      }
      headers["content-type"] = message.content_type;
      messages.push_back(DeliveredMessage("amqp", headers, message.body));
    }
    const nlohmann::json results = ReadWithCloudEventsSdk(messages);
    ASSERT_EQ(results.size(), batch.size());
    const std::string source = "/rabbit/" + queue;
    // Rebuilt from binary mode the data is the body as text; structured mode embeds JSON.
    ExpectCloudEventOf(results[0], batch[0], source,
                       mode == cloudevents::Mode::kStructured
                           ? nlohmann::json::parse(batch[0].payload)
                           : nlohmann::json(batch[0].payload));
    ExpectCloudEventOf(results[1], batch[1], source, "plain text");
  }
};

TEST_F(RabbitCloudEventsTest, BinaryModeIsAValidCloudEvent) {
  PublishAndRead(cloudevents::Mode::kBinary);
}

TEST_F(RabbitCloudEventsTest, StructuredModeIsAValidCloudEvent) {
  PublishAndRead(cloudevents::Mode::kStructured);
}

TEST_F(RabbitCloudEventsTest, EmptySourceIsPermanentAndBadOptionsAreRefused) {
  rabbitmq::SinkOptions options = Options(cloudevents::Mode::kBinary);
  options.cloudevents.source = "{type}";
  auto sink = rabbitmq::OpenSink(options);
  const std::vector<Envelope> batch{MakeEnvelope(UniqueName("ce-empty"))};
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[0].failure->reason.find("empty source"), std::string::npos);
  options.cloudevents.source = "/{nope}";
  EXPECT_THROW(rabbitmq::ValidateOptions(options), ConfigError);
}

}  // namespace
}  // namespace outbox::testing
