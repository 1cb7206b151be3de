#include "conninfo_mask.h"

#include <libpq-fe.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "outbox/core/percent_decode.h"
#include "outbox/core/secrets.h"

namespace outbox::postgres {
namespace {

constexpr std::string_view kMask = "***";
constexpr std::string_view kUriPrefixes[] = {"postgresql://", "postgres://"};

struct ConninfoOptionsDeleter {
  void operator()(PQconninfoOption* options) const noexcept { PQconninfoFree(options); }
};
using ConninfoOptionsPtr = std::unique_ptr<PQconninfoOption, ConninfoOptionsDeleter>;

// One option of a parsed connection string, in libpq's order.
struct Option {
  std::string keyword;
  std::optional<std::string> value;  // nullopt: not given
  bool secret = false;               // libpq hides it (dispchar "*")
};

// What PQconninfoParse made of a string: its options, or its error message.
struct Parsed {
  std::vector<Option> options;
  std::string error;  // "" when parsed
};

Parsed Parse(std::string_view conninfo) {
  Parsed parsed;
  if (conninfo.find('\0') != std::string_view::npos) {
    parsed.error = "it holds a NUL byte";
    return parsed;
  }
  char* error = nullptr;
  const ConninfoOptionsPtr options{PQconninfoParse(std::string{conninfo}.c_str(), &error)};
  if (!options) {
    parsed.error = error != nullptr ? error : "out of memory";
    PQfreemem(error);
    while (!parsed.error.empty() && (parsed.error.back() == '\n' || parsed.error.back() == ' ')) {
      parsed.error.pop_back();
    }
    if (parsed.error.empty()) parsed.error = "libpq gave no reason";
    return parsed;
  }
  for (const PQconninfoOption* option = options.get(); option->keyword != nullptr; ++option) {
    parsed.options.push_back(
        {.keyword = option->keyword,
         .value = option->val != nullptr ? std::optional<std::string>{option->val} : std::nullopt,
         .secret = option->dispchar != nullptr && option->dispchar[0] == '*'});
  }
  return parsed;
}

bool IsSecretKeyword(const Parsed& parsed, std::string_view keyword) {
  return std::any_of(parsed.options.begin(), parsed.options.end(), [&](const Option& option) {
    return option.secret && option.keyword == keyword;
  });
}

bool HasSecret(const Parsed& parsed) {
  return std::any_of(parsed.options.begin(), parsed.options.end(), [](const Option& option) {
    return option.secret && option.value && !option.value->empty();
  });
}

std::string_view UriPrefix(std::string_view conninfo) {
  for (const std::string_view prefix : kUriPrefixes) {
    if (conninfo.starts_with(prefix)) return prefix;
  }
  return {};
}

// isspace() in the C locale, as libpq's key=value parser uses it.
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// A half-open range of bytes of the connection string.
struct Span {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// Where the values of secret options stand in a key=value string, following libpq's
// conninfo_parse: keyword, optional spaces, '=', optional spaces, then a value that is either
// '...' (backslash escapes anything) or runs to the next space (backslash escapes anything).
std::vector<Span> KeyValueSecretSpans(std::string_view text, const Parsed& parsed) {
  std::vector<Span> spans;
  std::size_t at = 0;
  while (at < text.size()) {
    if (IsSpace(text[at])) {
      ++at;
      continue;
    }
    const std::size_t keyword_begin = at;
    while (at < text.size() && text[at] != '=' && !IsSpace(text[at])) ++at;
    const std::string_view keyword = text.substr(keyword_begin, at - keyword_begin);
    while (at < text.size() && IsSpace(text[at])) ++at;
    if (at >= text.size() || text[at] != '=') return {};  // libpq refused it already
    ++at;
    while (at < text.size() && IsSpace(text[at])) ++at;
    const std::size_t value_begin = at;
    if (at < text.size() && text[at] == '\'') {
      for (++at; at < text.size() && text[at] != '\''; ++at) {
        if (text[at] == '\\') ++at;
      }
      at = std::min(at + 1, text.size());
    } else {
      for (; at < text.size() && !IsSpace(text[at]); ++at) {
        if (text[at] == '\\') ++at;
      }
      at = std::min(at, text.size());
    }
    if (IsSecretKeyword(parsed, keyword)) spans.push_back({value_begin, at});
  }
  return spans;
}

// The '@' that ends a URI's user info, as libpq's conninfo_uri_parse_options finds it: the first
// '@' or '/' after the prefix, when it is an '@'. npos when there is no user info.
std::size_t UserInfoEnd(std::string_view uri, std::size_t prefix_size) {
  const std::size_t found = uri.find_first_of("@/", prefix_size);
  return found != std::string_view::npos && uri[found] == '@' ? found : std::string_view::npos;
}

// Where the secrets stand in a URI: the password of the user info (from the first ':' to the '@'
// that ends it) and the values of query parameters whose keyword, decoded, names a secret option.
std::vector<Span> UriSecretSpans(std::string_view uri, std::size_t prefix_size,
                                 const Parsed& parsed) {
  std::vector<Span> spans;
  const std::size_t user_info_end = UserInfoEnd(uri, prefix_size);
  std::size_t rest = prefix_size;
  if (user_info_end != std::string_view::npos) {
    const std::size_t colon = uri.find(':', prefix_size);
    if (colon < user_info_end && colon + 1 < user_info_end) {  // a password, not empty
      spans.push_back({colon + 1, user_info_end});
    }
    rest = user_info_end + 1;
  }
  const std::size_t query = uri.find('?', rest);
  if (query == std::string_view::npos) return spans;
  for (std::size_t at = query + 1; at <= uri.size();) {
    std::size_t end = uri.find('&', at);
    if (end == std::string_view::npos) end = uri.size();
    const std::size_t equals = uri.find('=', at);
    if (equals < end) {
      const auto keyword = PercentDecode(uri.substr(at, equals - at));
      if (keyword && IsSecretKeyword(parsed, *keyword)) spans.push_back({equals + 1, end});
    }
    at = end + 1;
  }
  return spans;
}

// `text` with each span replaced by ***.
std::string ReplaceSpans(std::string_view text, std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(), [](Span a, Span b) { return a.begin < b.begin; });
  std::string out;
  std::size_t at = 0;
  for (const Span span : spans) {
    if (span.begin < at) return {};  // overlapping: not a form this code understands
    out.append(text.substr(at, span.begin - at));
    out += kMask;
    at = span.end;
  }
  out.append(text.substr(at));
  return out;
}

// True when `masked` parses to the options of `original`, each non-empty secret as *** (an
// empty one as it was or as ***).
bool SameButMasked(const Parsed& original, const Parsed& masked) {
  if (!masked.error.empty() || masked.options.size() != original.options.size()) return false;
  for (std::size_t i = 0; i < original.options.size(); ++i) {
    const Option& was = original.options[i];
    const Option& now = masked.options[i];
    if (was.keyword != now.keyword) return false;
    const bool masked_ok = was.secret && was.value && now.value == kMask;
    const bool kept_ok =
        now.value == was.value && !(was.secret && was.value && !was.value->empty());
    if (!masked_ok && !kept_ok) return false;
  }
  return true;
}

// A value for a key=value string, quoted when libpq needs it to be.
std::string QuoteValue(std::string_view value) {
  const bool plain = !value.empty() && std::none_of(value.begin(), value.end(), [](char c) {
    return IsSpace(c) || c == '\'' || c == '\\';
  });
  if (plain) return std::string{value};
  std::string out = "'";
  for (const char c : value) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

// The options as a key=value string, secrets as ***.
std::string Rebuild(const Parsed& parsed) {
  std::string out;
  for (const Option& option : parsed.options) {
    if (!option.value) continue;
    if (!out.empty()) out += ' ';
    out += option.keyword + "=";
    out += option.secret && !option.value->empty() ? std::string{kMask} : QuoteValue(*option.value);
  }
  return out;
}

// Why a string that libpq parsed still must not be shown: a password that landed in a part that
// would be shown. "" when there is no such reason.
std::string MisplacedSecret(std::string_view conninfo, std::string_view prefix,
                            const Parsed& parsed) {
  constexpr std::string_view kEncodeHint =
      "; in a URI, a user name or password must percent-encode '@', '/', ':', '?' and '#' "
      "(%40, %2F, %3A, %3F, %23)";
  const std::string_view hint = prefix.empty() ? std::string_view{} : kEncodeHint;
  if (!prefix.empty()) {
    const std::size_t user_info_end = UserInfoEnd(conninfo, prefix.size());
    const std::size_t after =
        user_info_end == std::string_view::npos ? prefix.size() : user_info_end + 1;
    const std::size_t query = conninfo.find('?', after);
    const std::size_t length = query == std::string_view::npos ? query : query - after;
    if (conninfo.substr(after, length).find('@') != std::string_view::npos) {
      return "an '@' past the user info" + std::string{hint};
    }
  }
  for (const Option& option : parsed.options) {
    if (option.keyword == "port" && option.value &&
        option.value->find_first_not_of("0123456789,") != std::string::npos) {
      return "a port is not a number" + std::string{hint};
    }
  }
  return {};
}

// libpq's message with each quoted fragment hidden (they quote the input, which may be a
// password), except option names and the one-character delimiters libpq names.
std::string HideQuotedFragments(std::string_view message) {
  const Parsed known = Parse("");
  std::string out;
  std::size_t at = 0;
  while (at < message.size()) {
    const std::size_t open = message.find('"', at);
    const std::size_t close = open == std::string_view::npos ? open : message.find('"', open + 1);
    if (close == std::string_view::npos) {
      out.append(message.substr(at));
      break;
    }
    const std::string_view fragment = message.substr(open + 1, close - open - 1);
    const bool keyword =
        std::any_of(known.options.begin(), known.options.end(),
                    [&](const Option& option) { return option.keyword == fragment; });
    const bool delimiter = fragment == "=" || fragment == ":" || fragment == "/" || fragment == "]";
    out.append(message.substr(at, open + 1 - at));
    out += keyword || delimiter ? fragment : kMask;
    out += '"';
    at = close + 1;
  }
  return out;
}

std::string Unshowable(std::string_view prefix, std::string_view reason) {
  return std::string{prefix} + std::string{kMask} +
         " (not a valid connection string: " + std::string{reason} + ")";
}

}  // namespace

std::string MaskConninfo(std::string_view conninfo) {
  const std::string_view prefix = UriPrefix(conninfo);
  const Parsed parsed = Parse(conninfo);
  if (!parsed.error.empty()) return Unshowable(prefix, HideQuotedFragments(parsed.error));
  if (const std::string why = MisplacedSecret(conninfo, prefix, parsed); !why.empty()) {
    return Unshowable(prefix, why);
  }
  // Every secret the string spells is masked, also one a later one overrides.
  const std::vector<Span> spans = prefix.empty() ? KeyValueSecretSpans(conninfo, parsed)
                                                 : UriSecretSpans(conninfo, prefix.size(), parsed);
  if (spans.empty()) return HasSecret(parsed) ? Rebuild(parsed) : std::string{conninfo};
  std::string masked = ReplaceSpans(conninfo, spans);
  if (!masked.empty() && SameButMasked(parsed, Parse(masked))) return masked;
  return Rebuild(parsed);
}

std::vector<std::string> ConninfoSecrets(std::string_view conninfo) {
  std::vector<std::string> secrets = UrlSecretForms(conninfo);
  const std::string_view prefix = UriPrefix(conninfo);
  const Parsed parsed = Parse(conninfo);
  if (!parsed.error.empty()) return secrets;
  for (const Option& option : parsed.options) {
    if (option.secret && option.value) secrets.push_back(*option.value);
  }
  const std::vector<Span> spans = prefix.empty() ? KeyValueSecretSpans(conninfo, parsed)
                                                 : UriSecretSpans(conninfo, prefix.size(), parsed);
  for (const Span& span : spans)
    secrets.emplace_back(conninfo.substr(span.begin, span.end - span.begin));
  return secrets;
}

}  // namespace outbox::postgres
