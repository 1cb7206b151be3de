// WalLedger on PostgreSQL (outbox/store/wal.h): the slot's lease (its row in wal_progress), the
// positions reached (wal_positions) and the relay's stream_seq counters (wal_seqs), both
// insert-only logs read backwards (sql/013_wal_ledger_log.sql), and parked messages as rows of
// messages (sql/012_wal_delivery.sql). A commit is one statement when nothing is parked, else
// one transaction.

#include <algorithm>
#include <map>
#include <stdexcept>

#include "connection.h"
#include "migrations.h"
#include "outbox/store/postgres_wal.h"
#include "slot_state.h"
#include "statements.h"

namespace outbox::postgres {
namespace {

std::string MillisText(std::chrono::milliseconds duration) {
  return std::to_string(duration.count());
}

// Every (target, stream_key) of `streams` as two text-array literals, for unnest($n, $m).
std::pair<std::string, std::string> StreamArrays(const std::vector<WalStream>& streams) {
  std::vector<std::string> targets;
  std::vector<std::string> keys;
  targets.reserve(streams.size());
  keys.reserve(streams.size());
  for (const auto& [target, key] : streams) {
    targets.push_back(target);
    keys.push_back(key);
  }
  return {TextArray(targets), TextArray(keys)};
}

std::string_view StatusOf(ParkAs as) {
  switch (as) {
    case ParkAs::kFailed:
      return "failed";
    case ParkAs::kAbandoned:
      return "abandoned";
    case ParkAs::kWaiting:
      return "pending";
  }
  return "pending";
}

class PostgresWalLedger final : public WalLedger {
 public:
  PostgresWalLedger(const std::string& conninfo, const std::string& schema)
      : connection_(conninfo) {
    const std::string s = QuoteSchema(schema);
    RequireSchemaVersion(connection_.Ready(), schema, connection_.description());
    slot_ = ReadWalSlot(connection_.get(), schema);
    acquire_sql_ = "UPDATE " + s +
                   ".wal_progress SET"
                   " epoch = CASE WHEN owner IS NOT DISTINCT FROM $2 THEN epoch ELSE epoch + 1 END,"
                   " owner = $2, lease_until = now() + $3::bigint * interval '1 millisecond'"
                   " WHERE slot = $1 AND (owner IS NULL OR owner = $2 OR lease_until <= now())"
                   " RETURNING epoch";
    leave_sql_ = "UPDATE " + s +
                 ".wal_progress SET owner = NULL, lease_until = NULL"
                 " WHERE slot = $1 AND owner = $2 AND epoch = $3::bigint";
    // One row while the slot has its lease row (EnsureWalSlot made it); NULL before any commit.
    position_sql_ = "SELECT (SELECT p.position::text FROM " + s +
                    ".wal_positions p WHERE p.slot = $1 ORDER BY p.position DESC LIMIT 1)"
                    " FROM " +
                    s + ".wal_progress WHERE slot = $1";
    // The latest number of each pair, this relay's or the table mode's (one numbering whatever
    // the delivery: sql/014_delivery_switch.sql): backward scans of both keys, which stop at the
    // newest entry however many dead ones an old snapshot keeps below it.
    seqs_sql_ = "SELECT greatest(coalesce((SELECT q.seq FROM " + s +
                ".wal_seqs q WHERE q.target = u.target AND q.stream_key = u.stream_key"
                " ORDER BY q.seq DESC LIMIT 1), 0), coalesce((SELECT t.seq FROM " +
                s +
                ".stream_seqs t WHERE t.target = u.target AND t.stream_key = u.stream_key"
                " ORDER BY t.seq DESC LIMIT 1), 0))"
                " FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(target, stream_key, n)"
                " ORDER BY u.n";
    // A stream waits while a message of it is leased (messages_in_flight) or waiting in the
    // table: parked here, failed, or written there in table mode before a change of delivery
    // (messages_waiting_streams, by target and stream), or abandoned holding its stream
    // (on_abandon = 'hold', sql/016_hold_on_abandon.sql). Any other abandoned message holds
    // nothing back (as in table mode: see Envelope::stream_prev_seq); when the one just before the
    // stream's first message here is abandoned, prev is the seq below that run, by the claim's own
    // expression (PrevSeqSql), its "no abandoned row at all" guard included. Only the streams with
    // something to say come back.
    states_sql_ =
        "SELECT n, blocked, prev FROM (SELECT c.n,"
        " EXISTS (SELECT 1 FROM " +
        s +
        ".messages m WHERE m.stream_key = c.stream_key AND m.target = c.target"
        " AND m.status IN ('processing', 'failed'))"
        " OR EXISTS (SELECT 1 FROM " +
        s +
        ".messages m WHERE m.status IN ('pending', 'failed') AND m.stream_key IS NOT NULL"
        " AND m.target = c.target AND m.stream_key = c.stream_key)"
        " OR EXISTS (SELECT 1 FROM " +
        s +
        ".messages m WHERE m.status = 'abandoned' AND m.holds_stream"
        " AND m.target = c.target AND m.stream_key = c.stream_key) AS blocked, " +
        PrevSeqSql(s + ".messages") +
        " AS prev FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY"
        " AS c(target, stream_key, stream_seq, n)) states WHERE blocked OR prev IS NOT NULL";
    // Fenced by a share lock on the lease row: a relay taking the lease over waits for this
    // commit (and this one sees the takeover once it committed). A lock writes no row version.
    commit_sql_ = "WITH lease AS (SELECT 1 FROM " + s +
                  ".wal_progress WHERE slot = $1 AND owner = $2 AND epoch = $3::bigint"
                  " AND lease_until > now() FOR SHARE),"
                  " reached AS (INSERT INTO " +
                  s +
                  ".wal_positions (slot, position, epoch)"
                  " SELECT $1, $4::pg_lsn, $3::bigint WHERE EXISTS (SELECT 1 FROM lease)"
                  " ON CONFLICT DO NOTHING RETURNING 1),"
                  " seqs AS (INSERT INTO " +
                  s +
                  ".wal_seqs (target, stream_key, seq)"
                  " SELECT u.target, u.stream_key, u.seq"
                  " FROM unnest($5::text[], $6::text[], $7::bigint[]) AS u(target, stream_key, seq)"
                  " WHERE EXISTS (SELECT 1 FROM lease) RETURNING 1)"
                  " SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM reached),"
                  " (SELECT count(*) FROM seqs),"
                  // Whether StreamStates would find anything (three probes of indexes, small
                  // while the table serves only what WAL mode parks: messages_in_flight,
                  // messages_abandoned, messages_waiting_streams).
                  " NOT (EXISTS (SELECT 1 FROM " +
                  s +
                  ".messages WHERE status IN ('processing', 'failed'))"
                  " OR EXISTS (SELECT 1 FROM " +
                  s +
                  ".messages WHERE status = 'abandoned')"
                  " OR EXISTS (SELECT 1 FROM " +
                  s +
                  ".messages WHERE status IN ('pending', 'failed') AND stream_key IS NOT NULL))";
    // What this ledger's commits superseded, from where its last purge ended: the walk does not
    // pass again over what earlier purges removed (dead entries an old snapshot keeps).
    purge_positions_sql_ = "DELETE FROM " + s +
                           ".wal_positions WHERE slot = $1 AND position >= $2::pg_lsn"
                           " AND position < $3::pg_lsn";
    // One index range per pair (OFFSET 0 keeps the planner from joining the whole table instead,
    // which under an old snapshot means walking every dead row).
    purge_seqs_sql_ = "DELETE FROM " + s +
                      ".wal_seqs WHERE ctid = ANY (ARRAY(SELECT q.ctid"
                      " FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])"
                      " AS u(target, stream_key, low, high) CROSS JOIN LATERAL"
                      " (SELECT x.ctid FROM " +
                      s +
                      ".wal_seqs x WHERE x.target = u.target AND x.stream_key = u.stream_key"
                      " AND x.seq >= u.low AND x.seq < u.high OFFSET 0) q))";
    // Once per ledger: numbers a relay that stopped before its purge left behind.
    sweep_seqs_sql_ = "DELETE FROM " + s + ".wal_seqs q WHERE EXISTS (SELECT 1 FROM " + s +
                      ".wal_seqs n WHERE n.target = q.target AND n.stream_key = q.stream_key"
                      " AND n.seq > q.seq)";
    slot_sql_ = "SELECT " + SlotStateColumns("r") +
                " FROM pg_replication_slots r WHERE r.slot_name = $1"
                " AND r.database = current_database()";
    end_reader_sql_ =
        "SELECT active_pid, pg_terminate_backend(active_pid) FROM pg_replication_slots"
        " WHERE slot_name = $1 AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()";
    // Parked rows are the table relay's: wake it like an enqueue does (sql/006_wakeup.sql), so
    // that an idle one needs no sweep to find them (issue #42: its sweeps stop while idle).
    wake_sql_ = "SELECT " + s + ".wake_relay()";
    park_sql_ = "INSERT INTO " + s +
                ".messages (id, topic, stream_key, stream_seq, partition, target, type, payload,"
                " content_type, headers, event_id, created_at, status, attempts, available_at,"
                " last_error, abandoned_at, lease_epoch, holds_stream)"
                " VALUES ($1::uuid, $2, $3, $4::bigint, $5::integer, $6, $7, $8::bytea, $9,"
                " $10::jsonb, $11::uuid,"
                " timestamptz 'epoch' + $12::bigint * interval '1 microsecond', $13,"
                " $14::integer, now() + $15::bigint * interval '1 millisecond', $16,"
                " CASE WHEN $13 = 'abandoned' THEN now() END, 1,"
                // The rule of the table's kFail: the topic's on_abandon, else the target's default.
                " CASE WHEN $13 = 'abandoned' AND $3::text IS NOT NULL THEN coalesce("
                "(SELECT t.on_abandon FROM " +
                s +
                ".topic_settings t WHERE t.topic = $2),"
                " CASE WHEN $17::boolean THEN 'hold' ELSE 'continue' END) = 'hold' ELSE false END)"
                " ON CONFLICT (id) DO NOTHING";
  }

