#pragma once
// The AMQP 1.0 sink type for outboxd's [sinks.<name>] tables (sink/registry.h):
//
//   [sinks.<name>]
//   type = "amqp10"
//   url = "amqps://user:password@host"   # required, or OUTBOX_SINK_<NAME>_URL; amqp:// (5672)
//                              # or amqps:// (TLS, 5671); user and password: SASL PLAIN
//   address = "{topic}"        # placeholders {topic}, {target}, {type}; "/queue/{topic}" or
//                              # "/exchange/x/{topic}" for RabbitMQ 3.x's plugin
//   sasl_mechanisms = ""       # PLAIN, ANONYMOUS, EXTERNAL (space-separated); "": PLAIN with a
//                              # user in the url, else ANONYMOUS
//   max_in_flight = 1000       # deliveries awaiting their disposition, 1 to 100000
//   connect_timeout = "5s"     # 1ms to 10m
//   idle_timeout = "10s"       # "0s" (never) or 100ms to 1h: a silent connection is given up
//   max_message_bytes = 1048576  # 1 to 512 MiB
//   durable = true
//   tls_ca_file = ""           # PEM: CA certificates to trust (empty: the system's)
//   tls_cert_file = ""         # PEM: client certificate (with tls_key_file and tls_ca_file)
//   tls_key_file = ""          # PEM: its private key
//   tls_server_name = ""       # name expected in the server's certificate (empty: the host)
//   envelope = "full"          # or "external": no outbox-* properties (sink/envelope_style.h),
//                              # or "cloudevents" (docs/cloudevents.md), then also:
//   cloudevents_mode = "binary"  # cloudEvents_* application properties, or "structured"
//   cloudevents_source = "/outbox/{target}"  # placeholders {topic}, {target}, {type}
//
// The url's password may come from the environment, which wins over the file, and
// --check-config shows it as ***.
//
// What the keys mean: outbox::amqp10::SinkOptions (sink/amqp10.h).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/sink/amqp10.h"
#include "outbox/sink/registry.h"

namespace outbox::amqp10 {

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

// type = "amqp10".
SinkType Type();

}  // namespace outbox::amqp10
