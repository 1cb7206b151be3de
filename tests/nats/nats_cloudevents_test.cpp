// envelope = "cloudevents" on the NATS sink (issue #43): messages published to the shared
// JetStream server, read back from a stream of the test's own with a plain libnats client,
// rebuilt from the NATS binding (ce-* headers, percent-decoded; structured when Content-Type is
// application/cloudevents...) and validated by the official CloudEvents SDK for JavaScript.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nats_test_support.h"
#include "outbox/core/error.h"
#include "outbox/core/uuid.h"
#include "outbox/sink/nats.h"
#include "support/cloudevents_reader.h"

namespace outbox::testing {
namespace {

using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

Envelope MakeMessage(const std::string& topic, std::string payload) {
  return Envelope{.id = NewUuidV7(),
                  .topic = topic,
                  .payload = std::move(payload),
                  .created_at = std::chrono::system_clock::now()};
}

class NatsCloudEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string problem = EnsureCloudEventsSdk(); !problem.empty()) FAIL() << problem;
    client_.AddStream({.name = name_, .subjects = {subject_}});
  }
  void TearDown() override { client_.DeleteStream(name_); }

  nats::SinkOptions Options(cloudevents::Mode mode) const {
    nats::SinkOptions options;
    options.url = NatsUrl();
    options.subject = subject_;
    options.envelope = EnvelopeStyle::kCloudEvents;
    options.cloudevents.mode = mode;
    options.cloudevents.source = "nats://outbox/{target}";
    return options;
  }

  void PublishAndRead(cloudevents::Mode mode) {
    auto sink = nats::OpenSink(Options(mode));
    std::vector<Envelope> batch;
    batch.push_back(MakeMessage("orders", R"({"order":42})"));
    DecorateForCloudEvents(batch.back(), 9);
    batch.push_back(MakeMessage("orders", "plain text"));
    batch.back().content_type = "text/plain";
    for (const PublishOutcome& outcome : sink->Publish(batch, SteadyClock::now() + seconds{10})) {
      ASSERT_TRUE(outcome.published()) << outcome.failure->Describe();
    }
    const std::vector<StoredMessage> stored = client_.ReadAll(name_, seconds{20});
    ASSERT_EQ(stored.size(), batch.size());
    nlohmann::json messages = nlohmann::json::array();
    for (std::size_t i = 0; i < stored.size(); ++i) {
      nlohmann::json headers = nlohmann::json::object();
      for (const auto& [name, value] : stored[i].headers) {
        headers[name] = value;
        if (mode == cloudevents::Mode::kBinary) {
          EXPECT_TRUE(name.starts_with("ce-") || name == "Nats-Msg-Id") << name;
        }
      }
      EXPECT_EQ(stored[i].Header("Nats-Msg-Id"), batch[i].id.ToString());
      if (mode == cloudevents::Mode::kStructured) {
        EXPECT_EQ(stored[i].Header("Content-Type"), "application/cloudevents+json");
        EXPECT_EQ(headers.size(), 2U) << headers.dump();
      }
      messages.push_back(DeliveredMessage("nats", headers, stored[i].payload));
    }
    const nlohmann::json results = ReadWithCloudEventsSdk(messages);
    ASSERT_EQ(results.size(), batch.size());
    const bool structured = mode == cloudevents::Mode::kStructured;
    // The reader percent-decodes (the binding's rule), so values compare as they were.
    ExpectCloudEventOf(
        results[0], batch[0], "nats://outbox/default",
        structured ? nlohmann::json::parse(batch[0].payload) : nlohmann::json(batch[0].payload));
    ExpectCloudEventOf(results[1], batch[1], "nats://outbox/default", "plain text");
  }

  JetStreamClient client_;
  std::string name_ = UniqueName("CE");
  std::string subject_ = "outbox.ce." + name_;
};

TEST_F(NatsCloudEventsTest, BinaryModeIsAValidCloudEvent) {
  PublishAndRead(cloudevents::Mode::kBinary);
}

TEST_F(NatsCloudEventsTest, StructuredModeIsAValidCloudEvent) {
  PublishAndRead(cloudevents::Mode::kStructured);
}

TEST_F(NatsCloudEventsTest, EmptySourceIsPermanentAndBadOptionsAreRefused) {
  nats::SinkOptions options = Options(cloudevents::Mode::kBinary);
  options.cloudevents.source = "{type}";
  auto sink = nats::OpenSink(options);
  const std::vector<Envelope> batch{MakeMessage("orders", "{}")};
  const auto outcomes = sink->Publish(batch, SteadyClock::now() + seconds{10});
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[0].failure->reason.find("empty source"), std::string::npos);
  options.cloudevents.source = "";
  EXPECT_THROW(nats::ValidateOptions(options), ConfigError);
}

}  // namespace
}  // namespace outbox::testing
