// The RabbitMQ sink against a real broker: what arrives, in what order, and how every refusal and
// outage is reported. Each test declares its own queues and exchanges and reads them back through
// a separate rabbitmq-c connection (Admin), so a "published" outcome is checked against what the
// broker actually holds: no loss, no phantom.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/name_template.h"
#include "outbox/sink/rabbitmq.h"
#include "rabbit_test_support.h"
#include "support/envelope_fields.h"
#include "support/header_limits.h"
#include "support/tcp_proxy.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

rabbitmq::SinkOptions Options() {
  rabbitmq::SinkOptions options;
  options.url = AmqpUrl();
  return options;
}

std::unique_ptr<Sink> Open(rabbitmq::SinkOptions options = Options()) {
  return rabbitmq::OpenSink(std::move(options));
}

std::string Describe(const PublishOutcome& outcome) {
  return outcome.published() ? "published" : outcome.failure->Describe();
}

void ExpectAllPublished(const std::vector<PublishOutcome>& outcomes,
                        std::span<const Envelope> batch) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id) << "outcome " << i << " out of batch order";
    EXPECT_TRUE(outcomes[i].published()) << "message " << i << ": " << Describe(outcomes[i]);
  }
}

std::vector<std::string> Ids(const std::vector<Received>& received) {
  std::vector<std::string> ids;
  for (const Received& message : received) ids.push_back(message.message_id);
  return ids;
}

std::vector<std::string> Ids(std::span<const Envelope> batch) {
  std::vector<std::string> ids;
  for (const Envelope& envelope : batch) ids.push_back(envelope.id.ToString());
  return ids;
}

// No phantom: every message reported published is in the queue.
void ExpectPublishedAreDelivered(const std::vector<PublishOutcome>& outcomes,
                                 const std::vector<Received>& received) {
  std::set<std::string> delivered;
  for (const Received& message : received) delivered.insert(message.message_id);
  for (const PublishOutcome& outcome : outcomes) {
    if (outcome.published()) {
      EXPECT_TRUE(delivered.contains(outcome.id.ToString()))
          << outcome.id.ToString() << " reported published but not in the queue";
    }
  }
}

TEST(RabbitSinkOptionsTest, InvalidOptionsThrowConfigErrorNamingTheKey) {
  const auto expect_key = [](const std::string& key, auto mutate) {
    rabbitmq::SinkOptions options = Options();
    mutate(options);
    try {
      rabbitmq::OpenSink(options);
      ADD_FAILURE() << "no ConfigError for " << key;
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key(), key) << error.what();
      EXPECT_EQ(std::string{error.what()}.find("s3cret"), std::string::npos) << error.what();
    }
  };
  expect_key("url", [](auto& o) { o.url = "http://guest:s3cret@localhost/"; });
  expect_key("url", [](auto& o) { o.url = "amqp://guest:s3cret@host:notaport/"; });
  expect_key("url", [](auto& o) { o.url = "amqps://guest:s3cret@localhost/"; });
  expect_key("confirm_window", [](auto& o) { o.confirm_window = 0; });
  expect_key("routing_key", [](auto& o) { o.routing_key = "orders.{nope}"; });
  expect_key("routing_key", [](auto& o) { o.routing_key = "orders.{topic"; });
  expect_key("routing_key", [](auto& o) { o.routing_key = "orders}"; });
  expect_key("exchange", [](auto& o) { o.exchange = "{Topic}"; });
  expect_key("connect_timeout", [](auto& o) { o.connect_timeout = milliseconds{0}; });
  expect_key("heartbeat", [](auto& o) { o.heartbeat = seconds{-1}; });
  expect_key("max_message_bytes", [](auto& o) { o.max_message_bytes = 0; });
  expect_key("declare_exchange_type", [](auto& o) {
    o.exchange = "x";
    o.declare_exchange_type = "round-robin";
  });
  // An exchange to declare must be a plain name: the exchange is what is wrong.
  expect_key("exchange", [](auto& o) {
    o.exchange = "{topic}";
    o.declare_exchange_type = "topic";
  });
  expect_key("exchange", [](auto& o) { o.exchange = std::string(256, 'x'); });
  expect_key("routing_key", [](auto& o) { o.routing_key = "a\nb"; });
}

