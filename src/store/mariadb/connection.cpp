#include "connection.h"

#include <errmsg.h>
#include <mysqld_error.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <thread>

#include "outbox/core/error.h"
#include "outbox/core/percent_decode.h"

namespace outbox::mariadb {
namespace {

struct ResultDeleter {
  void operator()(MYSQL_RES* result) const { mysql_free_result(result); }
};
using ResultPtr = std::unique_ptr<MYSQL_RES, ResultDeleter>;

// The client's errors that mean the connection is gone (or never came): reconnect.
bool IsConnectionError(unsigned error) {
  switch (error) {
    case CR_CONNECTION_ERROR:
    case CR_CONN_HOST_ERROR:
    case CR_IPSOCK_ERROR:
    case CR_UNKNOWN_HOST:
    case CR_SERVER_GONE_ERROR:
    case CR_SERVER_LOST:
    case CR_SERVER_HANDSHAKE_ERR:
    case CR_SERVER_LOST_EXTENDED:
    case CR_ERR_NET_READ:
    case CR_ERR_NET_WRITE:
    case ER_CONNECTION_KILLED:
    case ER_SERVER_SHUTDOWN:
    case ER_NET_READ_ERROR:
    case ER_NET_READ_INTERRUPTED:
    case ER_NET_ERROR_ON_WRITE:
    case ER_NET_WRITE_INTERRUPTED:
      return true;
    default:
      return false;
  }
}

unsigned Seconds(std::chrono::milliseconds duration) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, (duration.count() + 999) / 1000));
}

std::string SessionSql(std::chrono::milliseconds deadline) {
  // Strict: a value that does not fit is an error, never silently cut. UTC: DATETIME columns hold
  // UTC_TIMESTAMP values, and NOW() must agree with them.
  std::string sql =
      "SET SESSION time_zone = '+00:00', "
      "sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'";
  if (deadline.count() > 0) {
    // The server gives up a statement at the deadline (max_statement_time, fractional seconds) and
    // a lock wait before it (whole seconds), so that the client's read timeout, a little later,
    // only ever fires for a server that does not answer.
    const auto seconds = static_cast<double>(deadline.count()) / 1000.0;
    sql += ", max_statement_time = " + std::to_string(seconds) +
           ", innodb_lock_wait_timeout = " + std::to_string(Seconds(deadline)) +
           ", lock_wait_timeout = " + std::to_string(Seconds(deadline));
  }
  return sql;
}

[[noreturn]] void ThrowOn(MYSQL* conn, std::string_view what, bool commits) {
  const unsigned error = mysql_errno(conn);
  FailureKind kind = KindOfError(error);
  if (commits && IsConnectionError(error)) kind = FailureKind::kOutcomeUnknown;
  throw MariaDbError(kind, std::string{what} + ": " + mysql_error(conn), error,
                     mysql_sqlstate(conn));
}

[[noreturn]] void ThrowOnStatement(MYSQL_STMT* stmt, std::string_view what, bool commits) {
  const unsigned error = mysql_stmt_errno(stmt);
  FailureKind kind = KindOfError(error);
  if (commits && IsConnectionError(error)) kind = FailureKind::kOutcomeUnknown;
  throw MariaDbError(kind, std::string{what} + ": " + mysql_stmt_error(stmt), error,
                     mysql_stmt_sqlstate(stmt));
}

