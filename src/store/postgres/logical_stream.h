#pragma once
// LogicalStream: the reading half of WAL mode (outbox/store/wal.h). It streams a logical
// replication slot over libpq's replication protocol with the built-in pgoutput plugin
// (proto_version 1, messages 'true') and returns, one committed transaction at a time, the
// contents of its transactional logical messages that carry exactly our prefix. Decoding those
// contents is DecodeWalRecord's (wal_record.h).
//
// Feedback: every standby status update reports write = flush = apply = the highest position
// given to Confirm (or the slot's own confirmed_flush_lsn when higher), never a position only
// received: the slot lets WAL go only once the caller says it is durable. A confirmed position
// past Received() is held back until the stream gets there. Updates go out at least
// every `status_interval` while Next runs, and at once when a keepalive asks for a reply.
//
// A connection that dies silently (a network cut, a host gone) is noticed: after half the
// silence limit without a byte from the server, a status update asks for a reply; after the whole
// limit Next throws kUnavailable. A live walsender answers at once, or within its
// wal_sender_timeout / 2 when busy, so the default limit is that timeout plus 5 s, or the statement
// deadline (StatementDeadline(), database.statement_deadline) when that is shorter.
//
// Threading: one thread calls Start, Next and Close; Confirm and Received may be called from any
// thread.
//
// Errors (StoreError): kUnavailable when the server cannot be reached, the stream breaks or goes
// silent (call Start again), or the slot is in use by another process; kPermanent when the slot or
// the publication does not exist, or the server sends data that is not valid pgoutput. After an
// error from Next the stream is closed. std::invalid_argument for bad constructor arguments.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/store/postgres_libpq.h"
#include "outbox/store/wal.h"

namespace outbox::postgres {

// One committed transaction's messages with our prefix.
struct DecodedCommit {
  Lsn end_lsn = 0;  // the end of its commit record (pgoutput Commit's end LSN)
  TimePoint commit_time;
  std::vector<std::string> contents;  // in the order the writer emitted them
};

// One pgoutput message (protocol 1, not streaming), as LogicalStream reads it.
struct PgoutputMessage {
  enum class Type : std::uint8_t {
    kBegin,
    kMessage,
    kCommit,
    kOther,  // Origin, Relation, Type, Insert, Update, Delete, Truncate: not ours
  };
  Type type = Type::kOther;
  Lsn lsn = 0;      // kBegin: the final LSN (its commit's); kMessage: its LSN; kCommit: its LSN
  Lsn end_lsn = 0;  // kCommit: the end of the commit record
  TimePoint commit_time;       // kBegin, kCommit
  bool transactional = false;  // kMessage
  std::string_view prefix;     // kMessage: views into the parsed bytes
  std::string_view content;
};

// Parses one pgoutput message; std::invalid_argument saying what is malformed (truncated, a
// negative length, bytes left over, an unknown type or flag). Never reads past `data`.
PgoutputMessage ParsePgoutput(std::string_view data);

struct LogicalStreamTiming {
  std::chrono::milliseconds status_interval{1000};  // between status updates
  // 0: the server's wal_sender_timeout + 5 s, or no limit when the server has none.
  std::chrono::milliseconds silence_limit{0};
};

class LogicalStream {
 public:
  // `conninfo`: a libpq connection string or URI (replication=database is added). `slot` and
  // `publication`: plain lower-case names ([a-z0-9_], at most 63 bytes); `prefix`: not empty, no
  // NUL. Does not connect.
  LogicalStream(std::string conninfo, std::string slot, std::string publication, std::string prefix,
                LogicalStreamTiming timing = {});
  LogicalStream(const LogicalStream&) = delete;
  LogicalStream& operator=(const LogicalStream&) = delete;
  ~LogicalStream();  // Close(), never throws

  // (Re)connects and starts streaming; transactions whose commit ends at or before `after` are
  // skipped. Received() starts again from `after`.
  void Start(Lsn after);

  // The next transaction with at least one of our messages, waiting at most `timeout` overall;
  // nullopt when none came in time (a transaction half received is kept for the next call).
  // What has already arrived is read even past the timeout (up to 1024 protocol messages), so a
  // zero timeout returns a transaction that is already on the socket.
  std::optional<DecodedCommit> Next(std::chrono::milliseconds timeout);

  // Everything up to `lsn` is durable elsewhere; never moves back. Reported to the server by the
  // next status update (within status_interval while Next runs, or by Close).
  void Confirm(Lsn lsn);

  // The server's WAL end from its latest keepalive or the end of the last commit received,
  // whichever is later, never a position inside a transaction still being received.
  [[nodiscard]] Lsn Received() const { return received_.load(std::memory_order_acquire); }

  // Sends the last status update, ends the stream (CopyDone, waiting up to a second for the
  // server's answer) and disconnects. Never throws.
  void Close() noexcept;

  // Non-transactional messages with our prefix seen and ignored (outbox.enqueue emits none).
  [[nodiscard]] std::uint64_t IgnoredNonTransactional() const { return ignored_non_transactional_; }

  // `replication slot "s" on host=... port=...` (no password), for messages and logs.
  [[nodiscard]] const std::string& description() const { return description_; }

 private:
  struct Pending {  // the transaction being received: from Begin until its Commit
    Lsn final_lsn = 0;
    std::vector<std::string> contents;
  };

  // Closes the connection (no goodbye: it is broken or out of step) and throws PgError.
  [[noreturn]] void Fail(FailureKind kind, const std::string& message,
                         const std::string& sqlstate = {});
  // Fail with the server's error, or libpq's reason for a broken connection.
  [[noreturn]] void FailFromConnection(std::string_view what);
  [[nodiscard]] std::string SlotGone() const;
  void CheckSlot();
  // Runs `sql` (simple protocol) on the walsender connection within the deadline; after it the
  // stream is closed and PgError(kUnavailable) thrown. The caller checks the result's status.
  ResultPtr Query(const std::string& sql, std::string_view what);
  // Handles one CopyData message; a commit to return, if it completes one. Throws
  // std::invalid_argument for malformed data.
  std::optional<DecodedCommit> Handle(std::string_view message);
  std::optional<DecodedCommit> HandleLogical(const PgoutputMessage& message);
  // Sends a status update when due (or `force`); `ping` asks the server to answer at once.
  void SendStatus(bool force, bool ping = false);
  // The flush position to report: confirmed, but never past what was received.
  [[nodiscard]] Lsn Reportable() const;
  // Waits until the socket is readable, a status update or silence check is due, or `until`;
  // true when the server sent something.
  bool Wait(Deadline until);
  void CheckSilence();  // after a wait that brought nothing

  std::string conninfo_;
  std::string slot_;
  std::string publication_;
  std::string prefix_;
  LogicalStreamTiming timing_;
  std::chrono::milliseconds deadline_;          // StatementDeadline() when constructed; 0: none
  std::chrono::milliseconds silence_limit_{0};  // in effect for this stream; 0: none
  std::string server_;                          // DescribeConninfo: no password
  std::string description_;

  ConnPtr conn_;
  Lsn skip_until_ = 0;
  std::optional<Pending> pending_;
  Deadline next_status_{};
  Deadline last_heard_{};  // the last byte from the server
  bool pinged_ = false;    // a reply was asked for since then
  Lsn slot_flush_ = 0;     // the slot's confirmed_flush_lsn when this stream started
  Lsn sent_flush_ = 0;     // the flush position of the last status update
  std::atomic<Lsn> confirmed_{0};
  std::atomic<Lsn> received_{0};
  std::uint64_t ignored_non_transactional_ = 0;
};

}  // namespace outbox::postgres