TEST(RabbitSinkOptionsTest, TemplatesExpandTopicTargetAndType) {
  Envelope envelope = MakeEnvelope("orders");
  envelope.target = "main";
  envelope.type = "OrderPlaced";
  const auto expand = [&](const std::string& text) {
    return NameTemplate::Parse(text, "routing_key").Expand(envelope);
  };
  EXPECT_EQ(expand("{topic}"), "orders");
  EXPECT_EQ(expand("{target}.{topic}.{type}"), "main.orders.OrderPlaced");
  EXPECT_EQ(expand("events"), "events");
  EXPECT_EQ(expand(""), "");
  envelope.type.reset();
  EXPECT_EQ(expand("x.{type}"), "x.");
  EXPECT_TRUE(NameTemplate::Parse("plain", "exchange").is_literal());
  EXPECT_FALSE(NameTemplate::Parse("a{topic}", "exchange").is_literal());
}

TEST(RabbitSinkTest, OpeningDoesNotNeedTheBroker) {
  rabbitmq::SinkOptions options;
  options.url = "amqp://guest:guest@127.0.0.1:1/";
  auto sink = Open(options);
  EXPECT_EQ(sink->Name(), "rabbitmq");
  sink->Close();
  sink->Close();
}

TEST(RabbitSinkTest, PropertiesAndHeadersArrive) {
  Admin admin;
  const std::string queue = UniqueName("props");
  admin.DeclareQueue(queue);
  auto sink = Open();

  Envelope envelope = MakeEnvelope(queue, R"({"order":42})");
  envelope.type = "OrderPlaced";
  envelope.content_type = "application/vnd.test+json";
  envelope.stream_key = "order-42";
  envelope.stream_seq = 7;
  envelope.partition = 3;
  envelope.attempts = 2;
  envelope.created_at = std::chrono::system_clock::time_point{seconds{1700000000}};
  envelope.headers = {{"correlation_id", "corr-1"},
                      {"causation_id", "cause-1"},
                      {"tenant_id", "tenant-a"},
                      {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                      {"x-custom", "value with spaces"},
                      // Refused by the store; the sink must not let them shadow its own.
                      {std::string{wire::kMessageId}, "forged"},
                      {std::string{wire::kPartitionHeader}, "99"}};
  const std::vector<Envelope> batch{envelope};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto received = admin.Consume(queue, 2, milliseconds{1000});
  ASSERT_EQ(received.size(), 1U);
  const Received& message = received[0];
  EXPECT_EQ(message.body, R"({"order":42})");
  EXPECT_EQ(message.exchange, "");
  EXPECT_EQ(message.routing_key, queue);
  EXPECT_EQ(message.message_id, envelope.id.ToString());
  EXPECT_EQ(message.correlation_id, "corr-1");
  EXPECT_EQ(message.type, "OrderPlaced");
  EXPECT_EQ(message.content_type, "application/vnd.test+json");
  EXPECT_EQ(message.timestamp, 1700000000U);
  EXPECT_EQ(message.delivery_mode, 2);

  EXPECT_EQ(message.headers.at("correlation_id"), "corr-1");
  EXPECT_EQ(message.headers.at("causation_id"), "cause-1");
  EXPECT_EQ(message.headers.at("tenant_id"), "tenant-a");
  EXPECT_EQ(message.headers.at("traceparent"),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  EXPECT_EQ(message.headers.at("x-custom"), "value with spaces");
  EXPECT_EQ(message.header_kinds.at("x-custom"), 'S');
  EXPECT_FALSE(message.headers.contains(std::string{wire::kMessageId}));
  EXPECT_EQ(message.headers.at(std::string{wire::kTopicHeader}), queue);
  EXPECT_EQ(message.headers.at(std::string{wire::kStreamKeyHeader}), "order-42");
  EXPECT_EQ(message.headers.at(std::string{wire::kStreamSeqHeader}), "7");
  EXPECT_EQ(message.header_kinds.at(std::string{wire::kStreamSeqHeader}), 'l');
  EXPECT_EQ(message.headers.at(std::string{wire::kPartitionHeader}), "3");
  EXPECT_EQ(message.headers.at(std::string{wire::kAttemptsHeader}), "2");
}

// envelope = full (the default): event_id is the shared event id of a fanned-out copy, else the
// message's own id; the internal headers are still there.
TEST(RabbitSinkTest, FullEnvelopeSendsTheEventIdAndTheInternalHeaders) {
  Admin admin;
  const std::string queue = UniqueName("event-id");
  admin.DeclareQueue(queue);
  auto sink = Open();

  Envelope copy = MakeEnvelope(queue);
  SetEveryField(copy);  // event_id: a copy of a message written to several targets
  Envelope single = MakeEnvelope(queue);
  const std::vector<Envelope> batch{copy, single};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto received = admin.Consume(queue, 2);
  ASSERT_EQ(received.size(), 2U);
  EXPECT_EQ(received[0].message_id, copy.id.ToString());
  EXPECT_EQ(received[0].header_kinds.at(std::string{wire::kEventId}), 'S');
  ExpectTheFullEnvelope(received[0].headers, copy);  // outbox-database: tenant-7
  EXPECT_EQ(received[0].header_kinds.at(std::string{wire::kDatabaseHeader}), 'S');
  EXPECT_EQ(received[1].message_id, single.id.ToString());
  ExpectTheFullEnvelope(received[1].headers, single);  // no database: no outbox-database
}

// envelope = external: the event and its context, nothing of how the outbox moved it.
TEST(RabbitSinkTest, ExternalEnvelopeSendsNoOutboxHeaders) {
  Admin admin;
  const std::string queue = UniqueName("external");
  admin.DeclareQueue(queue);
  rabbitmq::SinkOptions options = Options();
  options.envelope = EnvelopeStyle::kExternal;
  auto sink = Open(options);

  Envelope envelope = MakeEnvelope(queue, R"({"order":42})");
  SetEveryField(envelope);
  const std::vector<Envelope> batch{envelope};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto received = admin.Consume(queue, 2, milliseconds{1000});
  ASSERT_EQ(received.size(), 1U);
  const Received& message = received[0];
  EXPECT_EQ(message.body, R"({"order":42})");
  EXPECT_EQ(message.message_id, envelope.id.ToString());
  EXPECT_EQ(message.type, "OrderPlaced");
  EXPECT_EQ(message.content_type, "application/vnd.test+json");
  EXPECT_EQ(message.correlation_id, "corr-1");
  EXPECT_EQ(message.timestamp, 1700000000U);
  EXPECT_EQ(message.delivery_mode, 2);
  ExpectTheExternalEnvelope(message.headers, envelope);
  EXPECT_EQ(message.headers.size(), UserHeadersSent().size() + 1) << "nothing else";
}

// A user header named like the event id (the stores refuse it; an old row may hold one) never
// stands in for the real one, in any case.
TEST(RabbitSinkTest, UserHeaderNamedEventIdDoesNotOverrideIt) {
  Admin admin;
  const std::string queue = UniqueName("forged-event-id");
  admin.DeclareQueue(queue);
  for (const EnvelopeStyle style : {EnvelopeStyle::kFull, EnvelopeStyle::kExternal}) {
    rabbitmq::SinkOptions options = Options();
    options.envelope = style;
    auto sink = Open(options);
    Envelope envelope = MakeEnvelope(queue);
    envelope.event_id = NewUuidV7();
    envelope.headers = ForgedEventIdHeaders();
    const std::vector<Envelope> batch{envelope};
    ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

    const auto received = admin.Consume(queue, 1);
    ASSERT_EQ(received.size(), 1U);
    EXPECT_EQ(received[0].headers.at(std::string{wire::kEventId}), envelope.event_id->ToString());
    EXPECT_EQ(received[0].message_id, envelope.id.ToString());
    ExpectNoForgedEventId(received[0].headers, EnvelopeStyleName(style));
  }
}

TEST(RabbitSinkTest, MinimalEnvelopeAndTransientDelivery) {
  Admin admin;
  const std::string queue = UniqueName("minimal");
  admin.DeclareQueue(queue);
  rabbitmq::SinkOptions options = Options();
  options.persistent = false;
  auto sink = Open(options);

  Envelope envelope = MakeEnvelope(queue, "");
  envelope.content_type.clear();
  const std::vector<Envelope> batch{envelope};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto received = admin.Consume(queue, 1);
  ASSERT_EQ(received.size(), 1U);
  EXPECT_EQ(received[0].body, "");
  EXPECT_EQ(received[0].delivery_mode, 1);
  EXPECT_EQ(received[0].flags & (AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG |
                                 AMQP_BASIC_CORRELATION_ID_FLAG),
            0U);
  EXPECT_FALSE(received[0].headers.contains(std::string{wire::kStreamKeyHeader}));
  EXPECT_FALSE(received[0].headers.contains(std::string{wire::kStreamSeqHeader}));
  EXPECT_FALSE(received[0].headers.contains(std::string{wire::kStreamPrevSeqHeader}));
  EXPECT_FALSE(received[0].headers.contains(std::string{wire::kDatabaseHeader}));
}

// outbox-stream-prev-seq travels as a long long, like outbox-stream-seq, and only when set.
TEST(RabbitSinkTest, StreamPrevSeqHeaderOnlyWhenSet) {
  Admin admin;
  const std::string queue = UniqueName("prev-seq");
  admin.DeclareQueue(queue);
  auto sink = Open();
  Envelope after_abandoned = MakeEnvelope(queue, "{}");
  after_abandoned.stream_key = "order-42";
  after_abandoned.stream_seq = 5;
  after_abandoned.stream_prev_seq = 2;
  Envelope head_abandoned = after_abandoned;
  head_abandoned.id = NewUuidV7();
  head_abandoned.stream_key = "order-43";
  head_abandoned.stream_seq = 3;
  head_abandoned.stream_prev_seq = 0;
  Envelope ordinary = after_abandoned;
  ordinary.id = NewUuidV7();
  ordinary.stream_seq = 6;
  ordinary.stream_prev_seq.reset();
  const std::vector<Envelope> batch{after_abandoned, head_abandoned, ordinary};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto received = admin.Consume(queue, 3);
  ASSERT_EQ(received.size(), 3U);
  const std::string prev{wire::kStreamPrevSeqHeader};
  EXPECT_EQ(received[0].headers.at(prev), "2");
  EXPECT_EQ(received[0].header_kinds.at(prev), 'l');
  EXPECT_EQ(received[1].headers.at(prev), "0");
  EXPECT_EQ(received[1].header_kinds.at(prev), 'l');
  EXPECT_EQ(received[2].headers.at(std::string{wire::kStreamSeqHeader}), "6");
  EXPECT_FALSE(received[2].headers.contains(prev));
}

TEST(RabbitSinkTest, SmallWindowAcrossManyBatchesKeepsOrder) {
  Admin admin;
  const std::string queue = UniqueName("window");
  admin.DeclareQueue(queue);
  rabbitmq::SinkOptions options = Options();
  options.confirm_window = 7;
  auto sink = Open(options);

  std::vector<std::string> sent;
  for (int round = 0; round < 5; ++round) {
    const auto batch = MakeEnvelopes(queue, 50);
    ExpectAllPublished(sink->Publish(batch, In(milliseconds{10000})), batch);
    for (const auto& id : Ids(batch)) sent.push_back(id);
  }
  EXPECT_EQ(Ids(admin.Consume(queue, sent.size())), sent);
}

// The sink contract suite (tests/sink/) checks that an unroutable message is rejected and the
// rest of its batch published; here, that the reason names the exchange and the routing key.
TEST(RabbitSinkTest, UnroutableReasonNamesTheExchangeAndRoutingKey) {
  Admin admin;
  const std::string exchange = UniqueName("routes");
  admin.DeclareExchange(exchange, "direct");
  rabbitmq::SinkOptions options = Options();
  options.exchange = exchange;
  options.routing_key = "{type}";
  auto sink = Open(options);

  std::vector<Envelope> batch = MakeEnvelopes("orders", 1);
  batch[0].type = "nowhere";
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kRejected);
  EXPECT_EQ(outcomes[0].failure->reason,
            "unroutable: NO_ROUTE exchange='" + exchange + "' routing_key='nowhere'");
}

TEST(RabbitSinkTest, UnroutableWithoutMandatoryIsConfirmedAndDropped) {
  Admin admin;
  const std::string exchange = UniqueName("nomandatory");
  admin.DeclareExchange(exchange, "direct");
  rabbitmq::SinkOptions options = Options();
  options.exchange = exchange;
  options.mandatory = false;
  auto sink = Open(options);
  const auto batch = MakeEnvelopes("nowhere", 3);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
}

TEST(RabbitSinkTest, MissingExchangeIsRejectedByNameAndTheChannelIsReopened) {
  Admin admin;
  const std::string queue = UniqueName("after-404");
  admin.DeclareQueue(queue);
  const std::string missing = UniqueName("missing");
  rabbitmq::SinkOptions options = Options();
  options.exchange = "{type}";  // "" (the default exchange) when the envelope has no type
  auto sink = Open(options);

  std::vector<Envelope> bad = MakeEnvelopes(queue, 1);
  bad[0].type = missing;
  const auto outcomes = sink->Publish(bad, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kRejected);
  EXPECT_EQ(outcomes[0].failure->reason, "exchange '" + missing + "' not found (NOT_FOUND - no " +
                                             "exchange '" + missing + "' in vhost '/')");

  // The next Publish on the same sink reopens the channel.
  const auto good = MakeEnvelopes(queue, 3);
  ExpectAllPublished(sink->Publish(good, In(milliseconds{5000})), good);
  EXPECT_EQ(Ids(admin.Consume(queue, 3)), Ids(good));
}

// Issue #40: an exchange the relay's user may not write to (ACCESS_REFUSED, which closes the
// channel) is a state of the destination: unavailable, no attempt spent; the channel is reopened
// and the next publish, to an exchange it may write, goes. A user of the test's own
// (scripts/services rabbitmqctl), deleted at the end.
TEST(RabbitSinkTest, AccessRefusedIsUnavailableAndTheChannelIsReopened) {
  Admin admin;
  const std::string queue = UniqueName("after-403");
  admin.DeclareQueue(queue);
  const std::string denied = UniqueName("denied");
  admin.DeclareExchange(denied, "direct");
  // Writes to the default exchange only.
  const TemporaryUser limited(UniqueName("outbox-limited"), "limited-Pw-4031", "^$",
                              "^amq\\.default$", ".*");
  const std::string& user = limited.name();
  rabbitmq::SinkOptions options = Options();
  const std::string url = AmqpUrl();
  options.url = "amqp://" + user + ":limited-Pw-4031@" + url.substr(url.find('@') + 1);
  options.exchange = "{type}";  // "" (the default exchange) when the envelope has no type
  auto sink = Open(options);

  std::vector<Envelope> bad = MakeEnvelopes(queue, 1);
  bad[0].type = denied;
  const auto outcomes = sink->Publish(bad, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kUnavailable) << outcomes[0].failure->reason;
  EXPECT_NE(outcomes[0].failure->reason.find("ACCESS_REFUSED"), std::string::npos)
      << outcomes[0].failure->reason;
  EXPECT_NE(outcomes[0].failure->reason.find("not permitted to publish to exchange '" + denied),
            std::string::npos)
      << outcomes[0].failure->reason;

  const auto good = MakeEnvelopes(queue, 3);
  ExpectAllPublished(sink->Publish(good, In(milliseconds{5000})), good);
  EXPECT_EQ(Ids(admin.Consume(queue, 3)), Ids(good));
}

TEST(RabbitSinkTest, MissingExchangeMidBatchLosesNothingAndInventsNothing) {
  Admin admin;
  const std::string queue = UniqueName("mid-404");
  admin.DeclareQueue(queue);
  const std::string missing = UniqueName("missing");
  rabbitmq::SinkOptions options = Options();
  options.exchange = "{type}";
  auto sink = Open(options);

  std::vector<Envelope> batch = MakeEnvelopes(queue, 200);
  batch[100].type = missing;
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), batch.size());
  ASSERT_FALSE(outcomes[100].published());
  EXPECT_EQ(outcomes[100].failure->kind, FailureKind::kRejected);
  EXPECT_NE(outcomes[100].failure->reason.find("exchange '" + missing + "' not found"),
            std::string::npos)
      << outcomes[100].failure->reason;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (i == 100 || outcomes[i].published()) continue;
    // Before the failing publish: sent, confirm lost with the channel. After it: discarded by the
    // broker or never sent. Either way retried without spending an attempt.
    const FailureKind kind = outcomes[i].failure->kind;
    EXPECT_TRUE(kind == FailureKind::kOutcomeUnknown || kind == FailureKind::kUnavailable)
        << i << ": " << Describe(outcomes[i]);
    EXPECT_FALSE(outcomes[i].failure->treatment().spends_attempt);
  }
  for (std::size_t i = 101; i < batch.size(); ++i) {
    EXPECT_FALSE(outcomes[i].published()) << i << " published after the channel was closed";
  }
  const auto received = admin.Consume(queue, batch.size(), milliseconds{500});
  ExpectPublishedAreDelivered(outcomes, received);
  EXPECT_LE(received.size(), 100U);

  const auto next = MakeEnvelopes(queue, 10);
  ExpectAllPublished(sink->Publish(next, In(milliseconds{5000})), next);
}