// Binds `params`, executes `stmt` and reads every result set. `commits`: whether a lost reply
// leaves the outcome unknown (an autocommitted statement).
StatementResult RunStatement(MYSQL_STMT* stmt, std::string_view what, std::span<const Value> params,
                             bool commits) {
  const auto expected = mysql_stmt_param_count(stmt);
  if (expected != params.size()) {
    throw std::logic_error(std::string{what} + ": " + std::to_string(params.size()) +
                           " parameters for " + std::to_string(expected) + " placeholders");
  }
  std::vector<MYSQL_BIND> binds(params.size());
  std::vector<unsigned long> lengths(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    MYSQL_BIND& bind = binds[i];
    std::visit(
        [&](const auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, std::monostate>) {
            bind.buffer_type = MYSQL_TYPE_NULL;
          } else if constexpr (std::is_same_v<T, std::int64_t>) {
            bind.buffer_type = MYSQL_TYPE_LONGLONG;
            bind.buffer = const_cast<std::int64_t*>(&value);  // NOLINT: the API is not const
          } else if constexpr (std::is_same_v<T, double>) {
            bind.buffer_type = MYSQL_TYPE_DOUBLE;
            bind.buffer = const_cast<double*>(&value);  // NOLINT
          } else if constexpr (std::is_same_v<T, std::string>) {
            bind.buffer_type = MYSQL_TYPE_STRING;
            bind.buffer = const_cast<char*>(value.data());  // NOLINT
            lengths[i] = value.size();
            bind.buffer_length = value.size();
            bind.length = &lengths[i];
          } else {
            bind.buffer_type = MYSQL_TYPE_BLOB;
            bind.buffer = const_cast<char*>(value.data.data());  // NOLINT
            lengths[i] = value.data.size();
            bind.buffer_length = value.data.size();
            bind.length = &lengths[i];
          }
        },
        params[i]);
  }
  if (!binds.empty() && mysql_stmt_bind_param(stmt, binds.data()) != 0) {
    ThrowOnStatement(stmt, what, false);
  }
  if (mysql_stmt_execute(stmt) != 0) ThrowOnStatement(stmt, what, commits);

  StatementResult out;
  while (true) {
    const unsigned fields = mysql_stmt_field_count(stmt);
    if (fields > 0) {
      if (mysql_stmt_store_result(stmt) != 0) ThrowOnStatement(stmt, what, commits);
      ResultPtr meta{mysql_stmt_result_metadata(stmt)};
      if (!meta) ThrowOnStatement(stmt, what, commits);
      const MYSQL_FIELD* field = mysql_fetch_fields(meta.get());
      ResultSet set;
      set.columns.reserve(fields);
      std::vector<MYSQL_BIND> out_binds(fields);
      std::vector<std::string> buffers(fields);
      std::vector<unsigned long> out_lengths(fields);
      std::vector<my_bool> nulls(fields);
      for (unsigned i = 0; i < fields; ++i) {
        set.columns.emplace_back(field[i].name, field[i].name_length);
        buffers[i].resize(std::max<unsigned long>(field[i].max_length, 64));
        MYSQL_BIND& bind = out_binds[i];
        bind.buffer_type = MYSQL_TYPE_STRING;
        bind.buffer = buffers[i].data();
        bind.buffer_length = buffers[i].size();
        bind.length = &out_lengths[i];
        bind.is_null = &nulls[i];
      }
      if (mysql_stmt_bind_result(stmt, out_binds.data()) != 0) {
        ThrowOnStatement(stmt, what, commits);
      }
      while (true) {
        const int status = mysql_stmt_fetch(stmt);
        if (status == MYSQL_NO_DATA) break;
        if (status == 1) ThrowOnStatement(stmt, what, commits);
        auto& row = set.rows.emplace_back(fields);
        for (unsigned i = 0; i < fields; ++i) {
          if (nulls[i] != 0) continue;
          if (out_lengths[i] <= buffers[i].size()) {
            row[i].emplace(buffers[i].data(), out_lengths[i]);
            continue;
          }
          // Longer than max_length promised (a converted type): fetch it whole.
          std::string whole(out_lengths[i], '\0');
          MYSQL_BIND column{};
          column.buffer_type = MYSQL_TYPE_STRING;
          column.buffer = whole.data();
          column.buffer_length = whole.size();
          if (mysql_stmt_fetch_column(stmt, &column, i, 0) != 0) {
            ThrowOnStatement(stmt, what, commits);
          }
          row[i] = std::move(whole);
        }
      }
      out.sets.push_back(std::move(set));
      mysql_stmt_free_result(stmt);
    } else {
      out.affected_rows = static_cast<std::int64_t>(mysql_stmt_affected_rows(stmt));
    }
    const int next = mysql_stmt_next_result(stmt);
    if (next == -1) break;
    if (next > 0) ThrowOnStatement(stmt, what, commits);
  }
  return out;
}