  std::optional<std::int64_t> Acquire(const std::string& owner,
                                      std::chrono::milliseconds duration) override {
    if (owner.empty()) throw std::invalid_argument("WAL lease: owner must not be empty");
    if (duration.count() < 1) throw std::invalid_argument("WAL lease: duration must be positive");
    const std::string millis = MillisText(duration);
    const auto result = Exec(connection_.Ready(), "take the WAL slot's lease", acquire_sql_,
                             {Param{slot_}, Param{owner}, Param{millis}});
    if (PQntuples(result.get()) == 0) return std::nullopt;
    return ParseInt64(Column(result.get(), 0, 0), "WAL lease epoch");
  }

  void Leave(const std::string& owner, std::int64_t epoch) override {
    const std::string epoch_text = std::to_string(epoch);
    Exec(connection_.Ready(), "leave the WAL slot's lease", leave_sql_,
         {Param{slot_}, Param{owner}, Param{epoch_text}});
  }

  Lsn Position() override {
    const auto result =
        Exec(connection_.Ready(), "read the WAL position", position_sql_, {Param{slot_}});
    if (PQntuples(result.get()) != 1) {
      throw PgError(
          FailureKind::kPermanent,
          "the WAL slot " + slot_ + " has no row in wal_progress: run outboxctl migrate --wal-slot",
          "");
    }
    if (PQgetisnull(result.get(), 0, 0) != 0) return 0;
    const auto lsn = ParseLsn(Column(result.get(), 0, 0));
    if (!lsn) throw PgError(FailureKind::kPermanent, "wal_positions.position: not an LSN", "");
    return *lsn;
  }