TEST(RabbitSinkTest, QueueFullWithRejectPublishIsNackedAndRejected) {
  Admin admin;
  const std::string queue = UniqueName("full");
  admin.DeclareQueue(
      queue, {{"x-max-length", std::int64_t{0}}, {"x-overflow", std::string{"reject-publish"}}});
  auto sink = Open();
  const auto batch = MakeEnvelopes(queue, 3);
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 3U);
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kRejected);
    EXPECT_TRUE(outcome.failure->reason.starts_with("nacked by broker")) << outcome.failure->reason;
  }
  EXPECT_EQ(admin.Count(queue), 0U);
}

// The sink contract suite (tests/sink/) checks that a payload over max_message_bytes is
// permanent and the rest of its batch published; here, the reasons, and headers over one frame.
TEST(RabbitSinkTest, OversizedMessagesArePermanentAndNeverSent) {
  Admin admin;
  const std::string queue = UniqueName("oversize");
  admin.DeclareQueue(queue);
  rabbitmq::SinkOptions options = Options();
  options.max_message_bytes = 1000;
  auto sink = Open(options);

  std::vector<Envelope> batch = MakeEnvelopes(queue, 3);
  batch[0].payload.assign(1001, 'x');
  // Headers that cannot fit in one AMQP frame (131072 bytes) are refused the same way, before
  // anything reaches the socket, so the connection survives.
  for (int i = 0; i < 40; ++i) {
    batch[1].headers["x-big-" + std::to_string(i)] = std::string(4000, 'h');
  }
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 3U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_EQ(outcomes[0].failure->reason, "payload is 1001 bytes, over max_message_bytes (1000)");
  ASSERT_FALSE(outcomes[1].published());
  EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[1].failure->reason.find("frame size"), std::string::npos)
      << outcomes[1].failure->reason;
  EXPECT_TRUE(outcomes[2].published()) << Describe(outcomes[2]);
  EXPECT_EQ(Ids(admin.Consume(queue, 3, milliseconds{500})),
            (std::vector<std::string>{batch[2].id.ToString()}));
}

