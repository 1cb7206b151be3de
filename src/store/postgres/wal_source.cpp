// WalSource on PostgreSQL: LogicalStream (the slot, over the replication protocol) plus
// DecodeWalRecord (the record outbox.enqueue emits).

#include <cstdint>
#include <stdexcept>

#include "connection.h"
#include "logical_stream.h"
#include "migrations.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_wal.h"
#include "slot_state.h"
#include "wal_files.h"
#include "wal_record.h"

namespace outbox::postgres {
namespace {

// A committed transaction's records as the relay takes them: messages, switch marks, and what
// could not be decoded.
WalTransaction ToTransaction(Lsn end_lsn, TimePoint commit_time,
                             const std::vector<std::string>& contents) {
  WalTransaction transaction{.end_lsn = end_lsn, .commit_time = commit_time, .messages = {}};
  transaction.messages.reserve(contents.size());
  for (const std::string& content : contents) {
    if (content.size() == 1 && static_cast<std::uint8_t>(content[0]) == kWalSwitchRecord) {
      transaction.delivery_switched = true;
      continue;
    }
    try {
      transaction.messages.push_back(DecodeWalRecord(content));
    } catch (const std::invalid_argument& bad) {
      transaction.undecodable.push_back(std::string{bad.what()} + " (at " + FormatLsn(end_lsn) +
                                        ")");
    }
  }
  return transaction;
}

// How far before the position asked for the WAL files are read: a transaction that commits after
// it may have written its records before (they are taken only if its commit comes after).
constexpr Lsn kWalFilesMargin = Lsn{16} * 1024 * 1024;

class PostgresWalSource final : public WalSource {
 public:
  PostgresWalSource(const std::string& conninfo, const std::string& schema)
      : conninfo_(conninfo),
        prefix_(WalPrefix(schema)),
        slot_(SlotOf(conninfo, schema)),
        stream_(conninfo, slot_, kWalPublication, prefix_) {}

  void Start(Lsn after) override { stream_.Start(after); }

  std::optional<WalTransaction> Next(std::chrono::milliseconds timeout) override {
    auto commit = stream_.Next(timeout);
    if (!commit) return std::nullopt;
    return ToTransaction(commit->end_lsn, commit->commit_time, commit->contents);
  }

  WalRecovery ReadWalFiles(Lsn after) override {
    Connection connection(conninfo_);
    PGconn* conn = connection.get();
    const auto extension =
        Exec(conn, "find pg_walinspect",
             "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension"
             " WHERE extname = 'pg_walinspect'");
    if (PQntuples(extension.get()) == 0) {
      throw PgError(FailureKind::kPermanent,
                    "the extension pg_walinspect is not installed in this database (a superuser "
                    "runs CREATE EXTENSION pg_walinspect; outboxctl migrate --wal-slot does when "
                    "it may)",
                    "");
    }
    const std::string function =
        std::string{Column(extension.get(), 0, 0)} + ".pg_get_wal_records_info";
    // Up to where a slot made again starts (it gives what follows), or else the WAL flushed.
    const auto bounds = Exec(conn, "read the WAL's end",
                             "SELECT coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots"
                             " WHERE slot_name = $1 AND database = current_database()), "
                             "pg_current_wal_flush_lsn())::text",
                             {Param{slot_}});
    const auto until = ParseLsn(Column(bounds.get(), 0, 0));
    if (!until) throw PgError(FailureKind::kPermanent, "the WAL's end is not an LSN", "");
    WalRecovery recovery;
    recovery.until = *until;
    if (*until <= after) return recovery;
    const std::string sql =
        "SELECT start_lsn::text, end_lsn::text, xid::text, resource_manager, record_type,"
        " description FROM " +
        function +
        "($1::pg_lsn, $2::pg_lsn)"
        " WHERE resource_manager IN ('LogicalMessage', 'Transaction')";
    const auto read = [&](Lsn from) {
      return Exec(conn, "read the WAL files (pg_walinspect)", sql,
                  {Param{FormatLsn(from)}, Param{FormatLsn(*until)}});
    };
    ResultPtr rows;
    const Lsn from = after > kWalFilesMargin ? after - kWalFilesMargin : after;
    try {
      rows = read(from);
    } catch (const PgError& error) {
      // The margin's WAL may be removed already; what follows `after` is what matters.
      if (from == after) throw Explained(error, after);
      try {
        rows = read(after);
      } catch (const PgError& again) {
        throw Explained(again, after);
      }
    }
    std::vector<WalFileRecord> records;
    records.reserve(static_cast<std::size_t>(PQntuples(rows.get())));
    for (int row = 0; row < PQntuples(rows.get()); ++row) {
      WalFileRecord record;
      record.start = ParseLsn(Column(rows.get(), row, 0)).value_or(0);
      record.end = ParseLsn(Column(rows.get(), row, 1)).value_or(0);
      record.xid = static_cast<std::uint64_t>(ParseInt64(Column(rows.get(), row, 2), "xid"));
      record.resource_manager = std::string{Column(rows.get(), row, 3)};
      record.record_type = std::string{Column(rows.get(), row, 4)};
      record.description = std::string{Column(rows.get(), row, 5)};
      records.push_back(std::move(record));
    }
    WalFileCommits commits;
    try {
      commits = CommitsAfter(records, prefix_, after);
    } catch (const std::invalid_argument& bad) {
      throw PgError(
          FailureKind::kPermanent,
          std::string{"the WAL files' records are not in the form expected: "} + bad.what(), "");
    }
    const TimePoint now = std::chrono::system_clock::now();
    for (const WalFileCommit& commit : commits.commits) {
      recovery.transactions.push_back(ToTransaction(commit.end_lsn, now, commit.contents));
    }
    recovery.open_messages = commits.open_records;
    return recovery;
  }

