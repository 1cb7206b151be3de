#include "connection.h"

#include <libpq-events.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "outbox/core/error.h"

namespace outbox::postgres {
std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

FailureKind KindOfSqlState(std::string_view sqlstate) {
  // 08: connection exception; 57P01-03: server shutting down or not accepting connections;
  // 53: insufficient resources; 40001/40P01: serialization failure and deadlock, retryable;
  // 57014: cancelled (statement_timeout, or an operator's pg_cancel_backend): busy, not wrong.
  if (sqlstate.starts_with("08") || sqlstate.starts_with("57P") || sqlstate.starts_with("53") ||
      sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "57014") {
    return FailureKind::kUnavailable;
  }
  return FailureKind::kPermanent;
}

void ThrowStatementError(PGconn* conn, const PGresult* result, std::string_view what) {
  const char* state = result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  const char* primary =
      result != nullptr ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  std::string message{what};
  message += ": ";
  message += primary != nullptr ? std::string{primary} : Trim(PQerrorMessage(conn));
  if (PQstatus(conn) == CONNECTION_BAD) {
    throw PgError(FailureKind::kOutcomeUnknown, message + " (connection lost)", "");
  }
  const std::string sqlstate = state != nullptr ? state : "";
  if (!sqlstate.empty()) message += " (SQLSTATE " + sqlstate + ")";
  throw PgError(KindOfSqlState(sqlstate), message, sqlstate);
}

std::string DescribeConninfo(const std::string& conninfo) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
  if (options == nullptr) {
    PQfreemem(error);
    return {};
  }
  std::string description;
  for (const char* key : {"host", "hostaddr", "port", "dbname", "user"}) {
    for (PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
      if (std::string_view{option->keyword} == key && option->val != nullptr &&
          option->val[0] != '\0') {
        if (!description.empty()) description += ' ';
        description += std::string{key} + "=" + option->val;
      }
    }
  }
  PQconninfoFree(options);
  return description.empty() ? "the default server (PG* environment)" : description;
}

namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::atomic<std::int64_t> statement_deadline_ms{kDefaultStatementDeadline.count()};

// The event procedure whose instance data holds a connection's deadline in milliseconds (libpq's
// way to attach data to a PGconn; it is freed with it). It handles no event.
int DeadlineEvents(PGEventId /*event*/, void* /*info*/, void* /*pass_through*/) { return 1; }

[[noreturn]] void ThrowDeadline(PGconn* conn, std::string_view what, milliseconds deadline) {
  AbandonConnection(conn);
  throw PgError(FailureKind::kOutcomeUnknown,
                std::string{what} + ": no answer from PostgreSQL within " +
                    std::to_string(deadline.count()) +
                    " ms (database.statement_deadline): the server or the network is silent; "
                    "the connection is closed and opened again",
                "");
}

// The results of the query sent on `conn`, awaited until `until`: the first error, else the
// last result (PQexec's rule). Null when there was none.
ResultPtr AwaitResults(PGconn* conn, std::string_view what, steady_clock::time_point until,
                       milliseconds deadline) {
  for (;;) {
    const int unsent = PQflush(conn);
    if (unsent <= 0) break;  // -1: failed; PQgetResult reports it
    if (!WaitSocket(conn, POLLIN | POLLOUT, until)) ThrowDeadline(conn, what, deadline);
    if (PQconsumeInput(conn) == 0) break;
  }
  ResultPtr kept;
  for (;;) {
    while (PQisBusy(conn) != 0) {
      if (!WaitSocket(conn, POLLIN, until)) ThrowDeadline(conn, what, deadline);
      PQconsumeInput(conn);  // a failure makes the connection bad and PQisBusy false
    }
    ResultPtr next{PQgetResult(conn)};
    if (!next) break;
    const auto status = PQresultStatus(next.get());
    if (status == PGRES_COPY_IN || status == PGRES_COPY_OUT || status == PGRES_COPY_BOTH) {
      return next;
    }
    if (!kept || PQresultStatus(kept.get()) != PGRES_FATAL_ERROR) kept = std::move(next);
    if (PQstatus(conn) == CONNECTION_BAD) break;
  }
  return kept;
}

int AtLeastOne(std::int64_t value) { return static_cast<int>(std::max<std::int64_t>(value, 1)); }

}  // namespace

void SetStatementDeadline(milliseconds deadline) {
  statement_deadline_ms.store(std::max<std::int64_t>(deadline.count(), 0));
}

milliseconds StatementDeadline() { return milliseconds{statement_deadline_ms.load()}; }

