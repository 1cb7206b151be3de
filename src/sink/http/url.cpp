#include "url.h"

#include <curl/curl.h>

#include <string>

#include "outbox/core/percent_decode.h"
#include "outbox/sink/http.h"
#include "sink/curl_handles.h"

namespace outbox::webhook {
namespace {

// Where the authority (user info, host, port) of a URL-like text ends: the first '/', '?' or '#'
// after "scheme://", or its end. npos when there is no "://".
std::size_t AuthorityEnd(std::string_view text, std::size_t* start) {
  const std::size_t scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) return std::string_view::npos;
  *start = scheme_end + 3;
  const std::size_t end = text.find_first_of("/?#", *start);
  return end == std::string_view::npos ? text.size() : end;
}

std::string Part(CURLU* url, CURLUPart part, unsigned flags = 0) {
  char* text = nullptr;
  if (curl_url_get(url, part, &text, flags) != CURLUE_OK || text == nullptr) return {};
  const curl::CurlString owned{text};
  return owned.get();
}

}  // namespace

UrlCheck CheckUrl(std::string_view url) {
  curl::InitCurlOnce();
  UrlCheck check;
  const curl::UrlPtr parsed{curl_url()};
  if (!parsed) {
    check.problem = "out of memory";
    return check;
  }
  const std::string text{url};
  if (text.find_first_of(std::string_view{"\r\n\t \0", 5}) != std::string::npos) {
    check.problem = "contains whitespace or a control character";
    return check;
  }
  const CURLUcode code = curl_url_set(parsed.get(), CURLUPART_URL, text.c_str(), 0);
  if (code != CURLUE_OK) {
    check.problem = std::string{"is not a valid URL ("} + curl_url_strerror(code) + ")";
    return check;
  }
  const std::string scheme = Part(parsed.get(), CURLUPART_SCHEME);
  if (scheme != "http" && scheme != "https") {
    check.problem = "must start with http:// or https://";
    return check;
  }
  if (!Part(parsed.get(), CURLUPART_FRAGMENT).empty()) {
    check.problem = "has a fragment ('#'), which is never sent";
    return check;
  }
  Host host;
  host.name = Part(parsed.get(), CURLUPART_HOST);
  if (host.name.empty()) {
    check.problem = "has no host";
    return check;
  }
  const std::string port = Part(parsed.get(), CURLUPART_PORT, CURLU_DEFAULT_PORT);
  host.port = port.empty() ? 0 : std::stoi(port);
  host.key = scheme + "://" + host.name + ":" + port;
  if (host.name.size() > 2 && host.name.front() == '[' && host.name.back() == ']') {
    host.name = host.name.substr(1, host.name.size() - 2);
  }
  check.host = std::move(host);
  return check;
}

bool HostIsLiteral(std::string_view text) {
  std::size_t start = 0;
  const std::size_t end = AuthorityEnd(text, &start);
  if (end == std::string_view::npos) return text.find('{') == std::string_view::npos;
  return text.substr(0, end).find('{') == std::string_view::npos;
}

std::string SampleUrl(std::string_view text) {
  std::string sample;
  for (std::size_t at = 0; at < text.size();) {
    if (text[at] == '{') {
      const std::size_t close = text.find('}', at);
      if (close == std::string_view::npos) break;
      sample += "x";
      at = close + 1;
      continue;
    }
    sample += text[at++];
  }
  return sample;
}

std::string EncodePlaceholder(std::string_view value) {
  if (value.empty() || value.find_first_not_of('.') != std::string_view::npos) {
    return PercentEncode(value);
  }
  std::string encoded;
  encoded.reserve(value.size() * 3);
  for (std::size_t i = 0; i < value.size(); ++i) encoded += "%2E";
  return encoded;
}

std::string MaskUrl(std::string_view url) {
  std::size_t start = 0;
  const std::size_t end = AuthorityEnd(url, &start);
  if (end == std::string_view::npos) return std::string{url};
  const std::size_t at = url.substr(start, end - start).rfind('@');
  if (at == std::string_view::npos) return std::string{url};
  const std::string_view user_info = url.substr(start, at);
  const std::size_t colon = user_info.find(':');
  if (colon == std::string_view::npos) return std::string{url};
  return std::string{url.substr(0, start + colon + 1)} + "***" +
         std::string{url.substr(start + at)};
}

}  // namespace outbox::webhook