  void Confirm(Lsn lsn) override { stream_.Confirm(lsn); }

  void Close() override { stream_.Close(); }

  [[nodiscard]] Lsn Received() const override { return stream_.Received(); }

 private:
  // The slot named in the schema's settings, read on a short-lived connection of its own.
  static std::string SlotOf(const std::string& conninfo, const std::string& schema) {
    Connection connection(conninfo);
    RequireSchemaVersion(connection.get(), schema, connection.description());
    return ReadWalSlot(connection.get(), schema);
  }

  // What a failed read of the WAL files means for the messages after `after`.
  static PgError Explained(const PgError& error, Lsn after) {
    return PgError(error.kind(),
                   "cannot read the WAL files after " + FormatLsn(after) + ": " + error.what() +
                       (error.sqlstate() == "42501"
                            ? " (reading them needs a superuser or pg_read_server_files)"
                            : ""),
                   error.sqlstate());
  }

  std::string conninfo_;
  std::string prefix_;
  std::string slot_;
  LogicalStream stream_;
};

}  // namespace

std::string WalPrefix(const std::string& schema) {
  return schema == kDefaultSchema ? std::string{"outbox"} : "outbox:" + schema;
}

std::string ReadWalSlot(pg_conn* conn, const std::string& schema) {
  const auto result = Exec(conn, "read settings.wal_slot",
                           "SELECT wal_slot FROM " + QuoteSchema(schema) + ".settings");
  if (PQntuples(result.get()) != 1 || PQgetisnull(result.get(), 0, 0) != 0) {
    throw PgError(FailureKind::kPermanent,
                  "WAL mode: schema " + schema +
                      " has no replication slot; create it with `outboxctl migrate --wal-slot`",
                  "");
  }
  return std::string{Column(result.get(), 0, 0)};
}

WalStatus ReadWalStatus(pg_conn* conn, const std::string& schema) {
  const std::string s = QuoteSchema(schema);
  const auto result = Exec(
      conn, "read the WAL mode's status",
      "SELECT st.delivery, (SELECT count(*) FROM " + s +
          ".topic_settings t WHERE t.delivery = 'wal'), st.wal_slot, r.slot_name IS NOT NULL, " +
          SlotStateColumns("r") + ", " + s +
          ".wal_position(st.wal_slot)::text,"
          " CASE WHEN p.lease_until > now() THEN p.owner END"
          " FROM " +
          s +
          ".settings st"
          " LEFT JOIN pg_replication_slots r ON r.slot_name = st.wal_slot"
          "   AND r.database = current_database()"
          " LEFT JOIN " +
          s + ".wal_progress p ON p.slot = st.wal_slot");
  WalStatus status;
  if (PQntuples(result.get()) != 1) return status;
  const PGresult* row = result.get();
  status.delivery = std::string{Column(row, 0, 0)};
  status.wal_topics = ParseInt64(Column(row, 0, 1), "WAL topics");
  status.slot = OptionalText(row, 0, 2);
  status.state.exists = Column(row, 0, 3) == "t";
  ReadSlotState(row, 0, 4, status.state);
  status.position = ParseLsn(Column(row, 0, 9)).value_or(0);
  status.owner = OptionalText(row, 0, 10);
  return status;
}

std::unique_ptr<WalSource> OpenWalSource(const std::string& conninfo, const std::string& schema) {
  return std::make_unique<PostgresWalSource>(conninfo, schema);
}

}  // namespace outbox::postgres