void SetDeadline(PGconn* conn, milliseconds deadline) {
  if (conn == nullptr) return;
  if (PQinstanceData(conn, DeadlineEvents) == nullptr) {
    if (deadline.count() <= 0) return;
    if (PQregisterEventProc(conn, DeadlineEvents, "outbox statement deadline", nullptr) == 0) {
      return;
    }
  }
  // The milliseconds themselves, as the pointer's value: nothing to allocate or free.
  PQsetInstanceData(conn, DeadlineEvents,
                    reinterpret_cast<void*>(  // NOLINT(performance-no-int-to-ptr)
                        static_cast<std::intptr_t>(std::max<std::int64_t>(deadline.count(), 0))));
}

milliseconds DeadlineOf(PGconn* conn) {
  if (conn == nullptr) return milliseconds{0};
  return milliseconds{reinterpret_cast<std::intptr_t>(PQinstanceData(conn, DeadlineEvents))};
}

std::vector<std::pair<std::string, std::string>> SilentPeerDefaults(milliseconds deadline) {
  if (deadline.count() <= 0) return {};
  const std::int64_t seconds = (deadline.count() + 999) / 1000;
  std::vector<std::pair<std::string, std::string>> defaults;
  if (std::getenv("PGCONNECT_TIMEOUT") == nullptr) {  // NOLINT(concurrency-mt-unsafe)
    defaults.emplace_back("connect_timeout", std::to_string(std::max<std::int64_t>(seconds, 2)));
  }
  defaults.emplace_back("keepalives", "1");
  defaults.emplace_back("keepalives_idle", std::to_string(AtLeastOne(seconds / 3)));
  defaults.emplace_back("keepalives_interval", std::to_string(AtLeastOne(seconds / 6)));
  defaults.emplace_back("keepalives_count", "3");
  defaults.emplace_back("tcp_user_timeout", std::to_string(deadline.count()));
  return defaults;
}

ConnPtr Connect(const std::string& conninfo, milliseconds deadline,
                const std::vector<std::pair<std::string, std::string>>& overrides) {
  // expand_dbname: the first "dbname" is the caller's whole conninfo, and what it sets overrides
  // the keywords before it (the defaults); the keywords after it (the overrides) win over both.
  const auto defaults = SilentPeerDefaults(deadline);
  std::vector<const char*> keywords;
  std::vector<const char*> values;
  for (const auto& [key, value] : defaults) {
    keywords.push_back(key.c_str());
    values.push_back(value.c_str());
  }
  keywords.push_back("dbname");
  values.push_back(conninfo.c_str());
  for (const auto& [key, value] : overrides) {
    keywords.push_back(key.c_str());
    values.push_back(value.c_str());
  }
  keywords.push_back(nullptr);
  values.push_back(nullptr);
  ConnPtr conn{PQconnectdbParams(keywords.data(), values.data(), 1)};
  if (conn && PQstatus(conn.get()) == CONNECTION_OK) SetDeadline(conn.get(), deadline);
  return conn;
}

bool WaitSocket(PGconn* conn, short events, steady_clock::time_point until) {
  for (;;) {
    const auto now = steady_clock::now();
    if (now >= until) return false;
    pollfd descriptor{};
    descriptor.fd = PQsocket(conn);
    if (descriptor.fd < 0) return true;  // no socket: libpq reports the failure
    descriptor.events = events;
    const auto left = std::chrono::ceil<milliseconds>(until - now);
    const int ready =
        poll(&descriptor, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 60000)));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return true;  // the next libpq call reports it
  }
}

void AbandonConnection(PGconn* conn) {
  if (conn == nullptr) return;
  const int socket = PQsocket(conn);
  if (socket < 0) return;
  // Not close(): the descriptor is libpq's. After shutdown, reads see the end of the stream, so
  // libpq marks the connection lost; nothing is sent that could block.
  ::shutdown(socket, SHUT_RDWR);
  PQsetnonblocking(conn, 1);
  for (int turn = 0; turn < 64 && PQstatus(conn) == CONNECTION_OK; ++turn) {
    if (PQconsumeInput(conn) == 0) break;
    while (PQisBusy(conn) == 0) {
      const ResultPtr discarded{PQgetResult(conn)};
      if (!discarded) break;
    }
  }
}

void RollbackQuietly(PGconn* conn) noexcept {
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK ||
      PQtransactionStatus(conn) == PQTRANS_IDLE) {
    return;
  }
  try {
    Exec(conn, "roll back", "ROLLBACK");
  } catch (...) {  // NOLINT(bugprone-empty-catch): reports nothing; the connection says the rest
  }
}

