#include "outbox/store/sqlite.h"
#include "outbox/store/sqlite_type.h"

namespace outbox::sqlite {
namespace {

std::unique_ptr<const outbox::StoreSettings> Parse(const config::Section& database,
                                                   const config::GetenvFn&) {
  database.AllowOnly({"type", "url", "schema", "path"});
  // A SQLite database is a file: a url or schema here is a mistake, not something to ignore.
  // (OUTBOX_DATABASE_URL is ignored: it may be set for other tools.)
  for (const std::string_view key : {"url", "schema"}) {
    if (const config::TomlValue* value = database.Find(key)) {
      config::Fail(
          database.Key(key),
          "is for type = \"postgres\"; a \"sqlite\" database is named by " + database.Key("path"),
          value);
    }
  }
  std::string path;
  if (!database.Read("path", path)) {
    config::Fail(database.Key("path"),
                 "is required with type = \"sqlite\": the database file (created if missing)",
                 database.Find("type"));
  }
  if (path.empty() || config::HasControlCharacter(path)) {
    config::Fail(database.Key("path"), "must be a file path (not empty, no control characters)",
                 database.Find("path"));
  }
  return std::make_unique<const StoreSettings>(std::move(path));
}

}  // namespace

void StoreSettings::Describe(config::TomlWriter& out) const { out.String("path", path_); }

void StoreSettings::Prepare() const { Migrate(path_); }

std::unique_ptr<Store> StoreSettings::OpenStore(const RetryPolicy& retry,
                                                const RetentionPolicy& retention) const {
  return sqlite::OpenStore({.path = path_, .retry = retry, .retention = retention});
}

std::unique_ptr<Wakeup> StoreSettings::OpenWakeup() const { return sqlite::OpenWakeup(); }

std::unique_ptr<Admin> StoreSettings::OpenAdmin(std::chrono::milliseconds statement_timeout) const {
  return statement_timeout.count() > 0 ? sqlite::OpenAdmin(path_, statement_timeout)
                                       : sqlite::OpenAdmin(path_);
}

StoreType Type() { return {.name = "sqlite", .parse = Parse}; }

}  // namespace outbox::sqlite
