// type = "http" (sink/http_type.h): the [sinks.<name>] table read into SinkOptions.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <sstream>
#include <toml.hpp>  // secrets, headers and statuses: values of any type

#include "outbox/core/error.h"
#include "outbox/core/secrets.h"
#include "outbox/sink/http_type.h"
#include "url.h"

namespace outbox::webhook {
namespace {

using config::Fail;
using config::Quoted;
using std::chrono::milliseconds;

constexpr std::string_view kSecretPrefix = "whsec_";

constexpr std::int64_t kMaxInFlight = 10000;
constexpr std::int64_t kMaxMessageBytes = std::int64_t{64} * 1024 * 1024;

// secrets: one string or an array of strings; the environment (space-separated) wins.
config::ValueSource ReadSecrets(const config::Section& sink, std::string_view name,
                                const config::GetenvFn& getenv, SinkOptions& options) {
  const config::TomlValue* value = sink.Find("secrets");
  config::ValueSource source{.key = sink.Key("secrets"), .env = {}, .value = value};
  if (value != nullptr) {
    if (value->is_string()) {
      options.secrets.push_back(value->as_string().str);
    } else if (value->is_array()) {
      for (const config::TomlValue& entry : value->as_array()) {
        if (!entry.is_string()) {
          Fail(sink.Key("secrets"), "expected an array of \"whsec_...\" strings", &entry);
        }
        options.secrets.push_back(entry.as_string().str);
      }
    } else {
      Fail(sink.Key("secrets"),
           "expected a string or an array of strings, got " + config::TypeName(value->type()),
           value);
    }
  }
  const std::string env = SinkSecretEnv(name, "secrets");
  if (auto from_env = config::Env(getenv, env)) {
    source = {.key = sink.Key("secrets"), .env = env, .value = nullptr};
    options.secrets.clear();
    std::istringstream words{*from_env};
    for (std::string secret; words >> secret;) options.secrets.push_back(secret);
    // Blank is a mistake, not "unsigned": requests would go out without a signature.
    if (options.secrets.empty()) {
      Fail(sink.Key("secrets"), env +
                                    " is set but holds no secret (unset it to sign with the "
                                    "file's secrets)");
    }
  }
  return source;
}

// headers: an inline table (or a sub-table) of strings, in the order written.
void ReadHeaders(const config::Section& sink, SinkOptions& options) {
  const config::Section headers = sink.Table("headers");
  for (const auto& [header, value] : headers.Entries()) {
    if (!value->is_string()) {
      Fail(headers.Key(header), "expected a string, got " + config::TypeName(value->type()), value);
    }
    options.headers.emplace_back(header, value->as_string().str);
  }
}

// retry_statuses (4xx) and abandon_statuses (4xx, 5xx but 408, 429, 503; none in both): arrays of
// integers.
void ReadStatuses(const config::Section& sink, SinkOptions& options) {
  const auto read = [&sink](const std::string& key, int highest, std::vector<int>& out) {
    const config::TomlValue* value = sink.Find(key);
    if (value == nullptr) return;
    if (!value->is_array()) {
      Fail(sink.Key(key), "expected an array of integers, got " + config::TypeName(value->type()),
           value);
    }
    const std::string what = highest == 499 ? "4xx statuses" : "4xx or 5xx statuses";
    for (const config::TomlValue& entry : value->as_array()) {
      if (!entry.is_integer())
        Fail(sink.Key(key), "expected an array of integers (" + what + ")", &entry);
      const std::int64_t status = entry.as_integer();
      if (status < 400 || status > highest) {
        Fail(sink.Key(key),
             "lists " + what + (highest == 499 ? " (5xx are always retried)" : "") + ", got " +
                 std::to_string(status),
             &entry);
      }
      out.push_back(static_cast<int>(status));
    }
  };
  read("retry_statuses", 499, options.retry_statuses);
  read("abandon_statuses", 599, options.abandon_statuses);
  const config::TomlValue* abandon = sink.Find("abandon_statuses");
  for (const int status : options.abandon_statuses) {
    if (status == 408 || status == 429 || status == 503) {
      Fail(sink.Key("abandon_statuses"),
           "cannot list " + std::to_string(status) + ": it asks to wait and is always retried",
           abandon);
    }
    if (std::find(options.retry_statuses.begin(), options.retry_statuses.end(), status) !=
        options.retry_statuses.end()) {
      Fail(sink.Key("abandon_statuses"),
           "lists " + std::to_string(status) + ", which retry_statuses lists too", abandon);
    }
  }
}

std::unique_ptr<const outbox::SinkSettings> Parse(const config::Section& sink,
                                                  std::string_view name,
                                                  const config::GetenvFn& getenv) {
  sink.AllowOnly({"type",
                  "url",
                  "method",
                  "secrets",
                  "headers",
                  "max_in_flight",
                  "connect_timeout",
                  "request_timeout",
                  "retry_statuses",
                  "abandon_statuses",
                  "max_retry_after",
                  "max_message_bytes",
                  "http_version",
                  "tls_ca_file",
                  "tls_cert_file",
                  "tls_key_file",
                  "proxy",
                  "envelope",
                  "cloudevents_mode",
                  "cloudevents_source"});
  SinkOptions options;

  // url: required; the environment wins (it may hold a password).
  const config::ValueSource url =
      sink.ReadSecret("url", SinkSecretEnv(name, "url"), getenv, options.url, /*required=*/true);

  sink.ReadChoice("method", {"POST", "PUT"}, options.method);
  const config::ValueSource secrets = ReadSecrets(sink, name, getenv, options);
  ReadHeaders(sink, options);
  sink.ReadInteger("max_in_flight", 1, kMaxInFlight, options.max_in_flight);
  sink.ReadDuration("connect_timeout", milliseconds{1}, std::chrono::minutes{10},
                    options.connect_timeout);
  sink.ReadDuration("request_timeout", milliseconds{1}, std::chrono::hours{1},
                    options.request_timeout);
  ReadStatuses(sink, options);
  sink.ReadDuration("max_retry_after", std::chrono::seconds{1}, std::chrono::hours{24},
                    options.max_retry_after);
  sink.ReadInteger("max_message_bytes", 1, kMaxMessageBytes, options.max_message_bytes);
  std::string version = "auto";
  sink.ReadChoice("http_version", {"auto", "1.1", "2"}, version);
  options.http_version = version == "1.1" ? HttpVersion::kHttp1
                         : version == "2" ? HttpVersion::kHttp2
                                          : HttpVersion::kAuto;
  sink.Read("tls_ca_file", options.tls_ca_file);
  sink.Read("tls_cert_file", options.tls_cert_file);
  sink.Read("tls_key_file", options.tls_key_file);
  sink.Read("proxy", options.proxy);
  ReadEnvelope(sink, options.envelope, options.cloudevents);

  // The rest (the URL and its template, header names, secrets, files), named by key; the
  // messages never quote a secret or a header's value.
  sink.Check([&] { ValidateOptions(options); }, {&url, &secrets});
  return std::make_unique<const SinkSettings>(std::move(options));
}

std::string_view VersionName(HttpVersion version) {
  switch (version) {
    case HttpVersion::kHttp1:
      return "1.1";
    case HttpVersion::kHttp2:
      return "2";
    case HttpVersion::kAuto:
      break;
  }
  return "auto";
}

}  // namespace

void SinkSettings::Describe(config::TomlWriter& out) const {
  out.String("url", MaskUrl(options_.url));
  out.String("method", options_.method);
  std::vector<std::string> secrets(options_.secrets.size(), "***");
  out.Strings("secrets", secrets);
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [header, value] : options_.headers) headers.emplace_back(header, "***");
  out.StringTable("headers", headers);
  out.Integer("max_in_flight", static_cast<std::int64_t>(options_.max_in_flight));
  out.Duration("connect_timeout", options_.connect_timeout);
  out.Duration("request_timeout", options_.request_timeout);
  out.Integers("retry_statuses", options_.retry_statuses);
  out.Integers("abandon_statuses", options_.abandon_statuses);
  out.Duration("max_retry_after", options_.max_retry_after);
  out.Integer("max_message_bytes", static_cast<std::int64_t>(options_.max_message_bytes));
  out.String("http_version", VersionName(options_.http_version));
  out.String("tls_ca_file", options_.tls_ca_file);
  out.String("tls_cert_file", options_.tls_cert_file);
  out.String("tls_key_file", options_.tls_key_file);
  out.String("proxy", MaskUrl(options_.proxy));
  DescribeEnvelope(out, options_.envelope, options_.cloudevents);
}

