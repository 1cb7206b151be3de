// The operator's side of the MariaDB store (outbox/store/mariadb.h, OpenAdmin): the statements of
// the Admin contract; the checks of its arguments are the contract's (src/store/admin.cpp). The
// rules are PostgreSQL's (src/store/postgres/admin.cpp); where MariaDB needs another way to keep
// them, the comments below say so.
//
// Statements are built from the criteria a filter sets (one statement text per combination, each
// prepared once per connection), so that the optimizer sees no "? IS NULL OR" and picks the index
// the criteria call for; every value is a bound parameter.

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "connection.h"
#include "migrations.h"
#include "outbox/core/error.h"
#include "outbox/store/mariadb.h"

namespace outbox::mariadb {
namespace {

using Json = nlohmann::json;

// The columns of a MessageSummary, in its order.
constexpr std::string_view kSummaryColumns =
    "m.id, COALESCE(m.event_id, m.id), m.topic, m.stream_key, m.stream_seq, m.partition_no, "
    "m.target, m.type, m.status, m.attempts, m.available_at, m.created_at, m.last_error, "
    "m.lease_owner, m.lease_until, OCTET_LENGTH(m.payload), m.holds_stream";
constexpr std::size_t kSummaryColumnCount = 17;

// Which rows each change acts on, and what it sets. Each assignment reads no column but its own:
// a multi-table UPDATE promises no order of assignments (a single-table one goes left to right,
// each seeing the ones before it).
constexpr std::string_view kReplayEligible = "m.status IN ('abandoned', 'failed')";
// A second replay before any new attempt keeps the note as it is rather than nesting it. The
// epoch moves on so that the message counts as returned, never as fresh (as PostgreSQL's).
constexpr std::string_view kReplaySet =
    "m.last_error = CASE WHEN m.last_error IS NULL THEN 'replayed by operator' "
    "WHEN m.last_error LIKE 'replayed by operator%' THEN m.last_error "
    "ELSE CONCAT('replayed by operator; was: ', m.last_error) END, "
    "m.status = 'pending', m.attempts = 0, m.available_at = UTC_TIMESTAMP(6), "
    "m.abandoned_at = NULL, m.holds_stream = FALSE, m.lease_owner = NULL, m.lease_until = NULL, "
    "m.lease_epoch = m.lease_epoch + 1";
// Skip: only held rows; the stream goes on past them.
constexpr std::string_view kSkipEligible = "m.status = 'abandoned' AND m.holds_stream";
constexpr std::string_view kSkipSet = "m.holds_stream = FALSE";
constexpr std::string_view kAbandonEligible = "m.status IN ('pending', 'failed')";
// The one parameter: the reason.
constexpr std::string_view kAbandonSet =
    "m.last_error = CONCAT('abandoned by operator: ', ?), m.status = 'abandoned', "
    "m.abandoned_at = UTC_TIMESTAMP(6), m.lease_owner = NULL, m.lease_until = NULL";

// A JSON array of ids (32 hex digits each) as rows: `<alias>.hex`.
std::string IdTable(std::string_view alias) {
  return "JSON_TABLE(?, '$[*]' COLUMNS (hex CHAR(32) CHARACTER SET ascii PATH '$')) " +
         std::string{alias};
}

std::string Hex(const MessageId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(32, '0');
  for (std::size_t i = 0; i < 16; ++i) {
    hex[2 * i] = kDigits[id.bytes()[i] >> 4];
    hex[2 * i + 1] = kDigits[id.bytes()[i] & 0x0f];
  }
  return hex;
}

std::string HexList(std::span<const MessageId> ids) {
  Json list = Json::array();
  for (const auto& id : ids) list.push_back(Hex(id));
  return list.dump();
}

// The criteria a filter sets, as SQL over `m` and their parameters in order.
struct FilterSql {
  std::string where;
  std::vector<Value> params;
};

FilterSql Where(const MessageFilter& filter) {
  FilterSql out{.where = "TRUE", .params = {}};
  if (filter.status) {
    out.where += " AND m.status = ?";
    out.params.emplace_back(std::string{MessageStatusName(*filter.status)});
  }
  if (filter.topic) {
    out.where += " AND m.topic = ?";
    out.params.emplace_back(*filter.topic);
  }
  if (filter.stream_key) {
    out.where += " AND m.stream_key = ?";
    out.params.emplace_back(*filter.stream_key);
  }
  if (filter.target) {
    out.where += " AND m.target = ?";
    out.params.emplace_back(*filter.target);
  }
  if (filter.older_than) {
    out.where += " AND m.created_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND";
    out.params.emplace_back(static_cast<std::int64_t>(filter.older_than->count()));
  }
  if (filter.ids) {
    out.where += " AND m.id IN (SELECT UNHEX(f.hex) FROM " + IdTable("f") + ")";
    out.params.emplace_back(HexList(*filter.ids));
  }
  if (filter.event_id) {
    // The copies of one event: their event_id, or the id of a message written to one target.
    out.where += " AND (m.event_id = ? OR m.id = ?)";
    out.params.emplace_back(IdBytes(*filter.event_id));
    out.params.emplace_back(IdBytes(*filter.event_id));
  }
  if (filter.held) out.where += " AND m.status = 'abandoned' AND m.holds_stream";
  return out;
}

std::optional<TimePoint> OptionalTime(const std::optional<std::string>& text,
                                      std::string_view what) {
  if (!text) return std::nullopt;
  return ToTime(text, what);
}

using Row = std::vector<std::optional<std::string>>;

MessageSummary ReadSummary(const Row& row) {
  MessageSummary message;
  message.id = ToId(row.at(0), "list: id");
  message.event_id = ToId(row.at(1), "list: event_id");
  message.topic = row.at(2).value_or("");
  message.stream_key = row.at(3);
  if (row.at(4)) message.stream_seq = ToInt64(row[4], "list: stream_seq");
  message.partition = static_cast<int>(ToInt64(row.at(5), "list: partition_no"));
  message.target = row.at(6).value_or("");
  message.type = row.at(7);
  message.status = ParseMessageStatus(row.at(8).value_or(""));
  message.attempts = static_cast<int>(ToInt64(row.at(9), "list: attempts"));
  message.available_at = ToTime(row.at(10), "list: available_at");
  message.created_at = ToTime(row.at(11), "list: created_at");
  message.last_error = row.at(12);
  message.lease_owner = row.at(13);
  message.lease_until = OptionalTime(row.at(14), "list: lease_until");
  message.payload_bytes = ToInt64(row.at(15), "list: payload length");
  message.holds_stream = ToInt64(row.at(16), "list: holds_stream") != 0;
  return message;
}

class MariaDbAdmin final : public Admin {
 public:
  MariaDbAdmin(const std::string& url, const std::string& schema,
               std::chrono::milliseconds deadline)
      : schema_(QuoteSchema(schema)),
        table_(schema_ + ".messages"),
        // The rows of a list of ids (a JSON array, the one parameter), walked from the list into
        // the primary key; see ChangeChunk.
        by_ids_(IdTable("c") + " STRAIGHT_JOIN " + table_ +
                " m FORCE INDEX (PRIMARY) ON m.id = UNHEX(c.hex)"),
        // The connection's deadline is the server's max_statement_time and lock waits and, a
        // second later, the client's read timeout.
        connection_(url, deadline) {
    RequireSchemaVersion(connection_, schema);
    const std::string purge = "DELETE FROM " + table_ + " WHERE status = ";
    purge_published_ = purge +
                       "'published' AND published_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND "
                       "LIMIT ?";
    // A message that holds its stream is never purged (as the Store's Purge): it waits for a
    // replay or a skip.
    purge_abandoned_ = purge +
                       "'abandoned' AND NOT holds_stream AND abandoned_at < UTC_TIMESTAMP(6) - "
                       "INTERVAL ? SECOND LIMIT ?";
    // Every row that is not published, from the (status, id) index; published rows are never
    // read.
    count_groups_ = "SELECT status, target, topic, COUNT(*) FROM " + table_ +
                    " WHERE status IN ('pending', 'processing', 'failed', 'abandoned') GROUP BY "
                    "status, target, topic";
    // The totals of the leases and the live relays with the partitions each holds, in one
    // statement: one read view, and one UTC_TIMESTAMP(6) (a statement reads the clock once).
    relays_ =
        "SELECT t.partitions, t.unowned, t.acquisitions, t.db_now, r.owner, r.started_at, "
        "r.heartbeat_at, r.expires_at, r.held, r.next_expiry FROM (SELECT COUNT(*) AS partitions, "
        "COALESCE(SUM(owner IS NULL OR lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(6)), 0) "
        "AS unowned, COALESCE(SUM(epoch), 0) AS acquisitions, UTC_TIMESTAMP(6) AS db_now FROM " +
        schema_ +
        ".partition_leases) t LEFT JOIN (SELECT i.owner, i.started_at, i.heartbeat_at, "
        "i.expires_at, GROUP_CONCAT(l.partition_no ORDER BY l.partition_no) AS held, "
        "MIN(l.lease_until) AS next_expiry FROM " +
        schema_ + ".relay_instances i LEFT JOIN " + schema_ +
        ".partition_leases l ON l.owner = i.owner AND l.lease_until > UTC_TIMESTAMP(6) "
        "WHERE i.expires_at > UTC_TIMESTAMP(6) "
        "GROUP BY i.owner, i.started_at, i.heartbeat_at, i.expires_at) r ON 1 = 1 "
        "ORDER BY r.owner";
  }

