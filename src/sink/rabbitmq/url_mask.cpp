#include "url_mask.h"

#include <amqp.h>

#include <functional>
#include <optional>
#include <vector>

#include "outbox/config/toml_table.h"

namespace outbox::rabbitmq {
namespace {

constexpr std::string_view kMask = "***";

// What amqp_parse_url reads from a URL.
struct ParsedUrl {
  bool tls = false;
  std::string user;
  std::string password;
  std::string host;
  int port = 0;
  std::string vhost;
  // Where the password's text starts in the URL; nullopt when the URL names none (and the
  // library's default applies).
  std::optional<std::size_t> password_at;

  [[nodiscard]] std::string_view Scheme() const { return tls ? "amqps://" : "amqp://"; }
  [[nodiscard]] bool SameButPassword(const ParsedUrl& other) const {
    return tls == other.tls && user == other.user && host == other.host && port == other.port &&
           vhost == other.vhost;
  }
};

std::optional<ParsedUrl> Parse(std::string_view url) {
  if (url.find('\0') != std::string_view::npos) return std::nullopt;
  std::vector<char> buffer(url.begin(), url.end());
  buffer.push_back('\0');
  amqp_connection_info info{};
  amqp_default_connection_info(&info);
  if (amqp_parse_url(buffer.data(), &info) != AMQP_STATUS_OK) return std::nullopt;
  ParsedUrl parsed{.tls = info.ssl != 0,
                   .user = info.user,
                   .password = info.password,
                   .host = info.host,
                   .port = info.port,
                   .vhost = info.vhost,
                   .password_at = std::nullopt};
  // The parts the URL gives point into the buffer (decoded in place, each from where its text
  // starts); the defaults point elsewhere.
  const char* begin = buffer.data();
  const char* end = begin + buffer.size();
  if (std::less_equal<const char*>{}(begin, info.password) &&
      std::less<const char*>{}(info.password, end)) {
    parsed.password_at = static_cast<std::size_t>(info.password - begin);
  }
  return parsed;
}

// RFC 3986's unreserved characters stay; everything else is %XX.
std::string PercentEncode(std::string_view text) {
  constexpr std::string_view kHex = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out += c;
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[byte >> 4U];
      out += kHex[byte & 0xFU];
    }
  }
  return out;
}

std::string Rebuild(const ParsedUrl& parsed) {
  std::string out{parsed.Scheme()};
  out += PercentEncode(parsed.user) + ":" + std::string{kMask} + "@";
  out += parsed.host.find(':') != std::string::npos ? "[" + parsed.host + "]" : parsed.host;
  out += ":" + std::to_string(parsed.port) + "/" + PercentEncode(parsed.vhost);
  return out;
}

}  // namespace

std::string MaskAmqpUrl(std::string_view url) {
  if (!url.starts_with("amqp://") && !url.starts_with("amqps://")) {
    return config::MaskPassword(url);
  }
  const std::optional<ParsedUrl> parsed = Parse(url);
  if (!parsed) return std::string{url.substr(0, url.find("://") + 3)} + std::string{kMask};
  if (!parsed->password_at || parsed->password.empty()) return std::string{url};
  // amqp_parse_url ends the password at the first of these, which must be the user info's '@'.
  const std::size_t begin = *parsed->password_at;
  const std::size_t end = url.find_first_of(":@/?#[]", begin);
  if (end != std::string_view::npos && url[end] == '@') {
    std::string masked{url.substr(0, begin)};
    masked += kMask;
    masked += url.substr(end);
    const std::optional<ParsedUrl> again = Parse(masked);
    if (again && again->SameButPassword(*parsed) && again->password == kMask) return masked;
  }
  return Rebuild(*parsed);
}

}  // namespace outbox::rabbitmq
