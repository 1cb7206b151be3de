#pragma once
// Reading one TOML table of a configuration file, so that every error names the full dotted key
// as written ("sinks.orders.confirm_window") and where it is (file:line): outboxd's own sections
// and each sink type's [sinks.<name>] table (sink/registry.h) read through it. toml11 does the
// parsing; this adds the checks and messages a person fixing the file needs.
//
// toml11 is header-only and heavy (two seconds of every translation unit that includes it, more
// where its templates are used), so this header only declares its value type: Section reads
// values in src/config/toml_table.cpp. Code that looks into a TomlValue itself (an array, a value
// of any type) includes <toml.hpp> too.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "outbox/config/duration.h"
#include "outbox/core/ascii.h"

namespace toml {
// As <toml.hpp> declares them (toml11 3.x, toml/types.hpp and toml/comments.hpp).
struct discard_comments;
template <typename Comment, template <typename...> class Table, template <typename...> class Array>
class basic_value;
enum class value_t : std::uint8_t;
}  // namespace toml

namespace outbox::config {

using TomlValue = toml::basic_value<toml::discard_comments, std::map, std::vector>;
// Reads an environment variable; null when unset (std::getenv in production, a map in tests).
using GetenvFn = std::function<const char*(const char*)>;

// "prefix.key" ("key" when prefix is empty).
std::string Join(std::string_view prefix, std::string_view key);
// The text in double quotes, for messages. A value longer than kMaxQuotedBytes is cut to its
// first kMaxQuotedBytes bytes (never inside a UTF-8 sequence) and ends `…" (N bytes)`, so that
// a huge value is never echoed whole.
inline constexpr std::size_t kMaxQuotedBytes = 64;
std::string Quoted(std::string_view text);
// `text` with every line longer than `max_line_bytes` cut the same way (`… (N bytes)`, N the
// line's length), and at most `max_total_bytes` in all: for messages that quote input, such as
// toml11's. With `mask`, each line goes through it (its first 4 KiB) before it is cut, so that a
// cut never separates a password from what marks it as one (MaskPassword).
std::string CutErrorText(std::string_view text, std::size_t max_line_bytes = 160,
                         std::size_t max_total_bytes = 4096,
                         const std::function<std::string(std::string_view)>& mask = nullptr);
// The deepest nesting a configuration file may have: arrays, inline tables, table headers and
// dotted keys together ([a.b] is 2; x = [[1]] is 2; [[a]] is 2).
inline constexpr std::size_t kMaxTomlNesting = 32;
// Throws ConfigError("file", "<origin>:<line>: ...") for text toml11 must not be given: not
// UTF-8 (toml11 reads out of bounds on a literal string that is not), nested deeper than
// `max_depth` (toml11 recurses without a limit and overflows the stack), or with so many values
// on long lines that toml11 would take minutes (it scans a value's whole line for comments, for
// every value). Run it before toml11.
void CheckTomlLimits(std::string_view toml_text, const std::string& origin,
                     std::size_t max_depth = kMaxTomlNesting);
// TOML's name for a value's type ("string", "integer", "table", ...).
std::string TypeName(toml::value_t type);
// " (outbox.toml:12)" for a value read from a file; "" when toml11 does not know where it is.
std::string Where(const TomlValue& value);
// Throws ConfigError(key, message + where `value` is).
[[noreturn]] void Fail(const std::string& key, const std::string& message,
                       const TomlValue* value = nullptr);
std::size_t EditDistance(std::string_view a, std::string_view b);
using outbox::HasControlCharacter;  // core/ascii.h
// An environment variable, when set and not empty.
std::optional<std::string> Env(const GetenvFn& getenv, const std::string& name);
// `text` (free text: an error message from a library, a line of the configuration file) with
// every password in it replaced by ***: the password of a URI's user info (scheme://user:password
// @host, from the first ':' to the last '@' of the token, or to an '@' after a space on the same
// line), and the value of a password= or sslpassword= parameter of a URI query or a libpq key=value
// string ('quoted' or not, backslash escapes included). A pattern, not a parse: it may mask more
// than the password. For a value known to be a URL, mask by parsing it the way its client will
// (the PostgreSQL store and the RabbitMQ sink types do, for --check-config).
std::string MaskPassword(std::string_view text);
// `text` as a TOML basic string literal (quoted and escaped).
std::string TomlString(std::string_view text);
// `name` as a TOML key: bare when it can be (A-Z a-z 0-9 _ -), else a quoted string.
inline std::string TomlKey(std::string_view name) {
  const bool bare = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  return bare ? std::string{name} : TomlString(name);
}
// `value` as a TOML float literal ("2.0", "0.25", "inf").
std::string TomlFloat(double value);

// Where a value read by Section::ReadSecret came from: the file, the environment, or nowhere.
struct ValueSource {
  std::string key;                   // the full dotted key
  std::string env;                   // the environment variable it came from, or ""
  const TomlValue* value = nullptr;  // the file's value, when that is what was used
  // The value as a message may show it (masked), quoted after a check's message by
  // Section::Check ("..., got \"amqp://u:***@mq/\""); "" shows nothing.
  std::string shown;

