#include "config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <system_error>
#include <toml.hpp>
#include <type_traits>
#include <utility>

#include "outbox/core/error.h"

namespace outbox::outboxd {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using TomlValue = toml::basic_value<toml::discard_comments, std::map, std::vector>;

constexpr std::string_view kDatabaseUrlEnv = "OUTBOX_DATABASE_URL";
constexpr std::string_view kHttpTokenEnv = "OUTBOX_HTTP_TOKEN";
constexpr std::size_t kMaxTokenBytes = 256;
constexpr std::string_view kRabbitType = "rabbitmq";
constexpr std::string_view kFileType = "file";
constexpr std::string_view kPostgresType = "postgres";
constexpr std::string_view kSqliteType = "sqlite";
constexpr std::size_t kMaxInstanceBytes = 255;
constexpr std::size_t kMaxSinkNameBytes = 64;
constexpr std::size_t kMaxAmqpNameBytes = 255;  // exchange names and routing keys (shortstr)
constexpr std::int64_t kMaxConfirmWindow = 100000;
constexpr std::int64_t kMaxRabbitMessageBytes = 512 * 1024 * 1024;  // RabbitMQ's hard limit
constexpr std::int64_t kMaxBatchSize = 10000;
constexpr std::int64_t kMaxAttempts = 1000000;
constexpr double kMaxMultiplier = 1000.0;

constexpr milliseconds kHour{std::chrono::hours{1}};
constexpr milliseconds kDay{std::chrono::hours{24}};
constexpr milliseconds kYear{std::chrono::hours{24 * 365}};

std::string Join(std::string_view prefix, std::string_view key) {
  std::string joined{prefix};
  if (!joined.empty()) joined += '.';
  joined += key;
  return joined;
}

std::string Quoted(std::string_view text) { return "\"" + std::string{text} + "\""; }

// The type names of TOML, as an error message says what it found.
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

// " (outbox.toml:12)" for a value read from a file; "" when toml11 does not know where it is.
std::string Where(const TomlValue& value) {
  const toml::source_location location = value.location();
  if (location.file_name() == "unknown file") return "";
  return " (" + location.file_name() + ":" + std::to_string(location.line()) + ")";
}

[[noreturn]] void Fail(const std::string& key, const std::string& message,
                       const TomlValue* value = nullptr) {
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

// ---- Durations: a non-negative integer and a unit, e.g. "250ms", "30s", "5m", "1h", "7d". ----

constexpr std::string_view kDurationForm =
    "a duration such as \"250ms\", \"30s\", \"5m\", \"1h\" or \"7d\"";

std::optional<milliseconds> ParseDuration(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 12) return std::nullopt;  // 12 digits of days still fit in int64 ms
  std::int64_t count = 0;
  std::from_chars(text.data(), text.data() + digits, count);
  const std::string_view unit = text.substr(digits);
  std::int64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60 * 1000;
  } else if (unit == "h") {
    scale = 60 * 60 * 1000;
  } else if (unit == "d") {
    scale = 24 * 60 * 60 * 1000;
  } else {
    return std::nullopt;
  }
  return milliseconds{count * scale};
}

std::string FormatDuration(milliseconds duration) {
  struct Unit {
    std::int64_t millis;
    std::string_view suffix;
  };
  static constexpr std::array<Unit, 4> kUnits{
      {{24 * 60 * 60 * 1000, "d"}, {60 * 60 * 1000, "h"}, {60 * 1000, "m"}, {1000, "s"}}};
  const std::int64_t count = duration.count();
  if (count == 0) return "0s";
  for (const Unit& unit : kUnits) {
    if (count % unit.millis == 0)
      return std::to_string(count / unit.millis) + std::string{unit.suffix};
  }
  return std::to_string(count) + "ms";
}

// ---- Reading TOML tables ----

