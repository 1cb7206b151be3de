#pragma once
// The PostgreSQL store's thin layer over libpq, for code that runs its own statements on a libpq
// connection next to the store (the inbox, tools, tests): RAII handles, errors classified into
// outbox::FailureKind the way the store classifies its own, and parameterized statements that
// throw them. Unlike outbox/store/postgres.h, this header includes libpq-fe.h.

#include <libpq-fe.h>

#include <chrono>
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
// On a connection with a deadline (SetDeadline), the statement is sent without blocking and its
// answer awaited with poll() until the deadline; past it the connection is shut down (PQstatus
// becomes CONNECTION_BAD, so a Connection reconnects on its next use) and PgError(kOutcomeUnknown)
// says that the server did not answer in time. Without one it blocks as PQexecParams does.
ResultPtr Exec(PGconn* conn, std::string_view what, const std::string& sql,
               const std::vector<Param>& params = {}, bool binary_results = false);

// ---- Silent peers (issue #40) ----
// libpq waits for an answer without a timeout of its own, and a peer that keeps the socket open
// but never answers (a failed-over primary, a dropped route, a frozen VM or proxy) would hold a
// caller forever. The relay's connections therefore carry a client-side deadline on every
// statement, and TCP keepalives and tcp_user_timeout in their connection defaults.

// The deadline of the connections the library opens for a relay, an operator or a tool (the
// store, wake-up, partition leases, WAL source and ledger, admin): [database] statement_deadline,
// 15 s by default. Process-wide; set it before opening them. 0 turns the deadline off.
inline constexpr std::chrono::milliseconds kDefaultStatementDeadline{15000};
void SetStatementDeadline(std::chrono::milliseconds deadline);
std::chrono::milliseconds StatementDeadline();

// The deadline Exec applies on `conn` (0: none, the default of a PGconn the caller opened).
void SetDeadline(PGconn* conn, std::chrono::milliseconds deadline);
std::chrono::milliseconds DeadlineOf(PGconn* conn);

// Connects (blocking) to `conninfo` with defaults that bound a silent peer, derived from
// `deadline`: connect_timeout (its seconds, at least 2; not when PGCONNECT_TIMEOUT is set),
// keepalives=1, keepalives_idle (a third of it), keepalives_interval (a sixth), keepalives_count=3,
// tcp_user_timeout (the deadline). What `conninfo` sets wins over them; `overrides` win over both
// (e.g. replication=database). No defaults when `deadline` is 0. Never returns null; check
// PQstatus. Sets the connection's deadline (SetDeadline) when it is connected.
ConnPtr Connect(const std::string& conninfo, std::chrono::milliseconds deadline,
                const std::vector<std::pair<std::string, std::string>>& overrides = {});

// The keyword/value defaults Connect adds for `deadline` (for tests and documentation).
std::vector<std::pair<std::string, std::string>> SilentPeerDefaults(
    std::chrono::milliseconds deadline);

// Waits until `conn`'s socket is ready for `events` (POLLIN, POLLOUT) or `until` passes; true when
// ready (or the socket failed: the caller's next libpq call reports it), false at the deadline.
bool WaitSocket(PGconn* conn, short events, std::chrono::steady_clock::time_point until);

// Shuts `conn`'s socket down after a deadline passed, so that libpq sees the connection as lost
// (CONNECTION_BAD) and nothing later blocks on it; PQfinish is still the owner's to call.
void AbandonConnection(PGconn* conn);

// Rolls back the transaction open on `conn`, if any, and reports nothing (bounded by the
// connection's deadline like Exec).
void RollbackQuietly(PGconn* conn) noexcept;

// Quotes `name` as an SQL identifier after checking that it is a plain lower-case identifier
// ([a-z_][a-z0-9_]*, at most 63 bytes); throws std::invalid_argument otherwise.
std::string QuoteSchema(const std::string& name);

}  // namespace outbox::postgres
