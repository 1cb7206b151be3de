#include "outbox/config/toml_table.h"

#include <array>
#include <charconv>
#include <climits>
#include <nlohmann/json.hpp>
#include <toml.hpp>
#include <type_traits>

#include "outbox/core/error.h"
#include "outbox/core/utf8.h"

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

namespace {

// How many bytes of `text` fit in `max_bytes` without ending inside a UTF-8 sequence (a
// sequence has at most three continuation bytes; invalid UTF-8 is cut where it falls).
std::size_t Utf8Prefix(std::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return text.size();
  std::size_t cut = max_bytes;
  for (int back = 0;
       back < 3 && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0U) == 0x80U; ++back) {
    --cut;
  }
  return cut;
}

std::string CutTo(std::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string{text};
  return std::string{text.substr(0, Utf8Prefix(text, max_bytes))} + "… (" +
         std::to_string(text.size()) + " bytes)";
}

// CheckTomlLimits' scanner. Hand-written because toml11 (3.x, as Debian ships it) has neither
// limit:
// - Depth: it parses arrays and inline tables by recursion, so `a = [[[[…` a few hundred
//   thousand deep overflows the stack before any error; a header or dotted key with as many
//   parts builds a tree as deep, which it destroys recursively.
// - Time: for every value it reads the comments around it (even when told to discard them):
//   it scans the value's whole line, and when no '[' or '{' precedes the value on its line,
//   every line just above that starts with '#'. So N values on one line of N bytes cost N^2:
//   `a = [1,1,1,…]` as a 1 MiB line takes minutes.
// The scanner knows just enough TOML to measure both in one pass without recursing: strings (a
// "[" in one is text), comments, table headers, keys and values. Where it could misread
// invalid TOML it counts more, never less; toml11 rejects such text anyway.
class TomlLimitScanner {
 public:
  TomlLimitScanner(std::string_view text, const std::string& origin, std::size_t max_depth)
      : text_(text), origin_(origin), max_depth_(max_depth) {}

  void Run() {
    for (std::size_t i = 0; i < text_.size();) {
      const char c = text_[i];
      if (c == '\n') {
        EndLine(i++);
        // A value ends with its line unless an array or inline table is still open (or nothing
        // followed the '=': then whatever comes next is counted as the value).
        if (frames_.empty() && (!in_value_ || value_started_)) {
          header_ = in_value_ = value_started_ = false;
          key_dots_ = 0;
          line_start_ = true;
        }
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r') {
        ++i;
        continue;
      }
      if (c == '#') {
        while (i < text_.size() && text_[i] != '\n') ++i;
        continue;
      }
      const bool first_on_line = line_start_;
      line_start_ = false;
      if (in_value_) value_started_ = true;
      if (c == '"' || c == '\'') {
        i = SkipString(i);
        continue;
      }
      ++i;
      if (header_) {
        if (c == '.') {
          ++table_depth_;
          CheckDepth();
        } else if (c == ']' || c == '[' || c == '{') {
          // The header ends; anything after it on the line is counted as a value would be.
          header_ = false;
          in_value_ = value_started_ = true;
          if (c == ']' && i < text_.size() && text_[i] == ']') ++i;
          if (c != ']') Open(c == '{');
        }
        continue;
      }
      if (frames_.empty() && !in_value_) {  // a key, a table header, or the '=' after a key
        if (c == '[' && first_on_line) {
          Value();  // toml11 reads the comments of a table too
          bracket_on_line_ = true;
          header_ = true;
          table_depth_ = 1;
          if (i < text_.size() && text_[i] == '[') {
            ++i;
            table_depth_ = 2;  // an array of tables and its element
          }
          CheckDepth();
        } else if (c == '.') {
          ++key_dots_;
          CheckDepth();
        } else if (c == '=') {
          in_value_ = true;
          Value();
        } else if (c == '[' || c == '{') {
          in_value_ = value_started_ = true;
          Open(c == '{');
        }
        continue;
      }
      switch (c) {  // inside a value
        case '[':
        case '{':
          Open(c == '{');
          break;
        case ']':
        case '}':
          if (!frames_.empty()) {
            frame_depth_ -= 1 + frames_.back().key_dots;
            frames_.pop_back();
          }
          break;
        case ',':
          Value();
          if (!frames_.empty() && frames_.back().inline_table) {
            frame_depth_ -= frames_.back().key_dots;
            frames_.back().key_dots = 0;
            frames_.back().in_key = true;
          }
          break;
        case '=':
          if (!frames_.empty() && frames_.back().inline_table) {
            frames_.back().in_key = false;
            Value();
          }
          break;
        case '.':
          if (!frames_.empty() && frames_.back().inline_table && frames_.back().in_key) {
            ++frames_.back().key_dots;
            ++frame_depth_;
            CheckDepth();
          }
          break;
        default:
          break;
      }
    }
    EndLine(text_.size());
  }

