#include "logical_stream.h"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <stdexcept>
#include <utility>

#include "connection.h"

namespace outbox::postgres {
namespace {

using std::chrono::steady_clock;

constexpr std::chrono::milliseconds kCloseWait{1000};
// Past its timeout, Next still reads what has already arrived, up to this many protocol
// messages: a zero timeout then returns a transaction already on the socket (the relay gathers a
// batch that way), while one longer than that resumes in the next call.
constexpr int kMostMessagesPastTimeout = 1024;
// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
constexpr std::int64_t kPostgresEpochMicros = 946684800LL * 1000000LL;

struct FreeMem {
  void operator()(char* bytes) const noexcept { PQfreemem(bytes); }
};
using CopyBuffer = std::unique_ptr<char, FreeMem>;

// Bounds-checked reads of one protocol message (integers big-endian); std::invalid_argument
// when it ends early.
class Reader {
 public:
  Reader(std::string_view data, std::string_view what) : data_(data), what_(what) {}

  const char* Take(std::size_t count, std::string_view field) {
    if (data_.size() - at_ < count) {
      throw std::invalid_argument(std::string{what_} + " message of " +
                                  std::to_string(data_.size()) + " bytes ends inside its " +
                                  std::string{field});
    }
    const char* bytes = data_.data() + at_;
    at_ += count;
    return bytes;
  }
  std::uint8_t Byte(std::string_view field) { return static_cast<std::uint8_t>(*Take(1, field)); }
  Lsn Position(std::string_view field) { return static_cast<Lsn>(ReadInt64(Take(8, field))); }
  std::int32_t Int32(std::string_view field) { return ReadInt32(Take(4, field)); }
  TimePoint Time(std::string_view field) { return ReadTimestamp(Take(8, field)); }
  std::string_view CString(std::string_view field) {
    const auto end = data_.find('\0', at_);
    if (end == std::string_view::npos) {
      throw std::invalid_argument(std::string{what_} + " message's " + std::string{field} +
                                  " has no terminating NUL");
    }
    const auto text = data_.substr(at_, end - at_);
    at_ = end + 1;
    return text;
  }
  void End() const {
    if (at_ != data_.size()) {
      throw std::invalid_argument(std::string{what_} + " message has " +
                                  std::to_string(data_.size() - at_) +
                                  " unexpected bytes at its end");
    }
  }

