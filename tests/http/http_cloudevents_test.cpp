// envelope = "cloudevents" on the HTTP sink (issue #43): requests to webhook_receiver.py (which
// checks their Standard Webhooks signature), parsed by the official CloudEvents SDK for JavaScript
// through its own HTTP binding (HTTP.toEvent), in binary and in structured mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "http_test_support.h"
#include "outbox/core/error.h"
#include "outbox/core/uuid.h"
#include "outbox/sink/http.h"
#include "support/cloudevents_reader.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

const std::string kSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

Envelope MakeMessage(const std::string& topic, std::string payload) {
  return Envelope{.id = NewUuidV7(),
                  .topic = topic,
                  .payload = std::move(payload),
                  .created_at = std::chrono::system_clock::now()};
}

class HttpCloudEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string problem = EnsureCloudEventsSdk(); !problem.empty()) FAIL() << problem;
  }

  webhook::SinkOptions Options(cloudevents::Mode mode) const {
    webhook::SinkOptions options;
    options.url = receiver_.BaseUrl() + "/hooks/{topic}";
    options.secrets = {kSecret};
    options.request_timeout = milliseconds{10000};
    options.http_version = webhook::HttpVersion::kHttp1;
    options.envelope = EnvelopeStyle::kCloudEvents;
    options.cloudevents.mode = mode;
    options.cloudevents.source = "https://shop.example/{target}";
    return options;
  }

  void PublishAndRead(cloudevents::Mode mode, const std::string& topic) {
    receiver_.CreateDestination(topic);
    auto sink = webhook::OpenSink(Options(mode));
    std::vector<Envelope> batch;
    batch.push_back(MakeMessage(topic, R"({"order":42,"lines":[1,2]})"));
    DecorateForCloudEvents(batch.back(), 11);
    batch.push_back(MakeMessage(topic, "plain text"));
    batch.back().content_type = "text/plain; charset=utf-8";
    batch.back().event_id = NewUuidV7();
    for (const PublishOutcome& outcome : sink->Publish(batch, SteadyClock::now() + seconds{10})) {
      ASSERT_TRUE(outcome.published()) << outcome.failure->Describe();
    }
    const std::vector<ReceivedRequest> received =
        receiver_.WaitForRequests(topic, batch.size(), seconds{10});
    ASSERT_EQ(received.size(), batch.size());
    // In batch order: the two messages share no stream, so the sink sends them side by side and
    // they may arrive in either order.
    std::vector<ReceivedRequest> requests;
    for (const Envelope& envelope : batch) {
      const auto found = std::find_if(
          received.begin(), received.end(),
          [&](const ReceivedRequest& request) { return request.id == envelope.id.ToString(); });
      ASSERT_NE(found, received.end()) << "no request for " << envelope.id.ToString();
      requests.push_back(*found);
    }
    nlohmann::json messages = nlohmann::json::array();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const ReceivedRequest& request = requests[i];
      EXPECT_EQ(request.signature_ok, true);  // signed over the body sent
      EXPECT_EQ(request.id, batch[i].id.ToString());
      nlohmann::json headers = nlohmann::json::object();
      for (const auto& [name, value] : request.headers) {
        headers[name] = value;
        EXPECT_FALSE(name.starts_with("outbox-") || name == "event_id" || name == "type" ||
                     name == "traceparent" || name == "x-trace-id")
            << name;
        if (mode == cloudevents::Mode::kStructured) {
          EXPECT_FALSE(name.starts_with("ce-")) << name;
        }
      }
      if (mode == cloudevents::Mode::kStructured) {
        EXPECT_EQ(request.Header("content-type"), "application/cloudevents+json");
      }
      messages.push_back(DeliveredMessage("http", headers, request.payload));
    }
    const nlohmann::json results = ReadWithCloudEventsSdk(messages);
    ASSERT_EQ(results.size(), batch.size());
    const bool binary = mode == cloudevents::Mode::kBinary;
    ExpectCloudEventOf(results[0], batch[0], "https://shop.example/default",
                       nlohmann::json::parse(batch[0].payload), binary);
    if (binary) {
      // The binding's percent-encoding, as it came over the wire.
      EXPECT_EQ(requests[0].Header("ce-correlationid"),
                "corr%201%20%22quoted%22%20100%25%20caf%C3%A9");
    }
    ExpectCloudEventOf(results[1], batch[1], "https://shop.example/default", "plain text", binary);
  }

  WebhookReceiver receiver_{{kSecret}};
};

TEST_F(HttpCloudEventsTest, BinaryModeIsReadByTheSdksHttpBinding) {
  PublishAndRead(cloudevents::Mode::kBinary, "ce-binary");
}

TEST_F(HttpCloudEventsTest, StructuredModeIsReadByTheSdksHttpBinding) {
  PublishAndRead(cloudevents::Mode::kStructured, "ce-structured");
}

TEST_F(HttpCloudEventsTest, EmptySourceIsPermanentAndBadOptionsAreRefused) {
  receiver_.CreateDestination("ce-empty");
  webhook::SinkOptions options = Options(cloudevents::Mode::kBinary);
  options.cloudevents.source = "{type}";
  auto sink = webhook::OpenSink(options);
  std::vector<Envelope> batch{MakeMessage("ce-empty", "{}")};
  const auto outcomes = sink->Publish(batch, SteadyClock::now() + seconds{10});
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[0].failure->reason.find("empty source"), std::string::npos);
  EXPECT_TRUE(receiver_.Requests("ce-empty").empty());

  options.cloudevents.source = "";
  EXPECT_THROW(webhook::ValidateOptions(options), ConfigError);
  options.cloudevents.source = "/x";
  options.headers = {{"CE-Source", "/mine"}};
  EXPECT_THROW(webhook::ValidateOptions(options), ConfigError);
}

}  // namespace
}  // namespace outbox::testing
