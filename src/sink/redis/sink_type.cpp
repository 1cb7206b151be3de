#include <chrono>
#include <cstdint>
#include <limits>

#include "outbox/core/error.h"
#include "outbox/core/secrets.h"
#include "outbox/sink/redis_type.h"

namespace outbox::redis {
namespace {

using config::Fail;
using std::chrono::milliseconds;

std::unique_ptr<const outbox::SinkSettings> Parse(const config::Section& sink,
                                                  std::string_view name,
                                                  const config::GetenvFn& getenv) {
  sink.AllowOnly({"type", "url", "stream", "max_len", "dedup", "dedup_window", "dedup_prefix",
                  "pipeline", "connect_timeout", "max_message_bytes", "envelope", "cloudevents_mode", "cloudevents_source"});
  SinkOptions options;
  options.url.clear();
  const config::ValueSource url =
      sink.ReadSecret("url", SinkSecretEnv(name, "url"), getenv, options.url, /*required=*/true);
  sink.Read("stream", options.stream);
  sink.ReadInteger("max_len", 0, std::numeric_limits<std::int64_t>::max(), options.max_len);
  sink.Read("dedup", options.dedup);
  sink.ReadDuration("dedup_window", milliseconds{1000}, std::chrono::hours{24 * 365},
                    options.dedup_window);
  sink.Read("dedup_prefix", options.dedup_prefix);
  sink.ReadInteger("pipeline", 1, 100000, options.pipeline);
  sink.ReadDuration("connect_timeout", milliseconds{1}, std::chrono::minutes{10},
                    options.connect_timeout);
  sink.ReadInteger("max_message_bytes", 1, std::int64_t{512} * 1024 * 1024,
                   options.max_message_bytes);
  ReadEnvelope(sink, options.envelope, options.cloudevents, {"binary"});

  // The values themselves (the URL, the stream template, the prefix), checked where the sink
  // checks them, once; ParseUrl's messages never contain the password.
  sink.Check([&] { ValidateOptions(options); }, {&url});
  return std::make_unique<const SinkSettings>(std::move(options));
}

}  // namespace

void SinkSettings::Describe(config::TomlWriter& out) const {
  out.String("url", MaskUrl(options_.url));
  out.String("stream", options_.stream);
  out.Integer("max_len", static_cast<std::int64_t>(options_.max_len));
  out.Bool("dedup", options_.dedup);
  out.Duration("dedup_window", options_.dedup_window);
  out.String("dedup_prefix", options_.dedup_prefix);
  out.Integer("pipeline", static_cast<std::int64_t>(options_.pipeline));
  out.Duration("connect_timeout", options_.connect_timeout);
  out.Integer("max_message_bytes", static_cast<std::int64_t>(options_.max_message_bytes));
  DescribeEnvelope(out, options_.envelope, options_.cloudevents);
}

std::unique_ptr<Sink> SinkSettings::Open(const SinkContext& context) const {
  SinkOptions options = options_;
  if (!options.log) options.log = context.log;
  options.lease = context.lease;
  return OpenSink(std::move(options));
}

std::vector<std::string> SinkSettings::Secrets() const { return UrlSecretForms(options_.url); }

std::optional<SinkEndpoint> SinkSettings::Endpoint() const {
  const redis::Endpoint endpoint = ParseUrl(options_.url);
  if (!endpoint.unix_path.empty()) return std::nullopt;
  return SinkEndpoint{endpoint.host, endpoint.port};
}

SinkType Type() { return {.name = std::string{kSinkName}, .parse = Parse}; }

}  // namespace outbox::redis
