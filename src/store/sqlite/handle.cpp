#include "handle.h"

#include <nlohmann/json.hpp>

namespace outbox::sqlite {

void ThrowError(sqlite3* db, int code, std::string_view what) {
  const int primary = code & 0xff;
  const auto kind = primary == SQLITE_BUSY || primary == SQLITE_LOCKED ? FailureKind::kUnavailable
                                                                       : FailureKind::kPermanent;
  std::string message{what};
  message += ": ";
  message += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(code);
  throw StoreError(kind, message);
}

DbPtr Open(const std::string& path, std::chrono::milliseconds busy_timeout, bool create) {
  sqlite3* raw = nullptr;
  const int code = sqlite3_open_v2(
      path.c_str(), &raw,
      SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX, nullptr);
  DbPtr db{raw};
  if (code == SQLITE_CANTOPEN && !create) {
    throw StoreError(FailureKind::kPermanent,
                     "cannot open SQLite database '" + path +
                         "': it does not exist, or cannot be written (outboxctl migrate, or "
                         "outboxd at start, creates it)");
  }
  if (code != SQLITE_OK) ThrowError(db.get(), code, "cannot open SQLite database '" + path + "'");
  sqlite3_busy_timeout(db.get(), static_cast<int>(busy_timeout.count()));
  Run(db.get(), "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;", "configure");
  return db;
}

void Run(sqlite3* db, const char* sql, std::string_view what) {
  char* error = nullptr;
  const int code = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  sqlite3_free(error);
  if (code != SQLITE_OK) ThrowError(db, code, what);
}

Statement::Statement(sqlite3* db, std::string_view sql) : db_(db), sql_(sql) {
  sqlite3_stmt* raw = nullptr;
  const int code =
      sqlite3_prepare_v2(db, sql_.data(), static_cast<int>(sql_.size()), &raw, nullptr);
  statement_.reset(raw);
  if (code != SQLITE_OK) ThrowError(db, code, "prepare");
}

Statement& Statement::Bind(int index, std::string_view text) {
  sqlite3_bind_text(statement_.get(), index, text.data(), static_cast<int>(text.size()),
                    SQLITE_TRANSIENT);
  return *this;
}

Statement& Statement::BindBlob(int index, std::string_view bytes) {
  sqlite3_bind_blob(statement_.get(), index, bytes.data(), static_cast<int>(bytes.size()),
                    SQLITE_TRANSIENT);
  return *this;
}

Statement& Statement::Bind(int index, std::int64_t value) {
  sqlite3_bind_int64(statement_.get(), index, value);
  return *this;
}

Statement& Statement::BindOptional(int index, const std::optional<std::string>& text) {
  return text ? Bind(index, std::string_view{*text}) : BindNull(index);
}

Statement& Statement::BindNull(int index) {
  sqlite3_bind_null(statement_.get(), index);
  return *this;
}

bool Statement::Step() {
  const int code = sqlite3_step(statement_.get());
  if (code == SQLITE_ROW) return true;
  if (code == SQLITE_DONE) return false;
  ThrowError(db_, code, "step");
}

void Statement::Reset() {
  sqlite3_reset(statement_.get());
  sqlite3_clear_bindings(statement_.get());
}

std::string Statement::Text(int column) const {
  const auto* data = static_cast<const char*>(sqlite3_column_blob(statement_.get(), column));
  const int size = sqlite3_column_bytes(statement_.get(), column);
  return data == nullptr ? std::string{} : std::string(data, static_cast<std::size_t>(size));
}

std::optional<std::string> Statement::OptionalText(int column) const {
  if (IsNull(column)) return std::nullopt;
  return Text(column);
}

void RequireTables(sqlite3* db, const std::string& path) {
  // The newest parts of the schema (schema.cpp): fan-out's table and column.
  Statement check{db,
                  "SELECT (SELECT count(*) FROM sqlite_master WHERE name = 'outbox_messages'),"
                  " (SELECT count(*) FROM sqlite_master WHERE name = 'outbox_target_streams')"
                  " + (SELECT count(*) FROM pragma_table_info('outbox_messages')"
                  "    WHERE name = 'event_id')"};
  check.Step();
  if (check.Int(0) == 0) {
    throw StoreError(FailureKind::kPermanent,
                     "the SQLite database '" + path +
                         "' has no outbox tables: call outbox::sqlite::Migrate first (outboxctl "
                         "migrate, or outboxd at start, does it)");
  }
  if (check.Int(1) < 2) {
    throw StoreError(FailureKind::kPermanent,
                     "the SQLite database '" + path +
                         "' has the outbox tables of an older version: call "
                         "outbox::sqlite::Migrate to upgrade them");
  }
}

Headers ParseHeaders(const std::string& json) {
  Headers headers;
  const nlohmann::json object = nlohmann::json::parse(json);
  for (auto it = object.begin(); it != object.end(); ++it) {
    headers.emplace(it.key(),
                    it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  }
  return headers;
}

std::string HeadersToJson(const Headers& headers) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [name, value] : headers) object[name] = value;
  return object.dump();
}

std::string JsonStrings(const std::vector<std::string>& strings) {
  return nlohmann::json(strings).dump();
}

std::string ParseNameArray(const std::string& text, std::vector<std::string>& out) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_array()) return "are not a JSON array";
  if (json.empty()) return "are an empty array";
  out.reserve(json.size());
  for (const auto& element : json) {
    if (!element.is_string()) return std::string{"hold a "} + element.type_name() + ", not a name";
    out.push_back(element.get<std::string>());
  }
  return "";
}

std::int64_t PurgeChunk(sqlite3* db, const RetentionPolicy& retention, int max_rows) {
  const std::string now = kNowMillis;
  Statement purge{db,
                  "DELETE FROM outbox_messages WHERE position IN (SELECT position FROM"
                  " outbox_messages WHERE (status = 'published' AND published_at <= " +
                      now + " - ?1) OR (status = 'abandoned' AND abandoned_at <= " + now +
                      " - ?2) LIMIT ?3)"};  // <=: the clock has only millisecond steps
  purge.Bind(1, static_cast<std::int64_t>(retention.published.count()) * 1000)
      .Bind(2, static_cast<std::int64_t>(retention.abandoned.count()) * 1000)
      .Bind(3, std::int64_t{max_rows});
  purge.Step();
  return purge.Changes();
}

}  // namespace outbox::sqlite