 private:
  // What toml11's look at the lines above a value costs per line, beyond its bytes (it copies
  // each comment line into a string of its own), in bytes scanned.
  static constexpr std::uint64_t kCommentLineCost = 256;
  // The most bytes toml11 may scan for comments in a whole file: tens of milliseconds in an
  // optimized build; a file a person writes needs a fraction of it.
  static constexpr std::uint64_t kMaxCommentScanBytes = std::uint64_t{64} << 20;

  struct Frame {
    bool inline_table;     // { ... } rather than [ ... ]
    bool in_key;           // an inline table, before the '=' of its current key = value
    std::size_t key_dots;  // the dots of that key: each is a table more
  };

  [[noreturn]] void Refuse(const std::string& why) const {
    throw ConfigError("file", origin_ + ":" + std::to_string(line_) + ": " + why);
  }

  void CheckDepth() const {
    if (table_depth_ + key_dots_ + frame_depth_ > max_depth_) {
      Refuse("nested more than " + std::to_string(max_depth_) +
             " levels deep (arrays, inline tables, table headers and dotted keys together)");
    }
  }

  void Open(bool inline_table) {
    if (!inline_table) Value();  // the array's first element
    bracket_on_line_ = true;
    frames_.push_back(Frame{.inline_table = inline_table, .in_key = inline_table, .key_dots = 0});
    ++frame_depth_;
    CheckDepth();
  }

  // A value (or table) starts on this line: toml11 will read the comments around it.
  void Value() {
    ++values_;
    if (!bracket_on_line_) ++values_reading_above_;
  }

  // The line from line_begin_ to `end` (a '\n' or the end of the text) is complete.
  void EndLine(std::size_t end) {
    const std::uint64_t length = end - line_begin_ + 1;
    scan_bytes_ += values_ * length + values_reading_above_ * comment_lines_above_;
    if (scan_bytes_ > kMaxCommentScanBytes) {
      Refuse(
          "too many values on long lines for the TOML parser, which scans a value's whole "
          "line, and the '#' lines just above it, once per value (this line: " +
          std::to_string(values_) + " values, " + std::to_string(length) +
          " bytes); put the elements of a long array on lines of their own");
    }
    // toml11 looks at raw lines: one inside a multi-line string counts when it starts with '#'.
    std::size_t first = line_begin_;
    while (first < end && (text_[first] == ' ' || text_[first] == '\t')) ++first;
    if (first < end && text_[first] == '#') {
      comment_lines_above_ += length + kCommentLineCost;
    } else {
      comment_lines_above_ = 0;
    }
    values_ = values_reading_above_ = 0;
    bracket_on_line_ = false;
    line_begin_ = end + 1;
    ++line_;
  }

  // Skips the string that starts at text_[at] (a quote); returns the index after it. A
  // single-line string ends at the end of its line even when unterminated (an error toml11
  // reports).
  std::size_t SkipString(std::size_t at) {
    const char quote = text_[at];
    const bool basic = quote == '"';  // escapes with '\'; a literal string ('...') has none
    const auto triple = [&](std::size_t i) {
      return i + 2 < text_.size() && text_[i] == quote && text_[i + 1] == quote &&
             text_[i + 2] == quote;
    };
    std::size_t i = at;
    if (!triple(i)) {
      for (++i; i < text_.size() && text_[i] != '\n';) {
        const char c = text_[i++];
        if (c == quote) return i;
        if (basic && c == '\\' && i < text_.size() && text_[i] != '\n') ++i;
      }
      return i;
    }
    for (i += 3; i < text_.size();) {
      if (triple(i)) {
        i += 3;
        // """a"""" is `a"`: up to two more quotes are the end of the content.
        for (int extra = 0; extra < 2 && i < text_.size() && text_[i] == quote; ++extra) ++i;
        return i;
      }
      const char c = text_[i];
      if (c == '\n') EndLine(i);
      ++i;
      if (basic && c == '\\' && i < text_.size()) {
        if (text_[i] == '\n') EndLine(i);
        ++i;
      }
    }
    return i;
  }

