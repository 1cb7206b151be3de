// ValidateOptions (sink/http.h): everything that can be checked without sending a request.

#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "headers.h"
#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/http.h"
#include "outbox/sink/name_template.h"
#include "signature.h"
#include "url.h"

namespace outbox::webhook {
namespace {

constexpr std::size_t kMaxInFlight = 10000;
constexpr std::size_t kMaxMessageBytes = std::size_t{64} * 1024 * 1024;

void CheckReadable(const std::string& path, const char* key) {
  if (!path.empty() && access(path.c_str(), R_OK) != 0) {
    throw ConfigError(key, "cannot read '" + path + "'");
  }
}

// The URL template's placeholders. NameTemplate's errors quote the template: parsed again with
// its password masked, so that they quote that instead.
void CheckTemplate(const std::string& url) {
  const std::string masked = MaskUrl(url);
  if (masked == url) {
    NameTemplate::Parse(url, "url");  // throws ConfigError("url", ...)
    return;
  }
  try {
    NameTemplate::Parse(url, "url");
  } catch (const ConfigError&) {
    NameTemplate::Parse(masked, "url");  // the same error, quoting the masked URL
    throw ConfigError(
        "url", "has a '{' or '}' in its password (percent-encode them), got '" + masked + "'");
  }
}

}  // namespace

void ValidateOptions(const SinkOptions& options) {
  if (options.url.empty()) throw ConfigError("url", "is required");
  if (options.envelope == EnvelopeStyle::kCloudEvents) {
    cloudevents::ValidateOptions(options.cloudevents);
  }
  CheckTemplate(options.url);
  const UrlCheck check = CheckUrl(SampleUrl(options.url));
  if (!check.host) {
    throw ConfigError("url", check.problem + ", got '" + MaskUrl(options.url) + "'");
  }
  if (options.method != "POST" && options.method != "PUT") {
    throw ConfigError("method", "must be \"POST\" or \"PUT\", got '" + options.method + "'");
  }
  for (const auto& [name, value] : options.headers) {
    if (!IsHeaderName(name)) {
      throw ConfigError("headers", "'" + name + "' is not a valid HTTP header name");
    }
    if (ReservedHeaderName(name)) {
      throw ConfigError("headers", "'" + name +
                                       "' is set by the sink or by HTTP itself and cannot be "
                                       "configured");
    }
    if (options.envelope == EnvelopeStyle::kCloudEvents && StartsWithNoCase(name, "ce-")) {
      throw ConfigError("headers", "'" + name +
                                       "' is a CloudEvents attribute's header (ce-*), set by the "
                                       "sink with envelope = \"cloudevents\"");
    }
    if (options.envelope == EnvelopeStyle::kExternal && EqualsNoCase(name, kExternalTypeHeader)) {
      throw ConfigError("headers", "'" + name +
                                       "' is set by the sink (the message's type, with envelope = "
                                       "\"external\") and cannot be configured");
    }
    if (!IsHeaderValue(value)) {
      throw ConfigError("headers", "the value of '" + name + "' contains CR, LF or NUL");
    }
  }
  try {
    const Signer signer{options.secrets};
  } catch (const std::invalid_argument& error) {
    throw ConfigError("secrets", error.what());
  }
  if (options.max_in_flight < 1 || options.max_in_flight > kMaxInFlight) {
    throw ConfigError("max_in_flight", "must be between 1 and " + std::to_string(kMaxInFlight));
  }
  if (options.connect_timeout.count() < 1) {
    throw ConfigError("connect_timeout", "must be at least 1ms");
  }
  if (options.request_timeout.count() < 1) {
    throw ConfigError("request_timeout", "must be at least 1ms");
  }
  for (const int status : options.retry_statuses) {
    if (status < 400 || status > 499) {
      throw ConfigError("retry_statuses", "lists 4xx statuses (5xx are always retried), got " +
                                              std::to_string(status));
    }
  }
  for (const int status : options.abandon_statuses) {
    if (status < 400 || status > 599) {
      throw ConfigError("abandon_statuses",
                        "lists 4xx or 5xx statuses, got " + std::to_string(status));
    }
    if (status == 408 || status == 429 || status == 503) {
      throw ConfigError("abandon_statuses", "cannot list " + std::to_string(status) +
                                                ": it asks to wait and is always retried");
    }
    if (std::find(options.retry_statuses.begin(), options.retry_statuses.end(), status) !=
        options.retry_statuses.end()) {
      throw ConfigError("abandon_statuses",
                        "lists " + std::to_string(status) + ", which retry_statuses lists too");
    }
  }
  if (options.max_retry_after.count() < 1000) {
    throw ConfigError("max_retry_after", "must be at least 1s");
  }
  if (options.max_message_bytes < 1 || options.max_message_bytes > kMaxMessageBytes) {
    throw ConfigError("max_message_bytes",
                      "must be between 1 and " + std::to_string(kMaxMessageBytes));
  }
  CheckReadable(options.tls_ca_file, "tls_ca_file");
  CheckReadable(options.tls_cert_file, "tls_cert_file");
  CheckReadable(options.tls_key_file, "tls_key_file");
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    throw ConfigError(options.tls_cert_file.empty() ? "tls_cert_file" : "tls_key_file",
                      "tls_cert_file and tls_key_file go together");
  }
  if (!options.proxy.empty()) {
    const UrlCheck proxy = CheckUrl(options.proxy);
    if (!proxy.host) {
      throw ConfigError("proxy", proxy.problem + ", got '" + MaskUrl(options.proxy) + "'");
    }
  }
}

}  // namespace outbox::webhook