 protected:
  MessagePage ListPage(const MessageFilter& filter, int limit,
                       const std::optional<MessageId>& after) override {
    FilterSql where = Where(filter);
    std::string sql = "SELECT " + std::string{kSummaryColumns} + ", UTC_TIMESTAMP(6) FROM " +
                      table_ + " m WHERE " + where.where;
    if (after) {
      sql += " AND m.id > ?";
      where.params.emplace_back(IdBytes(*after));
    }
    sql += " ORDER BY m.id LIMIT ?";
    where.params.emplace_back(std::int64_t{limit});
    const auto result = connection_.Run("list", sql, where.params);
    MessagePage page;
    const ResultSet& rows = OnlySet(result, "list");
    for (const auto& row : rows.rows) {
      page.database_now = ToTime(row.at(kSummaryColumnCount), "list: now");
      page.messages.push_back(ReadSummary(row));
    }
    if (rows.rows.empty()) page.database_now = DatabaseNow();
    return page;
  }

  std::optional<MessageDetail> Find(const MessageId& id) override {
    const std::string sql = "SELECT " + std::string{kSummaryColumns} +
                            ", m.payload, m.content_type, m.headers, m.lease_epoch, "
                            "m.published_at, m.abandoned_at, UTC_TIMESTAMP(6) FROM " +
                            table_ + " m WHERE m.id = ?";
    const Value params[] = {IdBytes(id)};
    const auto result = connection_.Run("show", sql, params);
    const ResultSet& rows = OnlySet(result, "show");
    if (rows.rows.empty()) return std::nullopt;
    const Row& row = rows.rows[0];
    MessageDetail detail;
    detail.summary = ReadSummary(row);
    constexpr std::size_t kFirst = kSummaryColumnCount;
    detail.payload = row.at(kFirst).value_or("");
    detail.content_type = row.at(kFirst + 1).value_or("");
    detail.headers = ParseHeadersColumn(row.at(kFirst + 2), "show: headers");
    detail.lease_epoch = ToInt64(row.at(kFirst + 3), "show: lease_epoch");
    detail.published_at = OptionalTime(row.at(kFirst + 4), "show: published_at");
    detail.abandoned_at = OptionalTime(row.at(kFirst + 5), "show: abandoned_at");
    detail.database_now = ToTime(row.at(kFirst + 6), "show: now");
    return detail;
  }