  std::string_view text_;
  const std::string& origin_;
  std::size_t max_depth_;

  std::size_t line_ = 1;
  std::size_t line_begin_ = 0;  // where line_ starts

  std::vector<Frame> frames_;    // the open arrays and inline tables of the current value
  std::size_t table_depth_ = 0;  // the tables the last [header] (or [[header]]) opened
  std::size_t key_dots_ = 0;     // dots in the key of the current key = value line
  std::size_t frame_depth_ = 0;  // the frames and the dots of their keys
  bool header_ = false;          // inside [header]
  bool in_value_ = false;        // after the '=' of a key = value line
  bool value_started_ = false;   // ... and past the first token of its value
  bool line_start_ = true;       // nothing but blanks so far on this line, outside a value

  std::uint64_t values_ = 0;                // values starting on this line
  std::uint64_t values_reading_above_ = 0;  // ... with no '[' or '{' before them on it
  bool bracket_on_line_ = false;
  std::uint64_t comment_lines_above_ = 0;  // the cost of the '#' lines just above this one
  std::uint64_t scan_bytes_ = 0;           // what toml11 will scan for comments, so far
};

}  // namespace

std::string Quoted(std::string_view text) {
  if (text.size() <= kMaxQuotedBytes) return "\"" + std::string{text} + "\"";
  return "\"" + std::string{text.substr(0, Utf8Prefix(text, kMaxQuotedBytes))} + "…\" (" +
         std::to_string(text.size()) + " bytes)";
}

std::string CutErrorText(std::string_view text, std::size_t max_line_bytes,
                         std::size_t max_total_bytes,
                         const std::function<std::string(std::string_view)>& mask) {
  // mask sees this much of a line: enough to find a password near the part that is shown, and
  // bounded, so that it never works through megabytes.
  const std::size_t mask_window = std::max<std::size_t>(4096, max_line_bytes);
  std::string out;
  for (std::size_t start = 0;;) {
    if (out.size() > max_total_bytes) {
      out.resize(Utf8Prefix(out, max_total_bytes));
      out += "… (" + std::to_string(text.size()) + " bytes in all)";
      break;
    }
    const std::size_t newline = text.find('\n', start);
    const std::size_t end = newline == std::string_view::npos ? text.size() : newline;
    const std::string_view line = text.substr(start, end - start);
    if (!mask) {
      out += CutTo(line, max_line_bytes);
    } else {
      const std::string masked = mask(line.substr(0, mask_window));
      if (masked.size() <= max_line_bytes && line.size() <= mask_window) {
        out += masked;
      } else {
        out += masked.substr(0, Utf8Prefix(masked, max_line_bytes)) + "… (" +
               std::to_string(line.size()) + " bytes)";
      }
    }
    if (newline == std::string_view::npos) break;
    out += '\n';
    start = newline + 1;
  }
  return out;
}

void CheckTomlLimits(std::string_view toml_text, const std::string& origin, std::size_t max_depth) {
  // TOML is UTF-8 throughout. toml11 checks that itself, but where a literal string ('...',
  // '''...''') is not, it rewinds into a buffer other than the one it read (3.7.1, parser.hpp,
  // parse_literal_string and parse_ml_literal_string): a read out of bounds, which
  // fuzz/config_fuzz.cpp found. No sequence crosses a '\n', so lines can be checked one by one.
  if (!IsValidUtf8(toml_text)) {
    std::size_t line = 1;
    for (std::size_t begin = 0; begin <= toml_text.size(); ++line) {
      const std::size_t newline = std::min(toml_text.find('\n', begin), toml_text.size());
      if (!IsValidUtf8(toml_text.substr(begin, newline - begin))) {
        throw ConfigError("file", origin + ":" + std::to_string(line) +
                                      ": not valid UTF-8 (a TOML file must be UTF-8 throughout)");
      }
      begin = newline + 1;
    }
  }
  TomlLimitScanner{toml_text, origin, max_depth}.Run();
}

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