StmtPtr Prepare(MYSQL* conn, std::string_view what, const std::string& sql) {
  StmtPtr stmt{mysql_stmt_init(conn)};
  if (!stmt) ThrowOn(conn, what, false);
  const my_bool update_max_length = 1;
  mysql_stmt_attr_set(stmt.get(), STMT_ATTR_UPDATE_MAX_LENGTH, &update_max_length);
  if (mysql_stmt_prepare(stmt.get(), sql.data(), sql.size()) != 0) {
    ThrowOnStatement(stmt.get(), what, false);
  }
  return stmt;
}

}  // namespace

FailureKind KindOfError(unsigned error) {
  if (IsConnectionError(error)) return FailureKind::kUnavailable;
  switch (error) {
    case ER_LOCK_DEADLOCK:
    case ER_LOCK_WAIT_TIMEOUT:
    case ER_CON_COUNT_ERROR:
    case ER_TOO_MANY_USER_CONNECTIONS:
    case ER_STATEMENT_TIMEOUT:
    case ER_QUERY_INTERRUPTED:
    case ER_SERVER_SHUTDOWN:
    case ER_OPTION_PREVENTS_STATEMENT:  // read_only: a failover's old primary
      return FailureKind::kUnavailable;
    default:
      return FailureKind::kPermanent;
  }
}

Url ParseUrl(std::string_view text) {
  Url url;
  std::string_view rest = text;
  if (rest.starts_with("mariadb://")) {
    rest.remove_prefix(10);
  } else if (rest.starts_with("mysql://")) {
    rest.remove_prefix(8);
  } else {
    throw std::invalid_argument("the URL must start with mariadb:// or mysql://");
  }
  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  std::string_view path;
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  const auto decode = [](std::string_view part, const char* what) {
    auto decoded = PercentDecode(part);
    if (!decoded) throw std::invalid_argument(std::string{"bad percent-encoding in the "} + what);
    return *decoded;
  };
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const auto userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = userinfo.find(':');
    url.user = decode(userinfo.substr(0, colon), "user name");
    if (colon != std::string_view::npos) {
      url.password = decode(userinfo.substr(colon + 1), "password");
    }
  }
  if (rest.starts_with('[')) {  // [::1]:3306
    const auto close = rest.find(']');
    if (close == std::string_view::npos) throw std::invalid_argument("unclosed [ in the host");
    url.host = std::string{rest.substr(1, close - 1)};
    rest.remove_prefix(close + 1);
    if (!rest.empty() && !rest.starts_with(':')) {
      throw std::invalid_argument("expected :port after the host");
    }
    if (!rest.empty()) rest.remove_prefix(1);
  } else if (const auto colon = rest.rfind(':'); colon != std::string_view::npos) {
    if (colon > 0) url.host = std::string{rest.substr(0, colon)};
    rest.remove_prefix(colon + 1);
  } else {
    if (!rest.empty()) url.host = std::string{rest};
    rest = {};
  }
  if (!rest.empty()) {
    unsigned port = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), port);
    if (ec != std::errc{} || end != rest.data() + rest.size() || port == 0 || port > 65535) {
      throw std::invalid_argument("bad port '" + std::string{rest} + "' (1..65535)");
    }
    url.port = port;
  }
  url.database = decode(path, "database name");
  while (!query.empty()) {
    const auto amp = query.find('&');
    const auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    const std::string key{pair.substr(0, eq)};
    const std::string value =
        eq == std::string_view::npos ? std::string{} : decode(pair.substr(eq + 1), "URL option");
    if (key == "connect_timeout") {
      unsigned seconds = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
      if (ec != std::errc{} || end != value.data() + value.size() || seconds == 0) {
        throw std::invalid_argument("connect_timeout must be a positive number of seconds");
      }
      url.connect_timeout_seconds = seconds;
    } else if (key == "ssl_mode") {
      if (value != "disabled" && value != "preferred" && value != "required" &&
          value != "verify_ca" && value != "verify_identity") {
        throw std::invalid_argument(
            "ssl_mode must be disabled, preferred, required, verify_ca or "
            "verify_identity, not '" +
            value + "'");
      }
      url.ssl_mode = value;
    } else if (key == "ssl_ca") {
      url.ssl_ca = value;
    } else if (key == "unix_socket") {
      url.unix_socket = value;
    } else {
      throw std::invalid_argument("unknown URL option '" + key +
                                  "' (known: connect_timeout, ssl_mode, ssl_ca, unix_socket)");
    }
  }
  return url;
}

