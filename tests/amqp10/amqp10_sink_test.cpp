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
  envelope.database = "tenant-7";  // from a relay serving several databases
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
                                                    {"outbox-attempts", "2"},
                                                    {"outbox-target", envelope.target},
                                                    {"outbox-database", "tenant-7"}};
  EXPECT_EQ(m.properties, expected);
  EXPECT_EQ(m.property_types.at("outbox-database"), "string");
  EXPECT_EQ(m.property_types.at("outbox-stream-seq"), "long");
  EXPECT_EQ(m.property_types.at("outbox-partition"), "int");
  EXPECT_EQ(m.property_types.at("event_id"), "string");
  // What the inbox reads from it (inbox/amqp10.h).
  ASSERT_TRUE(m.delivery) << m.delivery_error;
  EXPECT_EQ(m.delivery->id, envelope.id);
  EXPECT_EQ(m.delivery->stream_key, "order-7");
  EXPECT_EQ(m.delivery->stream_seq, 42);
  EXPECT_EQ(m.delivery->stream_prev_seq, 40);
  EXPECT_EQ(m.delivery->target, envelope.target);
  EXPECT_TRUE(m.delivery->malformed.empty()) << m.delivery->malformed;
}

TEST(Amqp10SinkTest, ExternalEnvelopeSendsNoOutboxProperties) {
  Admin admin;
  const std::string queue = UniqueName("amqp10-ext");
  admin.DeclareQueue(queue);
  Envelope envelope = MakeEnvelope(queue);
  envelope.stream_key = "k";
  envelope.stream_seq = 1;
  envelope.database = "tenant-7";
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

// From a relay serving one database (an empty Envelope::database): no outbox-database property.
TEST(Amqp10SinkTest, NoDatabasePropertyFromARelayServingOneDatabase) {
  Admin admin;
  const std::string queue = UniqueName("amqp10-one-db");
  admin.DeclareQueue(queue);
  const std::vector<Envelope> batch{MakeEnvelope(queue)};
  auto sink = Open("/amq/queue/{topic}");
  ASSERT_TRUE(sink->Publish(batch, In(milliseconds{5000}))[0].published());
  const auto arrived = ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + queue, 1, kLimit, kIdle);
  ASSERT_EQ(arrived.size(), 1U);
  EXPECT_EQ(arrived[0].properties.count("outbox-target"), 1U) << "the full envelope";
  EXPECT_EQ(arrived[0].properties.count("outbox-database"), 0U);
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
  // The deadline covers the connection, the session and a link per queue too. With 2 s, once
  // (a full CI run of 2026-11-29, a loaded machine) neither open-queue message was sent; the cause
  // is not known, more time is the guess. The full queue's delivery gets no answer at any
  // deadline on RabbitMQ 3.10, so the test checks the same with 5 s.
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 3U);
  EXPECT_TRUE(outcomes[0].published()) << outcomes[0].failure->Describe();
  ASSERT_FALSE(outcomes[1].published());
  EXPECT_TRUE(outcomes[1].failure->kind == FailureKind::kOutcomeUnknown ||
              outcomes[1].failure->kind == FailureKind::kRejected)
      << outcomes[1].failure->Describe();
  EXPECT_TRUE(outcomes[2].published()) << outcomes[2].failure->Describe();
  EXPECT_EQ(ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + open, 2, kLimit, kIdle).size(), 2U);
}

// An address per message, more than the sink keeps links for (256): in the second round, to
// other addresses, the first round's idle links are closed to make room; everything is
// published.
TEST(Amqp10SinkTest, ManyAddressesArePublishedWithIdleLinksClosed) {
  const std::string stem = UniqueName("amqp10-many");
  // amq.direct with routing keys nothing is bound to: RabbitMQ 3.10 accepts and drops them.
  auto sink = Open("/exchange/amq.direct/{topic}");
  for (int round = 0; round < 2; ++round) {
    std::vector<Envelope> batch;
    for (int i = 0; i < 300; ++i) {
      batch.push_back(MakeEnvelope(stem + "-" + std::to_string(round) + "-" + std::to_string(i)));
    }
    const auto outcomes = sink->Publish(batch, In(milliseconds{20000}));
    ASSERT_EQ(outcomes.size(), batch.size());
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      ASSERT_TRUE(outcomes[i].published())
          << round << "/" << i << ": " << outcomes[i].failure->Describe();
    }
  }
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

// Issue #40: an exchange the relay's user may not write to is a state of the destination. The
// plugin refuses the link (amqp:unauthorized-access): unavailable, no attempt spent, while the
// messages to an exchange it may write (another link, another session) are published. A user of
// the test's own (scripts/services rabbitmqctl), deleted at the end.
TEST(Amqp10SinkTest, UnauthorizedAccessIsUnavailableAndOtherAddressesFlow) {
  Admin admin;
  const std::string denied = UniqueName("amqp10-denied");
  const std::string allowed = UniqueName("amqp10-allowed");
  const std::string queue = UniqueName("amqp10-allowed-q");
  admin.DeclareExchange(denied, "fanout");
  admin.DeclareExchange(allowed, "fanout");
  admin.DeclareQueue(queue);
  admin.Bind(queue, allowed, "");
  // Writes to `allowed` only.
  const TemporaryUser limited(UniqueName("outbox-amqp10-limited"), "limited-Pw-4031", "^$",
                              "^" + allowed + "$", ".*");
  const std::string& user = limited.name();
  const amqp10::Endpoint endpoint = amqp10::ParseUrl(Amqp10Url());
  amqp10::SinkOptions options;
  options.url =
      "amqp://" + user + ":limited-Pw-4031@" + endpoint.host + ":" + std::to_string(endpoint.port);
  options.address = "/exchange/{topic}/k";
  auto sink = amqp10::OpenSink(std::move(options));
  const std::vector<Envelope> batch{MakeEnvelope(allowed), MakeEnvelope(denied),
                                    MakeEnvelope(allowed)};
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 3U);
  EXPECT_TRUE(outcomes[0].published());
  ASSERT_FALSE(outcomes[1].published());
  EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kUnavailable)
      << outcomes[1].failure->Describe();
  EXPECT_FALSE(outcomes[1].failure->treatment().spends_attempt);
  EXPECT_NE(outcomes[1].failure->reason.find("amqp:unauthorized-access"), std::string::npos)
      << outcomes[1].failure->reason;
  EXPECT_TRUE(outcomes[2].published());
  EXPECT_EQ(ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + queue, 2, kLimit, kIdle).size(), 2U);
}

}  // namespace
}  // namespace outbox::testing
