// The Kafka sink against librdkafka's mock cluster on loopback TCP, for what is Kafka's own (the
// sink contract suite, kafka_sink_contract_test.cpp, covers what every sink must do): the record
// a consumer receives, the Debezium style, order through the producer's retries, a leader that
// goes down, records too large with their headers, the order of late copies, a fatal producer
// error, and how each report error is classified. Each test has a cluster of its own
// (MockCluster) and reads what the cluster holds through an independent librdkafka consumer, so a
// "published" outcome is checked against the log: no loss, no phantom.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "classify.h"
#include "kafka_test_support.h"
#include "outbox/core/error.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/kafka.h"
#include "support/envelope_fields.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

kafka::SinkOptions Options(const MockCluster& cluster) {
  kafka::SinkOptions options;
  options.brokers = cluster.bootstraps();
  options.properties = {{"log_level", "2"}};  // the tests take brokers down on purpose
  return options;
}

std::string Describe(const PublishOutcome& outcome) {
  return outcome.published() ? "published" : outcome.failure->Describe();
}

// One outcome per message in batch order, each published (`kind` unset) or failed with `kind`.
void ExpectEvery(const std::vector<PublishOutcome>& outcomes, std::span<const Envelope> batch,
                 std::optional<FailureKind> kind = std::nullopt) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id) << "outcome " << i << " out of batch order";
    const std::optional<FailureKind> got =
        outcomes[i].published() ? std::nullopt : std::optional{outcomes[i].failure->kind};
    EXPECT_EQ(got, kind) << "message " << i << ": " << Describe(outcomes[i]);
  }
}

// No phantom: every message reported published is in the log.
void ExpectPublishedAreThere(const std::vector<PublishOutcome>& outcomes,
                             const std::vector<Record>& records) {
  std::set<std::string> ids;
  for (const Record& record : records) ids.insert(record.Header("message_id").value_or(""));
  for (const PublishOutcome& outcome : outcomes) {
    if (outcome.published()) {
      EXPECT_TRUE(ids.contains(outcome.id.ToString()))
          << outcome.id.ToString() << " reported published but not in the topic";
    }
  }
}

std::vector<Envelope> MakeBatch(const std::string& topic, std::size_t count) {
  std::vector<Envelope> batch;
  for (std::size_t i = 0; i < count; ++i) {
    batch.push_back(MakeEnvelope(topic, R"({"n":)" + std::to_string(i) + "}"));
  }
  return batch;
}

// A sink to `topic` (one partition, led by broker `leader`) that has published one message: it is
// connected and has its producer id.
std::unique_ptr<Sink> ConnectedSink(MockCluster& cluster, const std::string& topic, int leader) {
  cluster.CreateTopic(topic, 1);
  cluster.SetLeader(topic, 0, leader);
  auto sink = kafka::OpenSink(Options(cluster));
  const std::vector<Envelope> first = {MakeEnvelope(topic)};
  ExpectEvery(sink->Publish(first, In(seconds{10})), first);
  return sink;
}

// ---- Classification: one row each (sink/kafka.h) ----