std::string DescribeUrl(const Url& url) {
  std::string out = url.unix_socket.empty() ? url.host + ":" + std::to_string(url.port)
                                            : "socket " + url.unix_socket;
  if (!url.database.empty()) out += "/" + url.database;
  if (!url.user.empty()) out += " user " + url.user;
  return out;
}

void CheckConnectionOptions(const std::string& url, const std::string& schema,
                            std::chrono::milliseconds statement_deadline) {
  if (url.empty()) throw ConfigError("url", "must not be empty");
  try {
    ParseUrl(url);
  } catch (const std::invalid_argument& error) {
    throw ConfigError("url", error.what());
  }
  try {
    QuoteSchema(schema);
  } catch (const std::invalid_argument& error) {
    throw ConfigError("schema", error.what());
  }
  if (statement_deadline.count() < 1) throw ConfigError("statement_deadline", "must be positive");
}

std::string QuoteSchema(const std::string& name) {
  const bool plain = !name.empty() && name.size() <= 64 &&
                     (std::isalpha(static_cast<unsigned char>(name[0])) != 0 || name[0] == '_') &&
                     std::all_of(name.begin(), name.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
                     });
  if (!plain) {
    throw std::invalid_argument("schema '" + name +
                                "' is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 "
                                "bytes)");
  }
  return "`" + name + "`";
}

std::size_t ResultSet::Column(std::string_view name) const {
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] == name) return i;
  }
  throw MariaDbError(FailureKind::kPermanent, "no column " + std::string{name} + " in the result",
                     0, "HY000");
}

std::int64_t ToInt64(const std::optional<std::string>& text, std::string_view what) {
  std::int64_t value = 0;
  if (text) {
    const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
    if (ec == std::errc{} && end == text->data() + text->size()) return value;
  }
  throw MariaDbError(FailureKind::kPermanent,
                     std::string{what} + ": not an integer: '" + text.value_or("NULL") + "'", 0,
                     "HY000");
}

