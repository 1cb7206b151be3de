// The AMQP 1.0 sink's [sinks.<name>] table (sink/amqp10_type.h).

#include <chrono>
#include <cstdint>
#include <stdexcept>

#include "outbox/core/secrets.h"
#include "outbox/sink/amqp10_type.h"

namespace outbox::amqp10 {
namespace {

using std::chrono::milliseconds;

constexpr std::int64_t kMaxInFlight = 100000;
constexpr std::int64_t kMaxMessageBytes = std::int64_t{512} * 1024 * 1024;

std::unique_ptr<const outbox::SinkSettings> Parse(const config::Section& sink,
                                                  std::string_view name,
                                                  const config::GetenvFn& getenv) {
  sink.AllowOnly({"type", "url", "address", "sasl_mechanisms", "max_in_flight", "connect_timeout",
                  "idle_timeout", "max_message_bytes", "durable", "tls_ca_file", "tls_cert_file",
                  "tls_key_file", "tls_server_name", "envelope", "cloudevents_mode", "cloudevents_source"});
  SinkOptions options;
  options.url.clear();
  config::ValueSource url =
      sink.ReadSecret("url", SinkSecretEnv(name, "url"), getenv, options.url, /*required=*/true);
  sink.Read("address", options.address);
  sink.Read("sasl_mechanisms", options.sasl_mechanisms);
  sink.ReadInteger("max_in_flight", 1, kMaxInFlight, options.max_in_flight);
  sink.ReadDuration("connect_timeout", milliseconds{1}, std::chrono::minutes{10},
                    options.connect_timeout);
  if (sink.ReadDuration("idle_timeout", milliseconds{0}, std::chrono::hours{1},
                        options.idle_timeout) &&
      options.idle_timeout > milliseconds::zero() && options.idle_timeout < milliseconds{100}) {
    config::Fail(sink.Key("idle_timeout"), "must be \"0s\" (never) or at least 100ms");
  }
  sink.ReadInteger("max_message_bytes", 1, kMaxMessageBytes, options.max_message_bytes);
  sink.Read("durable", options.durable);
  sink.Read("tls_ca_file", options.tls_ca_file);
  sink.Read("tls_cert_file", options.tls_cert_file);
  sink.Read("tls_key_file", options.tls_key_file);
  sink.Read("tls_server_name", options.tls_server_name);
  ReadEnvelope(sink, options.envelope, options.cloudevents);

  // The values themselves (the URL, the address template, the mechanisms, the files and their
  // combinations) are checked where the sink checks them, once; the messages never quote the
  // password.
  url.shown = MaskUrl(options.url);
  sink.Check([&] { ValidateOptions(options); }, {&url});
  return std::make_unique<const SinkSettings>(std::move(options));
}

}  // namespace

void SinkSettings::Describe(config::TomlWriter& out) const {
  out.String("url", MaskUrl(options_.url));
  out.String("address", options_.address);
  out.String("sasl_mechanisms", options_.sasl_mechanisms);
  out.Integer("max_in_flight", static_cast<std::int64_t>(options_.max_in_flight));
  out.Duration("connect_timeout", options_.connect_timeout);
  out.Duration("idle_timeout", options_.idle_timeout);
  out.Integer("max_message_bytes", static_cast<std::int64_t>(options_.max_message_bytes));
  out.Bool("durable", options_.durable);
  out.String("tls_ca_file", options_.tls_ca_file);
  out.String("tls_cert_file", options_.tls_cert_file);
  out.String("tls_key_file", options_.tls_key_file);
  out.String("tls_server_name", options_.tls_server_name);
  DescribeEnvelope(out, options_.envelope, options_.cloudevents);
}

std::unique_ptr<Sink> SinkSettings::Open(const SinkContext& /*context*/) const {
  return OpenSink(options_);
}

std::optional<SinkEndpoint> SinkSettings::Endpoint() const {
  try {
    const amqp10::Endpoint endpoint = ParseUrl(options_.url);
    return SinkEndpoint{endpoint.host, endpoint.port};
  } catch (const std::invalid_argument&) {
    return SinkEndpoint{};
  }
}

std::vector<std::string> SinkSettings::Secrets() const { return UrlSecretForms(options_.url); }

SinkType Type() { return {.name = std::string{kSinkName}, .parse = Parse}; }

}  // namespace outbox::amqp10