// The sink encodes its frames itself (one write for many publishes): a body longer than the
// connection's frame size goes in several body frames, and one of exactly a frame's room, an
// empty one and small ones around them arrive byte for byte and in order.
TEST(RabbitSinkTest, BodiesOverSeveralFramesArriveByteForByteInOrder) {
  Admin admin;
  const std::string queue = UniqueName("frames");
  admin.DeclareQueue(queue);
  auto sink = Open();
  constexpr std::size_t kFrameRoom = 131072 - 8;  // the broker's default frame_max, less framing
  const std::vector<std::size_t> sizes = {10, kFrameRoom - 1,     kFrameRoom, kFrameRoom + 1,
                                          0,  3 * kFrameRoom + 7, 257,        2 * kFrameRoom};
  std::vector<Envelope> batch = MakeEnvelopes(queue, sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    batch[i].payload.resize(sizes[i]);
    for (std::size_t b = 0; b < sizes[i]; ++b) {
      batch[i].payload[b] = static_cast<char>((b * 31 + i * 7) % 251);
    }
  }
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{10000})), batch);
  const auto received = admin.Consume(queue, batch.size() + 1, milliseconds{2000});
  ASSERT_EQ(received.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(received[i].message_id, batch[i].id.ToString()) << i;
    EXPECT_TRUE(received[i].body == batch[i].payload)
        << i << ": " << received[i].body.size() << " bytes arrived of " << sizes[i];
  }
}