// A table of the file being read (or an absent one); every error names the full dotted key.
class Section {
 public:
  Section(const TomlValue* table, std::string path) : table_(table), path_(std::move(path)) {}

  [[nodiscard]] bool present() const { return table_ != nullptr; }
  [[nodiscard]] std::string Key(std::string_view key) const { return Join(path_, key); }

  // The entries in the order the file wrote them.
  [[nodiscard]] std::vector<std::pair<std::string, const TomlValue*>> Entries() const {
    std::vector<std::pair<std::string, const TomlValue*>> entries;
    if (table_ == nullptr) return entries;
    for (const auto& [key, value] : table_->as_table()) entries.emplace_back(key, &value);
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      return Position(*a.second) < Position(*b.second);
    });
    return entries;
  }

  // Rejects the first key (in file order) that is not in `known`.
  void AllowOnly(std::initializer_list<std::string_view> known) const {
    AllowOnly(std::span<const std::string_view>{known.begin(), known.size()});
  }
  void AllowOnly(std::span<const std::string_view> known) const {
    for (const auto& [key, value] : Entries()) {
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string message = path_.empty() ? "unknown section or key" : "unknown key";
      const auto closest = std::min_element(known.begin(), known.end(), [&](auto a, auto b) {
        return EditDistance(key, a) < EditDistance(key, b);
      });
      if (closest != known.end() && EditDistance(key, *closest) <= 2) {
        message += " (did you mean " + Quoted(Key(*closest)) + "?)";
      } else {
        message +=
            "; " + (path_.empty() ? std::string{"the file"} : "[" + path_ + "]") + " accepts: ";
        bool first = true;
        for (const std::string_view name : known) {
          message += (first ? "" : ", ") + std::string{name};
          first = false;
        }
      }
      Fail(Key(key), message, value);
    }
  }

  [[nodiscard]] const TomlValue* Find(std::string_view key) const {
    if (table_ == nullptr) return nullptr;
    const auto& table = table_->as_table();
    const auto found = table.find(std::string{key});
    return found == table.end() ? nullptr : &found->second;
  }

  // The sub-table `key`; an absent one when the key is missing.
  [[nodiscard]] Section Table(std::string_view key) const {
    const TomlValue* value = Find(key);
    if (value != nullptr && !value->is_table()) {
      Fail(Key(key), "expected a table, got " + TypeName(value->type()), value);
    }
    return Section{value, Key(key)};
  }

  // Each Read leaves `out` alone when the key is missing and returns whether it was present.
  bool Read(std::string_view key, std::string& out) const {
    const TomlValue* value = Find(key);
    if (value == nullptr) return false;
    if (!value->is_string())
      Fail(Key(key), "expected a string, got " + TypeName(value->type()), value);
    out = value->as_string().str;
    return true;
  }

  bool Read(std::string_view key, bool& out) const {
    const TomlValue* value = Find(key);
    if (value == nullptr) return false;
    if (!value->is_boolean()) {
      Fail(Key(key), "expected a boolean (true or false), got " + TypeName(value->type()), value);
    }
    out = value->as_boolean();
    return true;
  }

  template <typename Int>
  bool ReadInteger(std::string_view key, std::int64_t min, std::int64_t max, Int& out) const {
    static_assert(std::is_integral_v<Int>);
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
    out = static_cast<Int>(number);
    return true;
  }

  // A float; an integer is accepted too ("multiplier = 2").
  bool ReadNumber(std::string_view key, double& out) const {
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

  // A duration string within [min, max]; for a seconds-valued `out`, a whole number of seconds.
  template <typename Duration>
  bool ReadDuration(std::string_view key, milliseconds min, milliseconds max, Duration& out) const {
    const TomlValue* value = Find(key);
    if (value == nullptr) return false;
    if (!value->is_string()) {
      Fail(Key(key),
           "expected " + std::string{kDurationForm} + " (a string), got " + TypeName(value->type()),
           value);
    }
    const std::string& text = value->as_string().str;
    const std::optional<milliseconds> duration = ParseDuration(text);
    if (!duration)
      Fail(Key(key), "expected " + std::string{kDurationForm} + ", got " + Quoted(text), value);
    if (*duration < min || *duration > max) {
      Fail(Key(key),
           "must be between " + FormatDuration(min) + " and " + FormatDuration(max) + ", got " +
               Quoted(text),
           value);
    }
    if constexpr (std::is_same_v<Duration, seconds>) {
      if (duration->count() % 1000 != 0) {
        Fail(Key(key), "must be a whole number of seconds, got " + Quoted(text), value);
      }
      out = std::chrono::duration_cast<seconds>(*duration);
    } else {
      out = *duration;
    }
    return true;
  }

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
  static std::pair<std::uint_least32_t, std::uint_least32_t> Position(const TomlValue& value) {
    const toml::source_location location = value.location();
    if (location.file_name() == "unknown file") return {UINT_LEAST32_MAX, UINT_LEAST32_MAX};
    return {location.line(), location.column()};
  }

  const TomlValue* table_;
  std::string path_;
};

