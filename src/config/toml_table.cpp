#include "outbox/config/toml_table.h"

#include <array>
#include <charconv>
#include <nlohmann/json.hpp>

#include "outbox/core/error.h"

namespace outbox::config {
namespace {

bool StartsWithIgnoringCase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    char c = text[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != prefix[i]) return false;
  }
  return true;
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

std::string Join(std::string_view prefix, std::string_view key) {
  std::string joined{prefix};
  if (!joined.empty()) joined += '.';
  joined += key;
  return joined;
}

std::string Quoted(std::string_view text) { return "\"" + std::string{text} + "\""; }

std::string TypeName(toml::value_t type) {
  switch (type) {
    case toml::value_t::boolean:
      return "boolean";
    case toml::value_t::integer:
      return "integer";
    case toml::value_t::floating:
      return "float";
    case toml::value_t::string:
      return "string";
    case toml::value_t::offset_datetime:
      return "date-time";
    case toml::value_t::local_datetime:
      return "local date-time";
    case toml::value_t::local_date:
      return "date";
    case toml::value_t::local_time:
      return "time";
    case toml::value_t::array:
      return "array";
    case toml::value_t::table:
      return "table";
    case toml::value_t::empty:
      break;
  }
  return "nothing";
}

std::string Where(const TomlValue& value) {
  const toml::source_location location = value.location();
  if (location.file_name() == "unknown file") return "";
  return " (" + location.file_name() + ":" + std::to_string(location.line()) + ")";
}

void Fail(const std::string& key, const std::string& message, const TomlValue* value) {
  throw ConfigError(key, message + (value != nullptr ? Where(*value) : std::string{}));
}

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool HasControlCharacter(std::string_view text) {
  return std::any_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == '\x7f'; });
}

std::optional<std::string> Env(const GetenvFn& getenv, const std::string& name) {
  if (!getenv) return std::nullopt;
  const char* value = getenv(name.c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string{value};
}

// A TOML basic string: a JSON string literal is one (TOML's basic-string escapes are JSON's),
// once DEL, which JSON leaves as it is and TOML does not allow, is escaped too.
std::string TomlString(std::string_view text) {
  const std::string json =
      nlohmann::json(std::string{text})
          .dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  std::string toml;
  for (const char c : json) {
    if (c == '\x7f') {
      toml += "\\u007F";
    } else {
      toml += c;
    }
  }
  return toml;
}

std::string TomlFloat(double value) {
  std::array<char, 64> text{};
  const auto result = std::to_chars(text.data(), text.data() + text.size(), value);
  std::string out{text.data(), result.ptr};
  if (out.find_first_of(".eEn") == std::string::npos) out += ".0";  // n: inf, nan
  return out;
}

std::string MaskPassword(std::string_view url) {
  constexpr std::string_view kMask = "***";
  std::string out{url};
  // scheme://user:password@host: from the first ':' of the user info to its last '@' (a
  // password that itself holds an unescaped '@' is masked whole).
  for (std::size_t scheme = out.find("://"); scheme != std::string::npos;
       scheme = out.find("://", scheme + 3)) {
    const std::size_t start = scheme + 3;
    std::size_t end = start;
    while (end < out.size() && out[end] != '/' && !IsSpace(out[end]) && out[end] != '"' &&
           out[end] != '\'') {
      ++end;
    }
    const std::size_t at = out.rfind('@', end == 0 ? 0 : end - 1);
    if (at == std::string::npos || at < start) continue;
    const std::size_t colon = out.find(':', start);
    if (colon == std::string::npos || colon > at) continue;
    out.replace(colon + 1, at - colon - 1, kMask);
  }
  // password=... in a URI query or a key=value connection string (possibly 'quoted').
  constexpr std::string_view kKey = "password";
  for (std::size_t at = 0; at + kKey.size() <= out.size(); ++at) {
    if (!StartsWithIgnoringCase(std::string_view{out}.substr(at), kKey)) continue;
    if (at > 0 && !IsSpace(out[at - 1]) && out[at - 1] != '?' && out[at - 1] != '&' &&
        out[at - 1] != '"') {
      continue;
    }
    std::size_t value = at + kKey.size();
    while (value < out.size() && IsSpace(out[value])) ++value;
    if (value >= out.size() || out[value] != '=') continue;
    ++value;
    while (value < out.size() && IsSpace(out[value])) ++value;
    std::size_t end = value;
    if (end < out.size() && out[end] == '\'') {
      for (++end; end < out.size() && out[end] != '\''; ++end) {
        if (out[end] == '\\') ++end;
      }
      end = std::min(end + 1, out.size());
    } else {
      while (end < out.size() && !IsSpace(out[end]) && out[end] != '&' && out[end] != '"') ++end;
    }
    out.replace(value, end - value, kMask);
    at = value + kMask.size() - 1;
  }
  return out;
}

}  // namespace outbox::config