// The most that the default header limits let a writer enqueue (MessageLimits, and the same
// PostgreSQL settings) reaches a consumer whole: 64 headers, a 128-byte name, a 4096-byte value,
// 8192 bytes of names and values, with the rest of the content header at its maximum too (topic,
// stream key, type and content type of 255 bytes, correlation_id as a property). One header or
// byte more is refused at enqueue, so no relay has to abandon it here.
TEST(RabbitSinkTest, HeadersAtTheDefaultLimitsAreCarriedAndOneMoreIsRefusedAtEnqueue) {
  Admin admin;
  std::string queue = UniqueName("header-limits");
  queue.append(255 - queue.size(), 'q');  // the topic, and the routing key
  admin.DeclareQueue(queue);
  auto sink = Open();

  NewMessage message;
  message.topic = queue;
  message.payload = R"({"big":"headers"})";
  message.stream_key = std::string(255, 'k');
  message.type = std::string(255, 't');
  message.content_type = "application/x-" + std::string(255 - 14, 'c');
  message.headers = HeadersAtTheLimits();
  ASSERT_EQ(ValidateMessage(message), "");

  Envelope envelope = MakeEnvelope(message.topic, message.payload);
  envelope.stream_key = message.stream_key;
  envelope.stream_seq = std::numeric_limits<std::int64_t>::max();
  envelope.type = message.type;
  envelope.content_type = message.content_type;
  envelope.headers = message.headers;
  envelope.partition = 4095;
  envelope.attempts = 1000;
  const std::vector<Envelope> batch{envelope};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto received = admin.Consume(queue, 2, milliseconds{1000});
  ASSERT_EQ(received.size(), 1U);
  EXPECT_EQ(received[0].body, message.payload);
  EXPECT_EQ(received[0].type, *message.type);
  EXPECT_EQ(received[0].content_type, message.content_type);
  EXPECT_EQ(received[0].correlation_id, message.headers.at("correlation_id"));
  Headers user_headers;
  for (const auto& [name, value] : received[0].headers) {
    if (!wire::IsReservedName(name)) user_headers.emplace(name, value);
  }
  EXPECT_EQ(user_headers, message.headers);
  // The outbox's own: event id, topic, stream key, stream seq, partition, attempts, target.
  EXPECT_EQ(received[0].headers.size(), message.headers.size() + 7);

  NewMessage more = message;
  more.headers["x-one-more"] = "";
  EXPECT_NE(ValidateMessage(more).find("(max_header_count)"), std::string::npos);
  more = message;
  more.headers.at("x-010") += 'h';
  EXPECT_NE(ValidateMessage(more).find("(max_headers_bytes)"), std::string::npos);
  more = message;
  const std::string longest(128, 'n');
  more.headers.erase(longest);
  more.headers[longest + 'n'] = std::string(4095, 'v');
  EXPECT_NE(ValidateMessage(more).find("(max_header_name_bytes)"), std::string::npos);
}

