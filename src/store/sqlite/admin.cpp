// The operator's side of the SQLite store (outbox::sqlite::OpenAdmin): the statements of the
// Admin contract; the checks of its arguments are the contract's (src/store/admin.cpp).
//
// A change works chunk by chunk, each chunk a write transaction of its own: SQLite has one writer
// at a time, so while a chunk runs no relay can claim one of its rows, and between chunks the
// relay goes on.
#include "outbox/store/admin.h"

#include <algorithm>

#include "handle.h"
#include "outbox/store/sqlite.h"

namespace outbox::sqlite {
namespace {

const std::string kNow = kNowMillis;

// The filter over `m`, on parameters ?1 status, ?2 topic, ?3 stream_key, ?4 target, ?5
// older_than seconds, ?6 ids (a JSON array); NULL means "any".
const std::string kFilter =
    " (?1 IS NULL OR m.status = ?1) AND (?2 IS NULL OR m.topic = ?2)"
    " AND (?3 IS NULL OR m.stream_key = ?3) AND (?4 IS NULL OR m.target = ?4)"
    " AND (?5 IS NULL OR m.created_at < " +
    kNow +
    " - ?5 * 1000)"
    " AND (?6 IS NULL OR m.id IN (SELECT value FROM json_each(?6)))";

// The filter by event id, ?9: every copy of a message written to several targets names the first
// in event_id; a message written to one target has none and is its own event. Only in the
// statement when the filter has an event id: written without "?9 IS NULL OR", SQLite searches
// the indexes of event_id (outbox_messages_event_id) and id instead of scanning.
constexpr const char* kEventFilter = " AND (m.event_id = ?9 OR m.id = ?9)";

// The WHERE clause of `filter` (without the keyword).
// No SQLite message holds its stream (on_abandon = "hold" is refused there): a held-only filter
// matches nothing.
std::string Where(const MessageFilter& filter) {
  return (filter.event_id ? kFilter + kEventFilter : kFilter) + (filter.held ? " AND 0" : "");
}

// The columns of a MessageSummary, in its order.
constexpr const char* kSummaryColumns =
    "m.id, m.topic, m.stream_key, m.stream_seq, m.partition, m.target, m.type, m.status,"
    " m.attempts, m.available_at, m.created_at, m.last_error, m.lease_owner, m.lease_until,"
    " length(CAST(m.payload AS BLOB)), coalesce(m.event_id, m.id)";
constexpr int kSummaryColumnCount = 16;

// ?7 after (an id or NULL), ?8 limit.
std::string ListSql(const MessageFilter& filter) {
  return std::string{"SELECT "} + kSummaryColumns + " FROM outbox_messages m WHERE" +
         Where(filter) + " AND (?7 IS NULL OR m.id > ?7) ORDER BY m.id LIMIT ?8";
}

const std::string kShow = std::string{"SELECT "} + kSummaryColumns +
                          ", m.payload, m.content_type, m.headers, m.lease_epoch, m.published_at,"
                          " m.abandoned_at, " +
                          kNow + " FROM outbox_messages m WHERE m.id = ?1";

constexpr const char* kReplayEligible = "'abandoned', 'failed'";
// The old error is kept after the note; a second replay before any new attempt keeps the note as
// it is rather than nesting it. The epoch moves on, as in the PostgreSQL store.
const std::string kReplaySet =
    "status = 'pending', attempts = 0, available_at = " + kNow +
    ", abandoned_at = NULL, lease_owner = NULL, lease_until = NULL,"
    " lease_epoch = lease_epoch + 1, last_error = CASE"
    " WHEN last_error IS NULL THEN 'replayed by operator'"
    " WHEN substr(last_error, 1, 20) = 'replayed by operator' THEN last_error"
    " ELSE 'replayed by operator; was: ' || last_error END";

constexpr const char* kAbandonEligible = "'pending', 'failed'";
// ?2 reason.
const std::string kAbandonSet = "status = 'abandoned', abandoned_at = " + kNow +
                                ", lease_owner = NULL, lease_until = NULL,"
                                " last_error = 'abandoned by operator: ' || ?2";

// Never a published row: the status index (outbox_messages_status) finds the others.
constexpr const char* kCountGroups =
    "SELECT status, target, topic, count(*) FROM outbox_messages"
    " WHERE status IN ('pending', 'processing', 'failed', 'abandoned')"
    " GROUP BY status, target, topic";

// Binds the filter to ?1..?6 and ?9 (when the statement has it: Where), and where the page
// starts and how long it is to ?7 and ?8.
void BindSelection(Statement& statement, const MessageFilter& filter,
                   const std::optional<MessageId>& after, int limit) {
  if (filter.status) {
    statement.Bind(1, MessageStatusName(*filter.status));
  } else {
    statement.BindNull(1);
  }
  statement.BindOptional(2, filter.topic)
      .BindOptional(3, filter.stream_key)
      .BindOptional(4, filter.target);
  if (filter.older_than) {
    statement.Bind(5, static_cast<std::int64_t>(filter.older_than->count()));
  } else {
    statement.BindNull(5);
  }
  if (filter.ids) {
    std::vector<std::string> ids;
    ids.reserve(filter.ids->size());
    for (const auto& id : *filter.ids) ids.push_back(id.ToString());
    statement.Bind(6, JsonStrings(ids));
  } else {
    statement.BindNull(6);
  }
  if (after) {
    statement.Bind(7, after->ToString());
  } else {
    statement.BindNull(7);
  }
  statement.Bind(8, std::int64_t{limit});
  if (filter.event_id) statement.Bind(9, filter.event_id->ToString());
}

MessageId ReadId(const Statement& statement, int column) {
  const std::string text = statement.Text(column);
  auto id = Uuid::Parse(text);
  if (!id) throw StoreError(FailureKind::kPermanent, "unexpected id in the outbox: " + text);
  return *id;
}

std::optional<TimePoint> OptionalTime(const Statement& statement, int column) {
  if (statement.IsNull(column)) return std::nullopt;
  return FromMillis(statement.Int(column));
}

MessageSummary ReadSummary(const Statement& row) {
  MessageSummary message;
  message.id = ReadId(row, 0);
  message.topic = row.Text(1);
  message.stream_key = row.OptionalText(2);
  if (!row.IsNull(3)) message.stream_seq = row.Int(3);
  message.partition = static_cast<int>(row.Int(4));
  message.target = row.Text(5);
  message.type = row.OptionalText(6);
  message.status = ParseMessageStatus(row.Text(7));
  message.attempts = static_cast<int>(row.Int(8));
  message.available_at = FromMillis(row.Int(9));
  message.created_at = FromMillis(row.Int(10));
  message.last_error = row.OptionalText(11);
  message.lease_owner = row.OptionalText(12);
  message.lease_until = OptionalTime(row, 13);
  message.payload_bytes = row.Int(14);
  message.event_id = ReadId(row, 15);
  return message;
}

TimePoint DatabaseNow(sqlite3* db) {
  Statement now{db, "SELECT " + kNow};
  now.Step();
  return FromMillis(now.Int(0));
}

// Interrupts the statements on `db` once `timeout` has passed, while it lives.
class Watchdog {
 public:
  Watchdog(sqlite3* db, std::chrono::milliseconds timeout)
      : db_(db), at_(std::chrono::steady_clock::now() + timeout) {
    sqlite3_progress_handler(db_, 1000, &Watchdog::Check, this);
  }
  ~Watchdog() { sqlite3_progress_handler(db_, 0, nullptr, nullptr); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  [[nodiscard]] bool passed() const { return passed_; }

 private:
  static int Check(void* self) {
    auto* watchdog = static_cast<Watchdog*>(self);
    watchdog->passed_ = std::chrono::steady_clock::now() >= watchdog->at_;
    return watchdog->passed_ ? 1 : 0;
  }

  sqlite3* db_;
  std::chrono::steady_clock::time_point at_;
  bool passed_ = false;
};

class SqliteAdmin final : public Admin {
 public:
  SqliteAdmin(const std::string& path, std::chrono::milliseconds busy_timeout)
      : db_(Open(path, busy_timeout, /*create=*/false)) {
    RequireTables(db_.get(), path);
  }