TimePoint ToTime(const std::optional<std::string>& text, std::string_view what) {
  // YYYY-MM-DD HH:MM:SS[.ffffff]
  const auto fail = [&]() -> TimePoint {
    throw MariaDbError(FailureKind::kPermanent,
                       std::string{what} + ": not a DATETIME: '" + text.value_or("NULL") + "'", 0,
                       "HY000");
  };
  if (!text || text->size() < 19) return fail();
  const std::string& s = *text;
  const auto number = [&](std::size_t at, std::size_t width) {
    int value = 0;
    const auto [end, ec] = std::from_chars(s.data() + at, s.data() + at + width, value);
    if (ec != std::errc{} || end != s.data() + at + width) fail();
    return value;
  };
  if (s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':') return fail();
  const std::chrono::year_month_day date{std::chrono::year{number(0, 4)},
                                         std::chrono::month{static_cast<unsigned>(number(5, 2))},
                                         std::chrono::day{static_cast<unsigned>(number(8, 2))}};
  if (!date.ok()) return fail();
  auto time = std::chrono::sys_days{date} + std::chrono::hours{number(11, 2)} +
              std::chrono::minutes{number(14, 2)} + std::chrono::seconds{number(17, 2)};
  std::chrono::microseconds fraction{0};
  if (s.size() > 19) {
    if (s[19] != '.' || s.size() > 26 || s.size() == 20) return fail();
    const std::size_t digits = s.size() - 20;
    int value = number(20, digits);
    for (std::size_t i = digits; i < 6; ++i) value *= 10;
    fraction = std::chrono::microseconds{value};
  }
  return std::chrono::time_point_cast<TimePoint::duration>(time + fraction);
}

MessageId ToId(const std::optional<std::string>& bytes, std::string_view what) {
  if (!bytes || bytes->size() != 16) {
    throw MariaDbError(FailureKind::kPermanent, std::string{what} + ": not a 16-byte id", 0,
                       "HY000");
  }
  Uuid::Bytes raw{};
  std::memcpy(raw.data(), bytes->data(), 16);
  return Uuid{raw};
}

Bytes IdBytes(const MessageId& id) {
  return Bytes{std::string(reinterpret_cast<const char*>(id.bytes().data()), 16)};  // NOLINT
}

std::string TimeText(TimePoint time) {
  const auto micros = std::chrono::time_point_cast<std::chrono::microseconds>(time);
  const auto days = std::chrono::floor<std::chrono::days>(micros);
  const std::chrono::year_month_day date{days};
  const std::chrono::hh_mm_ss clock{micros - days};
  char text[40];
  std::snprintf(text, sizeof text, "%04d-%02u-%02u %02d:%02d:%02d.%06lld",
                static_cast<int>(date.year()), static_cast<unsigned>(date.month()),
                static_cast<unsigned>(date.day()), static_cast<int>(clock.hours().count()),
                static_cast<int>(clock.minutes().count()),
                static_cast<int>(clock.seconds().count()),
                static_cast<long long>(clock.subseconds().count()));
  return text;
}

Connection::Connection(std::string url, std::chrono::milliseconds deadline, std::string session_sql)
    : url_text_(std::move(url)), deadline_(deadline), session_sql_(std::move(session_sql)) {
  try {
    url_ = ParseUrl(url_text_);
  } catch (const std::invalid_argument& e) {
    throw MariaDbError(FailureKind::kPermanent, std::string{"bad MariaDB URL: "} + e.what(), 0,
                       "HY000");
  }
  description_ = DescribeUrl(url_);
  Connect();
}