TEST(RabbitSinkTest, UnreachableBrokerIsUnavailableQuicklyWithBackoff) {
  rabbitmq::SinkOptions options;
  options.url = "amqp://guest:guest@127.0.0.1:1/";
  auto sink = Open(options);
  const auto batch = MakeEnvelopes("orders", 3);

  auto started = SteadyClock::now();
  auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  EXPECT_LT(SteadyClock::now() - started, milliseconds{1000});
  ASSERT_EQ(outcomes.size(), 3U);
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
    EXPECT_NE(
        outcome.failure->reason.find("cannot connect to RabbitMQ (amqp://guest@127.0.0.1:1/)"),
        std::string::npos)
        << outcome.failure->reason;
  }
  // Within the backoff the sink does not even try.
  started = SteadyClock::now();
  outcomes = sink->Publish(batch, In(milliseconds{5000}));
  EXPECT_LT(SteadyClock::now() - started, milliseconds{50});
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
    EXPECT_NE(outcome.failure->reason.find("next attempt in"), std::string::npos)
        << outcome.failure->reason;
  }
  sink->Close();
}

TEST(RabbitSinkTest, WrongPasswordIsUnavailableAndNeverShowsThePassword) {
  rabbitmq::SinkOptions options;
  const rabbitmq::Endpoint endpoint = rabbitmq::ParseUrl(AmqpUrl());
  options.url =
      "amqp://guest:wrong-s3cret@" + endpoint.host + ":" + std::to_string(endpoint.port) + "/";
  auto sink = Open(options);
  const auto outcomes = sink->Publish(MakeEnvelopes("orders", 1), In(milliseconds{5000}));
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kUnavailable);
  EXPECT_NE(outcomes[0].failure->reason.find("login failed"), std::string::npos)
      << outcomes[0].failure->reason;
  EXPECT_EQ(outcomes[0].failure->reason.find("s3cret"), std::string::npos);
}