TEST(KafkaClassifyTest, EachReportErrorHasItsKind) {
  const auto kind = [](rd_kafka_resp_err_t error, rd_kafka_msg_status_t status,
                       std::string_view fatal = {}) {
    const auto failure = kafka::ClassifyDelivery(error, status, fatal);
    EXPECT_TRUE(failure.has_value()) << rd_kafka_err2name(error);
    return failure ? failure->kind : FailureKind::kLeaseLost;
  };
  constexpr auto kNot = RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
  constexpr auto kMaybe = RD_KAFKA_MSG_STATUS_POSSIBLY_PERSISTED;
  EXPECT_FALSE(kafka::ClassifyDelivery(RD_KAFKA_RESP_ERR_NO_ERROR, RD_KAFKA_MSG_STATUS_PERSISTED)
                   .has_value());
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, kNot), FailureKind::kPermanent);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_INVALID_RECORD, kNot), FailureKind::kPermanent);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP, kNot), FailureKind::kPermanent);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_INVALID_MSG, kNot), FailureKind::kPermanent);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE, kNot), FailureKind::kPermanent);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION, kNot), FailureKind::kPermanent);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, kNot), FailureKind::kRejected);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, kNot), FailureKind::kRejected);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, kNot), FailureKind::kUnavailable);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED, kNot), FailureKind::kUnavailable);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_PRODUCER_FENCED, kNot), FailureKind::kRejected);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, kNot), FailureKind::kUnavailable);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__TRANSPORT, kNot), FailureKind::kUnavailable);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, kNot), FailureKind::kUnavailable);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__TIMED_OUT, kNot), FailureKind::kUnavailable);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__PURGE_QUEUE, kNot), FailureKind::kUnavailable);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, kNot), FailureKind::kUnavailable);
  // Sent once, so possibly on the log, whatever the last error says.
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, kMaybe), FailureKind::kOutcomeUnknown);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__TRANSPORT, kMaybe), FailureKind::kOutcomeUnknown);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR__PURGE_INFLIGHT, kMaybe), FailureKind::kOutcomeUnknown);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, kMaybe), FailureKind::kOutcomeUnknown);
  EXPECT_EQ(kind(RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, kNot, "fatal"),
            FailureKind::kOutcomeUnknown);

  EXPECT_EQ(kafka::ClassifyProduceError(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, "").kind,
            FailureKind::kPermanent);
  EXPECT_EQ(kafka::ClassifyProduceError(RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, "").kind,
            FailureKind::kRejected);
  EXPECT_EQ(kafka::ClassifyProduceError(RD_KAFKA_RESP_ERR__QUEUE_FULL, "").kind,
            FailureKind::kUnavailable);
  EXPECT_EQ(kafka::ClassifyProduceError(RD_KAFKA_RESP_ERR__FATAL, "").kind,
            FailureKind::kUnavailable);
}

// ---- Options ----

TEST(KafkaSinkOptionsTest, InvalidOptionsThrowConfigErrorNamingTheKey) {
  const auto expect_key = [](const std::string& key, auto mutate) {
    kafka::SinkOptions options;
    mutate(options);
    try {
      kafka::ValidateOptions(options);
      ADD_FAILURE() << "no ConfigError for " << key;
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key(), key) << error.what();
      EXPECT_EQ(std::string{error.what()}.find("s3cret"), std::string::npos) << error.what();
    }
  };
  expect_key("brokers", [](auto& o) { o.brokers = ""; });
  expect_key("brokers", [](auto& o) { o.brokers = "host:notaport"; });
  expect_key("brokers", [](auto& o) { o.brokers = "host:70000"; });
  expect_key("brokers", [](auto& o) { o.brokers = "a:1,,b:2"; });
  expect_key("topic", [](auto& o) { o.topic = "orders.{nope}"; });
  expect_key("topic", [](auto& o) { o.topic = "orders}"; });
  expect_key("compression", [](auto& o) { o.compression = "brotli"; });
  expect_key("linger", [](auto& o) { o.linger = milliseconds{-1}; });
  expect_key("max_in_flight", [](auto& o) { o.max_in_flight = 6; });
  expect_key("max_in_flight", [](auto& o) { o.max_in_flight = 0; });
  expect_key("max_message_bytes", [](auto& o) { o.max_message_bytes = 10; });
  expect_key("librdkafka.enable.idempotence", [](auto& o) {
    o.properties = {{"enable.idempotence", "false"}};
  });
  expect_key("librdkafka.acks", [](auto& o) { o.properties = {{"acks", "1"}}; });
  expect_key("librdkafka.request.required.acks", [](auto& o) {
    o.properties = {{"request.required.acks", "1"}};
  });
  expect_key("librdkafka.no.such.property", [](auto& o) {
    o.properties = {{"no.such.property", "1"}};
  });
  expect_key("librdkafka.security.protocol", [](auto& o) {
    o.properties = {{"security.protocol", "carrier-pigeon"}};
  });
}

TEST(KafkaSinkOptionsTest, ValidOptionsPass) {
  kafka::SinkOptions options;
  for (const std::string codec : {"none", "gzip", "snappy", "lz4", "zstd"}) {
    options.compression = codec;
    EXPECT_NO_THROW(kafka::ValidateOptions(options)) << codec;
  }
  options.properties = {{"client.id", "orders-relay"}, {"security.protocol", "sasl_plaintext"},
                        {"sasl.mechanisms", "PLAIN"},  {"sasl.username", "relay"},
                        {"sasl.password", "s3cret"},   {"partitioner", "consistent_random"}};
  EXPECT_NO_THROW(kafka::ValidateOptions(options));
  EXPECT_TRUE(kafka::IsSecretProperty("sasl.password"));
  EXPECT_TRUE(kafka::IsSecretProperty("ssl.key.password"));
  EXPECT_TRUE(kafka::IsSecretProperty("sasl.oauthbearer.client.secret"));
  EXPECT_TRUE(kafka::IsSecretProperty("sasl.oauthbearer.config"));
  EXPECT_FALSE(kafka::IsSecretProperty("sasl.username"));
  EXPECT_TRUE(kafka::IsReservedProperty("enable.idempotence"));
  EXPECT_FALSE(kafka::IsReservedProperty("client.id"));
}