  [[nodiscard]] bool from_env() const { return !env.empty(); }
  // " (from OUTBOX_SINK_ORDERS_URL)" for a value from the environment, else "".
  [[nodiscard]] std::string Origin() const { return env.empty() ? "" : " (from " + env + ")"; }
  // Throws ConfigError(key, message + where the value came from).
  [[noreturn]] void Fail(const std::string& message) const {
    config::Fail(key, message + Origin(), value);
  }
};

// A table of the file being read (or an absent one); every error names the full dotted key.
class Section {
 public:
  Section(const TomlValue* table, std::string path) : table_(table), path_(std::move(path)) {}

  [[nodiscard]] bool present() const { return table_ != nullptr; }
  [[nodiscard]] std::string Key(std::string_view key) const { return Join(path_, key); }

  // The entries in the order the file wrote them.
  [[nodiscard]] std::vector<std::pair<std::string, const TomlValue*>> Entries() const;

  // Rejects the first key (in file order) that is not in `known`.
  void AllowOnly(std::initializer_list<std::string_view> known) const {
    AllowOnly(std::span<const std::string_view>{known.begin(), known.size()});
  }
  void AllowOnly(std::span<const std::string_view> known) const;
  // This table with `keys` read by its owner, which AllowOnly accepts besides its own (outboxd
  // reads a sink's on_abandon before the sink's type reads the rest of its table).
  [[nodiscard]] Section WithCommonKeys(std::vector<std::string> keys) const {
    Section copy = *this;
    copy.common_keys_ = std::move(keys);
    return copy;
  }

  [[nodiscard]] const TomlValue* Find(std::string_view key) const;

  // The sub-table `key`; an absent one when the key is missing.
  [[nodiscard]] Section Table(std::string_view key) const;

  // Each Read leaves `out` alone when the key is missing and returns whether it was present.
  bool Read(std::string_view key, std::string& out) const;
  bool Read(std::string_view key, bool& out) const;

  template <typename Int>
  bool ReadInteger(std::string_view key, std::int64_t min, std::int64_t max, Int& out) const {
    static_assert(std::is_integral_v<Int>);
    std::int64_t number = 0;
    if (!ReadInt64(key, min, max, number)) return false;
    out = static_cast<Int>(number);
    return true;
  }

  // A float; an integer is accepted too ("multiplier = 2").
  bool ReadNumber(std::string_view key, double& out) const;

  // A duration string within [min, max]; for a seconds-valued `out`, a whole number of seconds.
  template <typename Duration>
  bool ReadDuration(std::string_view key, std::chrono::milliseconds min,
                    std::chrono::milliseconds max, Duration& out) const {
    std::chrono::milliseconds duration{};
    constexpr bool kWholeSeconds = std::is_same_v<Duration, std::chrono::seconds>;
    if (!ReadMilliseconds(key, min, max, kWholeSeconds, duration)) return false;
    if constexpr (kWholeSeconds) {
      out = std::chrono::duration_cast<std::chrono::seconds>(duration);
    } else {
      out = duration;
    }
    return true;
  }

  // A string that may hold a secret (a password, a token, a URL with user info), so that it may
  // come from the environment instead: the variable `env`, when set and not empty, wins over the
  // file. Leaves `out` alone when neither has it; `required`: then throws "is required (or set
  // <env>)". A message about the value goes through the returned source's Fail, which says where
  // it came from (and never points at the file's line when the environment's value was used).
  ValueSource ReadSecret(std::string_view key, const std::string& env, const GetenvFn& getenv,
                         std::string& out, bool required = false) const {
    ValueSource source{.key = Key(key), .env = {}, .value = Find(key)};
    Read(key, out);
    if (std::optional<std::string> from_env = Env(getenv, env)) {
      out = std::move(*from_env);
      source.env = env;
      source.value = nullptr;
    }
    if (required && out.empty()) source.Fail("is required (or set " + env + ")");
    return source;
  }