TEST(RabbitSinkTest, DeadlineAlreadyPassedSendsNothing) {
  Admin admin;
  const std::string queue = UniqueName("late");
  admin.DeclareQueue(queue);
  auto sink = Open();
  const auto batch = MakeEnvelopes(queue, 3);
  const auto outcomes = sink->Publish(batch, SteadyClock::now() - milliseconds{1});
  ASSERT_EQ(outcomes.size(), 3U);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    ASSERT_FALSE(outcomes[i].published());
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kUnavailable);
    EXPECT_EQ(outcomes[i].failure->reason, "not sent: the deadline had already passed");
  }
  EXPECT_EQ(admin.Count(queue), 0U);
  // The sink is still usable.
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  EXPECT_EQ(admin.Count(queue), 3U);
}

TEST(RabbitSinkTest, DeclaresTheExchangeWhenAsked) {
  Admin admin;
  const std::string exchange = UniqueName("declared");
  const std::string queue = UniqueName("declared-q");
  admin.DeclareQueue(queue);
  admin.DeleteLater(exchange);
  ASSERT_FALSE(admin.ExchangeExists(exchange));

  rabbitmq::SinkOptions options = Options();
  options.exchange = exchange;
  options.declare_exchange_type = "topic";
  auto sink = Open(options);
  // Nothing is bound yet: mandatory makes the first message come back.
  const auto first = MakeEnvelopes("orders.created", 1);
  auto outcomes = sink->Publish(first, In(milliseconds{5000}));
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kRejected);
  EXPECT_TRUE(admin.ExchangeExists(exchange));

  admin.Bind(queue, exchange, "orders.#");
  const auto second = MakeEnvelopes("orders.created", 2);
  ExpectAllPublished(sink->Publish(second, In(milliseconds{5000})), second);
  EXPECT_EQ(Ids(admin.Consume(queue, 2)), Ids(second));
}

TEST(RabbitSinkTest, ConflictingExchangeDeclarationIsUnavailableNamingTheExchange) {
  Admin admin;
  const std::string exchange = UniqueName("conflict");
  admin.DeclareExchange(exchange, "fanout");
  rabbitmq::SinkOptions options = Options();
  options.exchange = exchange;
  options.declare_exchange_type = "direct";
  auto sink = Open(options);
  const auto outcomes = sink->Publish(MakeEnvelopes("orders", 2), In(milliseconds{5000}));
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
    EXPECT_NE(outcome.failure->reason.find("declaring exchange '" + exchange + "'"),
              std::string::npos)
        << outcome.failure->reason;
    EXPECT_NE(outcome.failure->reason.find("PRECONDITION_FAILED"), std::string::npos)
        << outcome.failure->reason;
  }
}

