#include "migrations.h"

#include <stdexcept>

#include "connection.h"
#include "outbox/core/version.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_wal.h"

namespace outbox::postgres {
namespace {

void RunScript(PGconn* conn, const std::string& sql, std::string_view what) {
  ResultPtr result{PQexec(conn, sql.c_str())};
  const auto status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    ThrowStatementError(conn, result.get(), what);
  }
}

// The advisory lock migrators of `schema` take turns on.
std::string MigrateLockName(const std::string& schema) { return "outbox.migrate." + schema; }

// A string literal; the names quoted here are plain identifiers, so doubling quotes is enough.
std::string SqlLiteral(const std::string& text) { return "'" + ReplaceAll(text, "'", "''") + "'"; }

std::string VersionTableSql(const std::string& quoted) {
  return "CREATE SCHEMA IF NOT EXISTS " + quoted + ";\nCREATE TABLE IF NOT EXISTS " + quoted +
         ".schema_version (version integer PRIMARY KEY, name text NOT NULL, "
         "applied_at timestamptz NOT NULL DEFAULT now())";
}

// A migration's SQL for `schema`: its placeholders replaced (sql/001_initial.sql says which),
// except on comment lines, which explain them to whoever reads the printed script.
std::string MigrationSql(const Migration& migration, const std::string& schema) {
  const std::string quoted = QuoteSchema(schema);
  const std::string channel = SqlLiteral(WakeupChannel(schema));
  const std::string wakeup_lock = SqlLiteral(WakeupLockName(schema));
  const std::string wal_prefix = SqlLiteral(WalPrefix(schema));
  std::string sql;
  sql.reserve(migration.sql.size() + 1024);
  std::string_view rest = migration.sql;
  while (!rest.empty()) {
    const auto end = rest.find('\n');
    const auto line = rest.substr(0, end == std::string_view::npos ? rest.size() : end + 1);
    rest.remove_prefix(line.size());
    const auto code = line.find_first_not_of(" \t");
    if (code != std::string_view::npos && line.substr(code).starts_with("--")) {
      sql += line;
      continue;
    }
    std::string replaced = ReplaceAll(std::string{line}, "__SCHEMA__", quoted);
    replaced = ReplaceAll(std::move(replaced), "__CHANNEL__", channel);
    replaced = ReplaceAll(std::move(replaced), "__WAL_PREFIX__", wal_prefix);
    sql += ReplaceAll(std::move(replaced), "__WAKEUP_LOCK__", wakeup_lock);
  }
  return sql;
}

}  // namespace

int LatestSchemaVersion() { return Migrations().back().version; }

std::string WakeupChannel(const std::string& schema) { return schema + "_wakeup"; }

std::string WakeupLockName(const std::string& schema) { return schema + ".wakeup"; }

int Migrate(pg_conn* conn, const std::string& schema) {
  const std::string quoted = QuoteSchema(schema);
  if (PQtransactionStatus(conn) != PQTRANS_IDLE) {
    throw std::logic_error("outbox migrate: the connection must not be inside a transaction");
  }
  RunScript(conn, "BEGIN", "migrate: begin");
  try {
    // "already exists, skipping" notices are noise on every run after the first.
    RunScript(conn, "SET LOCAL client_min_messages = warning", "migrate: quiet");
    // Concurrent migrators (several relays starting at once) take turns here.
    Exec(conn, "migrate: lock", "SELECT pg_advisory_xact_lock(hashtext($1))",
         {Param{MigrateLockName(schema)}});
    RunScript(conn, VersionTableSql(quoted), "migrate: version table");
    const auto current =
        Exec(conn, "migrate: read version",
             "SELECT coalesce(max(version), 0) FROM " + quoted + ".schema_version");
    const int before = std::stoi(PQgetvalue(current.get(), 0, 0));
    if (before > LatestSchemaVersion()) {
      throw PgError(FailureKind::kPermanent,
                    "outbox migrate: schema " + schema + " is at version " +
                        std::to_string(before) + ", newer than this build knows (" +
                        std::to_string(LatestSchemaVersion()) + "); upgrade outbox",
                    "");
    }
    for (const auto& migration : Migrations()) {
      if (migration.version <= before) continue;
      const std::string what = "migrate: version " + std::to_string(migration.version) + " (" +
                               std::string{migration.name} + ")";
      RunScript(conn, MigrationSql(migration, schema), what);
      Exec(conn, what, "INSERT INTO " + quoted + ".schema_version (version, name) VALUES ($1, $2)",
           {Param{std::to_string(migration.version)}, Param{migration.name}});
    }
    RunScript(conn, "COMMIT", "migrate: commit");
    return before;
  } catch (...) {
    ResultPtr rollback{PQexec(conn, "ROLLBACK")};
    throw;
  }
}

