#pragma once
// The PostgreSQL store's thin layer over libpq, for code that runs its own statements on a libpq
// connection next to the store (the inbox, tools, tests): RAII handles, errors classified into
// outbox::FailureKind the way the store classifies its own, and parameterized statements that
// throw them. Unlike outbox/store/postgres.h, this header includes libpq-fe.h.

#include <libpq-fe.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/failure.h"
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

}  // namespace outbox::postgres