TEST(RabbitSinkTest, IdleLongerThanTwoHeartbeatsStillPublishes) {
  Admin admin;
  const std::string queue = UniqueName("idle");
  admin.DeclareQueue(queue);
  rabbitmq::SinkOptions options = Options();
  options.heartbeat = seconds{1};
  auto sink = Open(options);
  const auto first = MakeEnvelopes(queue, 2);
  ExpectAllPublished(sink->Publish(first, In(milliseconds{5000})), first);
  // No library call for 3 s: the broker gives up on the connection after two missed heartbeats.
  std::this_thread::sleep_for(milliseconds{3500});
  const auto second = MakeEnvelopes(queue, 2);
  ExpectAllPublished(sink->Publish(second, In(milliseconds{5000})), second);
  EXPECT_EQ(admin.Count(queue), 4U);
}

// Through a proxy that can break the connection.
class RabbitSinkProxyTest : public ::testing::Test {
 protected:
  RabbitSinkProxyTest()
      : endpoint_(rabbitmq::ParseUrl(AmqpUrl())), proxy_(endpoint_.host, endpoint_.port) {}

  rabbitmq::SinkOptions ProxiedOptions() {
    rabbitmq::SinkOptions options;
    options.url = "amqp://" + endpoint_.user + ":" + endpoint_.password +
                  "@127.0.0.1:" + std::to_string(proxy_.port()) + "/";
    if (endpoint_.vhost != "/") options.url += endpoint_.vhost;
    return options;
  }

  rabbitmq::Endpoint endpoint_;
  TcpProxy proxy_;
  Admin admin_;
};

TEST_F(RabbitSinkProxyTest, ConnectionDroppedBetweenBatchesIsReconnectedBeforeSending) {
  const std::string queue = UniqueName("drop");
  admin_.DeclareQueue(queue);
  auto sink = Open(ProxiedOptions());
  const auto first = MakeEnvelopes(queue, 5);
  ExpectAllPublished(sink->Publish(first, In(milliseconds{5000})), first);

  proxy_.DropAll();
  const auto second = MakeEnvelopes(queue, 5);
  ExpectAllPublished(sink->Publish(second, In(milliseconds{5000})), second);
  EXPECT_EQ(admin_.Count(queue), 10U);
}

TEST_F(RabbitSinkProxyTest, ConnectionLostWhileTheWindowIsFull) {
  const std::string queue = UniqueName("window-lost");
  admin_.DeclareQueue(queue);
  rabbitmq::SinkOptions options = ProxiedOptions();
  options.confirm_window = 2;
  auto sink = Open(options);
  const auto warmup = MakeEnvelopes(queue, 1);
  ExpectAllPublished(sink->Publish(warmup, In(milliseconds{5000})), warmup);

  proxy_.SetMode(TcpProxy::Mode::kHoldReplies);
  const auto batch = MakeEnvelopes(queue, 5);
  std::thread dropper([&] {
    std::this_thread::sleep_for(milliseconds{200});
    proxy_.DropAll();
  });
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  dropper.join();
  ASSERT_EQ(outcomes.size(), 5U);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_FALSE(outcomes[i].published()) << i;
    EXPECT_EQ(outcomes[i].failure->kind,
              i < 2 ? FailureKind::kOutcomeUnknown : FailureKind::kUnavailable)
        << i << ": " << outcomes[i].failure->reason;
  }
  EXPECT_EQ(admin_.Count(queue), 3U);  // the warm-up and the two sent before the window filled

  proxy_.SetMode(TcpProxy::Mode::kForward);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
}

TEST_F(RabbitSinkProxyTest, SilentBrokerTimesOutTheHandshakeAsUnavailable) {
  proxy_.SetMode(TcpProxy::Mode::kBlackhole);
  rabbitmq::SinkOptions options = ProxiedOptions();
  options.connect_timeout = milliseconds{300};
  auto sink = Open(options);
  const auto started = SteadyClock::now();
  const auto outcomes = sink->Publish(MakeEnvelopes("orders", 2), In(milliseconds{5000}));
  const auto elapsed = SteadyClock::now() - started;
  EXPECT_GE(elapsed, milliseconds{250});
  EXPECT_LT(elapsed, milliseconds{2000});
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable) << outcome.failure->reason;
  }
}

}  // namespace
}  // namespace outbox::testing
