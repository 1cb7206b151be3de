#include "outbox/core/error.h"
#include "outbox/core/secrets.h"
#include "outbox/sink/host_port.h"
#include "outbox/sink/rabbitmq_type.h"
#include "url_mask.h"

namespace outbox::rabbitmq {
namespace {

using config::Fail;
using config::Quoted;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::int64_t kMaxConfirmWindow = 100000;
constexpr std::int64_t kMaxMessageBytes = 512 * 1024 * 1024;  // RabbitMQ's hard limit

std::unique_ptr<const outbox::SinkSettings> Parse(const config::Section& sink,
                                                  std::string_view name,
                                                  const config::GetenvFn& getenv) {
  sink.AllowOnly({"type", "url", "exchange", "routing_key", "mandatory", "persistent",
                  "confirm_window", "connect_timeout", "heartbeat", "declare_exchange_type",
                  "max_message_bytes", "envelope", "cloudevents_mode",
                  "cloudevents_source"});
  SinkOptions options;
  options.url.clear();
  config::ValueSource url =
      sink.ReadSecret("url", SinkSecretEnv(name, "url"), getenv, options.url, /*required=*/true);
  sink.Read("exchange", options.exchange);
  sink.Read("routing_key", options.routing_key);
  sink.Read("mandatory", options.mandatory);
  sink.Read("persistent", options.persistent);
  sink.ReadInteger("confirm_window", 1, kMaxConfirmWindow, options.confirm_window);
  sink.ReadDuration("connect_timeout", milliseconds{1}, std::chrono::minutes{10},
                    options.connect_timeout);
  sink.ReadDuration("heartbeat", milliseconds{0}, seconds{65535}, options.heartbeat);
  sink.Read("declare_exchange_type", options.declare_exchange_type);
  sink.ReadInteger("max_message_bytes", 1, kMaxMessageBytes, options.max_message_bytes);
  ReadEnvelope(sink, options.envelope, options.cloudevents);

  // The values themselves (the URL, the names and templates, the topology) are checked where the
  // sink checks them, once; the messages never quote the password.
  url.shown = MaskAmqpUrl(options.url);
  sink.Check([&] { ValidateOptions(options); }, {&url});
  return std::make_unique<const SinkSettings>(std::move(options));
}

}  // namespace

void SinkSettings::Describe(config::TomlWriter& out) const {
  // Masked by librabbitmq's own parse (url_mask.h), not by pattern.
  out.String("url", MaskAmqpUrl(options_.url));
  out.String("exchange", options_.exchange);
  out.String("routing_key", options_.routing_key);
  out.Bool("mandatory", options_.mandatory);
  out.Bool("persistent", options_.persistent);
  out.Integer("confirm_window", static_cast<std::int64_t>(options_.confirm_window));
  out.Duration("connect_timeout", options_.connect_timeout);
  out.Duration("heartbeat", options_.heartbeat);
  out.String("declare_exchange_type", options_.declare_exchange_type);
  out.Integer("max_message_bytes", static_cast<std::int64_t>(options_.max_message_bytes));
  DescribeEnvelope(out, options_.envelope, options_.cloudevents);
}

std::unique_ptr<Sink> SinkSettings::Open(const SinkContext& /*context*/) const {
  return OpenSink(options_);
}

std::optional<SinkEndpoint> SinkSettings::Endpoint() const {
  return AmqpEndpoint(options_.url).value_or(SinkEndpoint{});
}

std::vector<std::string> SinkSettings::Secrets() const { return UrlSecretForms(options_.url); }

SinkType Type() { return {.name = std::string{kSinkName}, .parse = Parse}; }

std::optional<SinkEndpoint> AmqpEndpoint(std::string_view url) {
  constexpr std::string_view kScheme = "amqp://";
  if (!url.starts_with(kScheme)) return std::nullopt;
  std::string_view rest = url.substr(kScheme.size());
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (const std::size_t at = rest.rfind('@'); at != std::string_view::npos) {
    rest = rest.substr(at + 1);
  }
  auto address = ParseHostPort(rest, 5672);
  if (!address) return std::nullopt;
  if (address->host.empty()) address->host = "localhost";  // librabbitmq's default as well
  return SinkEndpoint{std::move(address->host), address->port};
}

}  // namespace outbox::rabbitmq