 private:
  std::string_view data_;
  std::string_view what_;
  std::size_t at_ = 0;
};

void PutInt64(std::string& out, std::size_t at, std::uint64_t value) {
  for (int i = 7; i >= 0; --i) {
    out[at + static_cast<std::size_t>(7 - i)] =
        static_cast<char>((value >> (8U * static_cast<unsigned>(i))) & 0xFFU);
  }
}

void RaiseTo(std::atomic<Lsn>& value, Lsn to) {
  Lsn current = value.load(std::memory_order_relaxed);
  while (current < to && !value.compare_exchange_weak(current, to, std::memory_order_acq_rel)) {
  }
}

void CheckName(std::string_view what, const std::string& name) {
  if (name.empty() || name.size() > 63 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    throw std::invalid_argument(std::string{what} + " name '" + name +
                                "' is not a plain lower-case name ([a-z0-9_], 1 to 63 bytes)");
  }
}

std::string ErrorField(const PGresult* result, int field) {
  const char* value = result != nullptr ? PQresultErrorField(result, field) : nullptr;
  return value != nullptr ? value : "";
}

// "123" from the server's "replication slot "s" is active for PID 123".
std::string PidIn(const std::string& message) {
  const auto at = message.find("PID ");
  if (at == std::string::npos) return "unknown";
  const auto digits = message.substr(at + 4);
  const auto end = digits.find_first_not_of("0123456789");
  const auto pid = digits.substr(0, end);
  return pid.empty() ? "unknown" : pid;
}

}  // namespace

PgoutputMessage ParsePgoutput(std::string_view data) {
  if (data.empty()) throw std::invalid_argument("empty pgoutput message");
  PgoutputMessage message;
  switch (data.front()) {
    case 'B': {  // final LSN, commit time, xid
      Reader reader{data, "Begin"};
      reader.Byte("type");
      message.type = PgoutputMessage::Type::kBegin;
      message.lsn = reader.Position("final LSN");
      message.commit_time = reader.Time("commit time");
      reader.Int32("xid");
      reader.End();
      return message;
    }
    case 'M': {  // flags, LSN, prefix, content length, content (no xid: not streaming)
      Reader reader{data, "Message"};
      reader.Byte("type");
      const std::uint8_t flags = reader.Byte("flags");
      if (flags > 1)
        throw std::invalid_argument("Message has unknown flags " + std::to_string(flags));
      message.type = PgoutputMessage::Type::kMessage;
      message.transactional = flags == 1;
      message.lsn = reader.Position("LSN");
      message.prefix = reader.CString("prefix");
      const std::int32_t size = reader.Int32("content length");
      if (size < 0) throw std::invalid_argument("Message has a negative content length");
      message.content = {reader.Take(static_cast<std::size_t>(size), "content"),
                         static_cast<std::size_t>(size)};
      reader.End();
      return message;
    }
    case 'C': {  // flags (unused), commit LSN, end LSN, commit time
      Reader reader{data, "Commit"};
      reader.Byte("type");
      reader.Byte("flags");
      message.type = PgoutputMessage::Type::kCommit;
      message.lsn = reader.Position("commit LSN");
      message.end_lsn = reader.Position("end LSN");
      message.commit_time = reader.Time("commit time");
      reader.End();
      if (message.end_lsn <= message.lsn) {
        throw std::invalid_argument("Commit at " + FormatLsn(message.lsn) + " ends at " +
                                    FormatLsn(message.end_lsn) + ", not after it");
      }
      return message;
    }
    // Origin, Relation, Type, Insert, Update, Delete, Truncate: changes of the publication's
    // tables. In protocol 1 each is one whole XLogData message, so skipping it is exact.
    case 'O':
    case 'R':
    case 'Y':
    case 'I':
    case 'U':
    case 'D':
    case 'T':
      return message;
    default:
      throw std::invalid_argument("unknown pgoutput message type " +
                                  std::to_string(static_cast<unsigned char>(data.front())));
  }
}

LogicalStream::LogicalStream(std::string conninfo, std::string slot, std::string publication,
                             std::string prefix, LogicalStreamTiming timing)
    : conninfo_(std::move(conninfo)),
      slot_(std::move(slot)),
      publication_(std::move(publication)),
      prefix_(std::move(prefix)),
      timing_(timing),
      deadline_(StatementDeadline()) {
  CheckName("replication slot", slot_);
  CheckName("publication", publication_);
  if (prefix_.empty() || prefix_.find('\0') != std::string::npos) {
    throw std::invalid_argument("logical message prefix must be non-empty text without NUL");
  }
  if (timing_.status_interval <= std::chrono::milliseconds{0} ||
      timing_.silence_limit < std::chrono::milliseconds{0}) {
    throw std::invalid_argument(
        "status update interval must be positive, and the silence limit not negative");
  }
  server_ = DescribeConninfo(conninfo_);
  if (server_.empty()) {
    // libpq's parse error may quote a password: say less.
    throw std::invalid_argument(
        "invalid PostgreSQL connection string (not shown: it may hold a password); expected a "
        "postgresql:// URI or key=value pairs");
  }
  description_ = "replication slot \"" + slot_ + "\" on " + server_;
}

LogicalStream::~LogicalStream() { Close(); }

void LogicalStream::Fail(FailureKind kind, const std::string& message,
                         const std::string& sqlstate) {
  conn_.reset();
  pending_.reset();
  throw PgError(kind, message, sqlstate);
}

void LogicalStream::FailFromConnection(std::string_view what) {
  std::string reason;
  std::string sqlstate;
  PGconn* conn = conn_.get();
  if (conn != nullptr) {
    PQconsumeInput(conn);
    // The server's ErrorResponse (a terminated walsender says why), when it is all here.
    if (PQisBusy(conn) == 0) {
      const ResultPtr result{PQgetResult(conn)};
      if (result && PQresultStatus(result.get()) == PGRES_FATAL_ERROR) {
        sqlstate = ErrorField(result.get(), PG_DIAG_SQLSTATE);
        reason = ErrorField(result.get(), PG_DIAG_MESSAGE_PRIMARY);
      } else if (result) {
        reason = "the server ended the replication stream";
      }
    }
    if (reason.empty()) reason = Trim(PQerrorMessage(conn));
  }
  if (reason.empty()) reason = "not connected (call Start)";
  std::string message = std::string{what} + " (" + description_ + "): " + reason;
  if (!sqlstate.empty()) message += " (SQLSTATE " + sqlstate + ")";
  // A broken connection has no SQLSTATE; a server error keeps its own class (a publication
  // dropped under the stream is not cured by reconnecting).
  Fail(sqlstate.empty() ? FailureKind::kUnavailable : KindOfSqlState(sqlstate), message, sqlstate);
}

void LogicalStream::Start(Lsn after) {
  Close();
  // The caller's conninfo over the silent-peer defaults (keepalives, tcp_user_timeout), then
  // replication=database over both. Its statements (the slot's check, START_REPLICATION) have the
  // deadline; the stream itself has the silence limit.
  conn_ = Connect(conninfo_, deadline_,
                  {{"replication", "database"}, {"fallback_application_name", "outbox-wal"}});
  if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) {
    const std::string reason = conn_ ? Trim(PQerrorMessage(conn_.get())) : "out of memory";
    Fail(FailureKind::kUnavailable,
         "cannot connect to PostgreSQL for " + description_ + ": " + reason);
  }
  CheckSlot();