// An environment variable, when set and not empty.
std::optional<std::string> Env(const GetenvFn& getenv, const std::string& name) {
  if (!getenv) return std::nullopt;
  const char* value = getenv(name.c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string{value};
}

std::string SinkUrlEnv(std::string_view sink_name) {
  std::string name = "OUTBOX_SINK_";
  for (const char c : sink_name) {
    if (c >= 'a' && c <= 'z') {
      name += static_cast<char>(c - 'a' + 'A');
    } else if (c == '-') {
      name += '_';
    } else {
      name += c;
    }
  }
  return name + "_URL";
}

std::string DefaultInstance() {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0 || host[0] == '\0') {
    return "outboxd-" + std::to_string(::getpid());
  }
  return std::string{host.data()} + "-" + std::to_string(::getpid());
}

bool HasControlCharacter(std::string_view text) {
  return std::any_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == '\x7f'; });
}

// What is wrong with a routing key or exchange template; "" when it is valid.
std::string CheckTemplate(std::string_view text) {
  static constexpr std::array<std::string_view, 3> kPlaceholders{"{topic}", "{target}", "{type}"};
  for (std::size_t at = 0; at < text.size(); ++at) {
    if (text[at] == '}') return "'}' without a matching '{'";
    if (text[at] != '{') continue;
    const std::size_t close = text.find('}', at);
    const std::string_view placeholder =
        close == std::string_view::npos ? text.substr(at) : text.substr(at, close - at + 1);
    if (std::find(kPlaceholders.begin(), kPlaceholders.end(), placeholder) == kPlaceholders.end()) {
      return "unknown placeholder " + Quoted(placeholder) +
             "; the placeholders are {topic}, {target} and {type}";
    }
    at = close;
  }
  if (HasControlCharacter(text)) return "must not contain control characters";
  return {};
}