namespace {

// Sends one request with `send` (a PQsend* call) and awaits its answer as Exec documents: blocking
// without a deadline (then `blocking` runs instead of `send`), else without blocking under it.
template <typename Send, typename Blocking>
ResultPtr SendAndAwait(PGconn* conn, std::string_view what, Send send, Blocking blocking) {
  const milliseconds deadline = DeadlineOf(conn);
  ResultPtr result;
  if (deadline.count() <= 0) {
    result.reset(blocking());
  } else {
    const auto until = steady_clock::now() + deadline;
    // Non-blocking while the statement is sent, so that a peer that stops reading cannot hold
    // the send either (libpq's blocking flush waits without a timeout); blocking again after.
    struct NonBlocking {
      PGconn* conn;
      bool was = PQisnonblocking(conn) != 0;
      explicit NonBlocking(PGconn* c) : conn(c) {
        if (!was) PQsetnonblocking(conn, 1);
      }
      NonBlocking(const NonBlocking&) = delete;
      NonBlocking& operator=(const NonBlocking&) = delete;
      ~NonBlocking() {
        if (!was && PQstatus(conn) == CONNECTION_OK) PQsetnonblocking(conn, 0);
      }
    } non_blocking{conn};
    if (send() == 0) ThrowStatementError(conn, nullptr, what);
    result = AwaitResults(conn, what, until, deadline);
  }
  const auto status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    ThrowStatementError(conn, result.get(), what);
  }
  return result;
}

// The parameters as libpq takes them; views `params`.
struct ParamArrays {
  explicit ParamArrays(const std::vector<Param>& params) {
    values.reserve(params.size());
    for (const auto& param : params) {
      values.push_back(param.value ? param.value->data() : nullptr);
      lengths.push_back(param.value ? static_cast<int>(param.value->size()) : 0);
      formats.push_back(param.binary ? 1 : 0);
    }
  }
  int count() const { return static_cast<int>(values.size()); }
  std::vector<const char*> values;
  std::vector<int> lengths;
  std::vector<int> formats;
};

// Runs a statement with parameters, given by its text or (`prepared`) by the name it was
// prepared under: what Exec and ExecPrepared share.
ResultPtr ExecWithParams(PGconn* conn, std::string_view what, const std::string& statement,
                         bool prepared, const std::vector<Param>& params, bool binary_results) {
  const ParamArrays p{params};
  const int format = binary_results ? 1 : 0;
  const char* text = statement.c_str();
  return SendAndAwait(
      conn, what,
      [&] {
        return prepared ? PQsendQueryPrepared(conn, text, p.count(), p.values.data(),
                                              p.lengths.data(), p.formats.data(), format)
                        : PQsendQueryParams(conn, text, p.count(), nullptr, p.values.data(),
                                            p.lengths.data(), p.formats.data(), format);
      },
      [&] {
        return prepared ? PQexecPrepared(conn, text, p.count(), p.values.data(), p.lengths.data(),
                                         p.formats.data(), format)
                        : PQexecParams(conn, text, p.count(), nullptr, p.values.data(),
                                       p.lengths.data(), p.formats.data(), format);
      });
}

}  // namespace

ResultPtr Exec(PGconn* conn, std::string_view what, const std::string& sql,
               const std::vector<Param>& params, bool binary_results) {
  return ExecWithParams(conn, what, sql, /*prepared=*/false, params, binary_results);
}

void Prepare(PGconn* conn, std::string_view what, const std::string& name, const std::string& sql) {
  SendAndAwait(
      conn, what, [&] { return PQsendPrepare(conn, name.c_str(), sql.c_str(), 0, nullptr); },
      [&] { return PQprepare(conn, name.c_str(), sql.c_str(), 0, nullptr); });
}

ResultPtr ExecPrepared(PGconn* conn, std::string_view what, const std::string& name,
                       const std::vector<Param>& params, bool binary_results) {
  return ExecWithParams(conn, what, name, /*prepared=*/true, params, binary_results);
}

std::string QuoteSchema(const std::string& name) {
  const bool valid =
      !name.empty() && name.size() <= 63 &&
      (std::islower(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
  if (!valid) {
    throw std::invalid_argument("schema name '" + name +
                                "' is not a plain lower-case identifier ([a-z_][a-z0-9_]*, at "
                                "most 63 bytes)");
  }
  return '"' + name + '"';
}

std::string ReplaceAll(std::string text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string TextArray(const std::vector<std::string>& values) {
  std::string literal = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) literal += ',';
    literal += '"';
    for (const char c : values[i]) {
      if (c == '"' || c == '\\') literal += '\\';
      literal += c;
    }
    literal += '"';
  }
  literal += '}';
  return literal;
}

std::string UuidArray(const std::vector<MessageId>& ids) {
  std::string literal = "{";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) literal += ',';
    literal += ids[i].ToString();
  }
  return literal + '}';
}

