#pragma once
// WAL mode (README, "WAL mode"): a writer's messages travel in PostgreSQL's write-ahead log as
// transactional logical messages (pg_logical_emit_message, prefix "outbox"), decoded only if the
// writer commits, in commit order, instead of being rows of outbox.messages. Two contracts:
//
// - WalSource reads them back from a logical replication slot (built-in pgoutput plugin), one
//   committed transaction at a time, and tells the slot how far it may let the WAL go.
// - WalLedger keeps, in the database, what makes a restart exact: the position up to which every
//   message's fate is durable, the per-stream stream_seq counters as of that position (so that
//   decoding again from it assigns the same numbers), the messages parked in outbox.messages (a
//   sink rejected them, or an earlier message of their stream is parked), and the one relay that
//   may read the slot (a lease with an epoch, fenced like partition leases).
//
// Both are used by one thread at a time. Errors: StoreError (kUnavailable: reconnect and start
// again from WalLedger::Position), std::invalid_argument for bad arguments.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"

namespace outbox {

// A WAL position (PostgreSQL's pg_lsn), e.g. 0/16B3748 is 0x16B3748.
using Lsn = std::uint64_t;

// "X/Y" as PostgreSQL prints an LSN, and back; ParseLsn returns nullopt for anything else.
std::string FormatLsn(Lsn lsn);
std::optional<Lsn> ParseLsn(std::string_view text);

// One message decoded from its WAL record: every field the table row would hold except
// stream_seq, which the relay assigns in commit order (when `sequenced` and the message has a
// stream_key). envelope.lease_epoch and attempts are 0.
struct WalMessage {
  Envelope envelope;
  bool sequenced = false;
};

// One committed transaction's outbox messages, in the order its writer emitted them.
struct WalTransaction {
  Lsn end_lsn = 0;  // the end of its commit record: confirming it confirms the transaction
  TimePoint commit_time;
  std::vector<WalMessage> messages;
  // Records with the outbox prefix that could not be decoded (not written by outbox.enqueue, or
  // by a newer version): what is wrong with each. They are reported, never published.
  std::vector<std::string> undecodable;
  // The transaction changed a delivery mode (outbox.switch_delivery's record): numbers and
  // stream states read before it are out of date for the transactions after it.
  bool delivery_switched = false;
};

// What the server's WAL files still hold of a schema's messages once its slot is gone
// (WalSource::ReadWalFiles).
struct WalRecovery {
  // Committed transactions with outbox records that end after the position asked for and at or
  // before `until`, in commit order, as the slot would have given them.
  std::vector<WalTransaction> transactions;
  Lsn until = 0;  // read up to here: where a slot made again starts, or else the WAL flushed
  std::size_t open_messages = 0;  // records of transactions not ended by `until` (read later)
};

class WalSource {
 public:
  virtual ~WalSource() = default;

  // (Re)starts streaming from the slot; transactions whose commit ends at or before `after` are
  // skipped (they were handled before a restart). Throws StoreError: kUnavailable when the server
  // cannot be reached, kPermanent when the slot does not exist (with how to recover).
  virtual void Start(Lsn after) = 0;

  // The next committed transaction with at least one outbox message (or undecodable record),
  // waiting at most `timeout` (a zero timeout still returns one that has already arrived);
  // nullopt when none came in time. Sends the standby status updates
  // that are due meanwhile (and the ones the server asks for). Throws StoreError(kUnavailable)
  // when the connection is lost: call Start again.
  virtual std::optional<WalTransaction> Next(std::chrono::milliseconds timeout) = 0;

  // Everything up to `lsn` is durable elsewhere: the slot may let that WAL go. Reported to the
  // server in the next status update (at most about a second later).
  virtual void Confirm(Lsn lsn) = 0;

  // Ends the stream and disconnects (the slot is then free for another reader); Start may
  // follow. Never throws.
  virtual void Close() = 0;

  // The position up to which the server has sent everything (its keepalives' WAL end, or the end
  // of the last transaction returned, whichever is later). When every returned transaction is
  // confirmed, confirming this position is safe too: an idle slot then holds no WAL.
  [[nodiscard]] virtual Lsn Received() const = 0;