  const std::string command = "START_REPLICATION SLOT \"" + slot_ + "\" LOGICAL " +
                              FormatLsn(after) + " (proto_version '1', publication_names '\"" +
                              publication_ + "\"', messages 'true')";
  const ResultPtr started = Query(command, "start streaming");
  if (PQresultStatus(started.get()) != PGRES_COPY_BOTH) {
    const std::string sqlstate = ErrorField(started.get(), PG_DIAG_SQLSTATE);
    const std::string primary = ErrorField(started.get(), PG_DIAG_MESSAGE_PRIMARY);
    if (sqlstate == "42704") Fail(FailureKind::kPermanent, SlotGone(), sqlstate);
    if (sqlstate == "55006") {
      Fail(FailureKind::kUnavailable,
           "replication slot \"" + slot_ + "\" is in use by another process (pid " +
               PidIn(primary) + ") on " + server_ +
               "; only one reader at a time (another relay holds it, or its old connection has "
               "not ended yet)",
           sqlstate);
    }
    FailFromConnection("cannot start streaming");
  }
  if (PQsetnonblocking(conn_.get(), 1) != 0) FailFromConnection("cannot start streaming");
  skip_until_ = after;
  received_.store(after, std::memory_order_release);
  pending_.reset();
  sent_flush_ = 0;
  next_status_ = steady_clock::now();  // tell the server our position at once
  last_heard_ = next_status_;
  pinged_ = false;
}

ResultPtr LogicalStream::Query(const std::string& sql, std::string_view what) {
  if (deadline_.count() <= 0) return ResultPtr{PQexec(conn_.get(), sql.c_str())};
  const auto until = steady_clock::now() + deadline_;
  if (PQsendQuery(conn_.get(), sql.c_str()) == 0) {
    FailFromConnection("cannot " + std::string{what});
  }
  ResultPtr kept;
  for (;;) {
    while (PQisBusy(conn_.get()) != 0) {
      if (!WaitSocket(conn_.get(), POLLIN, until)) {
        AbandonConnection(conn_.get());
        Fail(FailureKind::kUnavailable,
             "cannot " + std::string{what} + " (" + description_ + "): no answer within " +
                 std::to_string(deadline_.count()) +
                 " ms (database.statement_deadline); the connection is closed");
      }
      PQconsumeInput(conn_.get());
    }
    ResultPtr next{PQgetResult(conn_.get())};
    if (!next) break;
    const auto status = PQresultStatus(next.get());
    // START_REPLICATION's answer: the stream begins, nothing follows it.
    if (status == PGRES_COPY_BOTH) return next;
    if (!kept || PQresultStatus(kept.get()) != PGRES_FATAL_ERROR) kept = std::move(next);
    if (PQstatus(conn_.get()) == CONNECTION_BAD) break;
  }
  return kept;
}

