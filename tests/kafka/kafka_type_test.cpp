// The Kafka sink type for outboxd: [sinks.<name>] type = "kafka" read from TOML, every bad value
// refused with its key named, secrets from the environment and masked in --check-config.
#include "outbox/sink/kafka_type.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include "outbox/core/error.h"
#include "support/sink_type_test.h"

namespace outbox::kafka {
namespace {

using Env = testing::FakeEnvironment;

// Parses `[sinks.events]` + `body` with `env` as the environment.
std::unique_ptr<const outbox::SinkSettings> ParseSink(const std::string& body, Env env = {}) {
  return testing::ParseSinkTable(Type(), body, std::move(env));
}

const SinkOptions& OptionsOf(const std::unique_ptr<const outbox::SinkSettings>& settings) {
  return dynamic_cast<const SinkSettings&>(*settings).options();
}

// The ConfigError of parsing `body`: its key and message.
std::pair<std::string, std::string> ErrorOf(const std::string& body, Env env = {}) {
  return testing::SinkTableError(Type(), body, std::move(env));
}

TEST(KafkaSinkTypeTest, DefaultsAndEveryKey) {
  const auto defaults = ParseSink("brokers = \"k1:9092,k2:9093\"\n");
  EXPECT_EQ(OptionsOf(defaults).brokers, "k1:9092,k2:9093");
  EXPECT_EQ(OptionsOf(defaults).topic, "{topic}");
  EXPECT_EQ(OptionsOf(defaults).compression, "none");
  EXPECT_EQ(OptionsOf(defaults).max_in_flight, 5);
  EXPECT_EQ(OptionsOf(defaults).header_style, HeaderStyle::kOutbox);
  EXPECT_EQ(OptionsOf(defaults).envelope, EnvelopeStyle::kFull);
  const auto endpoint = defaults->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "k1");
  EXPECT_EQ(endpoint->port, 9092);

  const auto all = ParseSink(R"(brokers = ["k1:9092", "k2:9092"]
topic = "events.{target}.{type}"
compression = "zstd"
linger = "20ms"
max_in_flight = 3
header_style = "debezium"
max_message_bytes = 2000000
envelope = "external"
[sinks.events.librdkafka]
"client.id" = "relay-1"
"security.protocol" = "sasl_plaintext"
"sasl.mechanisms" = "PLAIN"
"sasl.username" = "relay"
"sasl.password" = "from-file"
"socket.keepalive.enable" = true
"retry.backoff.ms" = 50
)");
  const SinkOptions& options = OptionsOf(all);
  EXPECT_EQ(options.brokers, "k1:9092,k2:9092");
  EXPECT_EQ(options.topic, "events.{target}.{type}");
  EXPECT_EQ(options.compression, "zstd");
  EXPECT_EQ(options.linger, std::chrono::milliseconds{20});
  EXPECT_EQ(options.max_in_flight, 3);
  EXPECT_EQ(options.header_style, HeaderStyle::kDebezium);
  EXPECT_EQ(options.max_message_bytes, 2000000U);
  EXPECT_EQ(options.envelope, EnvelopeStyle::kExternal);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"client.id", "relay-1"},       {"security.protocol", "sasl_plaintext"},
      {"sasl.mechanisms", "PLAIN"},   {"sasl.username", "relay"},
      {"sasl.password", "from-file"}, {"socket.keepalive.enable", "true"},
      {"retry.backoff.ms", "50"}};
  EXPECT_EQ(options.properties, expected);

  config::TomlWriter out;
  all->Describe(out);
  const std::string described = out.Take();
  EXPECT_NE(described.find("header_style = \"debezium\""), std::string::npos) << described;
  EXPECT_NE(described.find("envelope = \"external\""), std::string::npos) << described;
  EXPECT_NE(described.find("[sinks.events.librdkafka]"), std::string::npos) << described;
  EXPECT_NE(described.find("\"sasl.password\" = \"***\""), std::string::npos) << described;
  EXPECT_NE(described.find("\"sasl.username\" = \"relay\""), std::string::npos) << described;
  EXPECT_EQ(described.find("from-file"), std::string::npos) << described;
  // What Describe writes reads back the same (secrets aside).
  EXPECT_NE(described.find("linger = \"20ms\""), std::string::npos) << described;
}

TEST(KafkaSinkTypeTest, EnvelopeIsFullOrExternal) {
  testing::ExpectEnvelopeKey(
      Type(), "brokers = \"k1:9092\"\n", [](const outbox::SinkSettings& settings) {
        return dynamic_cast<const SinkSettings&>(settings).options().envelope;
      });
}

TEST(KafkaSinkTypeTest, CloudEventsKeys) {
  testing::ExpectCloudEventsKeys(
      Type(), "brokers = \"k1:9092\"\n",
      [](const outbox::SinkSettings& settings) {
        return dynamic_cast<const SinkSettings&>(settings).options().cloudevents;
      },
      {"binary", "structured"});
}