TEST(KafkaSinkOptionsTest, BrokerLists) {
  const auto first = [](std::string_view list) {
    const auto brokers = kafka::ParseBrokers(list);
    return brokers ? brokers->front().host + ":" + std::to_string(brokers->front().port)
                   : std::string{"-"};
  };
  EXPECT_EQ(first("127.0.0.1:9092"), "127.0.0.1:9092");
  EXPECT_EQ(first("kafka-1"), "kafka-1:9092");
  EXPECT_EQ(first(" kafka-1:19092 , kafka-2:19092"), "kafka-1:19092");
  EXPECT_EQ(first("SASL_SSL://broker.example:9093"), "broker.example:9093");
  EXPECT_EQ(first("[::1]:9092"), "::1:9092");
  EXPECT_EQ(kafka::ParseBrokers("a:1,b:2,c")->size(), 3U);
  for (const std::string_view bad :
       {"", ",", "a:1,,b", ":9092", "a:0", "a:65536", "a:x", "[::1", "::1:9092", "a b:1"}) {
    EXPECT_FALSE(kafka::ParseBrokers(bad).has_value()) << bad;
  }
}

// ---- Against the mock cluster ----

TEST(KafkaSinkTest, ConfirmedBatchIsInTheTopicWithKeyValueTimestampAndHeaders) {
  MockCluster cluster;
  const std::string topic = "orders";
  cluster.CreateTopic(topic, 3);
  auto sink = kafka::OpenSink(Options(cluster));
  EXPECT_EQ(sink->Name(), "kafka");

  std::vector<Envelope> batch = MakeBatch(topic, 3);
  batch[0].stream_key = "order-17";
  batch[0].stream_seq = 4;
  batch[0].stream_prev_seq = 2;
  batch[0].type = "OrderPlaced";
  batch[0].partition = 11;
  batch[0].attempts = 2;
  batch[0].database = "tenant-7";  // from a relay serving several databases
  batch[0].headers = {{"correlation_id", "corr-1"}, {"traceparent", "00-abc-def-01"}};
  batch[0].created_at = std::chrono::system_clock::time_point{milliseconds{1700000000123}};
  batch[1].payload = std::string("\0\x01binary\xff", 9);
  batch[1].content_type = "application/octet-stream";
  batch[2].content_type.clear();
  batch[2].headers = {{"type", "user-type"}};  // no envelope type: the user's header stays

  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ExpectEvery(outcomes, batch);

  Consumer consumer(cluster.bootstraps());
  const auto records = consumer.ReadAll(topic, batch.size());
  ASSERT_EQ(records.size(), batch.size());
  std::map<std::string, Record> by_id;
  for (const Record& record : records) by_id[record.Header("message_id").value_or("?")] = record;
  ASSERT_EQ(by_id.size(), batch.size());

  const Record& first = by_id.at(batch[0].id.ToString());
  EXPECT_EQ(first.key, "order-17");
  EXPECT_EQ(first.value, batch[0].payload);
  EXPECT_EQ(first.timestamp_ms, 1700000000123);
  const std::vector<std::pair<std::string, std::string>> expected_headers = {
      {"correlation_id", "corr-1"},
      {"traceparent", "00-abc-def-01"},
      {"message_id", batch[0].id.ToString()},
      {"event_id", batch[0].id.ToString()},
      {"type", "OrderPlaced"},
      {"content_type", "application/json"},
      {"outbox-topic", topic},
      {"outbox-stream-key", "order-17"},
      {"outbox-stream-seq", "4"},
      {"outbox-stream-prev-seq", "2"},
      {"outbox-partition", "11"},
      {"outbox-attempts", "2"},
      {"outbox-target", "default"},
      {"outbox-database", "tenant-7"}};
  EXPECT_EQ(first.headers, expected_headers);

  const Record& second = by_id.at(batch[1].id.ToString());
  EXPECT_FALSE(second.key.has_value()) << "no stream key: no record key";
  EXPECT_EQ(second.value, batch[1].payload) << "the payload bytes as stored";
  EXPECT_EQ(second.Header("content_type"), "application/octet-stream");
  EXPECT_FALSE(second.Header("type").has_value());
  EXPECT_FALSE(second.Header("outbox-stream-key").has_value());
  EXPECT_FALSE(second.Header("outbox-stream-seq").has_value());
  EXPECT_FALSE(second.Header("outbox-database").has_value()) << "no database: no header";
  EXPECT_FALSE(second.Header("id").has_value()) << "only the debezium style writes `id`";

  const Record& third = by_id.at(batch[2].id.ToString());
  EXPECT_FALSE(third.Header("content_type").has_value());
  EXPECT_EQ(third.Header("type"), "user-type");
}