std::string LogicalStream::SlotGone() const {
  return description_ +
         " does not exist: it was dropped, or never created. Outbox messages written in WAL mode "
         "since it went away may be lost. To recover: recreate it with `outboxctl migrate "
         "--wal-slot`, then check what was lost (messages committed after the relay's last "
         "confirmed position and before the new slot) and have their writers send them again";
}

void LogicalStream::CheckSlot() {
  // A walsender in database mode runs simple queries; names are checked, so quoting is safe.
  const std::string sql =
      "SELECT s.slot_type, s.plugin, s.database, current_database(), s.wal_status, "
      "s.confirmed_flush_lsn, EXISTS (SELECT FROM pg_publication WHERE pubname = '" +
      publication_ +
      "'), (SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout') FROM (VALUES (1)) "
      "one LEFT JOIN pg_replication_slots s ON s.slot_name = '" +
      slot_ + "'";
  const ResultPtr result = Query(sql, "look up the replication slot");
  if (PQresultStatus(result.get()) != PGRES_TUPLES_OK || PQntuples(result.get()) != 1) {
    FailFromConnection("cannot look up the replication slot");
  }
  const auto text = [&](int column) { return std::string{Column(result.get(), 0, column)}; };
  if (PQgetisnull(result.get(), 0, 0) != 0) Fail(FailureKind::kPermanent, SlotGone(), "42704");
  if (text(0) != "logical" || text(1) != "pgoutput") {
    Fail(FailureKind::kPermanent, description_ + " is a " + text(0) + " slot of plugin '" +
                                      text(1) +
                                      "', not a logical slot of pgoutput: recreate it with "
                                      "`outboxctl migrate --wal-slot`");
  }
  if (text(2) != text(3)) {
    Fail(FailureKind::kPermanent,
         description_ + " belongs to database '" + text(2) + "', not '" + text(3) + "'");
  }
  if (text(4) == "lost") {
    Fail(FailureKind::kPermanent,
         description_ +
             " has lost WAL it needs (wal_status lost: more WAL than "
             "max_slot_wal_keep_size was kept for it). Outbox messages written in WAL "
             "mode since its confirmed position may be lost. To recover: drop it, "
             "recreate it with `outboxctl migrate --wal-slot`, then check what was lost");
  }
  if (text(6) != "t") {
    Fail(FailureKind::kPermanent, "publication \"" + publication_ + "\" for " + description_ +
                                      " does not exist: create it with `outboxctl migrate "
                                      "--wal-slot`");
  }
  // Reporting the slot's own position back moves nothing, and never reports less than it.
  slot_flush_ = ParseLsn(text(5)).value_or(0);
  RaiseTo(confirmed_, slot_flush_);
  silence_limit_ = timing_.silence_limit;
  if (silence_limit_.count() == 0) {
    const std::int64_t sender_timeout = ParseInt64(text(7), "wal_sender_timeout");  // ms
    if (sender_timeout > 0) silence_limit_ = std::chrono::milliseconds{sender_timeout + 5000};
    // A live walsender answers a status update that asks for a reply at once (it is read
    // between WAL records), so the statement deadline bounds a silent stream too: half of it
    // without a byte, a ping; the whole of it, the stream is presumed dead.
    if (deadline_.count() > 0 && (silence_limit_.count() == 0 || deadline_ < silence_limit_)) {
      silence_limit_ = deadline_;
    }
  }
}

void LogicalStream::Confirm(Lsn lsn) { RaiseTo(confirmed_, lsn); }

Lsn LogicalStream::Reportable() const {
  // A position past what this stream received cannot be durable elsewhere: a caller's slip there
  // would make the slot skip transactions for good, so it is held back until they arrive.
  return std::min(confirmed_.load(std::memory_order_acquire),
                  std::max(received_.load(std::memory_order_acquire), slot_flush_));
}