void ParseDatabase(const Section& root, const GetenvFn& getenv, Config& config) {
  const Section database = root.Table("database");
  database.AllowOnly({"type", "url", "schema", "path"});
  std::string type{kPostgresType};
  database.ReadChoice("type", {kPostgresType, kSqliteType}, type);
  if (type == kSqliteType) {
    config.database_type = DatabaseType::kSqlite;
    // A SQLite database is a file: a url or schema here is a mistake, not something to ignore.
    // (OUTBOX_DATABASE_URL is ignored: it may be set for other tools.)
    for (const std::string_view key : {"url", "schema"}) {
      if (const TomlValue* value = database.Find(key)) {
        Fail(database.Key(key),
             "is for type = \"postgres\"; a \"sqlite\" database is named by database.path", value);
      }
    }
    if (!database.Read("path", config.database_path)) {
      Fail("database.path",
           "is required with type = \"sqlite\": the database file (created if missing)",
           database.Find("type"));
    }
    if (config.database_path.empty() || HasControlCharacter(config.database_path)) {
      Fail("database.path", "must be a file path (not empty, no control characters)",
           database.Find("path"));
    }
    return;
  }
  if (const TomlValue* path = database.Find("path")) {
    Fail("database.path",
         "is only for type = \"sqlite\"; a PostgreSQL database is named by database.url", path);
  }
  database.Read("url", config.database_url);
  if (auto url = Env(getenv, std::string{kDatabaseUrlEnv})) config.database_url = std::move(*url);
  if (config.database_url.empty()) {
    Fail("database.url", "is required (or set " + std::string{kDatabaseUrlEnv} + ")",
         database.Find("url"));
  }
  if (database.Read("schema", config.schema)) {
    const std::string& schema = config.schema;
    const bool valid =
        !schema.empty() && schema.size() <= 63 &&
        ((schema[0] >= 'a' && schema[0] <= 'z') || schema[0] == '_') &&
        schema.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
    if (!valid) {
      Fail("database.schema",
           "must be a plain lower-case identifier ([a-z_][a-z0-9_]*, at most 63 bytes), got " +
               Quoted(schema),
           database.Find("schema"));
    }
  }
}

void ParseRelay(const Section& root, Config& config) {
  const Section relay = root.Table("relay");
  relay.AllowOnly({"instance", "batch_size", "lease", "sweep_interval", "publish_timeout",
                   "shutdown_timeout", "min_backoff", "max_backoff", "purge_interval"});
  if (relay.Read("instance", config.instance)) {
    if (config.instance.empty() || config.instance.size() > kMaxInstanceBytes ||
        HasControlCharacter(config.instance)) {
      Fail(
          "relay.instance",
          "must be 1 to " + std::to_string(kMaxInstanceBytes) + " bytes without control characters",
          relay.Find("instance"));
    }
  } else {
    config.instance = DefaultInstance();
  }
  relay.ReadInteger("batch_size", 1, kMaxBatchSize, config.batch_size);
  relay.ReadDuration("lease", seconds{1}, kDay, config.lease);
  relay.ReadDuration("sweep_interval", milliseconds{10}, kHour, config.sweep_interval);
  relay.ReadDuration("publish_timeout", milliseconds{1}, kHour, config.publish_timeout);
  relay.ReadDuration("shutdown_timeout", milliseconds{0}, kHour, config.shutdown_timeout);
  relay.ReadDuration("min_backoff", milliseconds{1}, kHour, config.min_backoff);
  relay.ReadDuration("max_backoff", milliseconds{1}, kHour, config.max_backoff);
  relay.ReadDuration("purge_interval", seconds{1}, kDay, config.purge_interval);
  // The relay renews its partition leases between batches: a batch must leave time for that.
  if (config.publish_timeout * 2 > config.lease) {
    Fail("relay.publish_timeout",
         "must be at most half of relay.lease (" + FormatDuration(config.lease) + "), got " +
             FormatDuration(config.publish_timeout),
         relay.Find("publish_timeout"));
  }
  if (config.max_backoff < config.min_backoff) {
    Fail("relay.max_backoff",
         "must be at least relay.min_backoff (" + FormatDuration(config.min_backoff) + "), got " +
             FormatDuration(config.max_backoff),
         relay.Find("max_backoff"));
  }
}

