// The operator's side of the PostgreSQL store (outbox/store/postgres_admin.h): the statements of
// the Admin contract; the checks of its arguments are the contract's (src/store/admin.cpp).
#include <stdexcept>
#include <string_view>

#include "connection.h"
#include "migrations.h"
#include "outbox/store/postgres_admin.h"
#include "outbox/store/postgres_wal.h"
#include "statements.h"

namespace outbox::postgres {
namespace {

// The filter over `m`, on parameters $1 status, $2 topic, $3 stream_key, $4 target, $5
// older_than seconds, $6 ids (uuid[]), $7 event id (the copies of one event: their event_id, or
// the id of a message written to one target); NULL means "any". Statements are unnamed, so each is
// planned with its values and the unset criteria fold away.
constexpr const char* kFilter = R"(
  ($1::text IS NULL OR m.status = $1::text)
  AND ($2::text IS NULL OR m.topic = $2::text)
  AND ($3::text IS NULL OR m.stream_key = $3::text)
  AND ($4::text IS NULL OR m.target = $4::text)
  AND ($5::bigint IS NULL OR m.created_at < now() - $5::bigint * interval '1 second')
  AND ($6::uuid[] IS NULL OR m.id = ANY($6::uuid[]))
  AND ($7::uuid IS NULL OR m.event_id = $7::uuid OR m.id = $7::uuid)__HELD_ONLY__)";
// Appended to kFilter when the filter asks for held messages only (MessageFilter::held).
constexpr const char* kHeldOnly = " AND m.status = 'abandoned' AND m.holds_stream";

// The columns of a MessageSummary, in its order.
constexpr const char* kSummaryColumns = R"(
  m.id, coalesce(m.event_id, m.id), m.topic, m.stream_key, m.stream_seq, m.partition, m.target, m.type, m.status, m.attempts,
  m.available_at, m.created_at, m.last_error, m.lease_owner, m.lease_until,
  octet_length(m.payload)::bigint, m.holds_stream)";
constexpr int kSummaryColumnCount = 17;

// $8 after (uuid or NULL), $9 limit. One row even when no message matches, for now().
constexpr const char* kList = R"(
SELECT page.*, n.db_now
FROM (SELECT now() AS db_now) n
LEFT JOIN LATERAL (
  SELECT __SUMMARY__ FROM __TABLE__ m
  WHERE __FILTER__ AND ($8::uuid IS NULL OR m.id > $8::uuid)
  ORDER BY m.id
  LIMIT $9::integer) page ON true
ORDER BY page.id)";

constexpr const char* kShow = R"(
SELECT __SUMMARY__, m.payload, m.content_type, m.headers, m.lease_epoch, m.published_at,
       m.abandoned_at, now()
FROM __TABLE__ m WHERE m.id = $1::uuid)";

// A chunk of Replay or Abandon: the next $9 candidates after $8 in id order, as of the statement's
// snapshot, then the change. The UPDATE re-checks the status of each row it locks, so a row a
// relay claimed in the meantime (now processing) is skipped. Returns the number of candidates, the
// last candidate's id (where the next chunk starts) and the changed ids.
// A change makes messages claimable (a replay) or lets a stream's later messages pass (an
// abandoned head): it wakes an idle relay like an enqueue does (wake_relay, sql/006_wakeup.sql),
// which otherwise would find them only at its next sweep.
constexpr const char* kChangeChunkSql = R"(
WITH candidates AS (
  SELECT m.id FROM __TABLE__ m
  WHERE __FILTER__ AND __ELIGIBLE__ AND ($8::uuid IS NULL OR m.id > $8::uuid)
  ORDER BY m.id
  LIMIT $9::integer),
changed AS (
  UPDATE __TABLE__ m SET __SET__
  FROM candidates c
  WHERE m.id = c.id AND __ELIGIBLE__
  RETURNING m.id)
SELECT (SELECT count(*) FROM candidates),
       (SELECT c.id FROM candidates c ORDER BY c.id DESC LIMIT 1),
       array(SELECT id FROM changed ORDER BY id),
       CASE WHEN EXISTS (SELECT 1 FROM changed) THEN (SELECT 1 FROM __SCHEMA__.wake_relay()) END)";

// The same selection without the change, for dry runs.
constexpr const char* kChangeDryRun = R"(
WITH candidates AS (
  SELECT m.id FROM __TABLE__ m
  WHERE __FILTER__ AND __ELIGIBLE__ AND ($8::uuid IS NULL OR m.id > $8::uuid)
  ORDER BY m.id
  LIMIT $9::integer)
