// The AMQP 1.0 sink against RabbitMQ's plugin, beyond the contract suite: what a consumer
// receives (sink/amqp10.h's mapping, read by a Proton receiver of its own), the envelope styles,
// a full queue, and refused credentials.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "amqp10_test_support.h"
#include "outbox/sink/amqp10.h"
#include "rabbit_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLimit{10000};
constexpr milliseconds kIdle{200};

std::unique_ptr<Sink> Open(const std::string& address,
                           EnvelopeStyle envelope = EnvelopeStyle::kFull) {
  amqp10::SinkOptions options;
  options.url = Amqp10Url();
  options.address = address;
  options.envelope = envelope;
  return amqp10::OpenSink(std::move(options));
}

TEST(Amqp10SinkTest, ConsumerReceivesTheDocumentedMessage) {
  Admin admin;
  const std::string queue = UniqueName("amqp10-map");
  admin.DeclareQueue(queue);
  Envelope envelope = MakeEnvelope(queue, std::string("\x00\x01 bytes \xff", 10));
  envelope.content_type = "application/octet-stream";
  envelope.type = "OrderPlaced";
  envelope.stream_key = "order-7";
  envelope.stream_seq = 42;
  envelope.stream_prev_seq = 40;
  envelope.partition = 3;
  envelope.attempts = 2;
  envelope.event_id = NewUuidV7();
  envelope.headers = {
      {"correlation_id", "corr-1"}, {"traceparent", "00-abc-def-01"}, {"outbox-topic", "forged"}};
  envelope.created_at = std::chrono::system_clock::time_point{milliseconds{1700000000123}};
  const std::vector<Envelope> batch{envelope};
  auto sink = Open("/amq/queue/{topic}");
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_TRUE(outcomes[0].published()) << outcomes[0].failure->Describe();

  const auto arrived = ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + queue, 1, kLimit, kIdle);
  ASSERT_EQ(arrived.size(), 1U);
  const Amqp10Message& m = arrived[0];
  EXPECT_EQ(m.id, envelope.id.ToString());
  EXPECT_EQ(m.group_id, "order-7");
  EXPECT_EQ(m.group_sequence, 42);
  EXPECT_EQ(m.partition_key, "order-7");
  EXPECT_EQ(m.subject, "OrderPlaced");
  EXPECT_EQ(m.content_type, "application/octet-stream");
  EXPECT_EQ(m.correlation_id, "corr-1");
  EXPECT_EQ(m.creation_time_ms, 1700000000123);
  EXPECT_TRUE(m.durable);
  EXPECT_TRUE(m.data_section) << "the body is not a data section";
  EXPECT_EQ(m.body, envelope.payload);
  const std::map<std::string, std::string> expected{{"correlation_id", "corr-1"},
                                                    {"traceparent", "00-abc-def-01"},
                                                    {"event_id", envelope.event_id->ToString()},
                                                    {"outbox-topic", queue},
                                                    {"outbox-stream-key", "order-7"},
                                                    {"outbox-stream-seq", "42"},
                                                    {"outbox-stream-prev-seq", "40"},
                                                    {"outbox-partition", "3"},
                                                    {"outbox-attempts", "2"}};
  EXPECT_EQ(m.properties, expected);
  EXPECT_EQ(m.property_types.at("outbox-stream-seq"), "long");
  EXPECT_EQ(m.property_types.at("outbox-partition"), "int");
  EXPECT_EQ(m.property_types.at("event_id"), "string");
}

TEST(Amqp10SinkTest, ExternalEnvelopeSendsNoOutboxProperties) {
  Admin admin;
  const std::string queue = UniqueName("amqp10-ext");
  admin.DeclareQueue(queue);
  Envelope envelope = MakeEnvelope(queue);
  envelope.stream_key = "k";
  envelope.stream_seq = 1;
  envelope.headers = {{"tenant_id", "t1"}};
  const std::vector<Envelope> batch{envelope};
  auto sink = Open("/amq/queue/{topic}", EnvelopeStyle::kExternal);
  ASSERT_TRUE(sink->Publish(batch, In(milliseconds{5000}))[0].published());
  const auto arrived = ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + queue, 1, kLimit, kIdle);
  ASSERT_EQ(arrived.size(), 1U);
  const std::map<std::string, std::string> expected{{"tenant_id", "t1"},
                                                    {"event_id", envelope.id.ToString()}};
  EXPECT_EQ(arrived[0].properties, expected);
  EXPECT_EQ(arrived[0].id, envelope.id.ToString());
}

// A queue full with x-overflow=reject-publish: RabbitMQ 3.10's plugin gives that delivery no
// disposition at all (its AMQP 0-9-1 side nacks it; RabbitMQ 4 answers `rejected`), so it is
// outcome-unknown at the deadline and published again later, while the rest of the batch is
// published: one delivery without an answer holds nothing else up.
TEST(Amqp10SinkTest, FullQueueOnRabbitMq310IsOutcomeUnknownForThatMessageOnly) {
  Admin admin;
  const std::string full = UniqueName("amqp10-full");
  const std::string open = UniqueName("amqp10-open");
  admin.DeclareQueue(
      full, {{"x-max-length", std::int64_t{0}}, {"x-overflow", std::string{"reject-publish"}}});
  admin.DeclareQueue(open);
  std::vector<Envelope> batch{MakeEnvelope(open), MakeEnvelope(full), MakeEnvelope(open)};
  auto sink = Open("/amq/queue/{topic}");
  const auto outcomes = sink->Publish(batch, In(milliseconds{2000}));
  ASSERT_EQ(outcomes.size(), 3U);
  EXPECT_TRUE(outcomes[0].published());
  ASSERT_FALSE(outcomes[1].published());
  EXPECT_TRUE(outcomes[1].failure->kind == FailureKind::kOutcomeUnknown ||
              outcomes[1].failure->kind == FailureKind::kRejected)
      << outcomes[1].failure->Describe();
  EXPECT_TRUE(outcomes[2].published());
  EXPECT_EQ(ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + open, 2, kLimit, kIdle).size(), 2U);
}

// Credentials the broker refuses: unavailable, with SASL's reason, and nothing sent.
TEST(Amqp10SinkTest, RefusedCredentialsAreUnavailable) {
  const amqp10::Endpoint endpoint = amqp10::ParseUrl(Amqp10Url());
  amqp10::SinkOptions options;
  options.url =
      "amqp://guest:wrong-password@" + endpoint.host + ":" + std::to_string(endpoint.port);
  options.address = "/queue/{topic}";
  auto sink = amqp10::OpenSink(std::move(options));
  const std::vector<Envelope> batch{MakeEnvelope(UniqueName("amqp10-auth"))};
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kUnavailable)
      << outcomes[0].failure->Describe();
  EXPECT_EQ(outcomes[0].failure->reason.find("wrong-password"), std::string::npos);
}

}  // namespace
}  // namespace outbox::testing