void ParseRetry(const Section& root, Config& config) {
  const Section retry = root.Table("retry");
  static constexpr std::array<std::string_view, 5> kRetryKeys{
      "initial_delay", "max_delay", "multiplier", "jitter", "max_attempts"};
  retry.AllowOnly(kRetryKeys);
  RetryPolicy& policy = config.retry;
  retry.ReadDuration("initial_delay", milliseconds{0}, kYear, policy.initial_delay);
  retry.ReadDuration("max_delay", milliseconds{0}, kYear, policy.max_delay);
  retry.ReadNumber("multiplier", policy.multiplier);
  if (policy.multiplier > kMaxMultiplier) {
    Fail("retry.multiplier", "must be at most 1000", retry.Find("multiplier"));
  }
  retry.ReadNumber("jitter", policy.jitter);
  retry.ReadInteger("max_attempts", 1, kMaxAttempts, policy.max_attempts);
  if (const std::optional<std::string> problem = policy.Validate()) {
    // RetryPolicy names the field first: "max_delay must be at least initial_delay".
    const std::size_t space = problem->find(' ');
    const std::string field = problem->substr(0, space);
    if (space == std::string::npos ||
        std::find(kRetryKeys.begin(), kRetryKeys.end(), field) == kRetryKeys.end())
      Fail("retry", *problem);
    Fail(retry.Key(field), problem->substr(space + 1), retry.Find(field));
  }
}

void ParseRetention(const Section& root, Config& config) {
  const Section retention = root.Table("retention");
  retention.AllowOnly({"published", "abandoned"});
  retention.ReadDuration("published", milliseconds{0}, 10 * kYear, config.retention.published);
  retention.ReadDuration("abandoned", milliseconds{0}, 10 * kYear, config.retention.abandoned);
}

void ParseLog(const Section& root, Config& config) {
  const Section log = root.Table("log");
  log.AllowOnly({"level", "format"});
  log.ReadChoice("level", {"trace", "debug", "info", "warn", "error"}, config.log_level);
  log.ReadChoice("format", {"text", "json"}, config.log_format);
}

// listen = "host:port" or "[v6]:port": {host, port}, or nullopt when malformed.
std::optional<std::pair<std::string, int>> SplitListen(std::string_view listen) {
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = listen.substr(0, colon);
  const std::string_view port_text = listen.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return std::nullopt;  // an IPv6 address needs brackets
  }
  const bool host_ok = std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == ':' || c == '_' || c == '%';
  });
  int port = 0;
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (!host_ok || port_text.empty() || error != std::errc{} ||
      end != port_text.data() + port_text.size() || port < 1 || port > 65535) {
    return std::nullopt;
  }
  return std::pair{std::string{host}, port};
}

void ParseHttp(const Section& root, const GetenvFn& getenv, Config& config) {
  const Section http = root.Table("http");
  http.AllowOnly({"listen", "token", "stats_interval", "ready_max_age"});
  HttpConfig& out = config.http;
  const bool listen_set = http.Read("listen", out.listen);
  if (config.database_type == DatabaseType::kSqlite) {
    // The operations side reads its statistics from PostgreSQL only (for now).
    if (listen_set && !out.listen.empty()) {
      Fail("http.listen",
           "is not available with database.type = \"sqlite\" yet; remove it or set it to \"\"",
           http.Find("listen"));
    }
    out.listen.clear();
  }
  if (listen_set && !out.listen.empty() && !SplitListen(out.listen)) {
    Fail("http.listen",
         "expected \"host:port\" (port 1 to 65535; \"[::1]:9780\" for IPv6) or \"\" to "
         "disable, got " +
             Quoted(HasControlCharacter(out.listen) ? "<control characters>" : out.listen),
         http.Find("listen"));
  }
  http.Read("token", out.token);
  std::string token_origin;
  if (auto token = Env(getenv, std::string{kHttpTokenEnv})) {
    out.token = std::move(*token);
    token_origin = " (from " + std::string{kHttpTokenEnv} + ")";
  }
  const bool token_ok =
      out.token.size() <= kMaxTokenBytes &&
      std::all_of(out.token.begin(), out.token.end(), [](char c) { return c > ' ' && c < '\x7f'; });
  if (!token_ok) {
    // The token itself is never quoted: it is a secret.
    Fail("http.token",
         "must be at most " + std::to_string(kMaxTokenBytes) +
             " bytes of printable ASCII without spaces" + token_origin,
         token_origin.empty() ? http.Find("token") : nullptr);
  }
  http.ReadDuration("stats_interval", milliseconds{100}, kHour, out.stats_interval);
  http.ReadDuration("ready_max_age", milliseconds{200}, kDay, out.ready_max_age);
  if (out.ready_max_age < 2 * out.stats_interval) {
    Fail("http.ready_max_age",
         "must be at least twice http.stats_interval (" + FormatDuration(out.stats_interval) +
             "), got " + FormatDuration(out.ready_max_age),
         http.Find("ready_max_age") != nullptr ? http.Find("ready_max_age")
                                               : http.Find("stats_interval"));
  }
}