TEST(KafkaSinkTest, DebeziumStyleAddsTheIdHeaderAndKeysByAggregate) {
  MockCluster cluster;
  const std::string topic = "debezium";
  cluster.CreateTopic(topic, 1);
  kafka::SinkOptions options = Options(cluster);
  options.header_style = kafka::HeaderStyle::kDebezium;
  auto sink = kafka::OpenSink(options);
  std::vector<Envelope> batch = MakeBatch(topic, 1);
  batch[0].stream_key = "customer-9";
  batch[0].type = "CustomerCreated";
  batch[0].headers = {{"id", "user-id-header"}};  // the message id wins
  ExpectEvery(sink->Publish(batch, In(seconds{10})), batch);

  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, 1);
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].key, "customer-9");
  EXPECT_EQ(records[0].Header("id"), batch[0].id.ToString());
  EXPECT_EQ(records[0].Header("message_id"), batch[0].id.ToString());
  EXPECT_EQ(records[0].Header("type"), "CustomerCreated");
  EXPECT_EQ(std::count_if(records[0].headers.begin(), records[0].headers.end(),
                          [](const auto& header) { return header.first == "id"; }),
            1);
}

// envelope = full (the default): event_id is the shared event id of a fanned-out copy, else the
// message's own id; the internal headers are still there.
TEST(KafkaSinkTest, FullEnvelopeSendsTheEventIdAndTheInternalHeaders) {
  MockCluster cluster;
  const std::string topic = "event-id";
  cluster.CreateTopic(topic, 1);
  auto sink = kafka::OpenSink(Options(cluster));
  std::vector<Envelope> batch = MakeBatch(topic, 2);
  SetEveryField(batch[0]);  // event_id: a copy of a message written to several targets
  ExpectEvery(sink->Publish(batch, In(seconds{10})), batch);

  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, batch.size());
  ASSERT_EQ(records.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(records[i].Header("message_id"), batch[i].id.ToString());
    ExpectTheFullEnvelope(records[i].headers, batch[i]);
  }
}

// envelope = external: the event and its context, nothing of how the outbox moved it. The record
// key and the Debezium `id` header are Kafka's own, and stay.
TEST(KafkaSinkTest, ExternalEnvelopeSendsNoOutboxHeaders) {
  MockCluster cluster;
  const std::string topic = "external";
  cluster.CreateTopic(topic, 1);
  kafka::SinkOptions options = Options(cluster);
  options.envelope = EnvelopeStyle::kExternal;
  options.header_style = kafka::HeaderStyle::kDebezium;
  auto sink = kafka::OpenSink(options);
  std::vector<Envelope> batch = MakeBatch(topic, 1);
  Envelope& envelope = batch[0];
  SetEveryField(envelope);
  // Kafka's timestamps are in milliseconds: a created_at with some.
  envelope.created_at = std::chrono::system_clock::time_point{milliseconds{1700000000123}};
  ExpectEvery(sink->Publish(batch, In(seconds{10})), batch);

  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, 1);
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].key, "order-42");
  EXPECT_EQ(records[0].value, envelope.payload);
  EXPECT_EQ(records[0].timestamp_ms, 1700000000123);
  NameValues expected_headers = UserHeadersSent();
  expected_headers.insert(expected_headers.end(), {{"message_id", envelope.id.ToString()},
                                                   {"event_id", envelope.event_id->ToString()},
                                                   {"id", envelope.id.ToString()},
                                                   {"type", "OrderPlaced"},
                                                   {"content_type", "application/vnd.test+json"}});
  EXPECT_EQ(records[0].headers, expected_headers);
}