  // When the slot is gone (dropped, or lost): the transactions committed after `after` read back
  // from the server's WAL files (PostgreSQL's pg_walinspect) while they are still there, up to
  // where a slot made again starts (the slot gives what follows). Throws StoreError: kPermanent
  // when they cannot be read (no pg_walinspect, no permission, that WAL already removed: the text
  // says which), kUnavailable when the server cannot be reached.
  virtual WalRecovery ReadWalFiles(Lsn after) = 0;
};

// A (target, stream_key) pair: the unit stream_seq counts in.
using WalStream = std::pair<std::string, std::string>;

// How a message is parked in outbox.messages (from there the table-mode relay, `outboxctl
// replay` and `outboxctl abandon` take it, under the table's rules).
enum class ParkAs : std::uint8_t {
  kFailed,     // a sink rejected it: status failed, due at `available_in`, one attempt spent
  kAbandoned,  // rejected for good (kPermanent) or out of attempts: status abandoned
  kWaiting,    // not sent or unconfirmed (an earlier message of its stream is parked, or its
               // target's sink is unavailable): status pending, no attempt spent
};

struct ParkedMessage {
  Envelope envelope;  // with the stream_seq the relay assigned
  ParkAs as = ParkAs::kWaiting;
  int attempts = 0;  // attempts spent (kFailed: at least 1)
  std::chrono::milliseconds available_in{0};
  std::string error;  // last_error
  // kAbandoned: whether its target's on_abandon default is "hold" (RetryPolicy::hold_targets);
  // the topic's topic_settings.on_abandon wins, as in table mode. A held stream's later messages
  // are parked to wait behind it (StreamStates: blocked) until an operator replays or skips it.
  bool hold_by_default = false;
};

// What one WalLedger::Commit makes durable, in one transaction.
struct WalCommit {
  Lsn position = 0;  // every message up to here is published or parked
  // The latest stream_seq given in each stream this commit changed.
  std::vector<std::pair<WalStream, std::int64_t>> seqs;
  std::vector<ParkedMessage> parked;
};

// What WalLedger::Commit did.
struct WalCommitted {
  bool committed = false;  // false: the lease was lost and nothing was written
  // When committed: outbox.messages then held no message that can hold a stream back or give a
  // stream_prev_seq (none leased, failed, abandoned, or pending after a claim), besides those
  // this commit parked. Messages only come there from WAL parks, which the relay knows, and from
  // table-mode writers (whose order against WAL mode's is not kept: README, WAL mode), so the
  // relay may skip StreamStates for a while.
  bool table_clear = false;

  explicit operator bool() const { return committed; }
};

// A stream of a WAL batch as outbox.messages sees it (WalLedger::StreamStates).
struct WalStreamState {
  // A message of the stream waits there (parked, leased or failed): this batch's messages of
  // the stream are parked behind it.
  bool blocked = false;
  // Set when the message just before the stream's first one in the batch was abandoned: the
  // seq below that run of abandoned messages (0 when it starts the stream), for the first
  // message's Envelope::stream_prev_seq, as a claim in table mode sets it.
  std::optional<std::int64_t> prev_seq;
};

// The slot as the server sees it (pg_replication_slots).
struct WalSlotState {
  bool exists = false;
  bool active = false;              // a walsender streams it now
  std::string wal_status;           // reserved, extended, unreserved or lost (its WAL was removed)
  std::int64_t retained_bytes = 0;  // WAL kept for it: the server's position - restart_lsn
  std::int64_t unconfirmed_bytes = 0;  // the server's position - confirmed_flush_lsn
  // How long the reader's confirmations trail the server's WAL, as the server measures it
  // (pg_stat_replication.flush_lag of the slot's walsender); absent while nobody reads the slot
  // or the server shows none (it clears it a while after the reader caught up).
  std::optional<double> flush_lag_seconds;
};

// WAL mode as an operator sees it (Admin::Wal, `outboxctl status`): the delivery setting, the slot
// and who reads it.
struct WalStatus {
  std::string delivery;              // the schema's delivery setting: "table" or "wal"
  std::int64_t wal_topics = 0;       // topics whose delivery is "wal"
  std::optional<std::string> slot;   // the slot's name, once `outboxctl migrate --wal-slot` made it
  WalSlotState state;                // the slot on the server (exists false when there is none)
  Lsn position = 0;                  // handled up to here
  std::optional<std::string> owner;  // the relay holding the slot's lease, while it is live
};

class WalLedger {
 public:
  virtual ~WalLedger() = default;

  // Takes the slot's lease for `owner` (when free, expired, or already `owner`'s) until now +
  // `duration` on the database's clock, or renews it. Returns the lease's epoch while `owner`
  // holds it (a new epoch when taken from another owner), nullopt while another owner's lease is
  // live.
  virtual std::optional<std::int64_t> Acquire(const std::string& owner,
                                              std::chrono::milliseconds duration) = 0;
  // Gives the lease up (graceful shutdown), if `owner` still holds it under `epoch`.
  virtual void Leave(const std::string& owner, std::int64_t epoch) = 0;

  // The position of the last Commit (0: nothing committed yet).
  virtual Lsn Position() = 0;

  // The latest stream_seq of each stream (0 for a stream never seen).
  virtual std::vector<std::int64_t> Seqs(const std::vector<WalStream>& streams) = 0;

  // What outbox.messages says about each stream of a batch, given with the stream_seq of its
  // first message in the batch (0 when not sequenced); one state per stream, in order.
  virtual std::vector<WalStreamState> StreamStates(
      const std::vector<std::pair<WalStream, std::int64_t>>& streams) = 0;

  // The slot's state on the server.
  virtual WalSlotState SlotState() = 0;

  // Ends the server process of another connection still streaming the slot (for a relay that
  // has just taken the lease: the previous holder can no longer commit, and the server lets one
  // reader stream a slot). Returns its process id, nullopt when there was none. Throws
  // StoreError(kPermanent) when the role may not end it.
  virtual std::optional<std::int64_t> EndOtherReader() = 0;

  // Makes `commit` durable if `owner` still holds the lease under `epoch`; not committed (and
  // nothing written) when it does not.
  virtual WalCommitted Commit(const std::string& owner, std::int64_t epoch,
                              const WalCommit& commit) = 0;

  // Removes what later commits superseded (earlier positions and stream_seq counters) and
  // returns how many records went; the relay calls it every few seconds. Removing is never
  // needed for correctness, only to keep the ledger small.
  virtual std::int64_t Purge() = 0;
};

}  // namespace outbox
