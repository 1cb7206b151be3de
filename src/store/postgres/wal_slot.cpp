// WAL mode's server side: the publication and logical replication slot a schema's relay reads
// (outbox/store/postgres.h, EnsureWalSlot).

#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "connection.h"
#include "migrations.h"
#include "outbox/core/partition.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_wal.h"
#include "slot_state.h"

namespace outbox::postgres {
namespace {

constexpr std::size_t kMaxIdentifierBytes = 63;  // PostgreSQL's NAMEDATALEN - 1

void RequireIdle(PGconn* conn, std::string_view what) {
  if (PQtransactionStatus(conn) != PQTRANS_IDLE) {
    throw std::logic_error("outbox " + std::string{what} +
                           ": the connection must not be inside a transaction");
  }
}

// The server, for messages: "database outbox_test on 127.0.0.1:15432".
std::string Where(PGconn* conn) {
  return "database " + std::string{PQdb(conn)} + " on " + std::string{PQhost(conn)} + ":" +
         std::string{PQport(conn)};
}

bool IsSqlState(const PgError& error, std::string_view state) { return error.sqlstate() == state; }

// Runs `body` in a transaction of its own: committed if it returns, rolled back if it throws.
void InTransaction(PGconn* conn, std::string_view what, const std::function<void()>& body) {
  Exec(conn, what, "BEGIN");
  try {
    body();
    Exec(conn, what, "COMMIT");
  } catch (...) {
    RollbackQuietly(conn);
    throw;
  }
}

// WAL mode's requirements of the server, checked before anything is created, each error naming
// its fix.
void CheckServer(PGconn* conn) {
  const auto level = Exec(conn, "wal slot: read wal_level", "SELECT current_setting('wal_level')");
  const std::string wal_level{Column(level.get(), 0, 0)};
  if (wal_level != "logical") {
    throw PgError(FailureKind::kPermanent,
                  "outbox WAL mode needs wal_level = logical, and " + Where(conn) +
                      " runs with wal_level = " + wal_level +
                      ": set it (ALTER SYSTEM SET wal_level = logical, or in postgresql.conf) and "
                      "restart PostgreSQL",
                  "");
  }
  const auto role = Exec(conn, "wal slot: read the role",
                         "SELECT current_user, rolsuper OR rolreplication FROM pg_roles "
                         "WHERE rolname = current_user");
  if (PQntuples(role.get()) == 1 && Column(role.get(), 0, 1) != "t") {
    const std::string name{Column(role.get(), 0, 0)};
    throw PgError(FailureKind::kPermanent,
                  "outbox WAL mode: role " + name +
                      " may not create or read a replication slot: it needs the REPLICATION "
                      "attribute (as a superuser: ALTER ROLE " +
                      name + " REPLICATION), or run this as a role that has it",
                  "");
  }
}

void EnsurePublication(PGconn* conn) {
  const std::string name{kWalPublication};
  const auto found = Exec(conn, "wal slot: find the publication",
                          "SELECT 1 FROM pg_publication WHERE pubname = $1", {Param{name}});
  if (PQntuples(found.get()) > 0) return;
  try {
    // No table: pgoutput is only asked for the logical messages, but insists on a publication.
    Exec(conn, "wal slot: create publication " + name, "CREATE PUBLICATION " + name);
  } catch (const PgError& error) {
    if (!IsSqlState(error, "42710")) throw;  // duplicate_object: another migrator made it
  }
}

// Throws unless `slot` is a usable pgoutput slot of this database; false when there is none.
bool SlotExists(PGconn* conn, const std::string& slot) {
  const auto found = Exec(conn, "wal slot: find the slot",
                          "SELECT slot_type, coalesce(plugin, ''), coalesce(database, ''), "
                          "database = current_database(), wal_status IS NOT DISTINCT FROM 'lost' "
                          "FROM pg_replication_slots WHERE slot_name = $1",
                          {Param{slot}});
  if (PQntuples(found.get()) == 0) return false;
  if (Column(found.get(), 0, 4) == "t") {
    // Never recreated silently: the messages emitted since it fell behind are gone.
    throw PgError(FailureKind::kPermanent,
                  "outbox WAL mode: slot " + slot +
                      " is lost (it fell behind max_slot_wal_keep_size and PostgreSQL removed WAL "
                      "it needed): the messages emitted since then are lost. To start over, drop "
                      "it (SELECT pg_drop_replication_slot('" +
                      slot + "')) and run outboxctl migrate --wal-slot again",
                  "");
  }
  if (Column(found.get(), 0, 0) != "logical" || Column(found.get(), 0, 1) != "pgoutput" ||
      Column(found.get(), 0, 3) != "t") {
    throw PgError(FailureKind::kPermanent,
                  "outbox WAL mode: a replication slot named " + slot + " already exists (" +
                      std::string{Column(found.get(), 0, 0)} + ", plugin '" +
                      std::string{Column(found.get(), 0, 1)} + "', database '" +
                      std::string{Column(found.get(), 0, 2)} +
                      "') and is not this schema's pgoutput slot in " + Where(conn) +
                      "; drop it (pg_drop_replication_slot) if nothing uses it",
                  "");
  }
  return true;
}

}  // namespace

std::string SlotStateColumns(const std::string& slot) {
  const std::string r = slot + ".";
  return "coalesce(" + r + "active, false), coalesce(" + r +
         "wal_status, ''),"
         " coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), " +
         r +
         "restart_lsn), 0)::bigint,"
         " coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), " +
         r +
         "confirmed_flush_lsn), 0)::bigint,"
         " (SELECT (extract(epoch FROM w.flush_lag) * 1000000)::bigint FROM pg_stat_replication w"
         " WHERE w.pid = " +
         r + "active_pid)";
}

void ReadSlotState(const PGresult* result, int row, int column, WalSlotState& state) {
  state.active = Column(result, row, column) == "t";
  state.wal_status = std::string{Column(result, row, column + 1)};
  state.retained_bytes = ParseInt64(Column(result, row, column + 2), "slot retained bytes");
  state.unconfirmed_bytes = ParseInt64(Column(result, row, column + 3), "slot unconfirmed bytes");
  if (PQgetisnull(result, row, column + 4) == 0) {
    state.flush_lag_seconds =
        static_cast<double>(ParseInt64(Column(result, row, column + 4), "slot flush lag")) / 1e6;
  }
}

std::string WalSlotName(const std::string& schema) {
  std::string name = "outbox_";
  for (const char c : schema) {
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    const bool plain = (lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9') || c == '_';
    name += plain ? lower : '_';
  }
  if (name.size() > kMaxIdentifierBytes) {
    // Cut, and told apart from other long names with the same start by a hash of the whole one.
    char hash[9];
    std::snprintf(hash, sizeof hash, "%08x", static_cast<unsigned>(Fnv1a32(schema)));
    name = name.substr(0, kMaxIdentifierBytes - 9) + "_" + hash;
  }
  return name;
}

std::string EnsureWalSlot(pg_conn* conn, const std::string& schema) {
  const std::string quoted = QuoteSchema(schema);
  RequireIdle(conn, "EnsureWalSlot");
  CheckServer(conn);
  RequireSchemaVersion(conn, schema, Where(conn));
  // The publication first: pgoutput looks publications up as of the WAL it decodes, so one made
  // after the slot would be missing for the slot's first changes.
  EnsurePublication(conn);
  // What lets the relay read back from the WAL files what a dropped slot took with it
  // (WalSource::ReadWalFiles): installed when this role may (a superuser), else left to one.
  try {
    Exec(conn, "wal slot: install pg_walinspect", "CREATE EXTENSION IF NOT EXISTS pg_walinspect");
  } catch (const PgError& error) {
    if (error.kind() == FailureKind::kUnavailable || error.kind() == FailureKind::kOutcomeUnknown) {
      throw;
    }
  }
  std::string slot = WalSlotName(schema);
  if (!SlotExists(conn, slot)) {
    try {
      // On its own, outside a transaction: a slot cannot be created by one that has written. It
      // waits for the transactions running now that have written something to end.
      Exec(conn, "wal slot: create slot " + slot,
           "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", {Param{slot}});
    } catch (const PgError& error) {
      if (!IsSqlState(error, "42710")) throw;  // duplicate_object: another migrator made it
      SlotExists(conn, slot);
    }
  }
  InTransaction(conn, "wal slot: record it", [&] {
    Exec(conn, "wal slot: record it",
         "UPDATE " + quoted + ".settings SET wal_slot = $1 WHERE wal_slot IS DISTINCT FROM $1",
         {Param{slot}});
    Exec(conn, "wal slot: record it",
         "INSERT INTO " + quoted + ".wal_progress (slot) VALUES ($1) ON CONFLICT DO NOTHING",
         {Param{slot}});
  });
  return slot;
}

std::string EnsureWalSlot(const std::string& conninfo, const std::string& schema) {
  Connection connection{conninfo};
  // No deadline: creating a slot waits for every running transaction that wrote to end.
  SetDeadline(connection.get(), std::chrono::milliseconds{0});
  return EnsureWalSlot(connection.get(), schema);
}

void DropWalSlot(pg_conn* conn, const std::string& schema) {
  const std::string quoted = QuoteSchema(schema);
  RequireIdle(conn, "DropWalSlot");
  std::string slot = WalSlotName(schema);
  const auto migrated =
      Exec(conn, "wal slot: find the schema", "SELECT to_regclass($1) IS NOT NULL",
           {Param{quoted + ".wal_progress"}});
  const bool has_settings = Column(migrated.get(), 0, 0) == "t";
  if (has_settings) {
    const auto recorded =
        Exec(conn, "wal slot: read settings", "SELECT wal_slot FROM " + quoted + ".settings");
    if (PQntuples(recorded.get()) == 1 && PQgetisnull(recorded.get(), 0, 0) == 0) {
      slot = std::string{Column(recorded.get(), 0, 0)};
    }
  }
  // A relay that has just disconnected leaves a walsender that ends a moment later: wait a few
  // seconds for it before refusing.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds{5};
  ResultPtr active;
  for (;;) {
    active = Exec(conn, "wal slot: find the slot",
                  "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active",
                  {Param{slot}});
    if (PQntuples(active.get()) == 0 || std::chrono::steady_clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds{50});
  }
  if (PQntuples(active.get()) > 0) {
    throw PgError(FailureKind::kPermanent,
                  "outbox WAL mode: slot " + slot + " is in use (server process " +
                      std::string{Column(active.get(), 0, 0)} +
                      "): stop the relay that reads it first",
                  "55006");
  }
  // Writers stop emitting before the slot goes; the topics first, which the settings' guard checks.
  if (has_settings) {
    InTransaction(conn, "wal slot: back to table delivery", [&] {
      // No relay reads the slot (checked above): the switch has no one to wait for.
      Exec(conn, "wal slot: back to table delivery", "SET LOCAL outbox.switch_wait = 0");
      Exec(conn, "wal slot: back to table delivery",
           "UPDATE " + quoted + ".topic_settings SET delivery = NULL WHERE delivery = 'wal'");
      Exec(conn, "wal slot: back to table delivery",
           "UPDATE " + quoted + ".settings SET delivery = 'table', wal_slot = NULL");
    });
  }
  try {
    Exec(conn, "wal slot: drop slot " + slot,
         "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
         "WHERE slot_name = $1",
         {Param{slot}});
  } catch (const PgError& error) {
    if (!IsSqlState(error, "42704")) throw;  // undefined_object: dropped meanwhile
  }
}

}  // namespace outbox::postgres