std::unique_ptr<Sink> SinkSettings::Open(const SinkContext& context) const {
  SinkOptions options = options_;
  if (!options.log) options.log = context.log;
  return OpenSink(std::move(options));
}

std::optional<SinkEndpoint> SinkSettings::Endpoint() const {
  // Through a proxy, the proxy is what must be up.
  if (options_.proxy.empty() && !HostIsLiteral(options_.url)) return std::nullopt;
  const UrlCheck check =
      CheckUrl(options_.proxy.empty() ? SampleUrl(options_.url) : options_.proxy);
  if (!check.host) return SinkEndpoint{};
  return SinkEndpoint{check.host->name, check.host->port};
}

std::vector<std::string> SinkSettings::Secrets() const {
  // libcurl sends the URL's (and the proxy's) user info as Basic authentication.
  std::vector<std::string> secrets = UrlSecretForms(options_.url);
  for (std::string& form : UrlSecretForms(options_.proxy)) secrets.push_back(std::move(form));
  for (const auto& [header, value] : options_.headers) {
    for (std::string& form : HeaderSecretForms(value)) secrets.push_back(std::move(form));
  }
  for (const std::string& secret : options_.secrets) {
    secrets.push_back(secret);
    if (secret.starts_with(kSecretPrefix)) secrets.push_back(secret.substr(kSecretPrefix.size()));
  }
  return secrets;
}

SinkType Type() { return {.name = std::string{kSinkName}, .parse = Parse}; }

}  // namespace outbox::webhook
