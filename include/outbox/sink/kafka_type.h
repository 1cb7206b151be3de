#pragma once
// The Kafka sink type for outboxd's [sinks.<name>] tables (sink/registry.h):
//
//   [sinks.<name>]
//   type = "kafka"
//   brokers = "kafka-1:9092,kafka-2:9092"  # required (a string, or an array of strings), or
//                                          # OUTBOX_SINK_<NAME>_BROKERS
//   topic = "{topic}"             # placeholders {topic}, {target}, {type}
//   compression = "none"          # none, gzip, snappy, lz4, zstd
//   linger = "5ms"                # 0s to 15m
//   max_in_flight = 5             # 1 to 5
//   header_style = "outbox"       # or "debezium" (adds header `id` = the message id)
//   max_message_bytes = 1000000   # 1000 to 1000000000
//   envelope = "full"             # or "external": no outbox-* headers (sink/envelope_style.h),
//                                 # or "cloudevents" (docs/cloudevents.md), then also:
//   cloudevents_mode = "binary"   # ce_* headers, or "structured"
//   cloudevents_source = "/outbox/{target}"  # placeholders {topic}, {target}, {type}
//
//   [sinks.<name>.librdkafka]     # any other librdkafka property, as a string (or a number or
//   "security.protocol" = "sasl_ssl"  # boolean, written as librdkafka spells it)
//   "sasl.mechanisms" = "SCRAM-SHA-512"
//   "sasl.username" = "relay"
//   # "sasl.password" from OUTBOX_SINK_<NAME>_LIBRDKAFKA_SASL_PASSWORD
//
// Properties the sink sets itself (enable.idempotence, acks, bootstrap.servers,
// compression.codec, linger.ms, ...: kafka::IsReservedProperty) are refused by name, as are
// properties librdkafka does not know or values it refuses. Secrets: every secret property
// (kafka::IsSecretProperty: sasl.password, ssl.key.password, ssl.keystore.password,
// sasl.oauthbearer.client.secret, sasl.oauthbearer.config, ssl.key.pem) may come from the
// environment variable OUTBOX_SINK_<NAME>_LIBRDKAFKA_<PROPERTY> (the property upper-cased, '.' as
// '_'), which wins over the file; --check-config shows every secret property as "***".
//
// What the keys mean: outbox::kafka::SinkOptions (sink/kafka.h).

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/sink/kafka.h"
#include "outbox/sink/registry.h"

namespace outbox::kafka {

class SinkSettings final : public outbox::SinkSettings {
 public:
  SinkSettings(std::string sink_name, SinkOptions options)
      : sink_name_(std::move(sink_name)), options_(std::move(options)) {}
  void Describe(config::TomlWriter& out) const override;
  [[nodiscard]] std::unique_ptr<Sink> Open(const SinkContext& context) const override;
  // The first broker of the bootstrap list.
  [[nodiscard]] std::optional<SinkEndpoint> Endpoint() const override;
  [[nodiscard]] std::vector<std::string> Secrets() const override;
  [[nodiscard]] const SinkOptions& options() const { return options_; }

 private:
  std::string sink_name_;
  SinkOptions options_;
};

// type = "kafka".
SinkType Type();

}  // namespace outbox::kafka
