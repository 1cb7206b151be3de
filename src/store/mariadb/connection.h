#pragma once
// The store's Connector/C layer: RAII handles, the connection URL, errors classified into
// FailureKind, and statements with bound parameters (prepared once per connection and kept).

#include <mysql.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/core/uuid.h"
#include "outbox/store/store.h"

namespace outbox::mariadb {

struct MysqlDeleter {
  void operator()(MYSQL* conn) const { mysql_close(conn); }
};
using MysqlPtr = std::unique_ptr<MYSQL, MysqlDeleter>;

struct StmtDeleter {
  void operator()(MYSQL_STMT* stmt) const { mysql_stmt_close(stmt); }
};
using StmtPtr = std::unique_ptr<MYSQL_STMT, StmtDeleter>;

// A failed statement or connection: StoreError with the server's error number and SQLSTATE.
class MariaDbError : public StoreError {
 public:
  MariaDbError(FailureKind kind, const std::string& message, unsigned error, std::string sqlstate)
      : StoreError(kind, message), error_(error), sqlstate_(std::move(sqlstate)) {}
  [[nodiscard]] unsigned error() const { return error_; }
  [[nodiscard]] const std::string& sqlstate() const { return sqlstate_; }

 private:
  unsigned error_;
  std::string sqlstate_;
};

// How an error number is treated: the client's connection errors (2002, 2003, 2006, 2013, ...),
// a server shutting down, a deadlock (1213) and a lock wait timeout (1205) are kUnavailable (call
// again); the rest kPermanent.
FailureKind KindOfError(unsigned error);

// A mariadb:// or mysql:// URL, read. Throws std::invalid_argument naming what is wrong (never the
// password).
struct Url {
  std::string host = "127.0.0.1";
  unsigned port = 3306;
  std::string user;
  std::string password;
  std::string database;
  std::string unix_socket;
  std::optional<unsigned> connect_timeout_seconds;
  std::string ssl_mode;  // empty: the connector's default
  std::string ssl_ca;
};
Url ParseUrl(std::string_view url);
// "host:port/database user u" for messages; never the password.
std::string DescribeUrl(const Url& url);

// What every Open* checks before it connects: a URL that parses, a plain schema name, a positive
// deadline; ConfigError naming the option ("url", "schema", "statement_deadline") otherwise.
void CheckConnectionOptions(const std::string& url, const std::string& schema,
                            std::chrono::milliseconds statement_deadline);

// `name` backquoted for SQL; throws std::invalid_argument unless it is a plain identifier
// ([A-Za-z_][A-Za-z0-9_]*, at most 64 bytes).
std::string QuoteSchema(const std::string& name);

// Bytes that are not text (payloads, ids): sent as binary, for BLOB and BINARY columns. Text goes
// as std::string, in the connection's character set (utf8mb4), so that it compares with text
// columns through their indexes.
struct Bytes {
  std::string data;
};

// A bound parameter: NULL, an integer, a double, text or bytes.
using Value = std::variant<std::monostate, std::int64_t, double, std::string, Bytes>;

// One result set: its column names and rows; NULL is nullopt, everything else its text (as the
// server converts it; bytes as they are).
struct ResultSet {
  std::vector<std::string> columns;
  std::vector<std::vector<std::optional<std::string>>> rows;

  // The column named `name`'s index; throws MariaDbError(kPermanent) when there is none.
  [[nodiscard]] std::size_t Column(std::string_view name) const;
};

// What a statement returned: its result sets (a CALL may return several) and the rows it changed
// (matched rows, CLIENT_FOUND_ROWS).
struct StatementResult {
  std::vector<ResultSet> sets;
  std::int64_t affected_rows = 0;
};

// Column readers; throw MariaDbError(kPermanent) naming `what` for a value that does not parse.
std::int64_t ToInt64(const std::optional<std::string>& text, std::string_view what);
// DATETIME(6) text "YYYY-MM-DD HH:MM:SS[.ffffff]" as UTC.
TimePoint ToTime(const std::optional<std::string>& text, std::string_view what);
// A BINARY(16) id.
MessageId ToId(const std::optional<std::string>& bytes, std::string_view what);
// The headers column (a JSON object) as Headers; a value that is not a string is kept as its JSON
// text. NULL: none. Anything but an object throws MariaDbError(kPermanent) naming `what`.
Headers ParseHeadersColumn(const std::optional<std::string>& text,
                           std::string_view what = "headers");
// An id as a BINARY(16) parameter.
Bytes IdBytes(const MessageId& id);
// A time as the DATETIME(6) text MariaDB reads.
std::string TimeText(TimePoint time);

// An owned connection that remembers how to reconnect. Every statement is bounded by the
// deadline: the client's read and write timeouts (a silent server) and the server's
// max_statement_time and lock wait (a busy one). Sessions are READ COMMITTED and UTC.
// Move-only; never throws from its destructor.
class Connection {
 public:
  // Connects or throws MariaDbError(kUnavailable) naming the server but never the password.
  // `session_sql` runs after every (re)connect. A zero deadline leaves the server's defaults.
  Connection(std::string url, std::chrono::milliseconds deadline, std::string session_sql = {});
  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() = default;

  [[nodiscard]] const std::string& description() const { return description_; }
  [[nodiscard]] std::chrono::milliseconds deadline() const { return deadline_; }

  // The connection, reconnected first if it was lost; throws MariaDbError(kUnavailable) if that
  // fails. A connection lost under a statement is first ended on the server (KILL), so that a
  // statement still in the network can never run after the reconnect.
  MYSQL* Ready();

  // Runs one statement with bound parameters (prepared on first use, kept for the connection's
  // life). `what` names it in errors. Throws MariaDbError; a connection lost while a COMMIT or
  // a statement that commits was in flight is kOutcomeUnknown.
  StatementResult Run(std::string_view what, const std::string& sql,
                      std::span<const Value> params = {});
  // A statement without parameters and results, on the text protocol (START TRANSACTION, COMMIT,
  // SET, DDL). `commits`: the statement commits, so a lost reply is kOutcomeUnknown.
  void Execute(std::string_view what, const std::string& sql, bool commits = false);

  // Closes the connection.
  void Close();

 private:
  [[noreturn]] void Fail(std::string_view what, unsigned error, const char* sqlstate,
                         const char* message, bool commits);
  void Connect();
  void EndStaleSessions();
  // Forgets a connection found lost; its session is ended at the reconnect (EndStaleSessions).
  void MarkLost();

  std::string url_text_;
  Url url_;
  std::string description_;
  std::chrono::milliseconds deadline_;
  std::string session_sql_;
  MysqlPtr conn_;
  std::map<std::string, StmtPtr, std::less<>> statements_;
  unsigned long session_id_ = 0;               // the server thread of conn_
  std::vector<unsigned long> stale_sessions_;  // of connections lost, not yet known ended
};

// Whether `conn` is inside a transaction (SERVER_STATUS_IN_TRANS, or autocommit off).
bool InTransaction(MYSQL* conn);

// On a connection the caller owns (the Writer's): `sql` on the text protocol, no results
// expected; and a statement with bound parameters, prepared for this one call. Throw MariaDbError.
void ExecuteOn(MYSQL* conn, std::string_view what, const std::string& sql);
StatementResult RunOn(MYSQL* conn, std::string_view what, const std::string& sql,
                      std::span<const Value> params = {});

}  // namespace outbox::mariadb
