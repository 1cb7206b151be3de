#pragma once
// The RabbitMQ sink type for outboxd's [sinks.<name>] tables (sink/registry.h):
//
//   [sinks.<name>]
//   type = "rabbitmq"
//   url = "amqp://user:password@host:5672/vhost"   # required, or OUTBOX_SINK_<NAME>_URL
//   exchange = ""              # a template like routing_key; "" is the default exchange
//   routing_key = "{topic}"    # placeholders {topic}, {target}, {type}; at most 255 bytes
//   mandatory = true, persistent = true, confirm_window = 1000 (1..100000),
//   connect_timeout = "5s", heartbeat = "10s" (whole seconds, "0s" disables),
//   declare_exchange_type = "" (or direct, topic, fanout, headers), max_message_bytes = 16 MiB
//   envelope = "full"          # or "external": no outbox-* headers (sink/envelope_style.h),
//                              # or "cloudevents" (docs/cloudevents.md), then also:
//   cloudevents_mode = "binary"  # cloudEvents_* headers, or "structured"
//   cloudevents_source = "/outbox/{target}"  # placeholders {topic}, {target}, {type}
//
// What the keys mean: outbox::rabbitmq::SinkOptions (sink/rabbitmq.h).

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/sink/rabbitmq.h"
#include "outbox/sink/registry.h"

namespace outbox::rabbitmq {

class SinkSettings final : public outbox::SinkSettings {
 public:
  explicit SinkSettings(SinkOptions options) : options_(std::move(options)) {}
  void Describe(config::TomlWriter& out) const override;
  [[nodiscard]] std::unique_ptr<Sink> Open(const SinkContext& context) const override;
  [[nodiscard]] std::optional<SinkEndpoint> Endpoint() const override;
  [[nodiscard]] std::vector<std::string> Secrets() const override;
  [[nodiscard]] const SinkOptions& options() const { return options_; }

 private:
  SinkOptions options_;
};

// type = "rabbitmq".
SinkType Type();

// The host and port an amqp:// URL connects to (user info, vhost and query left out; port 5672
// when none is given, host "localhost" when empty, IPv6 in brackets); nullopt when it is not an
// amqp:// URL or its port is not 1..65535.
std::optional<SinkEndpoint> AmqpEndpoint(std::string_view url);

}  // namespace outbox::rabbitmq
