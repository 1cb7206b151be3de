#pragma once
// RAII over libpq (STYLE.md point 3): one deleter and one alias per handle type, a connection that
// connects or throws, and errors classified once into outbox::FailureKind.

#include <libpq-fe.h>

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
#include "outbox/store/store.h"

namespace outbox::postgres {

struct ConnDeleter {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};
using ConnPtr = std::unique_ptr<PGconn, ConnDeleter>;

struct ResultDeleter {
  void operator()(PGresult* result) const noexcept { PQclear(result); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

// A StoreError that also carries PostgreSQL's SQLSTATE (empty when the connection failed).
class PgError : public StoreError {
 public:
  PgError(FailureKind kind, const std::string& message, std::string sqlstate)
      : StoreError(kind, message), sqlstate_(std::move(sqlstate)) {}
  [[nodiscard]] const std::string& sqlstate() const { return sqlstate_; }

 private:
  std::string sqlstate_;
};

// The failure kind of a SQLSTATE: connection and resource errors are kUnavailable, everything
// else kPermanent.
FailureKind KindOfSqlState(std::string_view sqlstate);

// Throws the PgError for a failed statement on `conn`. A connection lost under a statement leaves
// its outcome unknown (kOutcomeUnknown); `what` names the operation in the message.
[[noreturn]] void ThrowStatementError(PGconn* conn, const PGresult* result, std::string_view what);

// "host=... port=... dbname=... user=..." from a conninfo string, never including the password;
// empty when the string does not parse.
std::string DescribeConninfo(const std::string& conninfo);

// A statement parameter: text format unless `binary` (used for bytea); nullopt is SQL NULL.
struct Param {
  std::optional<std::string_view> value;
  bool binary = false;
};

// Runs one statement with parameters; text results unless `binary_results`. Throws PgError.
ResultPtr Exec(PGconn* conn, std::string_view what, const std::string& sql,
               const std::vector<Param>& params = {}, bool binary_results = false);

// Quotes `name` as an SQL identifier after checking that it is a plain lower-case identifier
// ([a-z_][a-z0-9_]*, at most 63 bytes); throws std::invalid_argument otherwise.
std::string QuoteSchema(const std::string& name);

// QuoteSchema's check as the Open* functions report it: ConfigError naming "schema".
void CheckSchemaOption(const std::string& name);

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

// Binary-format column readers.
std::int64_t ReadInt64(const char* bytes);
std::int32_t ReadInt32(const char* bytes);
Uuid ReadUuid(const char* bytes);
TimePoint ReadTimestamp(const char* bytes);  // timestamptz: microseconds since 2000-01-01 UTC

// An owned connection that remembers how to reconnect. Move-only; never throws from its
// destructor.
class Connection {
 public:
  // Connects or throws PgError(kUnavailable) naming the server but never the password.
  explicit Connection(std::string conninfo);
  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() = default;

  PGconn* get() const { return conn_.get(); }
  const std::string& description() const { return description_; }

  // Reconnects if the connection was lost; throws PgError(kUnavailable) if that fails.
  void EnsureConnected();

  // The connection, reconnected first if it was lost (what every call of a store begins with).
  PGconn* Ready() {
    EnsureConnected();
    return get();
  }

  // Closes the connection; reports nothing (libpq's PQfinish cannot fail).
  void Close() { conn_.reset(); }

 private:
  std::string conninfo_;
  std::string description_;
  ConnPtr conn_;
};

}  // namespace outbox::postgres
