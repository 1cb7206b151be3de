// The AMQP 1.0 sink's URL (sink/amqp10.h). The user info is taken out of the URL here and given
// to Proton apart (connection_options user/password), so that the URL Proton sees, and may quote
// in its errors, holds no secret.

#include <stdexcept>
#include <string>
#include <string_view>

#include "outbox/core/percent_decode.h"
#include "outbox/sink/amqp10.h"
#include "outbox/sink/host_port.h"

namespace outbox::amqp10 {
namespace {

constexpr int kAmqpPort = 5672;
constexpr int kAmqpsPort = 5671;
constexpr std::string_view kSeparator = "://";

std::string Decode(std::string_view text, const char* what) {
  auto decoded = PercentDecode(text);
  if (!decoded) {
    throw std::invalid_argument(std::string{"the user info's "} + what +
                                " has a '%' not followed by two hex digits");
  }
  return std::move(*decoded);
}

}  // namespace

std::string Endpoint::Describe() const {
  std::string text = tls ? "amqps://" : "amqp://";
  text += host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return text + ":" + std::to_string(port);
}

Endpoint ParseUrl(std::string_view url) {
  const std::string form = "expected amqp://[user:password@]host[:port] or amqps://...";
  if (url.empty()) throw std::invalid_argument("is empty; " + form);
  const std::size_t separator = url.find(kSeparator);
  if (separator == std::string_view::npos) throw std::invalid_argument("has no scheme; " + form);
  Endpoint endpoint;
  const std::string_view scheme = url.substr(0, separator);
  if (scheme == "amqps") {
    endpoint.tls = true;
  } else if (scheme != "amqp") {
    throw std::invalid_argument("the scheme is not amqp:// or amqps://");
  }
  std::string_view rest = url.substr(separator + kSeparator.size());
  // The user info runs to the last '@' (a password may hold an '@' that was not encoded).
  if (const std::size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view info = rest.substr(0, at);
    const std::size_t colon = info.find(':');
    endpoint.user = Decode(info.substr(0, colon), "user");
    if (colon != std::string_view::npos) {
      endpoint.password = Decode(info.substr(colon + 1), "password");
    }
    if (endpoint.user.empty()) throw std::invalid_argument("the user info has an empty user");
    rest.remove_prefix(at + 1);
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?# ") != std::string_view::npos) {
    throw std::invalid_argument(
        "has a path, query or space after the host (the target is `address`, not part of the "
        "URL); " +
        form);
  }
  auto address = ParseHostPort(rest, endpoint.tls ? kAmqpsPort : kAmqpPort);
  if (!address || address->host.empty() ||
      (!rest.starts_with('[') && address->host.find(':') != std::string::npos)) {
    throw std::invalid_argument("is not host[:port] with a port from 1 to 65535; " + form);
  }
  endpoint.host = std::move(address->host);
  endpoint.port = address->port;
  return endpoint;
}

std::string MaskUrl(std::string_view url) {
  const std::size_t separator = url.find(kSeparator);
  if (separator == std::string_view::npos) return std::string{url};
  const std::size_t info_begin = separator + kSeparator.size();
  const std::size_t at = url.rfind('@');
  if (at == std::string_view::npos || at < info_begin) return std::string{url};
  const std::string_view info = url.substr(info_begin, at - info_begin);
  const std::size_t colon = info.find(':');
  if (colon == std::string_view::npos) return std::string{url};
  return std::string{url.substr(0, info_begin + colon + 1)} + "***" + std::string{url.substr(at)};
}

}  // namespace outbox::amqp10
