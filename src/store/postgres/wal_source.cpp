// WalSource on PostgreSQL: LogicalStream (the slot, over the replication protocol) plus
// DecodeWalRecord (the record outbox.enqueue emits).

#include <stdexcept>

#include "connection.h"
#include "logical_stream.h"
#include "migrations.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_wal.h"
#include "slot_state.h"
#include "wal_record.h"

namespace outbox::postgres {
namespace {

class PostgresWalSource final : public WalSource {
 public:
  PostgresWalSource(const std::string& conninfo, const std::string& schema)
      : stream_(conninfo, SlotOf(conninfo, schema), kWalPublication, WalPrefix(schema)) {}

  void Start(Lsn after) override { stream_.Start(after); }

  std::optional<WalTransaction> Next(std::chrono::milliseconds timeout) override {
    auto commit = stream_.Next(timeout);
    if (!commit) return std::nullopt;
    WalTransaction transaction{
        .end_lsn = commit->end_lsn, .commit_time = commit->commit_time, .messages = {}};
    transaction.messages.reserve(commit->contents.size());
    for (const std::string& content : commit->contents) {
      try {
        transaction.messages.push_back(DecodeWalRecord(content));
      } catch (const std::invalid_argument& bad) {
        transaction.undecodable.push_back(std::string{bad.what()} + " (at " +
                                          FormatLsn(commit->end_lsn) + ")");
      }
    }
    return transaction;
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