  std::vector<std::int64_t> Seqs(const std::vector<WalStream>& streams) override {
    if (streams.empty()) return {};
    const auto [targets, keys] = StreamArrays(streams);
    const auto result = Exec(connection_.Ready(), "read stream_seq counters", seqs_sql_,
                             {Param{targets}, Param{keys}});
    std::vector<std::int64_t> seqs;
    seqs.reserve(streams.size());
    for (int row = 0; row < PQntuples(result.get()); ++row) {
      seqs.push_back(ParseInt64(Column(result.get(), row, 0), "stream_seq counter"));
    }
    if (seqs.size() != streams.size()) {
      throw PgError(FailureKind::kPermanent, "stream_seq counters: one row per stream expected",
                    "");
    }
    for (std::size_t i = 0; i < streams.size(); ++i) {
      ranges_.try_emplace(streams[i], SeqRange{.low = seqs[i], .high = seqs[i]});
    }
    return seqs;
  }

  std::vector<WalStreamState> StreamStates(
      const std::vector<std::pair<WalStream, std::int64_t>>& streams) override {
    std::vector<WalStreamState> states(streams.size());
    if (streams.empty()) return states;
    std::vector<std::string> targets;
    std::vector<std::string> keys;
    std::vector<std::int64_t> seqs;
    for (const auto& [stream, seq] : streams) {
      targets.push_back(stream.first);
      keys.push_back(stream.second);
      seqs.push_back(seq);
    }
    const std::string target_array = TextArray(targets);
    const std::string key_array = TextArray(keys);
    const std::string seq_array = NumberArray(seqs);
    const auto result =
        Exec(connection_.Ready(), "read the streams' state in the table", states_sql_,
             {Param{target_array}, Param{key_array}, Param{seq_array}});
    for (int row = 0; row < PQntuples(result.get()); ++row) {
      const auto n = ParseInt64(Column(result.get(), row, 0), "stream index");
      if (n < 1 || n > static_cast<std::int64_t>(states.size())) {
        throw PgError(FailureKind::kPermanent, "stream states: an index out of range", "");
      }
      WalStreamState& state = states[static_cast<std::size_t>(n - 1)];
      state.blocked = Column(result.get(), row, 1) == "t";
      if (PQgetisnull(result.get(), row, 2) == 0) {
        state.prev_seq = ParseInt64(Column(result.get(), row, 2), "stream_prev_seq");
      }
    }
    return states;
  }