// A user header named like the event id (the stores refuse it; an old row may hold one) never
// stands in for the real one, in any case.
TEST(KafkaSinkTest, UserHeaderNamedEventIdDoesNotOverrideIt) {
  MockCluster cluster;
  const std::string topic = "forged-event-id";
  cluster.CreateTopic(topic, 1);
  for (const EnvelopeStyle style : {EnvelopeStyle::kFull, EnvelopeStyle::kExternal}) {
    kafka::SinkOptions options = Options(cluster);
    options.envelope = style;
    auto sink = kafka::OpenSink(options);
    std::vector<Envelope> batch = MakeBatch(topic, 1);
    batch[0].event_id = NewUuidV7();
    batch[0].headers = ForgedEventIdHeaders();
    ExpectEvery(sink->Publish(batch, In(seconds{10})), batch);
    sink->Close();
  }
  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, 2);
  ASSERT_EQ(records.size(), 2U);
  for (const Record& record : records) ExpectNoForgedEventId(record.headers);
}

TEST(KafkaSinkTest, TopicTemplateUsesTargetAndType) {
  MockCluster cluster;
  const std::string prefix = "t";
  kafka::SinkOptions options = Options(cluster);
  options.topic = prefix + ".{target}.{type}";
  auto sink = kafka::OpenSink(options);
  std::vector<Envelope> batch = MakeBatch("orders", 1);
  batch[0].target = "main";
  batch[0].type = "OrderPlaced";
  ExpectEvery(sink->Publish(batch, In(seconds{10})), batch);  // auto-created by the mock
  const auto records = Consumer(cluster.bootstraps()).ReadAll(prefix + ".main.OrderPlaced", 1);
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].Header("outbox-topic"), "orders");
}

// Per-stream order in a window of 2000 messages over 8 partitions, while the brokers fail produce
// requests with retriable errors (librdkafka retries them, up to 5 requests in flight).
TEST(KafkaSinkTest, StreamsKeepTheirOrderThroughRetries) {
  MockCluster cluster;
  const std::string topic = "ordered";
  cluster.CreateTopic(topic, 8);
  kafka::SinkOptions options = Options(cluster);
  options.linger = milliseconds{1};
  options.properties.emplace_back("batch.num.messages", "20");  // many requests in flight
  options.properties.emplace_back("retry.backoff.ms", "10");
  auto sink = kafka::OpenSink(options);

  constexpr int kStreams = 40;
  constexpr int kMessages = 2000;
  std::vector<Envelope> batch;
  for (int i = 0; i < kMessages; ++i) {
    Envelope envelope = MakeEnvelope(topic, std::to_string(i));
    envelope.stream_key = "stream-" + std::to_string(i % kStreams);
    envelope.stream_seq = i / kStreams + 1;
    batch.push_back(std::move(envelope));
  }
  cluster.FailProduce({RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                       RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NO_ERROR,
                       RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NO_ERROR,
                       RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
                       RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND});
  const auto started = SteadyClock::now();
  const auto outcomes = sink->Publish(batch, In(seconds{30}));
  const auto took = SteadyClock::now() - started;
  ExpectEvery(outcomes, batch);
  std::cout << "[ info ] " << kMessages << " messages with injected retries published in "
            << std::chrono::duration_cast<milliseconds>(took).count() << " ms\n";

  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, kMessages);
  ExpectPublishedAreThere(outcomes, records);
  // Records in log order (partition, offset); a stream lives in one partition.
  std::map<std::string, std::vector<std::int64_t>> seqs;
  std::map<std::string, std::set<int>> partitions;
  std::vector<Record> sorted = records;
  std::sort(sorted.begin(), sorted.end(), [](const Record& a, const Record& b) {
    return std::tie(a.partition, a.offset) < std::tie(b.partition, b.offset);
  });
  std::set<std::string> seen;
  std::size_t duplicates = 0;
  for (const Record& record : sorted) {
    if (!seen.insert(record.Header("message_id").value_or("")).second) {
      ++duplicates;
      continue;  // order is about first deliveries
    }
    seqs[*record.key].push_back(std::stoll(record.Header("outbox-stream-seq").value_or("0")));
    partitions[*record.key].insert(record.partition);
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kMessages));
  EXPECT_EQ(duplicates, 0U) << "the idempotent producer's retries wrote duplicates";
  ASSERT_EQ(seqs.size(), static_cast<std::size_t>(kStreams));
  std::set<int> used;
  for (const auto& [key, list] : seqs) {
    EXPECT_EQ(partitions[key].size(), 1U) << key << " spread over partitions";
    used.insert(*partitions[key].begin());
    for (std::size_t i = 0; i < list.size(); ++i) {
      ASSERT_EQ(list[i], static_cast<std::int64_t>(i + 1)) << key << " out of order at " << i;
    }
  }
  EXPECT_GE(used.size(), 4U) << "the streams should spread over the partitions";
}

