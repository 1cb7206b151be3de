#include "migrations.h"

#include <stdexcept>

#include "connection.h"
#include "outbox/store/postgres.h"

namespace outbox::postgres {
namespace {

void RunScript(PGconn* conn, const std::string& sql, std::string_view what) {
  ResultPtr result{PQexec(conn, sql.c_str())};
  const auto status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    ThrowStatementError(conn, result.get(), what);
  }
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
         {Param{"outbox.migrate." + schema}});
    RunScript(conn,
              "CREATE SCHEMA IF NOT EXISTS " + quoted + ";" + "CREATE TABLE IF NOT EXISTS " +
                  quoted +
                  ".schema_version (version integer PRIMARY KEY, name text NOT NULL, "
                  "applied_at timestamptz NOT NULL DEFAULT now())",
              "migrate: version table");
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
    const std::string channel = "'" + WakeupChannel(schema) + "'";
    for (const auto& migration : Migrations()) {
      if (migration.version <= before) continue;
      const std::string what = "migrate: version " + std::to_string(migration.version) + " (" +
                               std::string{migration.name} + ")";
      std::string sql = ReplaceAll(std::string{migration.sql}, "__SCHEMA__", quoted);
      sql = ReplaceAll(std::move(sql), "__CHANNEL__", channel);
      sql = ReplaceAll(std::move(sql), "__WAKEUP_LOCK__", "'" + WakeupLockName(schema) + "'");
      RunScript(conn, sql, what);
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
  return Migrate(connection.get(), schema);
}

}  // namespace outbox::postgres
