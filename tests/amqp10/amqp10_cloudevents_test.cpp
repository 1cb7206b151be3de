// envelope = "cloudevents" on the AMQP 1.0 sink (issue #43): messages sent to RabbitMQ's AMQP 1.0
// plugin, received by the tests' own Proton receiver, rebuilt from the AMQP binding
// (cloudEvents_ application properties, datacontenttype as content-type; structured when
// content-type is application/cloudevents+json) and validated by the official CloudEvents SDK
// for JavaScript.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "amqp10_test_support.h"
#include "outbox/core/error.h"
#include "outbox/sink/amqp10.h"
#include "rabbit_test_support.h"
#include "support/cloudevents_reader.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLimit{10000};
constexpr milliseconds kIdle{200};

class Amqp10CloudEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string problem = EnsureCloudEventsSdk(); !problem.empty()) FAIL() << problem;
  }

  static amqp10::SinkOptions Options(cloudevents::Mode mode) {
    amqp10::SinkOptions options;
    options.url = Amqp10Url();
    options.address = "/amq/queue/{topic}";
    options.envelope = EnvelopeStyle::kCloudEvents;
    options.cloudevents.mode = mode;
    options.cloudevents.source = "amqp://outbox/{target}";
    return options;
  }

  void PublishAndRead(cloudevents::Mode mode) {
    Admin admin;
    const std::string queue = UniqueName("amqp10-ce");
    admin.DeclareQueue(queue);
    auto sink = amqp10::OpenSink(Options(mode));
    std::vector<Envelope> batch;
    batch.push_back(MakeEnvelope(queue, R"({"order":42})"));
    DecorateForCloudEvents(batch.back(), 6);
    batch.push_back(MakeEnvelope(queue, "plain text"));
    batch.back().content_type = "text/plain";
    for (const PublishOutcome& outcome : sink->Publish(batch, In(milliseconds{5000}))) {
      ASSERT_TRUE(outcome.published()) << outcome.failure->Describe();
    }
    const auto arrived =
        ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + queue, batch.size(), kLimit, kIdle);
    ASSERT_EQ(arrived.size(), batch.size());
    nlohmann::json messages = nlohmann::json::array();
    for (std::size_t i = 0; i < arrived.size(); ++i) {
      const Amqp10Message& message = arrived[i];
      EXPECT_EQ(message.id, batch[i].id.ToString());
      EXPECT_TRUE(message.data_section);
      EXPECT_TRUE(message.subject.empty());
      nlohmann::json properties = nlohmann::json::object();
      for (const auto& [name, value] : message.properties) {
        EXPECT_TRUE(name.starts_with("cloudEvents_")) << name;
        EXPECT_EQ(message.property_types.at(name), "string") << name;
        properties[name] = value;
      }
      if (mode == cloudevents::Mode::kStructured) {
        EXPECT_TRUE(message.properties.empty());
        EXPECT_EQ(message.content_type, "application/cloudevents+json");
      }
      properties["content-type"] = message.content_type;
      messages.push_back(DeliveredMessage("amqp", properties, message.body));
    }
    const nlohmann::json results = ReadWithCloudEventsSdk(messages);
    ASSERT_EQ(results.size(), batch.size());
    ExpectCloudEventOf(results[0], batch[0], "amqp://outbox/default",
                       mode == cloudevents::Mode::kStructured
                           ? nlohmann::json::parse(batch[0].payload)
                           : nlohmann::json(batch[0].payload));
    ExpectCloudEventOf(results[1], batch[1], "amqp://outbox/default", "plain text");
  }
};

TEST_F(Amqp10CloudEventsTest, BinaryModeIsAValidCloudEvent) {
  PublishAndRead(cloudevents::Mode::kBinary);
}

TEST_F(Amqp10CloudEventsTest, StructuredModeIsAValidCloudEvent) {
  PublishAndRead(cloudevents::Mode::kStructured);
}

TEST_F(Amqp10CloudEventsTest, EmptySourceIsPermanentAndBadOptionsAreRefused) {
  amqp10::SinkOptions options = Options(cloudevents::Mode::kBinary);
  options.cloudevents.source = "{type}";
  auto sink = amqp10::OpenSink(options);
  const std::vector<Envelope> batch{MakeEnvelope(UniqueName("amqp10-ce-empty"))};
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[0].failure->reason.find("empty source"), std::string::npos);
  options.cloudevents.source = "";
  EXPECT_THROW(amqp10::ValidateOptions(options), ConfigError);
}

}  // namespace
}  // namespace outbox::testing
