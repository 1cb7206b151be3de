#include <string_view>

#include "handle.h"
#include "outbox/store/sqlite.h"

namespace outbox::sqlite {
namespace {

// SQLite has no schemas: the outbox's tables share the application's database, prefixed.
// `position` (an AUTOINCREMENT rowid) is the commit order: SQLite serializes writers, so it
// orders claims, and within a stream it follows stream_seq.
constexpr const char* kSchemaV1 = R"(
CREATE TABLE IF NOT EXISTS outbox_settings (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  partition_count INTEGER NOT NULL CHECK (partition_count BETWEEN 1 AND 4096)
);
-- The stream counters of the databases written before fan-out (one per stream, across targets).
-- No longer written: it is the floor of outbox_target_streams (writer.cpp says why).
CREATE TABLE IF NOT EXISTS outbox_streams (
  stream_key TEXT PRIMARY KEY,
  last_seq INTEGER NOT NULL
);
-- The last stream_seq given per (target, stream): each target's copies of a stream are numbered
-- on their own, 1, 2, 3, ... (continuing from outbox_streams for a stream that has a row there).
CREATE TABLE IF NOT EXISTS outbox_target_streams (
  target TEXT NOT NULL,
  stream_key TEXT NOT NULL,
  last_seq INTEGER NOT NULL,
  PRIMARY KEY (target, stream_key)
);
-- A topic's default targets: the targets of a message that names none (a JSON array of target
-- names, e.g. '["default", "partner"]'). A topic without a row goes to "default".
CREATE TABLE IF NOT EXISTS outbox_topic_settings (
  topic TEXT PRIMARY KEY,
  targets TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox_messages (
  position INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  topic TEXT NOT NULL,
  stream_key TEXT,
  stream_seq INTEGER,
  partition INTEGER NOT NULL,
  target TEXT NOT NULL,
  type TEXT,
  payload BLOB NOT NULL,
  content_type TEXT NOT NULL,
  headers TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'processing', 'failed', 'published', 'abandoned')),
  attempts INTEGER NOT NULL DEFAULT 0,
  available_at INTEGER NOT NULL,
  last_error TEXT,
  lease_owner TEXT,
  lease_until INTEGER,
  lease_epoch INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  published_at INTEGER,
  abandoned_at INTEGER,
  -- A copy of a message written to several targets: the id of its first copy, shared by all of
  -- them. NULL for a message written to one target (its event id is its own id). Last, where
  -- the upgrade of an older database adds it (Migrate).
  event_id TEXT
);
CREATE INDEX IF NOT EXISTS outbox_messages_claimable ON outbox_messages (position)
  WHERE status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS outbox_messages_in_flight ON outbox_messages (stream_key, position)
  WHERE status IN ('processing', 'failed');
CREATE INDEX IF NOT EXISTS outbox_messages_status ON outbox_messages (status);
-- Small: only abandoned rows. The claim's lookup of abandoned predecessors (stream_prev_seq).
CREATE INDEX IF NOT EXISTS outbox_messages_abandoned_streams
  ON outbox_messages (stream_key, stream_seq) WHERE status = 'abandoned';
)";

// After the event_id column, which an older database gets from Migrate's ALTER TABLE. Small: only
// the copies of messages written to several targets. The admin's lookup by event id
// (MessageFilter::event_id).
constexpr const char* kEventIdIndex = R"(
CREATE INDEX IF NOT EXISTS outbox_messages_event_id ON outbox_messages (event_id)
  WHERE event_id IS NOT NULL;
)";

// Made before fan-out for the claim's check "an earlier message of this stream waits for a paused
// target", when a stream waited across targets. Head-of-line is per (target, stream) now, and a
// paused target's messages hold back only its own, which the claim skips anyway: nothing reads
// the index, and it cost an entry per message written.
constexpr const char* kDropWaitingStreams = "DROP INDEX IF EXISTS outbox_messages_waiting_streams";

bool HasColumn(sqlite3* db, const char* table, std::string_view column) {
  Statement columns{db, std::string{"SELECT name FROM pragma_table_info('"} + table + "')"};
  while (columns.Step()) {
    if (columns.Text(0) == column) return true;
  }
  return false;
}

}  // namespace

void Migrate(sqlite3* db, int partition_count) {
  if (partition_count < 1 || partition_count > 4096) {
    throw std::invalid_argument("partition_count must be in [1, 4096]");
  }
  Run(db, "BEGIN IMMEDIATE", "migrate: begin");
  try {
    // CREATE ... IF NOT EXISTS adds the tables and indexes a database lacks; a column is added
    // by hand: outbox_messages of a database created before fan-out has no event_id.
    Run(db, kSchemaV1, "migrate: version 1");
    if (!HasColumn(db, "outbox_messages", "event_id")) {
      Run(db, "ALTER TABLE outbox_messages ADD COLUMN event_id TEXT", "migrate: add event_id");
    }
    Run(db, kEventIdIndex, "migrate: event_id index");
    Run(db, kDropWaitingStreams, "migrate: drop outbox_messages_waiting_streams");
    Statement settings{db,
                       "INSERT INTO outbox_settings (singleton, partition_count) VALUES (1, ?) "
                       "ON CONFLICT (singleton) DO NOTHING"};
    settings.Bind(1, std::int64_t{partition_count}).Step();
    Run(db, "COMMIT", "migrate: commit");
  } catch (...) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void Migrate(const std::string& path, int partition_count) {
  const DbPtr db = Open(path, std::chrono::milliseconds{5000}, /*create=*/true);
  Migrate(db.get(), partition_count);
}

}  // namespace outbox::sqlite