  // One chunk, in three steps, since MariaDB's UPDATE returns no rows:
  //  1. the candidates: the next `limit` rows after `after` that match and are eligible, read
  //     without locking (so that rows a relay holds locked, candidates or not, never make the
  //     operator wait);
  //  2. in a transaction, the candidates locked FOR UPDATE by primary key, re-checking that they
  //     are still eligible on their latest version: a row a relay claimed meanwhile (now
  //     processing) drops out here, and one it is claiming right now is waited for, then dropped;
  //  3. the change of exactly the rows locked (they stay eligible while locked), and COMMIT.
  // Steps 2 and 3 walk the id list first (STRAIGHT_JOIN), into the primary key (FORCE INDEX):
  // on a small table the optimizer would rather scan the status index, locking (and waiting for)
  // rows that are no candidates.
  // A change makes messages claimable (a replay) or lets a stream's later messages pass (an
  // abandoned head); MariaDB has no NOTIFY to wake an idle relay with: its wake-up sees only new
  // messages, so it finds these at its next sweep (DefaultSweepInterval).
  ChunkResult ChangeChunk(ChangeKind kind, const MessageFilter& filter,
                          const std::optional<MessageId>& after, int limit,
                          const std::string& reason, bool dry_run) override {
    const std::string_view what = kind == ChangeKind::kReplay ? "replay"
                                  : kind == ChangeKind::kSkip ? "skip"
                                                              : "abandon";
    const std::string_view eligible = kind == ChangeKind::kReplay ? kReplayEligible
                                      : kind == ChangeKind::kSkip ? kSkipEligible
                                                                  : kAbandonEligible;
    const std::string_view set = kind == ChangeKind::kReplay ? kReplaySet
                                 : kind == ChangeKind::kSkip ? kSkipSet
                                                             : kAbandonSet;
    FilterSql where = Where(filter);
    std::string select =
        "SELECT m.id FROM " + table_ + " m WHERE " + where.where + " AND " + std::string{eligible};
    if (after) {
      select += " AND m.id > ?";
      where.params.emplace_back(IdBytes(*after));
    }
    select += " ORDER BY m.id LIMIT ?";
    where.params.emplace_back(std::int64_t{limit});

    ChunkResult chunk;
    const auto candidates = connection_.Run(what, select, where.params);
    std::vector<MessageId> ids;
    for (const auto& row : OnlySet(candidates, what).rows) ids.push_back(ToId(row.at(0), what));
    chunk.candidates = static_cast<std::int64_t>(ids.size());
    if (!ids.empty()) chunk.last_candidate = ids.back();
    if (dry_run || ids.empty()) {
      chunk.changed = std::move(ids);
      return chunk;
    }

    const std::string candidate_list = HexList(ids);
    connection_.Execute(what, "START TRANSACTION");
    try {
      const Value lock_params[] = {candidate_list};
      const auto locked = connection_.Run(what,
                                          "SELECT m.id FROM " + by_ids_ + " WHERE " +
                                              std::string{eligible} + " ORDER BY m.id FOR UPDATE",
                                          lock_params);
      for (const auto& row : OnlySet(locked, what).rows) {
        chunk.changed.push_back(ToId(row.at(0), what));
      }
      if (!chunk.changed.empty()) {
        std::vector<Value> change_params{HexList(chunk.changed)};
        if (kind == ChangeKind::kAbandon) change_params.emplace_back(reason);
        connection_.Run(
            what,
            "UPDATE " + by_ids_ + " SET " + std::string{set} + " WHERE " + std::string{eligible},
            change_params);
      }
      connection_.Execute(what, "COMMIT", /*commits=*/true);
    } catch (...) {
      RollBackQuietly();
      throw;
    }
    return chunk;
  }

