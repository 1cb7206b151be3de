#include "migrations.h"

#include <stdexcept>

#include "connection.h"
#include "outbox/store/mariadb.h"

namespace outbox::mariadb {
namespace {

std::string ReplaceAll(std::string text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string_view TrimRight(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  return text;
}

std::string VersionTableSql(const std::string& quoted) {
  return "CREATE TABLE IF NOT EXISTS " + quoted +
         ".schema_version (version INT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL, "
         "applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB";
}

// Migrators of one schema take turns on this lock (GET_LOCK names are server-wide).
std::string MigrateLock(const std::string& schema) { return "outbox.migrate." + schema; }

}  // namespace

std::vector<std::string> SplitStatements(std::string_view script,
                                         const std::string& quoted_schema) {
  std::vector<std::string> statements;
  std::string delimiter = ";";
  std::string current;
  while (!script.empty()) {
    const auto end = script.find('\n');
    std::string_view line = script.substr(0, end);
    script = end == std::string_view::npos ? std::string_view{} : script.substr(end + 1);
    const auto code = line.find_first_not_of(" \t");
    if (code == std::string_view::npos) {
      if (!current.empty()) current += '\n';
      continue;
    }
    const std::string_view text = TrimRight(line.substr(code));
    if (current.empty() && text.starts_with("--")) continue;
    if (current.empty() && text.starts_with("DELIMITER ")) {
      delimiter = std::string{TrimRight(text.substr(10))};
      continue;
    }
    std::string_view kept = TrimRight(line);
    const bool ends = kept.ends_with(delimiter);
    if (ends) kept.remove_suffix(delimiter.size());
    current += kept;
    current += '\n';
    if (ends) {
      statements.push_back(ReplaceAll(std::move(current), "__SCHEMA__", quoted_schema));
      current.clear();
    }
  }
  if (current.find_first_not_of(" \t\n") != std::string::npos) {
    throw std::logic_error("a migration ends without its delimiter '" + delimiter + "'");
  }
  return statements;
}

int LatestSchemaVersion() { return Migrations().back().version; }

void RequireSchemaVersion(Connection& connection, const std::string& schema) {
  const Value name{schema};
  const auto exists =
      connection.Run("check schema",
                     "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND "
                     "TABLE_NAME = 'schema_version'",
                     {&name, 1});
  std::int64_t version = 0;
  if (ToInt64(exists.sets.at(0).rows.at(0).at(0), "check schema") > 0) {
    const auto result = connection.Run("check schema", "SELECT COALESCE(MAX(version), 0) FROM " +
                                                           QuoteSchema(schema) + ".schema_version");
    version = ToInt64(result.sets.at(0).rows.at(0).at(0), "check schema");
  }
  if (version < LatestSchemaVersion()) {
    throw StoreError(
        FailureKind::kPermanent,
        "the outbox schema `" + schema + "` is " +
            (version == 0 ? std::string{"not migrated"} : "at version " + std::to_string(version)) +
            " on " + connection.description() + "; this build needs version " +
            std::to_string(LatestSchemaVersion()) + ": run outboxctl migrate");
  }
}

std::string MigrationScript(const std::string& schema, int from) {
  const std::string quoted = QuoteSchema(schema);
  if (from < 0 || from > LatestSchemaVersion()) {
    throw std::invalid_argument("no schema version " + std::to_string(from) + " (0.." +
                                std::to_string(LatestSchemaVersion()) + ")");
  }
  std::string script = "-- outbox schema " + schema + " from version " + std::to_string(from) +
                       " to " + std::to_string(LatestSchemaVersion()) +
                       ", for the mariadb client (mariadb < this.sql)\n";
  if (from == 0) script += "CREATE DATABASE IF NOT EXISTS " + quoted + ";\n";
  script += VersionTableSql(quoted) + ";\n";
  for (const Migration& migration : Migrations()) {
    if (migration.version <= from) continue;
    script += "\n-- version " + std::to_string(migration.version) + ": " +
              std::string{migration.name} + "\n";
    script += ReplaceAll(std::string{migration.sql}, "__SCHEMA__", quoted);
    if (!script.ends_with('\n')) script += '\n';
    script += "INSERT IGNORE INTO " + quoted + ".schema_version VALUES (" +
              std::to_string(migration.version) + ", '" + std::string{migration.name} +
              "', UTC_TIMESTAMP(6));\n";
  }
  return script;
}

int Migrate(MYSQL* conn, const std::string& schema) {
  const std::string quoted = QuoteSchema(schema);
  if (InTransaction(conn)) {
    throw std::logic_error("outbox migrate: the connection must not be inside a transaction");
  }
  const std::string lock = MigrateLock(schema);
  const Value lock_name{lock};
  const auto got = RunOn(conn, "migrate: lock", "SELECT GET_LOCK(?, 60)", {&lock_name, 1});
  if (got.sets.empty() || got.sets[0].rows.empty() || got.sets[0].rows[0][0].value_or("0") != "1") {
    throw MariaDbError(FailureKind::kUnavailable,
                       "migrate: another migrator of schema " + schema + " held the lock for 60 s",
                       0, "HY000");
  }
  struct Unlock {
    MYSQL* conn;
    const Value* name;
    ~Unlock() {
      try {
        RunOn(conn, "migrate: unlock", "SELECT RELEASE_LOCK(?)", {name, 1});
      } catch (...) {  // NOLINT(bugprone-empty-catch): the session's end releases it too
      }
    }
  } unlock{conn, &lock_name};
  ExecuteOn(conn, "migrate: create the database", "CREATE DATABASE IF NOT EXISTS " + quoted);
  ExecuteOn(conn, "migrate: version table", VersionTableSql(quoted));
  const auto current = RunOn(conn, "migrate: version",
                             "SELECT COALESCE(MAX(version), 0) FROM " + quoted + ".schema_version");
  const int before = static_cast<int>(ToInt64(current.sets.at(0).rows.at(0).at(0), "version"));
  if (before > LatestSchemaVersion()) {
    throw MariaDbError(FailureKind::kPermanent,
                       "schema " + schema + " is at version " + std::to_string(before) +
                           ", newer than this outbox's " + std::to_string(LatestSchemaVersion()) +
                           ": upgrade outbox",
                       0, "HY000");
  }
  for (const Migration& migration : Migrations()) {
    if (migration.version <= before) continue;
    const std::string what = "migrate to version " + std::to_string(migration.version) + " (" +
                             std::string{migration.name} + ")";
    for (const std::string& statement : SplitStatements(migration.sql, quoted)) {
      ExecuteOn(conn, what, statement);
    }
    const Value version{static_cast<std::int64_t>(migration.version)};
    const Value name{std::string{migration.name}};
    const Value params[] = {version, name};
    RunOn(conn, what, "INSERT INTO " + quoted + ".schema_version VALUES (?, ?, UTC_TIMESTAMP(6))",
          params);
  }
  return before;
}

int Migrate(const std::string& url, const std::string& schema) {
  QuoteSchema(schema);
  Connection conn{url, kDefaultStatementDeadline};
  return Migrate(conn.Ready(), schema);
}

}  // namespace outbox::mariadb