void CheckSchemaOption(const std::string& name) {
  try {
    QuoteSchema(name);
  } catch (const std::invalid_argument& error) {
    throw ConfigError("schema", error.what());
  }
}

namespace {
template <typename T>
std::string JoinNumbers(std::span<const T> values) {
  std::string literal = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) literal += ',';
    literal += std::to_string(values[i]);
  }
  return literal + '}';
}
}  // namespace

std::string NumberArray(std::span<const std::int64_t> values) { return JoinNumbers(values); }
std::string NumberArray(std::span<const int> values) { return JoinNumbers(values); }

namespace {
std::optional<std::int64_t> ToInt64(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}
}  // namespace

std::int64_t ParseInt64(std::string_view text, std::string_view what) {
  if (const auto value = ToInt64(text)) return *value;
  throw PgError(
      FailureKind::kPermanent,
      std::string{what} + ": expected an integer, got '" + std::string{text.substr(0, 64)} + "'",
      "");
}

std::vector<std::int64_t> ParseNumberArray(std::string_view literal, std::string_view what) {
  const auto bad = [&] {
    return PgError(FailureKind::kPermanent,
                   std::string{what} + ": expected an integer array, got '" +
                       std::string{literal.substr(0, 64)} + "'",
                   "");
  };
  if (literal.size() < 2 || literal.front() != '{' || literal.back() != '}') throw bad();
  std::vector<std::int64_t> values;
  const std::string_view body = literal.substr(1, literal.size() - 2);
  std::size_t start = 0;
  while (start < body.size()) {
    const std::size_t comma = std::min(body.find(',', start), body.size());
    const auto value = ToInt64(body.substr(start, comma - start));
    if (!value) throw bad();
    values.push_back(*value);
    start = comma + 1;
    if (comma + 1 == body.size()) throw bad();  // a trailing comma
  }
  return values;
}

std::string_view Column(const PGresult* result, int row, int column) {
  return {PQgetvalue(result, row, column),
          static_cast<std::size_t>(PQgetlength(result, row, column))};
}

std::optional<std::string> OptionalText(const PGresult* result, int row, int column) {
  if (PQgetisnull(result, row, column) != 0) return std::nullopt;
  return std::string{Column(result, row, column)};
}

Headers ParseHeaders(std::string_view jsonb_binary) {
  std::optional<Headers> headers;
  if (!jsonb_binary.empty() && jsonb_binary.front() == 1) {
    headers = HeadersFromJson(jsonb_binary.substr(1));
  }
  if (!headers) throw StoreError(FailureKind::kPermanent, "unexpected jsonb format for headers");
  return std::move(*headers);
}

std::optional<Headers> HeadersFromJson(std::string_view json) {
  // No exceptions: a malformed text is the caller's to report, in its own terms.
  const auto parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return std::nullopt;
  Headers headers;
  for (const auto& [name, value] : parsed.items()) {
    headers.emplace(name, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return headers;
}

std::string HeadersToJson(const Headers& headers) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [name, value] : headers) object[name] = value;
  return object.dump();
}

std::int64_t ReadInt64(const char* bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8U) | static_cast<unsigned char>(bytes[i]);
  return static_cast<std::int64_t>(value);
}

std::int32_t ReadInt32(const char* bytes) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = (value << 8U) | static_cast<unsigned char>(bytes[i]);
  return static_cast<std::int32_t>(value);
}

Uuid ReadUuid(const char* bytes) {
  Uuid::Bytes raw{};
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::uint8_t>(bytes[i]);
  return Uuid{raw};
}

TimePoint ReadTimestamp(const char* bytes) {
  // PostgreSQL's epoch is 2000-01-01 00:00:00 UTC, 946684800 s after the Unix epoch.
  constexpr std::int64_t kPostgresEpochMicros = 946684800LL * 1000000LL;
  return TimePoint{std::chrono::duration_cast<TimePoint::duration>(
      std::chrono::microseconds{ReadInt64(bytes) + kPostgresEpochMicros})};
}