  // Published rows first, then abandoned ones; together at most `chunk`, each DELETE a
  // transaction of its own (autocommit).
  std::int64_t PurgeChunk(const RetentionPolicy& retention, int chunk) override {
    const Value published[] = {static_cast<std::int64_t>(retention.published.count()),
                               std::int64_t{chunk}};
    const std::int64_t deleted =
        connection_.Run("purge published", purge_published_, published).affected_rows;
    if (deleted >= chunk) return deleted;
    const Value abandoned[] = {static_cast<std::int64_t>(retention.abandoned.count()),
                               std::int64_t{chunk - deleted}};
    return deleted + connection_.Run("purge abandoned", purge_abandoned_, abandoned).affected_rows;
  }

  // The count under max_statement_time = `timeout` for this one statement (SET STATEMENT ... FOR),
  // at most the connection's deadline: past it the client's read timeout would end the connection
  // first. A count the server interrupts is nullopt. The timeout is a number of ours in the
  // statement's text (SET STATEMENT takes no parameter): one prepared statement per timeout used.
  std::optional<std::vector<TopicCount>> CountGroups(std::chrono::milliseconds timeout) override {
    const std::chrono::milliseconds deadline = connection_.deadline();
    if (deadline.count() > 0) timeout = std::min(timeout, deadline);
    const std::string sql = "SET STATEMENT max_statement_time = " +
                            std::to_string(static_cast<double>(timeout.count()) / 1000.0) +
                            " FOR " + count_groups_;
    try {
      const auto result = connection_.Run("count by topic", sql);
      std::vector<TopicCount> groups;
      for (const auto& row : OnlySet(result, "count by topic").rows) {
        groups.push_back({.status = ParseMessageStatus(row.at(0).value_or("")),
                          .target = row.at(1).value_or(""),
                          .topic = row.at(2).value_or(""),
                          .messages = ToInt64(row.at(3), "count by topic")});
      }
      return groups;
    } catch (const MariaDbError& error) {
      if (error.error() == kStatementTimeout) return std::nullopt;
      throw;
    }
  }