TEST(KafkaSinkTypeTest, BrokersAndSecretsFromTheEnvironment) {
  const auto settings = ParseSink("[sinks.events.librdkafka]\n\"sasl.password\" = \"file\"\n",
                                  {{"OUTBOX_SINK_EVENTS_BROKERS", "env-1:19092"},
                                   {"OUTBOX_SINK_EVENTS_LIBRDKAFKA_SASL_PASSWORD", "s3cret"},
                                   {"OUTBOX_SINK_EVENTS_LIBRDKAFKA_SSL_KEY_PASSWORD", "k3y"}});
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.brokers, "env-1:19092");
  const std::vector<std::pair<std::string, std::string>> expected = {{"sasl.password", "s3cret"},
                                                                     {"ssl.key.password", "k3y"}};
  EXPECT_EQ(options.properties, expected);
  config::TomlWriter out;
  settings->Describe(out);
  const std::string described = out.Take();
  EXPECT_EQ(described.find("s3cret"), std::string::npos) << described;
  EXPECT_EQ(described.find("k3y"), std::string::npos) << described;
}

TEST(KafkaSinkTypeTest, BadValuesNameTheirKey) {
  const std::string brokers = "brokers = \"k1:9092\"\n";
  EXPECT_EQ(ErrorOf("").first, "sinks.events.brokers");
  EXPECT_EQ(ErrorOf("brokers = \"k1:notaport\"\n").first, "sinks.events.brokers");
  EXPECT_EQ(ErrorOf("brokers = \"k1:9092,,k2\"\n").first, "sinks.events.brokers");
  EXPECT_EQ(ErrorOf("brokers = [\"k1:9092\", 7]\n").first, "sinks.events.brokers");
  EXPECT_EQ(ErrorOf("", {{"OUTBOX_SINK_EVENTS_BROKERS", "bad:0"}}).first, "sinks.events.brokers");
  EXPECT_EQ(ErrorOf(brokers + "brokerz = \"x\"\n").first, "sinks.events.brokerz");
  EXPECT_EQ(ErrorOf(brokers + "compression = \"brotli\"\n").first, "sinks.events.compression");
  EXPECT_EQ(ErrorOf(brokers + "topic = \"{nope}\"\n").first, "sinks.events.topic");
  EXPECT_EQ(ErrorOf(brokers + "topic = \"\"\n").first, "sinks.events.topic");
  EXPECT_EQ(ErrorOf(brokers + "linger = \"soon\"\n").first, "sinks.events.linger");
  EXPECT_EQ(ErrorOf(brokers + "max_in_flight = 6\n").first, "sinks.events.max_in_flight");
  EXPECT_EQ(ErrorOf(brokers + "header_style = \"camel\"\n").first, "sinks.events.header_style");
  EXPECT_EQ(ErrorOf(brokers + "max_message_bytes = 10\n").first, "sinks.events.max_message_bytes");
  EXPECT_EQ(ErrorOf(brokers + "librdkafka = \"x\"\n").first, "sinks.events.librdkafka");

  const std::string table = brokers + "[sinks.events.librdkafka]\n";
  const auto [idempotence, idempotence_message] =
      ErrorOf(table + "\"enable.idempotence\" = false\n");
  EXPECT_EQ(idempotence, "sinks.events.librdkafka.enable.idempotence");
  EXPECT_NE(idempotence_message.find("set by the sink"), std::string::npos) << idempotence_message;
  EXPECT_EQ(ErrorOf(table + "acks = \"1\"\n").first, "sinks.events.librdkafka.acks");
  EXPECT_EQ(ErrorOf(table + "\"bootstrap.servers\" = \"x:1\"\n").first,
            "sinks.events.librdkafka.bootstrap.servers");
  const auto [unknown, unknown_message] = ErrorOf(table + "\"no.such.thing\" = \"1\"\n");
  EXPECT_EQ(unknown, "sinks.events.librdkafka.no.such.thing");
  EXPECT_NE(unknown_message.find("No such configuration property"), std::string::npos)
      << unknown_message;
  EXPECT_NE(unknown_message.find("test.toml"), std::string::npos) << "where: " << unknown_message;
  EXPECT_EQ(ErrorOf(table + "\"security.protocol\" = \"pigeon\"\n").first,
            "sinks.events.librdkafka.security.protocol");
  EXPECT_EQ(ErrorOf(table + "\"client.id\" = [1]\n").first, "sinks.events.librdkafka.client.id");
  // A partitioner that ignores the key would spread a stream over partitions.
  const auto [partitioner, partitioner_message] = ErrorOf(table + "partitioner = \"random\"\n");
  EXPECT_EQ(partitioner, "sinks.events.librdkafka.partitioner");
  EXPECT_NE(partitioner_message.find("ignores the record key"), std::string::npos)
      << partitioner_message;
  EXPECT_NO_THROW(ParseSink(table + "partitioner = \"murmur2\"\n")) << "a key-hashing one";
}

}  // namespace
}  // namespace outbox::kafka