SELECT (SELECT count(*) FROM candidates),
       (SELECT c.id FROM candidates c ORDER BY c.id DESC LIMIT 1),
       array(SELECT id FROM candidates ORDER BY id))";

constexpr const char* kReplayEligible = "m.status IN ('abandoned', 'failed')";
// The old error is kept after the note; a second replay before any new attempt keeps the note as
// it is rather than nesting it. The epoch moves on so that the message counts as returned, never
// as fresh, even if it was abandoned before its first claim (sql/004_claim_cursor.sql).
constexpr const char* kReplaySet = R"(
  status = 'pending', attempts = 0, available_at = now(), abandoned_at = NULL, holds_stream = false,
  lease_owner = NULL, lease_until = NULL, lease_epoch = m.lease_epoch + 1,
  last_error = CASE
    WHEN m.last_error IS NULL THEN 'replayed by operator'
    WHEN m.last_error LIKE 'replayed by operator%' THEN m.last_error
    ELSE 'replayed by operator; was: ' || m.last_error END)";

// Skip: only held rows; the stream goes on past them.
constexpr const char* kSkipEligible = "m.status = 'abandoned' AND m.holds_stream";
constexpr const char* kSkipSet = R"(holds_stream = false)";

constexpr const char* kAbandonEligible = "m.status IN ('pending', 'failed')";
// $10 reason.
constexpr const char* kAbandonSet = R"(
  status = 'abandoned', abandoned_at = now(), lease_owner = NULL, lease_until = NULL,
  last_error = 'abandoned by operator: ' || $10::text)";

// The backlog by topic: one arm per partial index (sql/001 and 004), so that published rows are
// never read; grouped, not ranked (the contract folds the groups).
constexpr const char* kCountGroups = R"(
SELECT status, target, topic, count(*) FROM (
  SELECT status, target, topic FROM __TABLE__ WHERE status = 'pending' AND lease_epoch = 0
  UNION ALL SELECT status, target, topic FROM __TABLE__
    WHERE status IN ('pending', 'failed') AND lease_epoch > 0
  UNION ALL SELECT status, target, topic FROM __TABLE__ WHERE status = 'processing'
  UNION ALL SELECT status, target, topic FROM __TABLE__ WHERE status = 'abandoned') unpublished
GROUP BY status, target, topic)";

constexpr std::string_view kQueryCanceled = "57014";

bool IsNull(const PGresult* result, int row, int column) {
  return PQgetisnull(result, row, column) != 0;
}

std::optional<TimePoint> OptionalTime(const PGresult* result, int row, int column) {
  if (IsNull(result, row, column)) return std::nullopt;
  return ReadTimestamp(PQgetvalue(result, row, column));
}

// Reads the kSummaryColumns of a binary-format row.
MessageSummary ReadSummary(const PGresult* rows, int row) {
  MessageSummary message;
  message.id = ReadUuid(PQgetvalue(rows, row, 0));
  message.event_id = ReadUuid(PQgetvalue(rows, row, 1));
  message.topic = Column(rows, row, 2);
  message.stream_key = OptionalText(rows, row, 3);
  if (!IsNull(rows, row, 4)) message.stream_seq = ReadInt64(PQgetvalue(rows, row, 4));
  message.partition = ReadInt32(PQgetvalue(rows, row, 5));
  message.target = Column(rows, row, 6);
  message.type = OptionalText(rows, row, 7);
  message.status = ParseMessageStatus(Column(rows, row, 8));
  message.attempts = ReadInt32(PQgetvalue(rows, row, 9));
  message.available_at = ReadTimestamp(PQgetvalue(rows, row, 10));
  message.created_at = ReadTimestamp(PQgetvalue(rows, row, 11));
  message.last_error = OptionalText(rows, row, 12);
  message.lease_owner = OptionalText(rows, row, 13);
  message.lease_until = OptionalTime(rows, row, 14);
  message.payload_bytes = ReadInt64(PQgetvalue(rows, row, 15));
  message.holds_stream = *PQgetvalue(rows, row, 16) != 0;  // binary bool
  return message;
}

// Parses a text-format uuid[] ("{a,b}").
std::vector<MessageId> ParseUuidArray(std::string_view literal) {
  std::vector<MessageId> ids;
  if (literal.size() < 2) return ids;
  literal = literal.substr(1, literal.size() - 2);
  while (!literal.empty()) {
    const std::size_t comma = literal.find(',');
    const std::string_view item = literal.substr(0, comma);
    if (auto id = Uuid::Parse(item)) {
      ids.push_back(*id);
    } else {
      throw StoreError(FailureKind::kPermanent, "unexpected uuid in result: " + std::string{item});
    }
    if (comma == std::string_view::npos) break;
    literal.remove_prefix(comma + 1);
  }
  return ids;
}

