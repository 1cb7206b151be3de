// redis:// and unix:// URLs (sink/redis.h): parsed once, for the sink's connection, the
// readiness probe and --check-config; every message names what is wrong without the password.

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "outbox/core/error.h"
#include "outbox/core/percent_decode.h"
#include "outbox/sink/host_port.h"
#include "outbox/sink/redis.h"

namespace outbox::redis {
namespace {

constexpr std::string_view kRedisScheme = "redis://";
constexpr std::string_view kUnixScheme = "unix://";
constexpr std::string_view kTlsScheme = "rediss://";
constexpr std::string_view kMask = "***";
constexpr int kDefaultPort = 6379;

[[noreturn]] void Fail(const std::string& message) { throw ConfigError("url", message); }

std::string Quote(std::string_view text) { return "'" + std::string{text} + "'"; }

// A database number: decimal digits, 0 to INT_MAX.
int ParseDb(std::string_view text) {
  int db = 0;
  const auto* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, db);
  if (text.empty() || error != std::errc{} || at != end || db < 0) {
    Fail("the database must be a number from 0, got " + Quote(text));
  }
  return db;
}

// "[user]:password" (percent-encoded) into the endpoint.
void ParseUserInfo(std::string_view info, Endpoint& endpoint) {
  const std::size_t colon = info.find(':');
  if (colon == std::string_view::npos) {
    Fail(
        "a user needs a password: redis://user:password@host (ACL), or redis://:password@host "
        "(a password only)");
  }
  auto user = PercentDecode(info.substr(0, colon));
  auto password = PercentDecode(info.substr(colon + 1));
  if (!user) Fail("the user has a '%' not followed by two hex digits");
  if (!password) Fail("the password has a '%' not followed by two hex digits");
  if (password->empty()) Fail("the password is empty (leave out \":@\" for no AUTH)");
  endpoint.user = std::move(*user);
  endpoint.password = std::move(*password);
}

Endpoint ParseTcp(std::string_view rest) {
  Endpoint endpoint;
  const std::size_t authority_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, authority_end);
  std::string_view tail =
      authority_end == std::string_view::npos ? std::string_view{} : rest.substr(authority_end);
  if (const std::size_t at = authority.rfind('@'); at != std::string_view::npos) {
    ParseUserInfo(authority.substr(0, at), endpoint);
    authority = authority.substr(at + 1);
  }
  const auto address = ParseHostPort(authority, kDefaultPort);
  if (!address) Fail("expected host[:port] after the user info, got " + Quote(authority));
  if (address->host.empty()) Fail("no host (redis://host[:port][/db])");
  endpoint.host = address->host;
  endpoint.port = address->port;
  if (tail.find_first_of("?#") != std::string_view::npos) {
    Fail("query parameters and fragments are not supported (redis://host[:port][/db])");
  }
  if (tail.starts_with('/')) tail.remove_prefix(1);
  if (!tail.empty()) endpoint.db = ParseDb(tail);
  return endpoint;
}

Endpoint ParseUnix(std::string_view rest) {
  Endpoint endpoint;
  endpoint.host.clear();
  endpoint.port = 0;
  const std::size_t slash = rest.find('/');
  if (const std::size_t at = rest.find('@'); at != std::string_view::npos && at < slash) {
    ParseUserInfo(rest.substr(0, at), endpoint);
    rest = rest.substr(at + 1);
  }
  const std::size_t query = rest.find('?');
  std::string_view path = rest.substr(0, query);
  if (!path.starts_with('/') || path.size() < 2) {
    Fail("expected unix:///path/to/socket (an absolute path), got a path of " +
         Quote(path.substr(0, 200)));
  }
  if (path.find('#') != std::string_view::npos) Fail("fragments are not supported");
  auto decoded = PercentDecode(path);
  if (!decoded) Fail("the path has a '%' not followed by two hex digits");
  endpoint.unix_path = std::move(*decoded);
  if (query != std::string_view::npos) {
    const std::string_view parameters = rest.substr(query + 1);
    if (!parameters.starts_with("db=") || parameters.find('&') != std::string_view::npos) {
      Fail("the only query parameter of a unix:// URL is db=N");
    }
    endpoint.db = ParseDb(parameters.substr(3));
  }
  return endpoint;
}

// Where the user info of `url` ends (its '@'), and where it begins; nullopt without one.
std::optional<std::pair<std::size_t, std::size_t>> UserInfo(std::string_view url) {
  // Without a scheme (a URL with its scheme forgotten), from the start.
  const std::size_t scheme_end = url.find("://");
  const std::size_t begin = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  const std::string_view rest = url.substr(begin);
  // The authority's last '@' (redis://), the '@' before the path (unix://).
  const std::size_t authority_end =
      url.starts_with(kUnixScheme) ? rest.find('/') : rest.find_first_of("/?#");
  const std::size_t at = rest.substr(0, authority_end).rfind('@');
  if (at == std::string_view::npos) return std::nullopt;
  return std::pair{begin, begin + at};
}

// Everything between the scheme and the user info's '@' (user and password) as ***: for text
// that is not a URL the sink reads.
std::string MaskUserInfo(std::string_view url) {
  const auto info = UserInfo(url);
  if (!info) return std::string{url};
  return std::string{url.substr(0, info->first)} + std::string{kMask} +
         std::string{url.substr(info->second)};
}

}  // namespace

std::string Endpoint::Describe() const {
  std::string text;
  if (!user.empty()) text += user + "@";
  if (!unix_path.empty()) {
    text = "unix:" + text + unix_path;
    if (db != 0) text += "?db=" + std::to_string(db);
    return text;
  }
  text += host.find(':') != std::string::npos ? "[" + host + "]" : host;
  text += ":" + std::to_string(port);
  if (db != 0) text += "/" + std::to_string(db);
  return text;
}

Endpoint ParseUrl(std::string_view url) {
  if (url.starts_with(kTlsScheme)) {
    Fail(
        "rediss:// (TLS) is not supported: it needs hiredis 1.0 or later (hiredis_ssl), and "
        "Debian bookworm packages hiredis 0.14; use redis:// on a trusted network or a TLS "
        "tunnel (stunnel, spiped) to the server");
  }
  if (url.starts_with(kRedisScheme)) return ParseTcp(url.substr(kRedisScheme.size()));
  if (url.starts_with(kUnixScheme)) return ParseUnix(url.substr(kUnixScheme.size()));
  Fail("expected a redis://host[:port][/db] or unix:///path URL, got " +
       Quote(MaskUserInfo(url.substr(0, 200))));
}

std::string MaskUrl(std::string_view url) {
  bool has_password = false;
  try {
    has_password = ParseUrl(url).password.has_value();
  } catch (const ConfigError&) {
    return MaskUserInfo(url);
  }
  const auto info = UserInfo(url);
  if (!has_password || !info) return std::string{url};
  // Only the password's text, between the user info's first ':' and its '@', is replaced.
  const std::size_t colon = url.find(':', info->first);
  return std::string{url.substr(0, colon + 1)} + std::string{kMask} +
         std::string{url.substr(info->second)};
}

}  // namespace outbox::redis
