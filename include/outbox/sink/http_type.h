#pragma once
// The HTTP webhook sink type for outboxd's [sinks.<name>] tables (sink/registry.h):
//
//   [sinks.<name>]
//   type = "http"
//   url = "https://hooks.example.com/outbox/{topic}"  # required, or OUTBOX_SINK_<NAME>_URL;
//                              # placeholders {topic}, {target}, {type} (percent-encoded)
//   method = "POST"            # or "PUT"
//   secrets = ["whsec_..."]    # Standard Webhooks signing secrets (one string also works), or
//                              # OUTBOX_SINK_<NAME>_SECRETS (space-separated); none: unsigned
//   headers = { Authorization = "Bearer ..." }  # sent with every request
//   max_in_flight = 64         # requests in flight per host, 1 to 10000
//   connect_timeout = "5s"     # 1ms to 10m
//   request_timeout = "30s"    # the whole request, 1ms to 1h
//   retry_statuses = []        # 4xx statuses retried with an attempt spent, whatever their default
//   abandon_statuses = []      # 4xx/5xx abandoned at once besides 400, 413, 415, 422
//   max_retry_after = "10m"    # the longest Retry-After honoured, 1s to 24h
//   max_message_bytes = 1048576  # 1 to 64 MiB
//   http_version = "auto"      # "auto", "1.1" or "2"
//   tls_ca_file = ""           # PEM: CA certificates to trust (empty: the system's)
//   tls_cert_file = ""         # PEM: client certificate (with tls_key_file)
//   tls_key_file = ""          # PEM: its private key
//   proxy = ""                 # http://host:port; empty: none (http_proxy is ignored)
//   envelope = "full"          # or "external": no outbox-* headers, the type as `type`
//                              # (sink/envelope_style.h), or "cloudevents"
//                              # (docs/cloudevents.md), then also:
//   cloudevents_mode = "binary"  # ce-* headers, or "structured"
//   cloudevents_source = "/outbox/{target}"  # placeholders {topic}, {target}, {type}
//
// Files must exist and be readable when the configuration is read. The URL and `secrets` may come
// from the environment (it wins over the file); the URL's password, every secret and the values of
// `headers` are shown as *** by --check-config.
//
// What the keys mean: outbox::webhook::SinkOptions (sink/http.h).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/sink/http.h"
#include "outbox/sink/registry.h"

namespace outbox::webhook {

class SinkSettings final : public outbox::SinkSettings {
 public:
  explicit SinkSettings(SinkOptions options) : options_(std::move(options)) {}
  void Describe(config::TomlWriter& out) const override;
  // The sink, logging through the context's log.
  [[nodiscard]] std::unique_ptr<Sink> Open(const SinkContext& context) const override;
  // The URL's host and port, when the template leaves them fixed (no placeholder before the
  // path); otherwise none (there is no one endpoint to probe).
  [[nodiscard]] std::optional<SinkEndpoint> Endpoint() const override;
  [[nodiscard]] std::vector<std::string> Secrets() const override;
  [[nodiscard]] const SinkOptions& options() const { return options_; }

 private:
  SinkOptions options_;
};

// type = "http".
SinkType Type();

}  // namespace outbox::webhook