void Connection::Connect() {
  statements_.clear();
  conn_.reset();
  MysqlPtr conn{mysql_init(nullptr)};
  if (!conn) throw MariaDbError(FailureKind::kUnavailable, "out of memory", 0, "HY000");
  const unsigned connect_timeout =
      url_.connect_timeout_seconds.value_or(deadline_.count() > 0 ? Seconds(deadline_) : 10);
  mysql_options(conn.get(), MYSQL_OPT_CONNECT_TIMEOUT, &connect_timeout);
  if (deadline_.count() > 0) {
    // A second past the server's own bound (max_statement_time), so that a busy server answers
    // with its error first and only a silent one is given up by the client.
    const unsigned io_timeout = Seconds(deadline_) + 1;
    mysql_options(conn.get(), MYSQL_OPT_READ_TIMEOUT, &io_timeout);
    mysql_options(conn.get(), MYSQL_OPT_WRITE_TIMEOUT, &io_timeout);
  }
  mysql_options(conn.get(), MYSQL_SET_CHARSET_NAME, "utf8mb4");
  const my_bool no_reconnect = 0;  // reconnects are ours: prepared statements die with a session
  mysql_options(conn.get(), MYSQL_OPT_RECONNECT, &no_reconnect);
  if (url_.ssl_mode == "disabled") {
    const my_bool off = 0;
    mysql_options(conn.get(), MYSQL_OPT_SSL_ENFORCE, &off);
  } else if (url_.ssl_mode == "required" || url_.ssl_mode == "verify_ca" ||
             url_.ssl_mode == "verify_identity") {
    const my_bool on = 1;
    mysql_options(conn.get(), MYSQL_OPT_SSL_ENFORCE, &on);
    const my_bool verify = url_.ssl_mode == "required" ? 0 : 1;
    mysql_options(conn.get(), MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify);
  }
  if (!url_.ssl_ca.empty()) mysql_options(conn.get(), MYSQL_OPT_SSL_CA, url_.ssl_ca.c_str());
  const unsigned long flags = CLIENT_MULTI_RESULTS | CLIENT_FOUND_ROWS;
  if (mysql_real_connect(
          conn.get(), url_.unix_socket.empty() ? url_.host.c_str() : nullptr, url_.user.c_str(),
          url_.password.c_str(), url_.database.empty() ? nullptr : url_.database.c_str(), url_.port,
          url_.unix_socket.empty() ? nullptr : url_.unix_socket.c_str(), flags) == nullptr) {
    throw MariaDbError(
        FailureKind::kUnavailable,
        "cannot connect to MariaDB at " + description_ + ": " + mysql_error(conn.get()),
        mysql_errno(conn.get()), mysql_sqlstate(conn.get()));
  }
  conn_ = std::move(conn);
  session_id_ = mysql_thread_id(conn_.get());
  try {
    ExecuteOn(conn_.get(), "session settings", SessionSql(deadline_));
    ExecuteOn(conn_.get(), "session settings",
              "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    if (!session_sql_.empty()) ExecuteOn(conn_.get(), "session settings", session_sql_);
  } catch (const MariaDbError& e) {
    conn_.reset();
    throw MariaDbError(FailureKind::kUnavailable, e.what(), e.error(), e.sqlstate());
  }
}

void Connection::EndStaleSessions() {
  if (stale_sessions_.empty()) return;
  // KILL CONNECTION closes the session's socket; a statement of it still in the network then
  // reaches nothing. KILL of one's own sessions needs no privilege.
  for (const unsigned long id : stale_sessions_) {
    const std::string kill = "KILL CONNECTION " + std::to_string(id);
    if (mysql_real_query(conn_.get(), kill.data(), kill.size()) != 0 &&
        mysql_errno(conn_.get()) != ER_NO_SUCH_THREAD) {
      ThrowOn(conn_.get(), "end the lost session", false);
    }
  }
  // Wait (bounded) until they are gone from the process list.
  const auto until =
      std::chrono::steady_clock::now() +
      std::min<std::chrono::milliseconds>(
          deadline_.count() > 0 ? deadline_ : std::chrono::seconds{5}, std::chrono::seconds{5});
  std::string ids;
  for (const unsigned long id : stale_sessions_) {
    ids += (ids.empty() ? "" : ",") + std::to_string(id);
  }
  while (true) {
    const auto result =
        RunOn(conn_.get(), "wait for the lost session to end",
              "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN (" + ids + ")");
    if (ToInt64(result.sets.at(0).rows.at(0).at(0), "sessions") == 0) break;
    if (std::chrono::steady_clock::now() >= until) {
      conn_.reset();
      throw MariaDbError(FailureKind::kUnavailable,
                         "a lost session (" + ids + ") is still running on " + description_, 0,
                         "HY000");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{20});
  }
  stale_sessions_.clear();
}

MYSQL* Connection::Ready() {
  if (!conn_) {
    Connect();
    try {
      EndStaleSessions();
    } catch (...) {
      MarkLost();  // and listed again: the next Ready tries once more
      throw;
    }
  }
  return conn_.get();
}

void Connection::Close() {
  statements_.clear();
  conn_.reset();
}

void Connection::MarkLost() {
  if (session_id_ != 0) stale_sessions_.push_back(session_id_);
  session_id_ = 0;
  statements_.clear();
  conn_.reset();
}

void Connection::Fail(std::string_view what, unsigned error, const char* sqlstate,
                      const char* message, bool commits) {
  FailureKind kind = KindOfError(error);
  std::string text = std::string{what} + ": " + message;
  std::string state = sqlstate;
  if (IsConnectionError(error)) {
    if (commits) kind = FailureKind::kOutcomeUnknown;
    MarkLost();  // conn_'s message and SQLSTATE were copied above
  }
  throw MariaDbError(kind, text, error, state);
}

StatementResult Connection::Run(std::string_view what, const std::string& sql,
                                std::span<const Value> params) {
  MYSQL* conn = Ready();
  // Outside a transaction the statement commits itself: a lost reply leaves its outcome unknown.
  const bool commits = !InTransaction(conn);
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    StmtPtr stmt{mysql_stmt_init(conn)};
    if (!stmt) Fail(what, mysql_errno(conn), mysql_sqlstate(conn), mysql_error(conn), false);
    const my_bool update_max_length = 1;
    mysql_stmt_attr_set(stmt.get(), STMT_ATTR_UPDATE_MAX_LENGTH, &update_max_length);
    if (mysql_stmt_prepare(stmt.get(), sql.data(), sql.size()) != 0) {
      Fail(what, mysql_stmt_errno(stmt.get()), mysql_stmt_sqlstate(stmt.get()),
           mysql_stmt_error(stmt.get()), false);
    }
    it = statements_.emplace(sql, std::move(stmt)).first;
  }
  try {
    return RunStatement(it->second.get(), what, params, commits);
  } catch (const MariaDbError& e) {
    if (IsConnectionError(e.error())) {
      MarkLost();
    } else {
      mysql_stmt_free_result(it->second.get());
      mysql_stmt_reset(it->second.get());
    }
    throw;
  }
}