// The filter as parameters $1..$7, owning their text.
class FilterParams {
 public:
  explicit FilterParams(const MessageFilter& filter) {
    if (filter.status) status_ = std::string{MessageStatusName(*filter.status)};
    if (filter.older_than) older_than_ = std::to_string(filter.older_than->count());
    if (filter.ids) ids_ = UuidArray(*filter.ids);
    if (filter.event_id) event_id_ = filter.event_id->ToString();
    params_ = {Text(status_),     Text(filter.topic), Text(filter.stream_key), Text(filter.target),
               Text(older_than_), Text(ids_),         Text(event_id_)};
  }
  // FilterParams holds views of its own strings: not copyable.
  FilterParams(const FilterParams&) = delete;
  FilterParams& operator=(const FilterParams&) = delete;

  [[nodiscard]] const std::vector<Param>& params() const { return params_; }

 private:
  static Param Text(const std::optional<std::string>& value) {
    return value ? Param{std::string_view{*value}} : Param{};
  }

  std::optional<std::string> status_;
  std::optional<std::string> older_than_;
  std::optional<std::string> ids_;
  std::optional<std::string> event_id_;
  std::vector<Param> params_;
};

// The live relays with the partitions each holds (times as Unix milliseconds), and the totals of
// the leases, read in one statement (one snapshot).
constexpr const char* kRelays = R"(
WITH leases AS (SELECT * FROM __SCHEMA__.partition_leases),
relays AS (
  SELECT r.owner,
         (extract(epoch FROM r.started_at) * 1000)::bigint AS started_ms,
         (extract(epoch FROM r.heartbeat_at) * 1000)::bigint AS heartbeat_ms,
         (extract(epoch FROM r.expires_at) * 1000)::bigint AS expires_ms,
         coalesce(array_to_string(array_agg(l.partition ORDER BY l.partition)
                                    FILTER (WHERE l.partition IS NOT NULL), ','), '') AS held,
         (extract(epoch FROM min(l.lease_until)) * 1000)::bigint AS next_expiry_ms
  FROM __SCHEMA__.relay_instances r
  LEFT JOIN leases l ON l.owner = r.owner AND l.lease_until > now()
  WHERE r.expires_at > now()
  GROUP BY r.owner)
SELECT t.partitions, t.unowned, t.acquisitions, (extract(epoch FROM now()) * 1000)::bigint,
       relays.*
FROM (SELECT count(*) AS partitions,
             count(*) FILTER (WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= now())
               AS unowned,
             coalesce(sum(epoch), 0)::bigint AS acquisitions
      FROM leases) t
LEFT JOIN relays ON true
ORDER BY relays.owner)";

TimePoint FromUnixMs(std::string_view text) {
  return TimePoint{std::chrono::milliseconds{ParseInt64(text, "relays")}};
}

class PostgresAdmin final : public Admin {
 public:
  PostgresAdmin(const std::string& conninfo, const std::string& schema,
                std::chrono::milliseconds statement_timeout)
      : schema_(schema),
        table_(QuoteSchema(schema) + ".messages"),
        statement_timeout_(statement_timeout),
        connection_(
            conninfo,
            statement_timeout.count() > 0
                ? "SET statement_timeout = " + std::to_string(statement_timeout.count())
                : std::string{},
            // The server ends a statement at its statement_timeout; the client waits
            // that long plus the usual deadline for it to say so.
            StatementDeadline().count() > 0
                ? StatementDeadline() + std::max(statement_timeout, std::chrono::milliseconds{0})
                : std::chrono::milliseconds{0}) {
    RequireSchemaVersion(connection_.Ready(), schema_, connection_.description());
    list_ = Build(kList);
    show_ = Build(kShow);
    replay_ = Build(ReplaceAll(ReplaceAll(kChangeChunkSql, "__SET__", kReplaySet), "__ELIGIBLE__",
                               kReplayEligible));
    replay_dry_run_ = Build(ReplaceAll(kChangeDryRun, "__ELIGIBLE__", kReplayEligible));
    abandon_ = Build(ReplaceAll(ReplaceAll(kChangeChunkSql, "__SET__", kAbandonSet), "__ELIGIBLE__",
                                kAbandonEligible));
    abandon_dry_run_ = Build(ReplaceAll(kChangeDryRun, "__ELIGIBLE__", kAbandonEligible));
    skip_ = Build(ReplaceAll(ReplaceAll(kChangeChunkSql, "__SET__", kSkipSet), "__ELIGIBLE__",
                             kSkipEligible));
    skip_dry_run_ = Build(ReplaceAll(kChangeDryRun, "__ELIGIBLE__", kSkipEligible));
    count_groups_ = Build(kCountGroups);
    relays_ = ReplaceAll(kRelays, "__SCHEMA__", QuoteSchema(schema));
  }

