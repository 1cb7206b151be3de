#pragma once
// RAII over SQLite (STYLE.md point 3) and its errors classified into outbox::FailureKind.

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/store/store.h"

namespace outbox::sqlite {

struct DbCloser {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, DbCloser>;

struct StatementFinalizer {
  void operator()(sqlite3_stmt* statement) const noexcept { sqlite3_finalize(statement); }
};

// Throws StoreError for SQLite result `code` on `db`: busy or locked is kUnavailable (try
// again), anything else kPermanent.
[[noreturn]] void ThrowError(sqlite3* db, int code, std::string_view what);

// Opens the database at `path` in WAL mode with a busy timeout; a missing file is created when
// `create` (migrating), else StoreError(kPermanent) naming the fix (a store or admin opened on a
// database never readied).
DbPtr Open(const std::string& path, std::chrono::milliseconds busy_timeout, bool create);

// Runs SQL without parameters or results (possibly several statements).
void Run(sqlite3* db, const char* sql, std::string_view what);

// A prepared statement; binds by 1-based index; Step() returns true while there is a row.
class Statement {
 public:
  Statement(sqlite3* db, std::string_view sql);
  Statement& Bind(int index, std::string_view text);
  Statement& BindBlob(int index, std::string_view bytes);
  Statement& Bind(int index, std::int64_t value);
  Statement& BindOptional(int index, const std::optional<std::string>& text);
  Statement& BindNull(int index);
  bool Step();
  void Reset();  // reusable after Reset, bindings cleared
  std::int64_t Int(int column) const { return sqlite3_column_int64(statement_.get(), column); }
  bool IsNull(int column) const {
    return sqlite3_column_type(statement_.get(), column) == SQLITE_NULL;
  }
  std::string Text(int column) const;
  std::optional<std::string> OptionalText(int column) const;
  int Changes() const { return sqlite3_changes(db_); }

 private:
  sqlite3* db_;
  std::unique_ptr<sqlite3_stmt, StatementFinalizer> statement_;
  std::string sql_;
};

// Milliseconds since the Unix epoch on SQLite's clock, as an SQL expression.
inline constexpr const char* kNowMillis =
    "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

// What the store and the admin share.

// A time stored as milliseconds since the Unix epoch.
inline TimePoint FromMillis(std::int64_t millis) {
  return TimePoint{
      std::chrono::duration_cast<TimePoint::duration>(std::chrono::milliseconds{millis})};
}

// Throws StoreError(kPermanent) naming Migrate when `db` (the file at `path`) has no outbox
// tables, or tables of an older version (Migrate upgrades them).
void RequireTables(sqlite3* db, const std::string& path);

// JSON is read and written here (handle.cpp) only: nlohmann/json is heavy to compile.
// The headers column (a JSON object); values that are not strings are kept as their JSON text.
Headers ParseHeaders(const std::string& json);
// The headers column's text: a JSON object of strings.
std::string HeadersToJson(const Headers& headers);
// A JSON array of strings, for json_each(?N) (ids, target names).
std::string JsonStrings(const std::vector<std::string>& strings);
// `text` read as a JSON array of strings into `out`; "" when it is one and not empty, else why
// not ("are not a JSON array", "are an empty array", "hold a number, not a name").
std::string ParseNameArray(const std::string& text, std::vector<std::string>& out);

// Deletes up to `max_rows` published and abandoned rows older than their retention; returns how
// many.
std::int64_t PurgeChunk(sqlite3* db, const RetentionPolicy& retention, int max_rows);

// Runs `body` in a write transaction (BEGIN IMMEDIATE takes the write lock up front, so a
// concurrent writer waits for busy_timeout instead of failing halfway).
template <typename Body>
auto InWriteTransaction(sqlite3* db, Body&& body) {
  Run(db, "BEGIN IMMEDIATE", "begin");
  try {
    auto result = body();
    Run(db, "COMMIT", "commit");
    return result;
  } catch (...) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

}  // namespace outbox::sqlite