RabbitSinkConfig ParseRabbitSink(const Section& sink, const std::string& name,
                                 const GetenvFn& getenv) {
  sink.AllowOnly({"type", "url", "exchange", "routing_key", "mandatory", "persistent",
                  "confirm_window", "connect_timeout", "heartbeat", "declare_exchange_type",
                  "max_message_bytes"});
  RabbitSinkConfig rabbit;
  const std::string url_key = sink.Key("url");
  const std::string url_env = SinkUrlEnv(name);
  sink.Read("url", rabbit.url);
  std::string url_origin;
  if (auto url = Env(getenv, url_env)) {
    rabbit.url = std::move(*url);
    url_origin = " (from " + url_env + ")";
  }
  if (rabbit.url.empty()) Fail(url_key, "is required (or set " + url_env + ")", sink.Find("url"));
  const TomlValue* url_value = url_origin.empty() ? sink.Find("url") : nullptr;
  if (rabbit.url.rfind("amqps://", 0) == 0) {
    Fail(url_key, "amqps:// (TLS) is not supported yet" + url_origin, url_value);
  }
  if (rabbit.url.rfind("amqp://", 0) != 0) {
    Fail(url_key, "expected an amqp:// URL, got " + Quoted(MaskPassword(rabbit.url)) + url_origin,
         url_value);
  }

  for (const std::string_view key : {"exchange", "routing_key"}) {
    std::string& text = key == "exchange" ? rabbit.exchange : rabbit.routing_key;
    if (!sink.Read(key, text)) continue;
    if (text.size() > kMaxAmqpNameBytes) {
      Fail(sink.Key(key), "must be at most 255 bytes", sink.Find(key));
    }
    if (const std::string problem = CheckTemplate(text); !problem.empty()) {
      Fail(sink.Key(key), problem, sink.Find(key));
    }
  }
  sink.Read("mandatory", rabbit.mandatory);
  sink.Read("persistent", rabbit.persistent);
  sink.ReadInteger("confirm_window", 1, kMaxConfirmWindow, rabbit.confirm_window);
  sink.ReadDuration("connect_timeout", milliseconds{1}, std::chrono::minutes{10},
                    rabbit.connect_timeout);
  sink.ReadDuration("heartbeat", milliseconds{0}, seconds{65535}, rabbit.heartbeat);
  sink.ReadChoice("declare_exchange_type", {"", "direct", "topic", "fanout", "headers"},
                  rabbit.declare_exchange_type);
  if (!rabbit.declare_exchange_type.empty() &&
      (rabbit.exchange.empty() || rabbit.exchange.find('{') != std::string::npos)) {
    Fail(sink.Key("exchange"), "must be a plain, non-empty name when declare_exchange_type is set",
         sink.Find("exchange") != nullptr ? sink.Find("exchange")
                                          : sink.Find("declare_exchange_type"));
  }
  sink.ReadInteger("max_message_bytes", 1, kMaxRabbitMessageBytes, rabbit.max_message_bytes);
  return rabbit;
}

FileSinkConfig ParseFileSink(const Section& sink) {
  sink.AllowOnly({"type", "path", "fsync"});
  FileSinkConfig file;
  if (sink.Read("path", file.path) && (file.path.empty() || HasControlCharacter(file.path))) {
    Fail(sink.Key("path"),
         "must be a file path, or \"-\" for standard output (not empty, no control characters)",
         sink.Find("path"));
  }
  sink.Read("fsync", file.fsync);
  return file;
}