std::optional<DecodedCommit> LogicalStream::Next(std::chrono::milliseconds timeout) {
  if (!conn_) FailFromConnection("cannot read the replication stream");
  const Deadline until = steady_clock::now() + timeout;
  int past_timeout = 0;
  // Bounded: before `until` every wait ends by it; after it, only what is already readable is
  // taken, and at most kMostMessagesPastTimeout messages of it.
  for (;;) {
    SendStatus(false);
    char* raw = nullptr;
    const int length = PQgetCopyData(conn_.get(), &raw, 1);
    if (length > 0) {
      const CopyBuffer buffer{raw};
      last_heard_ = steady_clock::now();
      pinged_ = false;
      std::optional<DecodedCommit> commit;
      try {
        commit = Handle({buffer.get(), static_cast<std::size_t>(length)});
      } catch (const std::invalid_argument& error) {
        Fail(FailureKind::kPermanent,
             "malformed pgoutput data from " + description_ + ": " + error.what());
      }
      if (commit) return commit;
      if (steady_clock::now() >= until && ++past_timeout >= kMostMessagesPastTimeout) {
        return std::nullopt;
      }
      continue;
    }
    if (length == 0) {
      const bool heard = Wait(until);
      if (!heard && steady_clock::now() >= until) {
        CheckSilence();
        return std::nullopt;
      }
      if (PQconsumeInput(conn_.get()) == 0) {
        FailFromConnection("lost the replication stream");
      }
      if (!heard) CheckSilence();
      continue;
    }
    // -1: the server ended the stream; -2: the connection failed.
    FailFromConnection("lost the replication stream");
  }
}

std::optional<DecodedCommit> LogicalStream::Handle(std::string_view message) {
  Reader reader{message, "replication"};
  switch (reader.Byte("type")) {
    case 'w':  // XLogData: WAL start, WAL end, send time, then one pgoutput message
      reader.Take(24, "XLogData header");
      return HandleLogical(ParsePgoutput(message.substr(25)));
    case 'k': {  // primary keepalive: WAL end, send time, reply requested
      const Lsn wal_end = reader.Position("WAL end");
      reader.Take(8, "send time");
      const bool reply = reader.Byte("reply flag") != 0;
      // Inside a transaction its end is not known yet: a position past its start is not safe to
      // hand out as received.
      if (!pending_) RaiseTo(received_, wal_end);
      if (reply) SendStatus(true);
      return std::nullopt;
    }
    default:
      throw std::invalid_argument("unknown replication message type " +
                                  std::to_string(static_cast<unsigned char>(message[0])));
  }
}

std::optional<DecodedCommit> LogicalStream::HandleLogical(const PgoutputMessage& message) {
  using Type = PgoutputMessage::Type;
  switch (message.type) {
    case Type::kBegin:
      if (pending_) throw std::invalid_argument("Begin inside a transaction");
      pending_ = Pending{.final_lsn = message.lsn, .contents = {}};
      return std::nullopt;
    case Type::kMessage:
      if (!message.transactional) {
        if (message.prefix == prefix_) ++ignored_non_transactional_;
        return std::nullopt;
      }
      if (!pending_) throw std::invalid_argument("transactional Message outside a transaction");
      if (message.prefix == prefix_) pending_->contents.emplace_back(message.content);
      return std::nullopt;
    case Type::kCommit: {
      if (!pending_) throw std::invalid_argument("Commit without Begin");
      if (message.lsn != pending_->final_lsn) {
        throw std::invalid_argument("Commit at " + FormatLsn(message.lsn) +
                                    " does not match its Begin's final LSN " +
                                    FormatLsn(pending_->final_lsn));
      }
      Pending done = std::move(*pending_);
      pending_.reset();
      RaiseTo(received_, message.end_lsn);
      if (message.end_lsn <= skip_until_ || done.contents.empty()) return std::nullopt;
      return DecodedCommit{.end_lsn = message.end_lsn,
                           .commit_time = message.commit_time,
                           .contents = std::move(done.contents)};
    }
    case Type::kOther:
      return std::nullopt;
  }
  return std::nullopt;
}

