// The MariaDB store type for outboxd's [database] table (outbox/store/mariadb_type.h): the table
// read and checked once here, each Open* forwarding to outbox/store/mariadb.h.
#include <stdexcept>

#include "connection.h"
#include "outbox/store/mariadb.h"
#include "outbox/store/mariadb_type.h"

namespace outbox::mariadb {
namespace {

constexpr std::string_view kMask = "***";

// Where the password is written in `url` (between the user's ':' and the '@'); npos when the URL
// has none.
struct Span {
  std::size_t at = std::string::npos;
  std::size_t size = 0;
};
Span PasswordSpan(std::string_view url) {
  const auto scheme = url.find("://");
  if (scheme == std::string_view::npos) return {};
  const std::size_t start = scheme + 3;
  const std::size_t authority_end = std::min(url.find('/', start), url.find('?', start));
  const std::string_view authority = url.substr(
      start, authority_end == std::string_view::npos ? url.size() - start : authority_end - start);
  const auto at = authority.rfind('@');
  if (at == std::string_view::npos) return {};
  const auto colon = authority.substr(0, at).find(':');
  if (colon == std::string_view::npos) return {};
  return {.at = start + colon + 1, .size = at - colon - 1};
}

std::unique_ptr<const outbox::StoreSettings> Parse(const config::Section& database,
                                                   const config::GetenvFn& getenv) {
  database.AllowOnly({"type", "url", "schema", "path", "mode", "statement_deadline", "idle_poll"});
  // Another store type's key is a mistake worth naming, not an unknown key.
  if (const config::TomlValue* path = database.Find("path")) {
    config::Fail(
        database.Key("path"),
        "is only for type = \"sqlite\"; a MariaDB database is named by " + database.Key("url"),
        path);
  }
  std::string mode = "table";
  if (database.Read("mode", mode) && mode != "table") {
    config::Fail(database.Key("mode"),
                 mode == "wal"
                     ? "MariaDB has no WAL mode (only type = \"postgres\" has one): "
                       "remove the key, or set \"table\""
                     : "must be \"table\" (MariaDB's only mode), got " + config::Quoted(mode),
                 database.Find("mode"));
  }
  std::string url;
  database.Read("url", url);
  const bool from_env = [&] {
    auto env = config::Env(getenv, kDatabaseUrlEnv);
    if (env) url = std::move(*env);
    return env.has_value();
  }();
  if (url.empty()) {
    config::Fail(database.Key("url"), "is required (or set " + std::string{kDatabaseUrlEnv} + ")",
                 database.Find("url"));
  }
  try {
    ParseUrl(url);
  } catch (const std::invalid_argument& error) {
    // The parser's words never quote the password.
    config::Fail(database.Key("url"),
                 std::string{from_env ? "(from " + std::string{kDatabaseUrlEnv} + ") " : ""} +
                     error.what() + " (mariadb://user:password@host:port/database)",
                 from_env ? nullptr : database.Find("url"));
  }
  std::string schema{kDefaultSchema};
  if (database.Read("schema", schema)) {
    try {
      QuoteSchema(schema);
    } catch (const std::invalid_argument&) {
      config::Fail(database.Key("schema"),
                   "must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 bytes): the "
                   "name of the database the outbox lives in; got " +
                       config::Quoted(schema),
                   database.Find("schema"));
    }
  }
  // Every connection has one: the server ends a statement at it (max_statement_time, lock
  // waits), the client gives up on a silent server a second later.
  std::chrono::milliseconds deadline = kDefaultStatementDeadline;
  if (const config::TomlValue* value = database.Find("statement_deadline")) {
    database.ReadDuration("statement_deadline", std::chrono::milliseconds{0}, std::chrono::hours{1},
                          deadline);
    if (deadline < std::chrono::seconds{1}) {
      config::Fail(database.Key("statement_deadline"),
                   "must be at least 1s (a MariaDB connection always has a deadline), got " +
                       config::FormatDuration(deadline),
                   value);
    }
  }
  // MariaDB has no NOTIFY: the wake-up looks for new messages, every 5 ms just after work, backing
  // off to this while idle (the cost of a quiet relay against the wait of a message written by
  // another process).
  std::chrono::milliseconds idle_poll = kDefaultIdlePoll;
  database.ReadDuration("idle_poll", std::chrono::milliseconds{5}, std::chrono::minutes{1},
                        idle_poll);
  return std::make_unique<const StoreSettings>(std::move(url), std::move(schema), deadline,
                                               idle_poll);
}

}  // namespace

StoreSettings::StoreSettings(std::string url, std::string schema,
                             std::chrono::milliseconds statement_deadline,
                             std::chrono::milliseconds idle_poll)
    : url_(std::move(url)),
      schema_(std::move(schema)),
      deadline_(statement_deadline),
      idle_poll_(idle_poll) {
  ParseUrl(url_);
  QuoteSchema(schema_);
}

void StoreSettings::Describe(config::TomlWriter& out) const {
  std::string masked = url_;
  if (const Span password = PasswordSpan(url_); password.at != std::string::npos) {
    masked.replace(password.at, password.size, kMask);
  }
  out.String("url", masked);
  out.String("schema", schema_);
  out.String("mode", "table");
  out.Duration("statement_deadline", deadline_);
  out.Duration("idle_poll", idle_poll_);
}

std::string StoreSettings::Description() const {
  const Url url = ParseUrl(url_);
  return "MariaDB database " + schema_ + " on " +
         (url.unix_socket.empty() ? url.host + ":" + std::to_string(url.port)
                                  : "socket " + url.unix_socket);
}

std::optional<StoreSettings::SchemaVersions> StoreSettings::MigrateSchema() const {
  const int before = mariadb::Migrate(url_, schema_);
  return SchemaVersions{.before = before, .after = LatestSchemaVersion()};
}

std::optional<std::string> StoreSettings::MigrationScript(int from) const {
  return mariadb::MigrationScript(schema_, from);
}

std::unique_ptr<Store> StoreSettings::OpenStore(const RetryPolicy& retry,
                                                const RetentionPolicy& retention) const {
  return mariadb::OpenStore({.url = url_,
                             .schema = schema_,
                             .retry = retry,
                             .retention = retention,
                             .statement_deadline = deadline_,
                             .random = {}});
}

std::unique_ptr<Wakeup> StoreSettings::OpenWakeup() const {
  WakeupOptions options;
  options.url = url_;
  options.schema = schema_;
  options.statement_deadline = deadline_;
  options.max_poll = idle_poll_;
  options.min_poll = std::min(options.min_poll, idle_poll_);
  return mariadb::OpenWakeup(std::move(options));
}

std::unique_ptr<PartitionLeases> StoreSettings::OpenPartitionLeases() const {
  return mariadb::OpenPartitionLeases(url_, schema_, deadline_);
}

std::unique_ptr<Admin> StoreSettings::OpenAdmin(std::chrono::milliseconds statement_timeout) const {
  return mariadb::OpenAdmin(url_, schema_, statement_timeout, deadline_);
}

std::vector<std::string> StoreSettings::Secrets() const {
  std::vector<std::string> secrets;
  const std::string password = ParseUrl(url_).password;
  if (!password.empty()) secrets.push_back(password);
  if (const Span span = PasswordSpan(url_); span.at != std::string::npos && span.size > 0) {
    std::string written = url_.substr(span.at, span.size);
    if (written != password) secrets.push_back(std::move(written));
  }
  return secrets;
}

StoreType Type() { return {.name = "mariadb", .parse = Parse}; }

}  // namespace outbox::mariadb
