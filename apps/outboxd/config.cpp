#include "config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <system_error>
#include <toml.hpp>
#include <type_traits>
#include <utility>

#include "database_list.h"
#include "outbox/config/toml_file.h"
#include "outbox/core/error.h"
#include "outbox/sink/claim_check_type.h"

namespace outbox::outboxd {
namespace {

using config::CutErrorText;
using config::Env;
using config::Fail;
using config::FormatDuration;
using config::HasControlCharacter;
using config::Quoted;
using config::Section;
using config::TomlValue;
using config::TypeName;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::string_view kHttpTokenEnv = "OUTBOX_HTTP_TOKEN";
constexpr std::size_t kMaxTokenBytes = 256;
constexpr std::size_t kMaxSinkNameBytes = 64;
constexpr std::int64_t kMaxAttempts = 1000000;
constexpr double kMaxMultiplier = 1000.0;

constexpr milliseconds kHour{std::chrono::hours{1}};
constexpr milliseconds kDay{std::chrono::hours{24}};
constexpr milliseconds kYear{std::chrono::hours{24 * 365}};

void ParseDatabase(const Section& root, const GetenvFn& getenv, Config& config) {
  const TomlValue* many = root.Find("databases");
  if (many == nullptr) many = root.Find("discovery");
  if (many != nullptr) {
    if (root.Find("database") != nullptr) {
      Fail("database",
           "[database] names one database; [[databases]] and [discovery] name many: use one or "
           "the other",
           root.Find("database"));
    }
    config.databases = apps::ReadDatabaseList(root, getenv);
    config.discovery = apps::ReadDiscovery(root, getenv);
    return;
  }
  const Section database = root.Table("database");
  const StoreRegistry& types = StoreTypes();
  database.Read("type", config.database_type);
  const StoreType* type = types.Find(config.database_type);
  if (type == nullptr) {
    Fail("database.type",
         "unknown store type " + Quoted(config.database_type) + "; expected " + types.Names(),
         database.Find("type"));
  }
  config.database = type->parse(database, getenv);
}

void ParseRelay(const Section& root, Config& config) {
  if (config.many_databases()) {
    config.relay =
        ReadRelaySection(root.Table("relay"), {.sweep_interval = kManyDatabasesSweep,
                                               .purge_interval = kManyDatabasesPurge,
                                               .idle_lease_factor = kManyDatabasesIdleLeaseFactor});
    return;
  }
  config.relay = ReadRelaySection(
      root.Table("relay"), {.sweep_interval = config.database->DefaultSweepInterval(),
                            .linger = config.database->WalMode() ? kWalLinger : kTableLinger});
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

// 127.0.0.0/8, ::1, ::ffff:127.x.x.x or "localhost"; a host name never (whatever it resolves to).
// IPv4 is read as the resolver reads a numeric host ("127.1" is 127.0.0.1, "0" is 0.0.0.0).
bool IsLoopbackHost(const std::string& host) {
  std::string lower = host;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  });
  if (lower == "localhost") return true;
  in_addr v4{};
  if (::inet_aton(host.c_str(), &v4) != 0) {
    std::array<unsigned char, 4> bytes{};  // network order
    std::memcpy(bytes.data(), &v4.s_addr, bytes.size());
    return bytes[0] == 127;
  }
  std::array<unsigned char, 16> v6{};
  if (::inet_pton(AF_INET6, host.c_str(), v6.data()) != 1) return false;
  const auto zero = [&](std::size_t from, std::size_t to) {
    return std::all_of(v6.begin() + static_cast<std::ptrdiff_t>(from),
                       v6.begin() + static_cast<std::ptrdiff_t>(to),
                       [](unsigned char b) { return b == 0; });
  };
  if (zero(0, 15) && v6[15] == 1) return true;                              // ::1
  return zero(0, 10) && v6[10] == 0xff && v6[11] == 0xff && v6[12] == 127;  // ::ffff:127.x.x.x
}

void ParseHttp(const Section& root, const GetenvFn& getenv, Config& config) {
  const Section http = root.Table("http");
  http.AllowOnly({"listen", "token", "allow_unauthenticated", "stats_interval", "ready_max_age"});
  HttpConfig& out = config.http;
  if (http.Read("listen", out.listen) && !out.listen.empty() && !SplitListen(out.listen)) {
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
  http.Read("allow_unauthenticated", out.allow_unauthenticated);
  if (out.listens_beyond_loopback() && out.token.empty() && !out.allow_unauthenticated) {
    Fail("http.listen",
         Quoted(out.listen) + " listens beyond loopback without a token: anyone who can reach " +
             "the port could read /metrics and /api/outbox. Set [http] token (or " +
             std::string{kHttpTokenEnv} +
             "), or set [http] allow_unauthenticated = true to accept that (or listen on " +
             "127.0.0.1)",
         http.Find("listen"));
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

// `max_rate` and `max_burst`, which every sink type takes (each type's AllowOnly names them):
// read here, in one place, for the dispatcher's token bucket (relay/dispatcher.h), which checks
// them.
std::optional<RateLimit> ReadRateLimit(const Section& sink) {
  RateLimit limit;
  const bool has_rate = sink.ReadNumber("max_rate", limit.max_rate);
  if (double burst = 0; sink.ReadNumber("max_burst", burst)) {
    if (!has_rate)
      Fail(sink.Key("max_burst"), "is only read with max_rate", sink.Find("max_burst"));
    limit.max_burst = burst;
  }
  if (!has_rate) return std::nullopt;
  sink.Check([&limit] { ValidateRateLimit(limit); });
  return limit;
}

void ParseSinks(const Section& root, const GetenvFn& getenv, Config& config) {
  const Section sinks = root.Table("sinks");
  const SinkRegistry& types = SinkTypes();
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
    const auto [owner, inserted] = env_owner.emplace(SinkSecretEnv(name, "url"), name);
    if (!inserted) {
      Fail(key,
           "its environment variable " + owner->first + " is also that of sink " +
               Quoted(owner->second) + "; rename one of them",
           value);
    }
    const Section sink{value, key};
    std::string type;
    if (!sink.Read("type", type)) {
      Fail(sink.Key("type"), "is required: " + types.Names(), value);
    }
    const SinkType* sink_type = types.Find(type);
    if (sink_type == nullptr) {
      Fail(sink.Key("type"), "unknown sink type " + Quoted(type) + "; expected " + types.Names(),
           sink.Find("type"));
    }
    // on_abandon, max_rate and max_burst are every sink's: read here, accepted by the type's own
    // AllowOnly as common keys.
    std::string on_abandon = "continue";
    if (sink.Read("on_abandon", on_abandon) && on_abandon != "continue" && on_abandon != "hold") {
      Fail(sink.Key("on_abandon"), "must be \"continue\" or \"hold\", got " + Quoted(on_abandon),
           sink.Find("on_abandon"));
    }
    if (on_abandon == "hold") config.retry.hold_targets.push_back(name);
    // The claim check is every sink type's sub-table, read here (claim_check_type.h): the type
    // reads its table without it, and the sink it opens is wrapped.
    std::optional<claim_check::Options> claim_check;
    std::optional<TomlValue> without_claim_check;
    if (const TomlValue* table = sink.Find(claim_check::kTableKey); table != nullptr) {
      if (!table->is_table()) {
        Fail(sink.Key(claim_check::kTableKey),
             "expected a table (a [" + key + ".claim_check] section), got " +
                 TypeName(table->type()),
             table);
      }
      claim_check = claim_check::ReadOptions(Section{table, sink.Key(claim_check::kTableKey)}, name,
                                             getenv, config.claim_check);
      without_claim_check = *value;
      without_claim_check->as_table().erase(std::string{claim_check::kTableKey});
    } else {
      claim_check = config.claim_check;  // the global [claim_check], if any
    }
    const Section for_type = without_claim_check ? Section{&*without_claim_check, key} : sink;
    std::unique_ptr<const SinkSettings> settings = sink_type->parse(
        for_type.WithCommonKeys({"on_abandon", "max_rate", "max_burst"}), name, getenv);
    if (claim_check) {
      settings = claim_check::WithClaimCheck(std::move(settings), name, std::move(*claim_check));
    }
    config.sinks.push_back(SinkConfig{.name = name,
                                      .type = type,
                                      .settings = std::move(settings),
                                      .rate_limit = ReadRateLimit(sink),
                                      .on_abandon = on_abandon});
  }
  if (config.sinks.empty()) {
    Fail("sinks",
         "at least one sink is required, e.g. [sinks.default] with type = " + types.Names());
  }
}

// ---- Rendering (Describe) ----

}  // namespace

std::string HttpConfig::host() const {
  const auto split = SplitListen(listen);
  return split ? split->first : std::string{};
}

int HttpConfig::port() const {
  const auto split = SplitListen(listen);
  return split ? split->second : 0;
}

bool HttpConfig::listens_beyond_loopback() const {
  if (listen.empty()) return false;
  const auto split = SplitListen(listen);
  return !split || !IsLoopbackHost(split->first);
}

namespace {

Config ParseText(std::string_view toml_text, const std::string& origin, const GetenvFn& getenv) {
  const TomlValue root = config::ParseToml(toml_text, origin);
  const Section top{&root, ""};
  top.AllowOnly({"database", "databases", "discovery", "relay", "retry", "retention", "log", "http",
                 "claim_check", "sinks"});
  Config config;
  ParseDatabase(top, getenv, config);
  ParseRelay(top, config);
  ParseRetry(top, config);
  ParseRetention(top, config);
  ParseLog(top, config);
  ParseHttp(top, getenv, config);
  if (const TomlValue* table = top.Find(claim_check::kTableKey); table != nullptr) {
    if (!table->is_table()) {
      Fail("claim_check", "expected a table, got " + TypeName(table->type()), table);
    }
    config.claim_check =
        claim_check::ReadOptions(Section{table, "claim_check"}, /*sink_name=*/"", getenv);
  }
  ParseSinks(top, getenv, config);
  return config;
}

}  // namespace

Config ParseConfig(std::string_view toml_text, const std::string& origin, const GetenvFn& getenv) {
  try {
    return ParseText(toml_text, origin, getenv);
  } catch (const ConfigError& error) {
    // The last guard: values are quoted cut (Quoted), but a key or path may be as long as the
    // file too ("unknown key" names it). What reaches the operator stays short.
    constexpr std::size_t kMaxKeyBytes = 256;
    constexpr std::size_t kMaxLineBytes = 1024;
    constexpr std::size_t kMaxMessageBytes = 4096;
    const std::string_view what = error.what();  // key() + ": " + message
    const std::string_view message =
        what.substr(std::min(what.size(), error.key().size() + std::string_view{": "}.size()));
    const std::string cut = CutErrorText(message, kMaxLineBytes, kMaxMessageBytes);
    if (error.key().size() <= kMaxKeyBytes && cut == message) throw;
    throw ConfigError(CutErrorText(error.key(), kMaxKeyBytes), cut);
  }
}

Config LoadConfig(const std::string& path, const GetenvFn& getenv) {
  return ParseConfig(config::ReadConfigFile(path), path, getenv);
}

std::vector<std::string> Secrets(const Config& config) {
  std::vector<std::string> secrets;
  const auto add = [&secrets](std::vector<std::string> more) {
    for (std::string& secret : more) secrets.push_back(std::move(secret));
  };
  if (config.database) add(config.database->Secrets());
  for (const NamedDatabase& database : config.databases) add(database.settings->Secrets());
  if (config.discovery) {
    // The catalog's password, in the forms a PostgreSQL store quotes it.
    try {
      add(apps::DiscoveredDatabase(*config.discovery,
                                   {.name = "catalog", .url = config.discovery->url})
              .settings->Secrets());
    } catch (const ConfigError&) {
      secrets.push_back(config.discovery->url);
    }
  }
  for (const SinkConfig& sink : config.sinks) {
    if (sink.settings) add(sink.settings->Secrets());
  }
  secrets.push_back(config.http.token);
  return secrets;
}

std::string Describe(const Config& config) {
  config::TomlWriter out;
  if (config.database) {
    out.Header("database");
    out.String("type", config.database_type);
    config.database->Describe(out);
  }
  for (const NamedDatabase& database : config.databases) {
    out.ArrayHeader("databases");
    out.String("name", database.name);
    out.Raw(database.fingerprint);
  }
  if (config.discovery) {
    out.Header("discovery");
    out.String("url", MaskPassword(config.discovery->url));
    out.String("query", config.discovery->query);
    out.Duration("interval", config.discovery->interval);
    out.String("type", config.discovery->type);
    out.Duration("statement_deadline", config.discovery->statement_deadline);
  }

  DescribeRelaySection(out, config.relay);

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
  out.Bool("allow_unauthenticated", config.http.allow_unauthenticated);
  out.Duration("stats_interval", config.http.stats_interval);
  out.Duration("ready_max_age", config.http.ready_max_age);
  if (config.claim_check) {
    out.Header("claim_check");
    claim_check::DescribeOptions(out, *config.claim_check);
  }

  for (const SinkConfig& sink : config.sinks) {
    out.Header("sinks." + sink.name);
    out.String("type", sink.type);
    out.String("on_abandon", sink.on_abandon);
    sink.settings->Describe(out);
    if (sink.rate_limit) {
      out.Float("max_rate", sink.rate_limit->max_rate);
      out.Float("max_burst", sink.rate_limit->burst());
    }
  }
  return out.Take();
}

}  // namespace outbox::outboxd
