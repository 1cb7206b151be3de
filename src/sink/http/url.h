#pragma once
// The sink's URLs: checked with libcurl's own parser (the one that will send them), reduced to
// the host they go to, masked for display.

#include <optional>
#include <string>
#include <string_view>

namespace outbox::webhook {

// Where a request goes, as far as limits and Retry-After are concerned: scheme, host and port
// ("http://127.0.0.1:8080"), the port explicit.
struct Host {
  std::string key;
  std::string name;  // the host name or address, IPv6 without brackets
  int port = 0;
};

// The host of `url`, or why it is not an http(s) URL the sink can send to (no scheme, another
// scheme, no host, a fragment, ...), never naming its password.
struct UrlCheck {
  std::optional<Host> host;
  std::string problem;
};
UrlCheck CheckUrl(std::string_view url);

// True when the URL template `text` has no placeholder before its path: every message goes to
// the same host.
bool HostIsLiteral(std::string_view text);

// The template with each placeholder replaced by a sample value, for checking it.
std::string SampleUrl(std::string_view text);

// A placeholder's value ({topic}, {target}, {type}) as it goes into the URL: percent-encoded
// (PercentEncode: every byte but A-Z a-z 0-9 - . _ ~, so '/' is %2F and a value is never more
// than part of one path segment), and a value made of dots only ("." and ".." above all) with
// every dot as %2E. Kept as they are, "." and ".." would make a dot segment, which proxies and
// servers resolve (http://host/hooks/{topic}/tail with topic ".." is /hooks/../tail, read as
// /tail): encoded, the endpoint sees a path under the template's prefix (/hooks/%2E%2E/tail).
// Any value, in the query too (where %2E decodes to '.' as well).
std::string EncodePlaceholder(std::string_view value);

}  // namespace outbox::webhook
