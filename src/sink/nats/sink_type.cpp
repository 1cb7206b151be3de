#include <algorithm>
#include <chrono>
#include <cstdint>

#include "outbox/core/error.h"
#include "outbox/core/secrets.h"
#include "outbox/sink/nats_type.h"

namespace outbox::nats {
namespace {

using config::Fail;
using std::chrono::milliseconds;

constexpr std::int64_t kMaxPending = 100000;
constexpr std::int64_t kMaxMessageBytes = std::int64_t{64} * 1024 * 1024;

// The keys naming files (ValidateOptions checks that they can be read).
constexpr std::string_view kFileKeys[] = {"creds", "nkey_seed", "tls_ca_file", "tls_cert_file",
                                          "tls_key_file"};

std::string* FileOption(SinkOptions& options, std::string_view key) {
  if (key == "creds") return &options.creds;
  if (key == "nkey_seed") return &options.nkey_seed;
  if (key == "tls_ca_file") return &options.tls_ca_file;
  if (key == "tls_cert_file") return &options.tls_cert_file;
  return &options.tls_key_file;
}

std::unique_ptr<const outbox::SinkSettings> Parse(const config::Section& sink,
                                                  std::string_view name,
                                                  const config::GetenvFn& getenv) {
  sink.AllowOnly({"type",
                  "url",
                  "subject",
                  "expect_stream",
                  "max_pending",
                  "connect_timeout",
                  "ping_interval",
                  "max_message_bytes",
                  "token",
                  "creds",
                  "nkey_seed",
                  "tls_ca_file",
                  "tls_cert_file",
                  "tls_key_file",
                  "tls_server_name",
                  "envelope",
                  "cloudevents_mode",
                  "cloudevents_source"});
  SinkOptions options;
  options.url.clear();

  // url: required; the environment wins (it may hold a password or token).
  const config::ValueSource url =
      sink.ReadSecret("url", SinkSecretEnv(name, "url"), getenv, options.url, /*required=*/true);
  sink.Read("subject", options.subject);
  sink.Read("expect_stream", options.expect_stream);
  sink.ReadInteger("max_pending", 1, kMaxPending, options.max_pending);
  sink.ReadDuration("connect_timeout", milliseconds{1}, std::chrono::minutes{10},
                    options.connect_timeout);
  sink.ReadDuration("ping_interval", milliseconds{100}, std::chrono::hours{1},
                    options.ping_interval);
  sink.ReadInteger("max_message_bytes", 1, kMaxMessageBytes, options.max_message_bytes);

  sink.ReadSecret("token", SinkSecretEnv(name, "token"), getenv, options.token);

  for (const std::string_view key : kFileKeys) sink.Read(key, *FileOption(options, key));
  sink.Read("tls_server_name", options.tls_server_name);
  ReadEnvelope(sink, options.envelope, options.cloudevents);

  // The values themselves (the URL, the subject and its template, the stream name, readable files,
  // combinations), checked where the sink checks them, once.
  sink.Check([&] { ValidateOptions(options); }, {&url});
  return std::make_unique<const SinkSettings>(std::move(options));
}

}  // namespace

void SinkSettings::Describe(config::TomlWriter& out) const {
  out.String("url", MaskUrl(options_.url));
  out.String("subject", options_.subject);
  out.String("expect_stream", options_.expect_stream);
  out.Integer("max_pending", static_cast<std::int64_t>(options_.max_pending));
  out.Duration("connect_timeout", options_.connect_timeout);
  out.Duration("ping_interval", options_.ping_interval);
  out.Integer("max_message_bytes", static_cast<std::int64_t>(options_.max_message_bytes));
  out.String("token", options_.token.empty() ? "" : "***");
  out.String("creds", options_.creds);
  out.String("nkey_seed", options_.nkey_seed);
  out.String("tls_ca_file", options_.tls_ca_file);
  out.String("tls_cert_file", options_.tls_cert_file);
  out.String("tls_key_file", options_.tls_key_file);
  out.String("tls_server_name", options_.tls_server_name);
  DescribeEnvelope(out, options_.envelope, options_.cloudevents);
}

std::vector<std::string> SinkSettings::Secrets() const {
  // Each server of the list may carry user info; a lone user there is a token.
  std::vector<std::string> secrets;
  std::string_view urls = options_.url;
  while (!urls.empty()) {
    const std::size_t comma = std::min(urls.find(','), urls.size());
    for (std::string& form : UrlSecretForms(urls.substr(0, comma), /*lone_user_is_secret=*/true)) {
      secrets.push_back(std::move(form));
    }
    urls.remove_prefix(std::min(comma + 1, urls.size()));
  }
  secrets.push_back(options_.token);
  return secrets;
}

std::unique_ptr<Sink> SinkSettings::Open(const SinkContext& context) const {
  SinkOptions options = options_;
  if (!options.log) options.log = context.log;
  options.lease = context.lease;
  return OpenSink(std::move(options));
}

std::optional<SinkEndpoint> SinkSettings::Endpoint() const {
  try {
    const Servers servers = ParseUrl(options_.url);
    return SinkEndpoint{servers.addresses.front().host, servers.addresses.front().port};
  } catch (const std::invalid_argument&) {
    return SinkEndpoint{};
  }
}

SinkType Type() { return {.name = std::string{kSinkName}, .parse = Parse}; }

}  // namespace outbox::nats