  WalSlotState SlotState() override {
    const auto result =
        Exec(connection_.Ready(), "read the WAL slot's state", slot_sql_, {Param{slot_}});
    WalSlotState state;
    if (PQntuples(result.get()) != 1) return state;
    state.exists = true;
    ReadSlotState(result.get(), 0, 0, state);
    return state;
  }

  std::optional<std::int64_t> EndOtherReader() override {
    const auto result = Exec(connection_.Ready(), "end the slot's previous reader", end_reader_sql_,
                             {Param{slot_}});
    if (PQntuples(result.get()) == 0) return std::nullopt;
    return ParseInt64(Column(result.get(), 0, 0), "slot reader pid");
  }

  WalCommitted Commit(const std::string& owner, std::int64_t epoch,
                      const WalCommit& commit) override {
    PGconn* conn = connection_.Ready();
    const bool transaction = !commit.parked.empty();
    if (transaction) Exec(conn, "begin the WAL commit", "BEGIN");
    try {
      const WalCommitted written = WritePosition(conn, owner, epoch, commit);
      if (!written) {
        if (transaction) Exec(conn, "roll back the WAL commit", "ROLLBACK");
        return written;
      }
      for (const ParkedMessage& parked : commit.parked) Park(conn, parked);
      if (transaction) {
        Exec(conn, "wake the table relay", wake_sql_);
        Exec(conn, "commit the WAL commit", "COMMIT");
      }
      Committed(commit);
      return written;
    } catch (...) {
      // A lost connection has no transaction left; otherwise end this one.
      if (transaction) RollbackQuietly(conn);
      throw;
    }
  }

  std::int64_t Purge() override {
    PGconn* conn = connection_.Ready();
    std::int64_t removed = 0;
    if (!swept_) {
      removed += Affected(Exec(conn, "sweep stream_seq counters", sweep_seqs_sql_));
      swept_ = true;
    }
    if (committed_ > purged_) {
      const std::string low = FormatLsn(purged_);
      const std::string high = FormatLsn(committed_);
      removed += Affected(Exec(conn, "purge WAL positions", purge_positions_sql_,
                               {Param{slot_}, Param{low}, Param{high}}));
      purged_ = committed_;
    }
    std::vector<std::string> targets;
    std::vector<std::string> keys;
    std::vector<std::int64_t> lows;
    std::vector<std::int64_t> highs;
    for (const auto& [stream, range] : ranges_) {
      if (range.high <= range.low) continue;
      targets.push_back(stream.first);
      keys.push_back(stream.second);
      lows.push_back(range.low);
      highs.push_back(range.high);
    }
    if (!targets.empty()) {
      const std::string target_array = TextArray(targets);
      const std::string key_array = TextArray(keys);
      const std::string low_array = NumberArray(lows);
      const std::string high_array = NumberArray(highs);
      removed += Affected(
          Exec(conn, "purge stream_seq counters", purge_seqs_sql_,
               {Param{target_array}, Param{key_array}, Param{low_array}, Param{high_array}}));
      for (auto& [stream, range] : ranges_) range.low = range.high;
    }
    return removed;
  }