 protected:
  MessagePage ListPage(const MessageFilter& filter, int limit,
                       const std::optional<MessageId>& after) override {
    const FilterParams filter_params{filter};
    auto params = filter_params.params();
    const std::string after_text = after ? after->ToString() : "";
    const std::string limit_text = std::to_string(limit);
    params.push_back(after ? Param{after_text} : Param{});
    params.push_back(Param{limit_text});
    const auto result = Exec(connection_.Ready(), "list", WithHeldOnly(list_, filter), params,
                             /*binary_results=*/true);
    const PGresult* rows = result.get();
    MessagePage page;
    for (int row = 0; row < PQntuples(rows); ++row) {
      page.database_now = ReadTimestamp(PQgetvalue(rows, row, kSummaryColumnCount));
      if (IsNull(rows, row, 0)) continue;  // the one row of an empty page
      page.messages.push_back(ReadSummary(rows, row));
    }
    return page;
  }

  std::optional<MessageDetail> Find(const MessageId& id) override {
    const std::string id_text = id.ToString();
    const auto result =
        Exec(connection_.Ready(), "show", show_, {Param{id_text}}, /*binary_results=*/true);
    const PGresult* rows = result.get();
    if (PQntuples(rows) == 0) return std::nullopt;
    MessageDetail detail;
    detail.summary = ReadSummary(rows, 0);
    constexpr int kFirst = kSummaryColumnCount;
    detail.payload = Column(rows, 0, kFirst);
    detail.content_type = Column(rows, 0, kFirst + 1);
    detail.headers = ParseHeaders(Column(rows, 0, kFirst + 2));
    detail.lease_epoch = ReadInt64(PQgetvalue(rows, 0, kFirst + 3));
    detail.published_at = OptionalTime(rows, 0, kFirst + 4);
    detail.abandoned_at = OptionalTime(rows, 0, kFirst + 5);
    detail.database_now = ReadTimestamp(PQgetvalue(rows, 0, kFirst + 6));
    return detail;
  }

  ChunkResult ChangeChunk(ChangeKind kind, const MessageFilter& filter,
                          const std::optional<MessageId>& after, int limit,
                          const std::string& reason, bool dry_run) override {
    const bool replay = kind == ChangeKind::kReplay;
    const bool skip = kind == ChangeKind::kSkip;
    const std::string& sql = replay ? (dry_run ? replay_dry_run_ : replay_)
                             : skip ? (dry_run ? skip_dry_run_ : skip_)
                                    : (dry_run ? abandon_dry_run_ : abandon_);
    const FilterParams filter_params{filter};
    auto params = filter_params.params();
    const std::string after_text = after ? after->ToString() : "";
    const std::string limit_text = std::to_string(limit);
    params.push_back(after ? Param{std::string_view{after_text}} : Param{});
    params.push_back(Param{limit_text});
    if (kind == ChangeKind::kAbandon && !dry_run) {
      params.push_back(Param{std::string_view{reason}});
    }
    const auto result = Exec(connection_.Ready(), replay ? "replay" : (skip ? "skip" : "abandon"),
                             WithHeldOnly(sql, filter), params);
    const PGresult* row = result.get();
    ChunkResult chunk;
    chunk.candidates = std::stoll(PQgetvalue(row, 0, 0));
    if (!IsNull(row, 0, 1)) chunk.last_candidate = Uuid::Parse(Column(row, 0, 1));
    chunk.changed = ParseUuidArray(Column(row, 0, 2));
    return chunk;
  }

  std::int64_t PurgeChunk(const RetentionPolicy& retention, int chunk) override {
    const Statements statements{schema_, /*keep_published=*/false};
    const std::string published = std::to_string(retention.published.count());
    const std::string abandoned = std::to_string(retention.abandoned.count());
    const std::string chunk_text = std::to_string(chunk);
    const auto result = Exec(connection_.Ready(), "purge", statements.purge,
                             {Param{published}, Param{abandoned}, Param{chunk_text}});
    return std::stoll(PQcmdTuples(result.get()));
  }

  std::optional<WalStatus> ReadWal() override {
    return ReadWalStatus(connection_.Ready(), schema_);
  }