void LogicalStream::SendStatus(bool force, bool ping) {
  const auto now = steady_clock::now();
  if (!force && now < next_status_) return;
  next_status_ = now + timing_.status_interval;
  const Lsn flush = Reportable();
  const auto clock = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count() -
                     kPostgresEpochMicros;
  std::string update(34, '\0');  // 'r', write, flush, apply, clock, reply requested
  update[0] = 'r';
  update[33] = ping ? '\1' : '\0';
  PutInt64(update, 1, flush);
  PutInt64(update, 9, flush);
  PutInt64(update, 17, flush);
  PutInt64(update, 25, static_cast<std::uint64_t>(clock));
  const int queued = PQputCopyData(conn_.get(), update.data(), static_cast<int>(update.size()));
  if (queued < 0) FailFromConnection("cannot send a status update");
  if (queued == 0) return;  // libpq's buffer is full: the next one will carry the position
  sent_flush_ = flush;
  if (PQflush(conn_.get()) < 0) FailFromConnection("cannot send a status update");
}

bool LogicalStream::Wait(Deadline until) {
  const auto now = steady_clock::now();
  auto wake = std::min(until, next_status_);
  if (silence_limit_.count() > 0) {
    wake = std::min(wake, last_heard_ + (pinged_ ? silence_limit_ : silence_limit_ / 2));
  }
  const auto wait =
      wake > now ? std::chrono::ceil<std::chrono::milliseconds>(wake - now).count() : 0;
  pollfd descriptor{};
  descriptor.fd = PQsocket(conn_.get());
  descriptor.events = POLLIN;
  const int unsent = PQflush(conn_.get());
  if (unsent < 0) FailFromConnection("cannot send a status update");
  if (unsent == 1) descriptor.events |= POLLOUT;
  // EINTR and errors fall through to PQconsumeInput, which reports a broken socket.
  const int ready = poll(&descriptor, 1, static_cast<int>(std::min<std::int64_t>(wait, 60000)));
  const bool heard = ready > 0 && (descriptor.revents & (POLLIN | POLLERR | POLLHUP)) != 0;
  if (heard) {
    last_heard_ = steady_clock::now();
    pinged_ = false;
  }
  return heard;
}

void LogicalStream::CheckSilence() {
  if (silence_limit_.count() == 0) return;
  const auto silent = steady_clock::now() - last_heard_;
  if (silent >= silence_limit_) {
    Fail(FailureKind::kUnavailable,
         "lost the replication stream (" + description_ + "): no answer from the server for " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
             " ms, even to a status update asking for one; the connection is presumed dead");
  }
  if (!pinged_ && silent >= silence_limit_ / 2) {
    SendStatus(true, true);
    pinged_ = true;
  }
}

void LogicalStream::Close() noexcept {
  if (!conn_) return;
  try {
    PGconn* conn = conn_.get();
    if (PQstatus(conn) == CONNECTION_OK && PQisnonblocking(conn) != 0) {
      if (Reportable() > sent_flush_) SendStatus(true);
      conn = conn_.get();
      if (conn != nullptr && PQputCopyEnd(conn, nullptr) == 1) {
        // Wait (bounded) for the server's CopyDone and the command's end: the walsender has then
        // released the slot, so a new stream can take it at once.
        const Deadline until = steady_clock::now() + kCloseWait;
        bool copy_done = false;
        while (steady_clock::now() < until) {
          const int unsent = PQflush(conn);
          if (unsent < 0) break;
          if (!copy_done) {
            char* raw = nullptr;
            const int length = PQgetCopyData(conn, &raw, 1);
            const CopyBuffer discarded{raw};
            if (length > 0) continue;
            if (length == -2) break;
            if (length == -1) {
              copy_done = true;
              continue;
            }
          } else if (PQisBusy(conn) == 0) {
            const ResultPtr result{PQgetResult(conn)};
            if (!result) break;
            continue;
          }
          const auto left =
              std::chrono::ceil<std::chrono::milliseconds>(until - steady_clock::now());
          pollfd descriptor{};
          descriptor.fd = PQsocket(conn);
          descriptor.events = static_cast<short>(POLLIN | (unsent == 1 ? POLLOUT : 0));
          poll(&descriptor, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
          if (PQconsumeInput(conn) == 0) break;
        }
      }
    }
  } catch (...) {  // NOLINT(bugprone-empty-catch): closing reports nothing
  }
  conn_.reset();
  pending_.reset();
}

}  // namespace outbox::postgres