Connection::Connection(std::string conninfo, std::string session_sql,
                       std::optional<std::chrono::milliseconds> deadline)
    : conninfo_(std::move(conninfo)),
      session_sql_(std::move(session_sql)),
      description_(DescribeConninfo(conninfo_)),
      deadline_(deadline.value_or(StatementDeadline())) {
  if (description_.empty()) {
    // libpq's parse error quotes the offending fragment, which may be a password: say less.
    throw PgError(FailureKind::kPermanent,
                  "invalid PostgreSQL connection string (not shown: it may hold a password); "
                  "expected a postgresql:// URI or key=value pairs",
                  "");
  }
  EnsureConnected();
}

// A connection lost or given up at a deadline may leave its server session behind, and a
// statement sent on it may still be in the network (a frozen route, a proxy that holds bytes):
// reaching the session later, it would run after the caller has moved on (a claim leasing
// messages its relay no longer knows of). The new connection ends those sessions and waits for
// them to go (at most the deadline, or 5 s) before it is used, so that what they had not run yet
// never runs; what they had run before is the caller's to reconcile, as for any reply that was
// lost. Only sessions of the same role that started before this one (a pid reused since is not
// touched). One that cannot be ended, or is still there after the wait, fails the connection
// (kUnavailable): the caller backs off and the next connection tries again; a session already
// gone is done with.
void Connection::EndStaleSessions() {
  const auto wait_ms =
      std::min<std::int64_t>(deadline_.count() > 0 ? deadline_.count() : 5000, 5000);
  std::string pids = "{";
  for (const int pid : stale_sessions_) {
    if (pids.size() > 1) pids += ',';
    pids += std::to_string(pid);
  }
  pids += '}';
  const std::string wait_text = std::to_string(wait_ms);
  const auto result = Exec(
      conn_.get(), "end the server sessions of the connections lost",
      "SELECT pid, pg_terminate_backend(pid, $2) FROM pg_stat_activity WHERE pid = ANY($1::int[]) "
      "AND usename = current_user AND backend_start < (SELECT backend_start FROM "
      "pg_stat_activity WHERE pid = pg_backend_pid())",
      {Param{pids}, Param{wait_text}});
  for (int row = 0; row < PQntuples(result.get()); ++row) {
    if (std::string_view{PQgetvalue(result.get(), row, 1)} != "t") {
      throw PgError(FailureKind::kUnavailable,
                    std::string{"the server session "} + PQgetvalue(result.get(), row, 0) +
                        " of a connection lost is still there " + wait_text +
                        " ms after it was told to end; a statement sent on that connection "
                        "could still run, so this connection is not used until it is gone",
                    "");
    }
  }
  stale_sessions_.clear();
}

void Connection::EnsureConnected() {
  if (conn_ && PQstatus(conn_.get()) == CONNECTION_OK) return;
  // Its session is ended by the next connection that gets through (EndStaleSessions), however
  // many attempts fail before. (PQbackendPID says 0 once the connection is bad: the pid is kept
  // from its start.)
  if (session_pid_ != 0) stale_sessions_.push_back(std::exchange(session_pid_, 0));
  conn_.reset();  // the old one first: its server session may hold what the new one needs
  conn_ = Connect(conninfo_, deadline_);
  if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) {
    const std::string reason = conn_ ? Trim(PQerrorMessage(conn_.get())) : "out of memory";
    conn_.reset();
    throw PgError(FailureKind::kUnavailable,
                  "cannot connect to PostgreSQL (" + description_ + "): " + reason, "");
  }
  const auto set_up_failed = [this](const std::string& reason) {
    conn_.reset();
    return PgError(FailureKind::kUnavailable,
                   "cannot set up the connection to PostgreSQL (" + description_ + "): " + reason,
                   "");
  };
  if (!stale_sessions_.empty()) {
    try {
      EndStaleSessions();
    } catch (const PgError& error) {
      throw set_up_failed(error.what());
    }
  }
  session_pid_ = PQbackendPID(conn_.get());
  // Every statement of the store is short; with JIT on, the claim's plan (its cost estimate is
  // over jit_above_cost once the table is large) spent 30-60 ms compiling to save microseconds
  // (measured: a claim of 500 from 200k rows, 68 ms with JIT, 13.6 ms without). A server without
  // the setting (before PostgreSQL 11) refuses it, which changes nothing.
  try {
    Exec(conn_.get(), "set jit", "SET jit = off");
  } catch (const PgError& error) {
    if (PQstatus(conn_.get()) != CONNECTION_OK) throw set_up_failed(error.what());
  }
  ++generation_;
  if (session_sql_.empty()) return;
  try {
    Exec(conn_.get(), "set up the session", session_sql_);
  } catch (const PgError& error) {
    throw set_up_failed(error.what());
  }
}

}  // namespace outbox::postgres
