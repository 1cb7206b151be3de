#include "conninfo_mask.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_admin.h"
#include "outbox/store/postgres_libpq.h"
#include "outbox/store/postgres_type.h"
#include "outbox/store/postgres_wal.h"

namespace outbox::postgres {
namespace {

constexpr std::size_t kMaxSchemaBytes = 63;  // PostgreSQL's identifier length (NAMEDATALEN - 1)

bool IsPlainIdentifier(const std::string& name) {
  return !name.empty() && name.size() <= kMaxSchemaBytes &&
         ((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_') &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
}

std::unique_ptr<const outbox::StoreSettings> Parse(const config::Section& database,
                                                   const config::GetenvFn& getenv) {
  database.AllowOnly({"type", "url", "schema", "path", "mode", "statement_deadline"});
  // Another store type's key is a mistake worth naming, not an unknown key.
  if (const config::TomlValue* path = database.Find("path")) {
    config::Fail(
        database.Key("path"),
        "is only for type = \"sqlite\"; a PostgreSQL database is named by " + database.Key("url"),
        path);
  }
  std::string url;
  database.Read("url", url);
  if (auto from_env = config::Env(getenv, kDatabaseUrlEnv)) url = std::move(*from_env);
  if (url.empty()) {
    config::Fail(database.Key("url"), "is required (or set " + std::string{kDatabaseUrlEnv} + ")",
                 database.Find("url"));
  }
  std::string schema{kDefaultSchema};
  if (database.Read("schema", schema) && !IsPlainIdentifier(schema)) {
    config::Fail(database.Key("schema"),
                 "must be a plain lower-case identifier ([a-z_][a-z0-9_]*, at most 63 bytes), "
                 "got " +
                     config::Quoted(schema),
                 database.Find("schema"));
  }
  std::string mode = "table";
  if (database.Read("mode", mode) && mode != "table" && mode != "wal") {
    config::Fail(database.Key("mode"), "must be \"table\" or \"wal\", got " + config::Quoted(mode),
                 database.Find("mode"));
  }
  // How long the relay waits for any answer of the database before it gives the connection up
  // (outbox/store/postgres_libpq.h): at least 1 s, at most 1 h; "0s" turns it off.
  std::chrono::milliseconds deadline = kDefaultStatementDeadline;
  if (const config::TomlValue* value = database.Find("statement_deadline")) {
    database.ReadDuration("statement_deadline", std::chrono::milliseconds{0}, std::chrono::hours{1},
                          deadline);
    if (deadline.count() > 0 && deadline < std::chrono::seconds{1}) {
      config::Fail(database.Key("statement_deadline"),
                   "must be at least 1s (or \"0s\" to wait for the database without a deadline), "
                   "got " +
                       config::FormatDuration(deadline),
                   value);
    }
  }
  return std::make_unique<const StoreSettings>(std::move(url), std::move(schema), mode == "wal",
                                               deadline);
}

}  // namespace

void StoreSettings::Describe(config::TomlWriter& out) const {
  // Masked by libpq's own parse (conninfo_mask.h), not by pattern.
  out.String("url", MaskConninfo(url_));
  out.String("schema", schema_);
  out.String("mode", wal_ ? "wal" : "table");
  out.Duration("statement_deadline", deadline_);
}

std::optional<StoreSettings::SchemaVersions> StoreSettings::MigrateSchema() const {
  SetStatementDeadline(deadline_);
  const int before = postgres::Migrate(url_, schema_);
  return SchemaVersions{.before = before, .after = LatestSchemaVersion()};
}

std::optional<std::string> StoreSettings::MigrationScript(int from) const {
  return postgres::MigrationScript(schema_, from);
}

StoreSettings::WalSlotReady StoreSettings::EnsureWalSlot() const {
  SetStatementDeadline(deadline_);
  return {.slot = postgres::EnsureWalSlot(url_, schema_),
          .setting = schema_ + ".settings.delivery"};
}

std::unique_ptr<Store> StoreSettings::OpenStore(const RetryPolicy& retry,
                                                const RetentionPolicy& retention) const {
  SetStatementDeadline(deadline_);
  return postgres::OpenStore(
      {.conninfo = url_, .schema = schema_, .retry = retry, .retention = retention});
}

std::vector<std::string> StoreSettings::Secrets() const { return ConninfoSecrets(url_); }

std::unique_ptr<Wakeup> StoreSettings::OpenWakeup() const {
  SetStatementDeadline(deadline_);
  return postgres::OpenWakeup(url_, schema_);
}

std::unique_ptr<PartitionLeases> StoreSettings::OpenPartitionLeases() const {
  SetStatementDeadline(deadline_);
  return postgres::OpenPartitionLeases(url_, schema_);
}

std::unique_ptr<Admin> StoreSettings::OpenAdmin(std::chrono::milliseconds statement_timeout) const {
  SetStatementDeadline(deadline_);
  return postgres::OpenAdmin(url_, schema_, statement_timeout);
}

std::unique_ptr<WalSource> StoreSettings::OpenWalSource() const {
  SetStatementDeadline(deadline_);
  return wal_ ? postgres::OpenWalSource(url_, schema_) : nullptr;
}

std::unique_ptr<WalLedger> StoreSettings::OpenWalLedger() const {
  SetStatementDeadline(deadline_);
  return wal_ ? postgres::OpenWalLedger(url_, schema_) : nullptr;
}

StoreType Type() { return {.name = "postgres", .parse = Parse}; }

}  // namespace outbox::postgres