  RelayOverview ListRelays() override {
    const auto result = Exec(connection_.Ready(), "relays", relays_);
    const PGresult* rows = result.get();
    RelayOverview overview;
    for (int row = 0; row < PQntuples(rows); ++row) {
      overview.partition_count = ParseInt64(Column(rows, row, 0), "relays");
      overview.unowned_partitions = ParseInt64(Column(rows, row, 1), "relays");
      overview.lease_acquisitions = ParseInt64(Column(rows, row, 2), "relays");
      overview.database_now = FromUnixMs(Column(rows, row, 3));
      if (IsNull(rows, row, 4)) continue;  // the one row when no relay is live
      RelayStatus relay{.owner = std::string{Column(rows, row, 4)},
                        .started_at = FromUnixMs(Column(rows, row, 5)),
                        .heartbeat_at = FromUnixMs(Column(rows, row, 6)),
                        .expires_at = FromUnixMs(Column(rows, row, 7))};
      const std::string_view held = Column(rows, row, 8);
      for (std::size_t at = 0; at < held.size();) {
        const auto comma = std::min(held.find(',', at), held.size());
        relay.partitions.push_back(
            static_cast<int>(ParseInt64(held.substr(at, comma - at), "relays")));
        at = comma + 1;
      }
      if (!IsNull(rows, row, 9)) relay.next_lease_expiry = FromUnixMs(Column(rows, row, 9));
      overview.relays.push_back(std::move(relay));
    }
    return overview;
  }

  // Under the connection's statement_timeout when it is `timeout` (one statement: a caller that
  // counts often opens its Admin with that timeout), else in a transaction of its own under SET
  // LOCAL statement_timeout, so that the timeout ends with it.
  std::optional<std::vector<TopicCount>> CountGroups(std::chrono::milliseconds timeout) override {
    PGconn* conn = connection_.Ready();
    const bool own_transaction = timeout != statement_timeout_;
    if (own_transaction) Exec(conn, "count by topic", "BEGIN");
    try {
      if (own_transaction) {
        Exec(conn, "count by topic",
             "SET LOCAL statement_timeout = " + std::to_string(timeout.count()));
      }
      const auto result = Exec(conn, "count by topic", count_groups_);
      const PGresult* rows = result.get();
      std::vector<TopicCount> groups;
      for (int row = 0; row < PQntuples(rows); ++row) {
        groups.push_back({.status = ParseMessageStatus(Column(rows, row, 0)),
                          .target = std::string{Column(rows, row, 1)},
                          .topic = std::string{Column(rows, row, 2)},
                          .messages = ParseInt64(Column(rows, row, 3), "count by topic")});
      }
      if (own_transaction) Exec(conn, "count by topic", "COMMIT");
      return groups;
    } catch (const PgError& error) {
      Rollback(conn);
      if (error.sqlstate() == kQueryCanceled) return std::nullopt;
      throw;
    } catch (...) {
      Rollback(conn);
      throw;
    }
  }

 private:
  static void Rollback(PGconn* conn) { RollbackQuietly(conn); }

  // `sql` (built with kFilter) with the held-only criterion when the filter asks for it.
  static std::string WithHeldOnly(const std::string& sql, const MessageFilter& filter) {
    return ReplaceAll(sql, "__HELD_ONLY__", filter.held ? kHeldOnly : "");
  }

  std::string Build(const std::string& sql) const {
    return ReplaceAll(ReplaceAll(ReplaceAll(ReplaceAll(sql, "__SUMMARY__", kSummaryColumns),
                                            "__FILTER__", kFilter),
                                 "__TABLE__", table_),
                      "__SCHEMA__", QuoteSchema(schema_));
  }

  std::string schema_;
  std::string table_;
  std::chrono::milliseconds statement_timeout_;  // the connection's; 0: the database's default
  Connection connection_;
  std::string list_;
  std::string show_;
  std::string replay_;
  std::string replay_dry_run_;
  std::string abandon_;
  std::string abandon_dry_run_;
  std::string skip_;
  std::string skip_dry_run_;
  std::string count_groups_;
  std::string relays_;
};

}  // namespace

std::unique_ptr<Admin> OpenAdmin(const std::string& conninfo, const std::string& schema,
                                 std::chrono::milliseconds statement_timeout) {
  QuoteSchema(schema);  // std::invalid_argument before connecting
  if (statement_timeout.count() < 0) {
    throw std::invalid_argument("statement_timeout must not be negative");
  }
  return std::make_unique<PostgresAdmin>(conninfo, schema, statement_timeout);
}

}  // namespace outbox::postgres
