#pragma once
// The NATS JetStream sink type for outboxd's [sinks.<name>] tables (sink/registry.h):
//
//   [sinks.<name>]
//   type = "nats"
//   url = "nats://user:password@host:4222,nats://host2:4222"  # required, or
//                              # OUTBOX_SINK_<NAME>_URL; tls://... for TLS; "token@host" for a
//                              # token in the URL
//   subject = "{topic}"        # placeholders {topic}, {target}, {type}; no wildcards
//   expect_stream = ""         # a stream name: publishes to any other stream are refused
//   max_pending = 1000         # publishes awaiting their ack, 1 to 100000
//   connect_timeout = "5s"     # 1ms to 10m
//   ping_interval = "10s"      # 100ms to 1h; a silent server is given up within 3 intervals
//   max_message_bytes = 1048576  # 1 to 64 MiB (NATS's own limit: the server's max_payload)
//   token = ""                 # or OUTBOX_SINK_<NAME>_TOKEN
//   creds = ""                 # a credentials file (user JWT and NKey seed)
//   nkey_seed = ""             # a file holding an NKey user seed
//   tls_ca_file = ""           # PEM: CA certificates to trust (empty: the system's)
//   tls_cert_file = ""         # PEM: client certificate (with tls_key_file)
//   tls_key_file = ""          # PEM: its private key
//   tls_server_name = ""       # name expected in the server's certificate (empty: the host)
//   envelope = "full"          # or "external": no outbox-* headers (sink/envelope_style.h),
//                              # or "cloudevents" (docs/cloudevents.md), then also:
//   cloudevents_mode = "binary"  # ce-* headers, or "structured"
//   cloudevents_source = "/outbox/{target}"  # placeholders {topic}, {target}, {type}
//
// At most one way to authenticate: user info in the URL, token, creds or nkey_seed. TLS is on
// when the URL is tls:// or any tls_* key is set. Files must exist and be readable when the
// configuration is read. Secrets (the URL's password or token, `token`) may come from the
// environment, which wins over the file, and --check-config shows them as ***.
//
// What the keys mean: outbox::nats::SinkOptions (sink/nats.h).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/sink/nats.h"
#include "outbox/sink/registry.h"

namespace outbox::nats {

class SinkSettings final : public outbox::SinkSettings {
 public:
  explicit SinkSettings(SinkOptions options) : options_(std::move(options)) {}
  void Describe(config::TomlWriter& out) const override;
  // The sink, logging through the context's log and comparing duplicate windows with its lease.
  [[nodiscard]] std::unique_ptr<Sink> Open(const SinkContext& context) const override;
  // The first server of the URL.
  [[nodiscard]] std::optional<SinkEndpoint> Endpoint() const override;
  [[nodiscard]] std::vector<std::string> Secrets() const override;
  [[nodiscard]] const SinkOptions& options() const { return options_; }

 private:
  SinkOptions options_;
};

// type = "nats".
SinkType Type();

}  // namespace outbox::nats