  // Runs `check`, a component's own validation of what was read here (a sink's ValidateOptions),
  // which throws ConfigError naming its own keys ("url", "librdkafka.<property>": a sub-table's
  // key); throws it again under this table's key, pointing at the value in the file. A key read by
  // ReadSecret is reported by its source in `sources` (which says where its value came from).
  void Check(const std::function<void()>& check,
             std::initializer_list<const ValueSource*> sources = {}) const;

  // A string that must be one of `choices`.
  bool ReadChoice(std::string_view key, std::initializer_list<std::string_view> choices,
                  std::string& out) const {
    std::string text;
    if (!Read(key, text)) return false;
    if (std::find(choices.begin(), choices.end(), text) == choices.end()) {
      std::string message = "must be one of ";
      bool first = true;
      for (const std::string_view choice : choices) {
        message += (first ? "" : ", ") + Quoted(choice);
        first = false;
      }
      Fail(Key(key), message + "; got " + Quoted(text), Find(key));
    }
    out = std::move(text);
    return true;
  }

 private:
  // ReadInteger and ReadDuration without their templates (toml11 stays in toml_table.cpp).
  bool ReadInt64(std::string_view key, std::int64_t min, std::int64_t max, std::int64_t& out) const;
  // With `whole_seconds`, a duration that is not a whole number of seconds is an error.
  bool ReadMilliseconds(std::string_view key, std::chrono::milliseconds min,
                        std::chrono::milliseconds max, bool whole_seconds,
                        std::chrono::milliseconds& out) const;

  const TomlValue* table_;
  std::string path_;
  std::vector<std::string> common_keys_;  // see WithCommonKeys
};

// Writes TOML back (for --check-config): sections and key = value lines.
class TomlWriter {
 public:
  void Header(std::string_view name) {
    if (!out_.empty()) out_ += '\n';
    out_ += "[" + std::string{name} + "]\n";
  }
  // Lines written by another writer (Take), as they are.
  void Raw(std::string_view lines) { out_ += lines; }
  // The header of one more table of the array of tables `name`: [[name]].
  void ArrayHeader(std::string_view name) {
    if (!out_.empty()) out_ += '\n';
    out_ += "[[" + std::string{name} + "]]\n";
  }
  void String(std::string_view key, std::string_view value) { Line(key, TomlString(value)); }
  void Bool(std::string_view key, bool value) { Line(key, value ? "true" : "false"); }
  void Integer(std::string_view key, std::int64_t value) { Line(key, std::to_string(value)); }
  void Float(std::string_view key, double value) { Line(key, TomlFloat(value)); }
  void Duration(std::string_view key, std::chrono::milliseconds value) {
    Line(key, TomlString(FormatDuration(value)));
  }
  void Strings(std::string_view key, const std::vector<std::string>& values) {
    std::string array = "[";
    for (const std::string& value : values) {
      array += (array.size() > 1 ? ", " : "") + TomlString(value);
    }
    Line(key, array + "]");
  }
  void Integers(std::string_view key, const std::vector<int>& values) {
    std::string array = "[";
    for (const int value : values) {
      array += (array.size() > 1 ? ", " : "") + std::to_string(value);
    }
    Line(key, array + "]");
  }
  // An inline table of strings: { name = "value", "odd name" = "value" }.
  void StringTable(std::string_view key,
                   const std::vector<std::pair<std::string, std::string>>& entries) {
    std::string table = "{";
    for (const auto& [name, value] : entries) {
      table += (table.size() > 1 ? ", " : " ") + TomlKey(name) + " = " + TomlString(value);
    }
    Line(key, table + (entries.empty() ? "}" : " }"));
  }
  [[nodiscard]] std::string Take() { return std::move(out_); }

 private:
  void Line(std::string_view key, const std::string& value) {
    out_ += std::string{key} + " = " + value + "\n";
  }
  std::string out_;
};

}  // namespace outbox::config