// The forward declarations of toml_table.h name toml11's own value type.
static_assert(
    std::is_same_v<TomlValue, toml::basic_value<toml::discard_comments, std::map, std::vector>>);

namespace {

std::pair<std::uint_least32_t, std::uint_least32_t> Position(const TomlValue& value) {
  const toml::source_location location = value.location();
  if (location.file_name() == "unknown file") return {UINT_LEAST32_MAX, UINT_LEAST32_MAX};
  return {location.line(), location.column()};
}

}  // namespace

std::vector<std::pair<std::string, const TomlValue*>> Section::Entries() const {
  std::vector<std::pair<std::string, const TomlValue*>> entries;
  if (table_ == nullptr) return entries;
  for (const auto& [key, value] : table_->as_table()) entries.emplace_back(key, &value);
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return Position(*a.second) < Position(*b.second);
  });
  return entries;
}

void Section::AllowOnly(std::span<const std::string_view> known) const {
  for (const auto& [key, value] : Entries()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (std::find(common_keys_.begin(), common_keys_.end(), key) != common_keys_.end()) continue;
    std::string message = path_.empty() ? "unknown section or key" : "unknown key";
    // The closest of the table's own keys and the common ones. (Captured by name: clang before
    // 16 cannot capture a structured binding.)
    std::vector<std::string_view> names(known.begin(), known.end());
    names.insert(names.end(), common_keys_.begin(), common_keys_.end());
    const auto closest =
        std::min_element(names.begin(), names.end(), [&written = key](auto a, auto b) {
          return EditDistance(written, a) < EditDistance(written, b);
        });
    if (closest != names.end() && EditDistance(key, *closest) <= 2) {
      message += " (did you mean " + Quoted(Key(*closest)) + "?)";
    } else {
      message +=
          "; " + (path_.empty() ? std::string{"the file"} : "[" + path_ + "]") + " accepts: ";
      bool first = true;
      for (const std::string_view name : known) {
        message += (first ? "" : ", ") + std::string{name};
        first = false;
      }
      for (const std::string& name : common_keys_) message += ", " + name;
    }
    Fail(Key(key), message, value);
  }
}

const TomlValue* Section::Find(std::string_view key) const {
  if (table_ == nullptr) return nullptr;
  const auto& table = table_->as_table();
  const auto found = table.find(std::string{key});
  return found == table.end() ? nullptr : &found->second;
}

Section Section::Table(std::string_view key) const {
  const TomlValue* value = Find(key);
  if (value != nullptr && !value->is_table()) {
    Fail(Key(key), "expected a table, got " + TypeName(value->type()), value);
  }
  return Section{value, Key(key)};
}

bool Section::Read(std::string_view key, std::string& out) const {
  const TomlValue* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_string())
    Fail(Key(key), "expected a string, got " + TypeName(value->type()), value);
  out = value->as_string().str;
  return true;
}

bool Section::Read(std::string_view key, bool& out) const {
  const TomlValue* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    Fail(Key(key), "expected a boolean (true or false), got " + TypeName(value->type()), value);
  }
  out = value->as_boolean();
  return true;
}

bool Section::ReadInt64(std::string_view key, std::int64_t min, std::int64_t max,
                        std::int64_t& out) const {
  const TomlValue* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_integer()) {
    Fail(Key(key), "expected an integer, got " + TypeName(value->type()), value);
  }
  const std::int64_t number = value->as_integer();
  if (number < min || number > max) {
    Fail(Key(key),
         "must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " +
             std::to_string(number),
         value);
  }
  out = number;
  return true;
}

bool Section::ReadNumber(std::string_view key, double& out) const {
  const TomlValue* value = Find(key);
  if (value == nullptr) return false;
  if (value->is_floating()) {
    out = value->as_floating();
  } else if (value->is_integer()) {
    out = static_cast<double>(value->as_integer());
  } else {
    Fail(Key(key), "expected a number, got " + TypeName(value->type()), value);
  }
  return true;
}