 private:
  // Of one (target, stream) pair in wal_seqs: numbers below `high` (this ledger's latest) and
  // from `low` on are superseded and not yet purged.
  struct SeqRange {
    std::int64_t low = 0;
    std::int64_t high = 0;
  };

  static std::int64_t Affected(const ResultPtr& result) {
    return ParseInt64(PQcmdTuples(result.get()), "rows removed");
  }

  void Committed(const WalCommit& commit) {
    committed_ = std::max(committed_, commit.position);
    for (const auto& [stream, seq] : commit.seqs) {
      auto& range = ranges_.try_emplace(stream, SeqRange{}).first->second;
      range.high = std::max(range.high, seq);
    }
  }

  WalCommitted WritePosition(PGconn* conn, const std::string& owner, std::int64_t epoch,
                             const WalCommit& commit) {
    std::vector<std::string> targets;
    std::vector<std::string> keys;
    std::vector<std::int64_t> seqs;
    for (const auto& [stream, seq] : commit.seqs) {
      targets.push_back(stream.first);
      keys.push_back(stream.second);
      seqs.push_back(seq);
    }
    const std::string epoch_text = std::to_string(epoch);
    const std::string position = FormatLsn(commit.position);
    const std::string target_array = TextArray(targets);
    const std::string key_array = TextArray(keys);
    const std::string seq_array = NumberArray(seqs);
    const auto result = Exec(conn, "record the WAL position", commit_sql_,
                             {Param{slot_}, Param{owner}, Param{epoch_text}, Param{position},
                              Param{target_array}, Param{key_array}, Param{seq_array}});
    if (ParseInt64(Column(result.get(), 0, 0), "WAL commit") != 1) return {};
    return {.committed = true, .table_clear = Column(result.get(), 0, 3) == "t"};
  }

  void Park(PGconn* conn, const ParkedMessage& parked) {
    const Envelope& e = parked.envelope;
    const std::string id = e.id.ToString();
    const std::string seq = e.stream_seq ? std::to_string(*e.stream_seq) : std::string{};
    const std::string partition = std::to_string(e.partition);
    const std::string headers_json = HeadersToJson(e.headers);
    const std::string event = e.event_id ? e.event_id->ToString() : std::string{};
    const std::string created = std::to_string(
        std::chrono::duration_cast<std::chrono::microseconds>(e.created_at.time_since_epoch())
            .count());
    const std::string status{StatusOf(parked.as)};
    const std::string attempts = std::to_string(parked.attempts);
    const std::string delay = MillisText(parked.available_in);
    const auto optional = [](const std::optional<std::string>& value) {
      return value ? Param{std::string_view{*value}} : Param{};
    };
    Exec(conn, "park a WAL message", park_sql_,
         {Param{id}, Param{e.topic}, optional(e.stream_key), e.stream_seq ? Param{seq} : Param{},
          Param{partition}, Param{e.target}, optional(e.type), Param{e.payload, /*binary=*/true},
          Param{e.content_type}, Param{headers_json}, e.event_id ? Param{event} : Param{},
          Param{created}, Param{status}, Param{attempts}, Param{delay},
          parked.error.empty() ? Param{} : Param{parked.error},
          Param{parked.hold_by_default ? "true" : "false"}});
  }

  Connection connection_;
  std::string slot_;
  std::string acquire_sql_;
  std::string leave_sql_;
  std::string position_sql_;
  std::string seqs_sql_;
  std::string states_sql_;
  std::string commit_sql_;
  std::string purge_positions_sql_;
  std::string purge_seqs_sql_;
  std::string sweep_seqs_sql_;
  std::string slot_sql_;
  std::string end_reader_sql_;
  std::string park_sql_;
  std::string wake_sql_;

  Lsn committed_ = 0;  // the position of this ledger's last commit
  Lsn purged_ = 0;     // positions below it are purged
  std::map<WalStream, SeqRange> ranges_;
  bool swept_ = false;
};

}  // namespace

std::unique_ptr<WalLedger> OpenWalLedger(const std::string& conninfo, const std::string& schema) {
  return std::make_unique<PostgresWalLedger>(conninfo, schema);
}

}  // namespace outbox::postgres