 protected:
  MessagePage ListPage(const MessageFilter& filter, int limit,
                       const std::optional<MessageId>& after) override {
    MessagePage page;
    page.database_now = DatabaseNow(db_.get());
    Statement list{db_.get(), ListSql(filter)};
    BindSelection(list, filter, after, limit);
    while (list.Step()) page.messages.push_back(ReadSummary(list));
    return page;
  }

  std::optional<MessageDetail> Find(const MessageId& id) override {
    Statement show{db_.get(), kShow};
    show.Bind(1, id.ToString());
    if (!show.Step()) return std::nullopt;
    MessageDetail detail;
    detail.summary = ReadSummary(show);
    constexpr int kFirst = kSummaryColumnCount;
    detail.payload = show.Text(kFirst);
    detail.content_type = show.Text(kFirst + 1);
    detail.headers = ParseHeaders(show.Text(kFirst + 2));
    detail.lease_epoch = show.Int(kFirst + 3);
    detail.published_at = OptionalTime(show, kFirst + 4);
    detail.abandoned_at = OptionalTime(show, kFirst + 5);
    detail.database_now = FromMillis(show.Int(kFirst + 6));
    return detail;
  }

  ChunkResult ChangeChunk(ChangeKind kind, const MessageFilter& filter,
                          const std::optional<MessageId>& after, int limit,
                          const std::string& reason, bool dry_run) override {
    if (kind == ChangeKind::kSkip) return {};  // nothing holds its stream here (see Where)
    const bool replay = kind == ChangeKind::kReplay;
    const std::string eligible = replay ? kReplayEligible : kAbandonEligible;
    const auto select = [&] {
      Statement candidates{db_.get(), "SELECT m.id FROM outbox_messages m WHERE" + Where(filter) +
                                          " AND m.status IN (" + eligible +
                                          ") AND (?7 IS NULL OR m.id > ?7) ORDER BY m.id LIMIT ?8"};
      BindSelection(candidates, filter, after, limit);
      ChunkResult chunk;
      while (candidates.Step()) chunk.changed.push_back(ReadId(candidates, 0));
      chunk.candidates = static_cast<std::int64_t>(chunk.changed.size());
      if (!chunk.changed.empty()) chunk.last_candidate = chunk.changed.back();
      return chunk;
    };
    if (dry_run) return select();
    return InWriteTransaction(db_.get(), [&] {
      ChunkResult chunk = select();
      if (chunk.changed.empty()) return chunk;
      std::vector<std::string> ids;
      ids.reserve(chunk.changed.size());
      for (const auto& id : chunk.changed) ids.push_back(id.ToString());
      // The status is checked again where the row is changed, as in the PostgreSQL store.
      Statement change{db_.get(), "UPDATE outbox_messages SET " +
                                      (replay ? kReplaySet : kAbandonSet) +
                                      " WHERE id IN (SELECT value FROM json_each(?1))"
                                      " AND status IN (" +
                                      eligible + ") RETURNING id"};
      change.Bind(1, JsonStrings(ids));
      if (!replay) change.Bind(2, reason);
      chunk.changed.clear();
      while (change.Step()) chunk.changed.push_back(ReadId(change, 0));
      std::sort(chunk.changed.begin(), chunk.changed.end());
      return chunk;
    });
  }