std::string MigrationScript(const std::string& schema, int from) {
  const int latest = LatestSchemaVersion();
  if (from < 0 || from > latest) {
    throw std::invalid_argument(
        "outbox migration script: --from must be between 0 (an empty "
        "database) and " +
        std::to_string(latest) + ", got " + std::to_string(from));
  }
  const std::string quoted = QuoteSchema(schema);
  const std::string from_text = std::to_string(from);
  // The same statements as Migrate, in the same order, as one text. No BEGIN/COMMIT: the tool
  // that applies it (psql --single-transaction, Flyway, Liquibase, sqitch) owns the transaction.
  std::string script =
      "-- outbox " + std::string{kVersion} + ": schema " + schema + " from version " + from_text +
      " to " + std::to_string(latest) +
      ".\n"
      "-- Generated by `outboxctl migrate --print-sql`; `outboxctl migrate` runs the same SQL.\n"
      "-- Apply it in ONE transaction, e.g. psql -v ON_ERROR_STOP=1 --single-transaction -f FILE.\n"
      "-- It refuses to run (SQLSTATE 55000) unless the schema is at version " +
      from_text +
      ".\n\n"
      // Outside a transaction, SET LOCAL warns: a first sign that the script is applied wrongly.
      "SET LOCAL client_min_messages = warning;\n"
      "SELECT pg_advisory_xact_lock(hashtext(" +
      SqlLiteral(MigrateLockName(schema)) + "));\n" + VersionTableSql(quoted) +
      ";\n\n"
      "DO $outbox_guard$\nDECLARE\n  current integer;\nBEGIN\n"
      "  SELECT coalesce(max(version), 0) INTO current FROM " +
      quoted +
      ".schema_version;\n"
      "  IF current <> " +
      from_text +
      " THEN\n"
      "    RAISE EXCEPTION 'outbox migration: schema " +
      schema + " is at version %, this script upgrades version " + from_text +
      "', current\n"
      "      USING ERRCODE = '55000', HINT = 'outboxctl migrate --print-sql --from ' || current;\n"
      "  END IF;\nEND\n$outbox_guard$;\n";
  for (const auto& migration : Migrations()) {
    if (migration.version <= from) continue;
    script += "\n-- version " + std::to_string(migration.version) + ": " +
              std::string{migration.name} + "\n";
    script += MigrationSql(migration, schema);
    if (!script.ends_with('\n')) script += '\n';
    script += "INSERT INTO " + quoted + ".schema_version (version, name) VALUES (" +
              std::to_string(migration.version) + ", " + SqlLiteral(std::string{migration.name}) +
              ");\n";
  }
  return script;
}

void RequireSchemaVersion(pg_conn* conn, const std::string& schema, const std::string& where) {
  const std::string version_table = QuoteSchema(schema) + ".schema_version";
  const auto exists =
      Exec(conn, "check schema", "SELECT to_regclass($1) IS NOT NULL", {Param{version_table}});
  int version = 0;
  if (std::string_view{PQgetvalue(exists.get(), 0, 0)} == "t") {
    const auto result =
        Exec(conn, "check schema", "SELECT coalesce(max(version), 0) FROM " + version_table);
    version = std::atoi(PQgetvalue(result.get(), 0, 0));
  }
  if (version < LatestSchemaVersion()) {
    throw StoreError(
        FailureKind::kPermanent,
        "the outbox schema \"" + schema + "\" is " +
            (version == 0 ? std::string{"not migrated"} : "at version " + std::to_string(version)) +
            " in " + where + "; this build needs version " + std::to_string(LatestSchemaVersion()) +
            ": run outboxctl migrate");
  }
}

int Migrate(const std::string& conninfo, const std::string& schema) {
  Connection connection{conninfo};
  // No deadline on the migration itself (it may rewrite a large table); the connection keeps its
  // keepalives and tcp_user_timeout.
  SetDeadline(connection.get(), std::chrono::milliseconds{0});
  return Migrate(connection.get(), schema);
}

}  // namespace outbox::postgres