// A payload over max_message_bytes is the contract suite's; here the record's headers make it
// too large (librdkafka's own check), and the broker refuses one.
TEST(KafkaSinkTest, TooLargeWithItsHeadersOrByTheBrokerIsPermanent) {
  MockCluster cluster;
  const std::string topic = "large";
  cluster.CreateTopic(topic, 1);
  kafka::SinkOptions options = Options(cluster);
  options.max_message_bytes = 2000;
  auto sink = kafka::OpenSink(options);
  std::vector<Envelope> batch = {MakeEnvelope(topic),
                                 MakeEnvelope(topic, std::string(1990, 'y')),  // + headers > 2000
                                 MakeEnvelope(topic)};
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 3U);
  EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
  ASSERT_FALSE(outcomes[1].published());
  EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kPermanent) << Describe(outcomes[1]);
  EXPECT_TRUE(outcomes[2].published()) << Describe(outcomes[2]);

  // The broker's own refusal (its topic limit lower than ours) is permanent too.
  cluster.FailProduce({RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE});
  const std::vector<Envelope> refused = {MakeEnvelope(topic)};
  const auto broker_outcomes = sink->Publish(refused, In(seconds{10}));
  ExpectEvery(broker_outcomes, refused, FailureKind::kPermanent);
  const std::vector<Envelope> after = {MakeEnvelope(topic)};
  ExpectEvery(sink->Publish(after, In(seconds{10})), after);

  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, 3);
  EXPECT_EQ(records.size(), 3U);
}

// Issue #40: the broker refuses the producer the topic (TOPIC_AUTHORIZATION_FAILED, as the mock
// cluster answers a produce request): a state of the destination, unavailable (no attempt
// spent). librdkafka then remembers the refusal for the topic until its next metadata refresh:
// the next message is refused at enqueue, unavailable too. Other topics go on.
TEST(KafkaSinkTest, TopicAuthorizationFailedIsUnavailable) {
  MockCluster cluster;
  const std::string topic = "acl";
  cluster.CreateTopic(topic, 1);
  auto sink = kafka::OpenSink(Options(cluster));
  cluster.FailProduce({RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED});
  const std::vector<Envelope> refused = {MakeEnvelope(topic)};
  const auto outcomes = sink->Publish(refused, In(seconds{10}));
  ExpectEvery(outcomes, refused, FailureKind::kUnavailable);
  EXPECT_NE(Describe(outcomes.at(0)).find("TOPIC_AUTHORIZATION_FAILED"), std::string::npos)
      << Describe(outcomes[0]);
  const std::vector<Envelope> next = {MakeEnvelope(topic)};
  ExpectEvery(sink->Publish(next, In(seconds{10})), next, FailureKind::kUnavailable);
  const std::string other = "acl-other";
  cluster.CreateTopic(other, 1);
  const std::vector<Envelope> elsewhere = {MakeEnvelope(other)};
  ExpectEvery(sink->Publish(elsewhere, In(seconds{10})), elsewhere);
}

// A produce response that comes after the deadline (outcome unknown, published again: the
// contract suite's lost confirmation): the late first copies are written before the second ones,
// as sink/kafka.h says of what is published again.
TEST(KafkaSinkTest, LateCopiesAreWrittenBeforeTheirSecondCopies) {
  MockCluster cluster;
  const std::string topic = "late";
  auto sink = ConnectedSink(cluster, topic, 1);

  cluster.DelayProduce(1, milliseconds{2500});
  const std::vector<Envelope> batch = MakeBatch(topic, 5);
  const auto outcomes = sink->Publish(batch, In(milliseconds{700}));
  ExpectEvery(outcomes, batch, FailureKind::kOutcomeUnknown);

  const auto again = sink->Publish(batch, In(seconds{15}));
  ExpectEvery(again, batch);
  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, 1 + 2 * batch.size());
  ExpectPublishedAreThere(again, records);
  // The late first copies were written too (after the deadline), and in order before the second.
  std::vector<std::string> ids;
  for (const Record& record : records) ids.push_back(record.Header("message_id").value_or(""));
  ASSERT_EQ(ids.size(), 1 + 2 * batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(ids[1 + i], batch[i].id.ToString());
    EXPECT_EQ(ids[1 + batch.size() + i], batch[i].id.ToString());
  }
}

