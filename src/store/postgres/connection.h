#pragma once
// The store's libpq layer: the RAII handles, errors and Exec of outbox/store/postgres_libpq.h
// (STYLE.md point 3, public so that the inbox and tools share them), and what only the store uses:
// a connection that connects or throws, array literals, column readers.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/core/uuid.h"
#include "outbox/store/postgres_libpq.h"
#include "outbox/store/store.h"

namespace outbox::postgres {

// "host=... port=... dbname=... user=..." from a conninfo string, never including the password;
// empty when the string does not parse.
std::string DescribeConninfo(const std::string& conninfo);

// QuoteSchema's check as the Open* functions report it: ConfigError naming "schema".
void CheckSchemaOption(const std::string& name);

// `text` without its trailing newlines and spaces (libpq's messages end in a newline).
std::string Trim(std::string text);

// `text` with every occurrence of `from` replaced by `to`.
std::string ReplaceAll(std::string text, std::string_view from, std::string_view to);

// A text-format array literal of `values` ({"a","b\"c"}), for unnest($n::text[]).
std::string TextArray(const std::vector<std::string>& values);

// A uuid[] array literal of `ids` ({a,b}), for unnest($n::uuid[]).
std::string UuidArray(const std::vector<MessageId>& ids);

// An integer array literal ({1,2}), for $n::integer[] or $n::bigint[].
std::string NumberArray(std::span<const std::int64_t> values);
std::string NumberArray(std::span<const int> values);

// A text-format integer column; throws PgError (kPermanent) for anything else, naming `what`.
std::int64_t ParseInt64(std::string_view text, std::string_view what);

// The elements of a text-format one-dimensional integer array ("{1,2}"); throws PgError
// (kPermanent) for anything else, naming `what`.
std::vector<std::int64_t> ParseNumberArray(std::string_view literal, std::string_view what);

// A column's bytes, and the same or nullopt for SQL NULL (text or binary format alike).
std::string_view Column(const PGresult* result, int row, int column);
std::optional<std::string> OptionalText(const PGresult* result, int row, int column);

// Headers from a binary-format jsonb column: a version byte (1), then the JSON object; values
// that are not strings are kept as their JSON text.
Headers ParseHeaders(std::string_view jsonb_binary);
// The same from the JSON text alone (a WAL record's headers); nullopt unless it is a JSON object.
std::optional<Headers> HeadersFromJson(std::string_view json);
// The headers as the text of a JSON object of strings (the headers column's input). JSON is read
// and written in connection.cpp only (nlohmann/json is heavy to compile).
std::string HeadersToJson(const Headers& headers);

// Binary-format column readers.
std::int64_t ReadInt64(const char* bytes);
std::int32_t ReadInt32(const char* bytes);
Uuid ReadUuid(const char* bytes);
TimePoint ReadTimestamp(const char* bytes);  // timestamptz: microseconds since 2000-01-01 UTC

// Prepares `sql` as the statement `name` on `conn`, parameter types from the SQL; runs a prepared
// statement. Both throw and keep a deadline as Exec does. A prepared statement lives as long as
// its server session (Connection::generation tells when that is new).
void Prepare(PGconn* conn, std::string_view what, const std::string& name, const std::string& sql);
ResultPtr ExecPrepared(PGconn* conn, std::string_view what, const std::string& name,
                       const std::vector<Param>& params, bool binary_results = false);

// An owned connection that remembers how to reconnect. Move-only; never throws from its
// destructor.
class Connection {
 public:
  // Connects or throws PgError(kUnavailable) naming the server but never the password.
  // `session_sql` (e.g. "SET statement_timeout = 30000") runs after every (re)connect. Every
  // statement on it has `deadline` (Exec; StatementDeadline() when not given, 0: none), and it
  // connects with the silent-peer defaults of that deadline (Connect).
  explicit Connection(std::string conninfo, std::string session_sql = {},
                      std::optional<std::chrono::milliseconds> deadline = std::nullopt);
  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() = default;

  PGconn* get() const { return conn_.get(); }
  const std::string& description() const { return description_; }

  std::chrono::milliseconds deadline() const { return deadline_; }

  // Counts the server sessions this connection has opened: what was prepared under another
  // number is gone.
  std::uint64_t generation() const { return generation_; }

  // Reconnects if the connection was lost (or abandoned at a deadline); throws
  // PgError(kUnavailable) if that fails.
  void EnsureConnected();

  // The connection, reconnected first if it was lost (what every call of a store begins with).
  PGconn* Ready() {
    EnsureConnected();
    return get();
  }

  // Closes the connection; reports nothing (libpq's PQfinish cannot fail).
  void Close() { conn_.reset(); }

 private:
  void EndStaleSessions();

  std::string conninfo_;
  std::string session_sql_;
  std::string description_;
  std::chrono::milliseconds deadline_;
  ConnPtr conn_;
  int session_pid_ = 0;  // the server session of conn_
  std::uint64_t generation_ = 0;
  std::vector<int> stale_sessions_;  // of connections lost, not yet known gone (EndStaleSessions)
};

}  // namespace outbox::postgres
