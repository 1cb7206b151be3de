// The NATS sink's URL list, masking and subject syntax (sink/nats.h). The user info is taken out
// of the URL here and given to libnats apart (natsOptions_SetUserInfo / SetToken), so that the
// URLs libnats sees, and may quote in its errors, hold no secret.

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/percent_decode.h"
#include "outbox/sink/nats.h"

namespace outbox::nats {
namespace {

constexpr int kDefaultPort = 4222;
constexpr std::string_view kSeparator = "://";

// The entries of a comma-separated list, blanks around them trimmed.
std::vector<std::string_view> Entries(std::string_view list) {
  std::vector<std::string_view> entries;
  for (;;) {
    const std::size_t comma = list.find(',');
    std::string_view entry = list.substr(0, comma);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    entries.push_back(entry);
    if (comma == std::string_view::npos) return entries;
    list.remove_prefix(comma + 1);
  }
}

std::string Ordinal(std::size_t index) { return "server " + std::to_string(index + 1); }

}  // namespace

std::string Servers::Describe() const {
  std::string text;
  for (const HostPort& address : addresses) {
    if (!text.empty()) text += ',';
    text += tls ? "tls://" : "nats://";
    text += address.host.find(':') != std::string::npos ? "[" + address.host + "]" : address.host;
    text += ":" + std::to_string(address.port);
  }
  return text;
}

// The messages quote nothing of the URL: a password with an unencoded ',' or '@' would end up in
// what looks like a host.
Servers ParseUrl(std::string_view url) {
  const std::string form = "expected nats://[user:password@]host[:port][,nats://host[:port]...]";
  if (url.empty()) throw std::invalid_argument("is empty; " + form);
  Servers servers;
  std::optional<std::string_view> user_info;
  std::optional<bool> tls;
  const std::vector<std::string_view> entries = Entries(url);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::string_view entry = entries[i];
    if (entry.empty()) {
      throw std::invalid_argument(Ordinal(i) + " is empty; " + form);
    }
    const std::size_t separator = entry.find(kSeparator);
    if (separator == std::string_view::npos) {
      throw std::invalid_argument(Ordinal(i) + " has no scheme; " + form);
    }
    const std::string_view scheme = entry.substr(0, separator);
    if (scheme != "nats" && scheme != "tls") {
      throw std::invalid_argument(Ordinal(i) +
                                  ": the scheme is not nats:// or tls:// (websockets are not "
                                  "supported)");
    }
    if (tls && *tls != (scheme == "tls")) {
      throw std::invalid_argument("mixes nats:// and tls:// servers; use one scheme for all");
    }
    tls = scheme == "tls";
    entry.remove_prefix(separator + kSeparator.size());
    if (const std::size_t at = entry.rfind('@'); at != std::string_view::npos) {
      const std::string_view info = entry.substr(0, at);
      if (info.empty()) throw std::invalid_argument(Ordinal(i) + ": empty user info before '@'");
      if (user_info && *user_info != info) {
        throw std::invalid_argument(
            "servers carry different user info; write it once (it applies to every server)");
      }
      user_info = info;
      entry.remove_prefix(at + 1);
    }
    // Nothing after the address: NATS URLs have no path, query or fragment.
    if (!entry.empty() && entry.back() == '/') entry.remove_suffix(1);
    if (entry.find_first_of("/?#@ ") != std::string_view::npos) {
      throw std::invalid_argument(Ordinal(i) +
                                  " is not host[:port] (NATS URLs have no path or query)");
    }
    auto address = ParseHostPort(entry, kDefaultPort);
    if (!address || address->host.empty() ||
        (!entry.starts_with('[') && address->host.find(':') != std::string::npos)) {
      throw std::invalid_argument(Ordinal(i) + " is not host[:port] with a port from 1 to 65535");
    }
    servers.addresses.push_back(std::move(*address));
  }
  servers.tls = tls.value_or(false);
  if (user_info) {
    const std::size_t colon = user_info->find(':');
    const auto decode = [](std::string_view text, const char* what) {
      auto decoded = PercentDecode(text);
      if (!decoded) {
        throw std::invalid_argument(std::string{"the user info's "} + what +
                                    " has a '%' not followed by two hex digits");
      }
      return std::move(*decoded);
    };
    if (colon == std::string_view::npos) {
      servers.token = decode(*user_info, "token");
    } else {
      servers.user = decode(user_info->substr(0, colon), "user");
      servers.password = decode(user_info->substr(colon + 1), "password");
      if (servers.user.empty()) throw std::invalid_argument("the user info has an empty user");
    }
  }
  return servers;
}

std::string MaskUrl(std::string_view url) {
  std::string masked;
  std::size_t from = 0;
  for (;;) {
    const std::size_t scheme_end = url.find(kSeparator, from);
    if (scheme_end == std::string_view::npos) break;
    const std::size_t info_begin = scheme_end + kSeparator.size();
    const std::size_t next_scheme = url.find(kSeparator, info_begin);
    masked += url.substr(from, info_begin - from);
    from = info_begin;
    // The user info runs to the last '@' before the next scheme (a password may hold an '@' or a
    // ',' that was not percent-encoded).
    const std::string_view entry =
        url.substr(info_begin, next_scheme == std::string_view::npos ? std::string_view::npos
                                                                     : next_scheme - info_begin);
    const std::size_t last_at = entry.rfind('@');
    if (last_at == std::string_view::npos) continue;
    const std::size_t at = info_begin + last_at;
    const std::string_view info = url.substr(info_begin, at - info_begin);
    const std::size_t colon = info.find(':');
    masked += colon == std::string_view::npos ? "***" : std::string{info.substr(0, colon)} + ":***";
    from = at;
  }
  masked += url.substr(from);
  return masked;
}

std::string SubjectProblem(std::string_view subject) {
  if (subject.empty()) return "is empty";
  for (const char c : subject) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte == 0x7F) return "contains whitespace or a control character";
  }
  std::size_t begin = 0;
  for (;;) {
    const std::size_t dot = subject.find('.', begin);
    const std::string_view token = subject.substr(begin, dot - begin);
    if (token.empty()) return "has an empty token (a leading, trailing or double '.')";
    if (token == "*" || token == ">") return "has a wildcard token ('*' or '>')";
    if (dot == std::string_view::npos) return {};
    begin = dot + 1;
  }
}

}  // namespace outbox::nats