void ParseSinks(const Section& root, const GetenvFn& getenv, Config& config) {
  const Section sinks = root.Table("sinks");
  std::map<std::string, std::string> env_owner;  // OUTBOX_SINK_<NAME>_URL -> sink name
  for (const auto& [name, value] : sinks.Entries()) {
    const std::string key = sinks.Key(name);
    const bool valid_name =
        !name.empty() && name.size() <= kMaxSinkNameBytes &&
        name.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
            std::string::npos;
    if (!valid_name) {
      Fail(key, "a sink name must be 1 to 64 letters, digits, '_' or '-'", value);
    }
    if (!value->is_table()) {
      Fail(key, "expected a table (a [sinks." + name + "] section), got " + TypeName(value->type()),
           value);
    }
    const auto [owner, inserted] = env_owner.emplace(SinkUrlEnv(name), name);
    if (!inserted) {
      Fail(key,
           "its environment variable " + owner->first + " is also that of sink " +
               Quoted(owner->second) + "; rename one of them",
           value);
    }
    const Section sink{value, key};
    std::string type;
    if (!sink.Read("type", type)) {
      Fail(sink.Key("type"), "is required: \"rabbitmq\" or \"file\"", value);
    }
    SinkConfig entry{.name = name, .settings = FileSinkConfig{}};
    if (type == kRabbitType) {
      entry.settings = ParseRabbitSink(sink, name, getenv);
    } else if (type == kFileType) {
      entry.settings = ParseFileSink(sink);
    } else {
      Fail(sink.Key("type"),
           "unknown sink type " + Quoted(type) + "; expected \"rabbitmq\" or \"file\"",
           sink.Find("type"));
    }
    config.sinks.push_back(std::move(entry));
  }
  if (config.sinks.empty()) {
    Fail("sinks",
         "at least one sink is required, e.g. [sinks.default] with type = \"rabbitmq\" or "
         "\"file\"");
  }
}

// ---- Rendering (Describe) ----

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

class Writer {
 public:
  void Header(std::string_view name) {
    if (!out_.empty()) out_ += '\n';
    out_ += "[" + std::string{name} + "]\n";
  }
  void String(std::string_view key, std::string_view value) { Line(key, TomlString(value)); }
  void Bool(std::string_view key, bool value) { Line(key, value ? "true" : "false"); }
  void Integer(std::string_view key, std::int64_t value) { Line(key, std::to_string(value)); }
  void Float(std::string_view key, double value) { Line(key, TomlFloat(value)); }
  void Duration(std::string_view key, milliseconds value) {
    Line(key, TomlString(FormatDuration(value)));
  }
  [[nodiscard]] std::string Take() { return std::move(out_); }

 private:
  void Line(std::string_view key, const std::string& value) {
    out_ += std::string{key} + " = " + value + "\n";
  }
  std::string out_;
};

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

std::string HttpConfig::host() const {
  const auto split = SplitListen(listen);
  return split ? split->first : std::string{};
}