bool Section::ReadMilliseconds(std::string_view key, std::chrono::milliseconds min,
                               std::chrono::milliseconds max, bool whole_seconds,
                               std::chrono::milliseconds& out) const {
  const TomlValue* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_string()) {
    Fail(Key(key),
         "expected " + std::string{kDurationForm} + " (a string), got " + TypeName(value->type()),
         value);
  }
  const std::string& text = value->as_string().str;
  const std::optional<std::chrono::milliseconds> duration = ParseDuration(text);
  if (!duration)
    Fail(Key(key), "expected " + std::string{kDurationForm} + ", got " + Quoted(text), value);
  if (*duration < min || *duration > max) {
    Fail(Key(key),
         "must be between " + FormatDuration(min) + " and " + FormatDuration(max) + ", got " +
             Quoted(text),
         value);
  }
  if (whole_seconds && duration->count() % 1000 != 0) {
    Fail(Key(key), "must be a whole number of seconds, got " + Quoted(text), value);
  }
  out = *duration;
  return true;
}

void Section::Check(const std::function<void()>& check,
                    std::initializer_list<const ValueSource*> sources) const {
  try {
    check();
  } catch (const ConfigError& error) {
    const std::string key = Key(error.key());
    for (const ValueSource* source : sources) {
      if (source->key != key) continue;
      source->Fail(error.message() +
                   (source->shown.empty() ? std::string{} : ", got " + Quoted(source->shown)));
    }
    const std::size_t dot = error.key().find('.');
    const TomlValue* value =
        dot == std::string::npos
            ? Find(error.key())
            : Table(error.key().substr(0, dot)).Find(error.key().substr(dot + 1));
    Fail(key, error.message(), value);
  }
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

std::string MaskPassword(std::string_view text) {
  constexpr std::string_view kMask = "***";
  std::string out{text};
  // scheme://user:password@host: from the first ':' after "://" to the last '@' of the token
  // (up to the next space), whatever stands between: a password may hold '/', '#', '?' or an
  // unescaped '@'. A token with a ':' but no '@' may be a password cut by a space ("amqp://u:pa
  // ss@host"): its '@' is then looked for further on, on the same line and before the next "://".
  // Text that holds no password may lose more than the password; it never keeps one.
  const auto token_end = [&out](std::size_t from) {
    while (from < out.size() && !IsSpace(out[from])) ++from;
    return from;
  };
  for (std::size_t scheme = out.find("://"); scheme != std::string::npos;
       scheme = out.find("://", scheme + 3)) {
    const std::size_t start = scheme + 3;
    std::size_t end = token_end(start);
    const std::size_t colon = out.find(':', start);
    if (colon >= end) continue;
    std::size_t at = out.rfind('@', end - 1);
    if (at == std::string::npos || at < start) {
      const std::size_t limit = std::min(out.find_first_of("\r\n", end), out.find("://", end));
      const std::size_t later = out.find('@', end);
      if (later >= limit) continue;
      end = token_end(later);
      at = out.rfind('@', end - 1);
    } else if (at < colon) {
      continue;  // user@host:port, no password
    }
    out.replace(colon + 1, at - colon - 1, kMask);
  }
  // password=... and sslpassword=... in a URI query or a key=value connection string: a value
  // 'quoted' or up to the next space, '&' or '"', a backslash escaping the next character either
  // way (libpq: password=SECRET\ X is "SECRET X").
  constexpr std::string_view kKey = "password";
  constexpr std::string_view kSslPrefix = "ssl";
  for (std::size_t at = 0; at + kKey.size() <= out.size(); ++at) {
    if (!StartsWithIgnoringCase(std::string_view{out}.substr(at), kKey)) continue;
    std::size_t key = at;
    if (key >= kSslPrefix.size() &&
        StartsWithIgnoringCase(std::string_view{out}.substr(key - kSslPrefix.size()), kSslPrefix)) {
      key -= kSslPrefix.size();
    }
    if (key > 0 && !IsSpace(out[key - 1]) && out[key - 1] != '?' && out[key - 1] != '&' &&
        out[key - 1] != '"') {
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
      for (; end < out.size() && !IsSpace(out[end]) && out[end] != '&' && out[end] != '"'; ++end) {
        if (out[end] == '\\') ++end;
      }
      end = std::min(end, out.size());
    }
    out.replace(value, end - value, kMask);
    at = value + kMask.size() - 1;
  }
  return out;
}

}  // namespace outbox::config