void Connection::Execute(std::string_view what, const std::string& sql, bool commits) {
  MYSQL* conn = Ready();
  if (mysql_real_query(conn, sql.data(), sql.size()) != 0) {
    Fail(what, mysql_errno(conn), mysql_sqlstate(conn), mysql_error(conn), commits);
  }
  // Drain whatever results came (none are expected).
  do {
    ResultPtr result{mysql_store_result(conn)};
  } while (mysql_next_result(conn) == 0);
  if (mysql_errno(conn) != 0) {
    Fail(what, mysql_errno(conn), mysql_sqlstate(conn), mysql_error(conn), commits);
  }
}

bool InTransaction(MYSQL* conn) {
  unsigned int status = 0;
  mariadb_get_infov(conn, MARIADB_CONNECTION_SERVER_STATUS, &status);
  return (status & SERVER_STATUS_IN_TRANS) != 0 || (status & SERVER_STATUS_AUTOCOMMIT) == 0;
}

void ExecuteOn(MYSQL* conn, std::string_view what, const std::string& sql) {
  if (mysql_real_query(conn, sql.data(), sql.size()) != 0) ThrowOn(conn, what, false);
  do {
    ResultPtr result{mysql_store_result(conn)};
  } while (mysql_next_result(conn) == 0);
  if (mysql_errno(conn) != 0) ThrowOn(conn, what, false);
}

StatementResult RunOn(MYSQL* conn, std::string_view what, const std::string& sql,
                      std::span<const Value> params) {
  const StmtPtr stmt = Prepare(conn, what, sql);
  return RunStatement(stmt.get(), what, params, !InTransaction(conn));
}

}  // namespace outbox::mariadb