  RelayOverview ListRelays() override {
    const auto result = connection_.Run("relays", relays_);
    RelayOverview overview;
    for (const auto& row : OnlySet(result, "relays").rows) {
      overview.partition_count = ToInt64(row.at(0), "relays: partitions");
      overview.unowned_partitions = ToInt64(row.at(1), "relays: unowned");
      overview.lease_acquisitions = ToInt64(row.at(2), "relays: acquisitions");
      overview.database_now = ToTime(row.at(3), "relays: now");
      if (!row.at(4)) continue;  // the one row when no relay is live
      RelayStatus relay{.owner = *row[4],
                        .started_at = ToTime(row.at(5), "relays: started_at"),
                        .heartbeat_at = ToTime(row.at(6), "relays: heartbeat_at"),
                        .expires_at = ToTime(row.at(7), "relays: expires_at")};
      const std::string held = row.at(8).value_or("");
      for (std::size_t at = 0; at < held.size();) {
        const auto comma = std::min(held.find(',', at), held.size());
        relay.partitions.push_back(
            static_cast<int>(ToInt64(held.substr(at, comma - at), "relays: partition")));
        at = comma + 1;
      }
      relay.next_lease_expiry = OptionalTime(row.at(9), "relays: next lease expiry");
      overview.relays.push_back(std::move(relay));
    }
    return overview;
  }

  // No WAL mode on MariaDB: ReadWal stays the default (nullopt).

 private:
  // ER_STATEMENT_TIMEOUT: max_statement_time ended the statement.
  static constexpr unsigned kStatementTimeout = 1969;

  static const ResultSet& OnlySet(const StatementResult& result, std::string_view what) {
    if (result.sets.empty()) {
      throw MariaDbError(FailureKind::kPermanent, std::string{what} + ": no result set", 0,
                         "HY000");
    }
    return result.sets[0];
  }

  TimePoint DatabaseNow() {
    const auto result = connection_.Run("now", "SELECT UTC_TIMESTAMP(6)");
    const ResultSet& rows = OnlySet(result, "now");
    if (rows.rows.empty()) {
      throw MariaDbError(FailureKind::kPermanent, "now: no row", 0, "HY000");
    }
    return ToTime(rows.rows[0].at(0), "now");
  }

  void RollBackQuietly() {
    try {
      connection_.Execute("roll back", "ROLLBACK");
    } catch (const StoreError&) {  // NOLINT(bugprone-empty-catch): the session ends with it
    }
  }

  std::string schema_;  // quoted
  std::string table_;
  std::string by_ids_;
  Connection connection_;
  std::string purge_published_;
  std::string purge_abandoned_;
  std::string count_groups_;
  std::string relays_;
};

}  // namespace

std::unique_ptr<Admin> OpenAdmin(const std::string& url, const std::string& schema,
                                 std::chrono::milliseconds statement_timeout,
                                 std::chrono::milliseconds statement_deadline) {
  QuoteSchema(schema);  // std::invalid_argument before connecting
  if (statement_timeout.count() < 0) {
    throw std::invalid_argument("statement_timeout must not be negative");
  }
  if (statement_deadline.count() < 0) {
    throw std::invalid_argument("statement_deadline must not be negative");
  }
  return std::make_unique<MariaDbAdmin>(
      url, schema, statement_timeout.count() > 0 ? statement_timeout : statement_deadline);
}

}  // namespace outbox::mariadb