int HttpConfig::port() const {
  const auto split = SplitListen(listen);
  return split ? split->second : 0;
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

Config ParseConfig(std::string_view toml_text, const std::string& origin, const GetenvFn& getenv) {
  TomlValue root;
  try {
    std::istringstream stream{std::string{toml_text}};
    root = toml::parse<toml::discard_comments, std::map, std::vector>(stream, origin);
  } catch (const std::exception& error) {
    // toml11 quotes the offending line, which may hold a password.
    throw ConfigError("file", origin + " is not valid TOML: " + MaskPassword(error.what()));
  }
  const Section top{&root, ""};
  top.AllowOnly({"database", "relay", "retry", "retention", "log", "http", "sinks"});
  Config config;
  ParseDatabase(top, getenv, config);
  ParseRelay(top, config);
  ParseRetry(top, config);
  ParseRetention(top, config);
  ParseLog(top, config);
  ParseHttp(top, getenv, config);
  ParseSinks(top, getenv, config);
  return config;
}

Config LoadConfig(const std::string& path, const GetenvFn& getenv) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw ConfigError("file", "cannot read " + path + ": " + std::system_category().message(errno));
  }
  std::string text;
  std::array<char, 65536> buffer{};
  int error = 0;
  for (;;) {
    const ssize_t count = ::read(fd, buffer.data(), buffer.size());
    if (count > 0) {
      text.append(buffer.data(), static_cast<std::size_t>(count));
    } else if (count == 0) {
      break;
    } else if (errno != EINTR) {
      error = errno;
      break;
    }
  }
  ::close(fd);
  if (error != 0) {
    throw ConfigError("file", "cannot read " + path + ": " + std::system_category().message(error));
  }
  return ParseConfig(text, path, getenv);
}

std::string Describe(const Config& config) {
  Writer out;
  out.Header("database");
  if (config.database_type == DatabaseType::kSqlite) {
    out.String("type", kSqliteType);
    out.String("path", config.database_path);
  } else {
    out.String("type", kPostgresType);
    out.String("url", MaskPassword(config.database_url));
    out.String("schema", config.schema);
  }

  out.Header("relay");
  out.String("instance", config.instance);
  out.Integer("batch_size", config.batch_size);
  out.Duration("lease", config.lease);
  out.Duration("sweep_interval", config.sweep_interval);
  out.Duration("publish_timeout", config.publish_timeout);
  out.Duration("shutdown_timeout", config.shutdown_timeout);
  out.Duration("min_backoff", config.min_backoff);
  out.Duration("max_backoff", config.max_backoff);
  out.Duration("purge_interval", config.purge_interval);

  out.Header("retry");
  out.Duration("initial_delay", config.retry.initial_delay);
  out.Duration("max_delay", config.retry.max_delay);
  out.Float("multiplier", config.retry.multiplier);
  out.Float("jitter", config.retry.jitter);
  out.Integer("max_attempts", config.retry.max_attempts);

  out.Header("retention");
  out.Duration("published", config.retention.published);
  out.Duration("abandoned", config.retention.abandoned);

  out.Header("log");
  out.String("level", config.log_level);
  out.String("format", config.log_format);

  out.Header("http");
  out.String("listen", config.http.listen);
  out.String("token", config.http.token.empty() ? "" : "***");
  out.Duration("stats_interval", config.http.stats_interval);
  out.Duration("ready_max_age", config.http.ready_max_age);

  for (const SinkConfig& sink : config.sinks) {
    out.Header("sinks." + sink.name);
    if (const auto* rabbit = std::get_if<RabbitSinkConfig>(&sink.settings)) {
      out.String("type", kRabbitType);
      out.String("url", MaskPassword(rabbit->url));
      out.String("exchange", rabbit->exchange);
      out.String("routing_key", rabbit->routing_key);
      out.Bool("mandatory", rabbit->mandatory);
      out.Bool("persistent", rabbit->persistent);
      out.Integer("confirm_window", static_cast<std::int64_t>(rabbit->confirm_window));
      out.Duration("connect_timeout", rabbit->connect_timeout);
      out.Duration("heartbeat", rabbit->heartbeat);
      out.String("declare_exchange_type", rabbit->declare_exchange_type);
      out.Integer("max_message_bytes", static_cast<std::int64_t>(rabbit->max_message_bytes));
    } else if (const auto* file = std::get_if<FileSinkConfig>(&sink.settings)) {
      out.String("type", kFileType);
      out.String("path", file->path);
      out.Bool("fsync", file->fsync);
    }
  }
  return out.Take();
}

}  // namespace outbox::outboxd