// The leader of some partitions goes down mid-run: their messages are not lost, and once the
// broker is back everything is published.
TEST(KafkaSinkTest, LeaderDownThenBackLosesNothing) {
  MockCluster cluster;
  const std::string topic = "leader";
  cluster.CreateTopic(topic, 3);
  for (int partition = 0; partition < 3; ++partition)
    cluster.SetLeader(topic, partition, partition + 1);
  auto sink = kafka::OpenSink(Options(cluster));
  std::vector<Envelope> batch;
  for (int i = 0; i < 60; ++i) {
    Envelope envelope = MakeEnvelope(topic, std::to_string(i));
    envelope.stream_key = "s" + std::to_string(i % 6);
    batch.push_back(std::move(envelope));
  }
  ExpectEvery(sink->Publish(batch, In(seconds{10})), batch);

  cluster.Down(1);
  std::vector<Envelope> during;
  for (int i = 0; i < 60; ++i) {
    Envelope envelope = MakeEnvelope(topic, "during-" + std::to_string(i));
    envelope.stream_key = "s" + std::to_string(i % 6);
    during.push_back(std::move(envelope));
  }
  const auto outcomes = sink->Publish(during, In(milliseconds{1500}));
  std::size_t published = 0;
  for (const PublishOutcome& outcome : outcomes) {
    if (outcome.published()) {
      ++published;
    } else {
      EXPECT_TRUE(outcome.failure->kind == FailureKind::kUnavailable ||
                  outcome.failure->kind == FailureKind::kOutcomeUnknown)
          << outcome.failure->Describe();
    }
  }
  EXPECT_GT(published, 0U) << "the partitions led by brokers 2 and 3 still take messages";
  EXPECT_LT(published, during.size()) << "broker 1's partition cannot";

  cluster.Up(1);
  std::vector<Envelope> retry;
  for (std::size_t i = 0; i < during.size(); ++i) {
    if (!outcomes[i].published()) retry.push_back(during[i]);
  }
  ExpectEvery(sink->Publish(retry, In(seconds{20})), retry);
  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, batch.size() + during.size());
  std::set<std::string> ids;
  for (const Record& record : records) ids.insert(record.Header("message_id").value_or(""));
  for (const Envelope& envelope : during) EXPECT_TRUE(ids.contains(envelope.id.ToString()));
}

// A fatal error of the idempotent producer (here: the broker reports a sequence gap): what was in
// flight is outcome-unknown, and the next batch goes out on a new producer.
TEST(KafkaSinkTest, FatalProducerErrorIsOutcomeUnknownAndTheProducerIsRemade) {
  MockCluster cluster;
  const std::string topic = "fatal";
  auto sink = ConnectedSink(cluster, topic, 1);

  cluster.FailProduce({RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER});
  const std::vector<Envelope> batch = MakeBatch(topic, 3);
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ExpectEvery(outcomes, batch, FailureKind::kOutcomeUnknown);
  EXPECT_NE(outcomes[0].failure->reason.find("fatal"), std::string::npos)
      << outcomes[0].failure->reason;

  ExpectEvery(sink->Publish(batch, In(seconds{10})), batch);
  const auto records = Consumer(cluster.bootstraps()).ReadAll(topic, 1 + batch.size());
  EXPECT_EQ(records.size(), 1 + batch.size());
}

TEST(KafkaSinkTest, ADeadlineAlreadyPassedIsUnavailable) {
  MockCluster cluster;
  auto sink = kafka::OpenSink(Options(cluster));
  const std::vector<Envelope> batch = MakeBatch("late", 2);
  ExpectEvery(sink->Publish(batch, SteadyClock::now() - milliseconds{1}), batch,
              FailureKind::kUnavailable);
}

}  // namespace
}  // namespace outbox::testing