  std::int64_t PurgeChunk(const RetentionPolicy& retention, int chunk) override {
    return sqlite::PurgeChunk(db_.get(), retention, chunk);
  }

  // Cancelled by a progress handler once `timeout` has passed.
  // One relay per database file: no partition leases to list.
  RelayOverview ListRelays() override { return {.database_now = std::chrono::system_clock::now()}; }

  std::optional<std::vector<TopicCount>> CountGroups(std::chrono::milliseconds timeout) override {
    Watchdog watchdog{db_.get(), timeout};
    std::vector<TopicCount> groups;
    try {
      Statement count{db_.get(), kCountGroups};
      while (count.Step()) {
        groups.push_back({.status = ParseMessageStatus(count.Text(0)),
                          .target = count.Text(1),
                          .topic = count.Text(2),
                          .messages = count.Int(3)});
      }
    } catch (const StoreError&) {
      if (watchdog.passed()) return std::nullopt;
      throw;
    }
    return groups;
  }

 private:
  DbPtr db_;
};

}  // namespace

std::unique_ptr<Admin> OpenAdmin(const std::string& path, std::chrono::milliseconds busy_timeout) {
  if (path.empty()) throw std::invalid_argument("sqlite admin: the database path is empty");
  if (busy_timeout.count() < 0) {
    throw std::invalid_argument("sqlite admin: busy_timeout must not be negative");
  }
  return std::make_unique<SqliteAdmin>(path, busy_timeout);
}

}  // namespace outbox::sqlite
