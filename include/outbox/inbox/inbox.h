#pragma once
// The inbox: a consumer processes each delivered message exactly once, with the deduplication
// written in the consumer's own PostgreSQL transaction, next to the handler's side effects.
//
//   outbox::inbox::Inbox inbox({.consumer = "billing"});
//   PQexec(conn, "BEGIN");
//   const auto result = inbox.Process(conn, delivery, [&](pg_conn* c) { /* apply it on c */ });
//   PQexec(conn, "COMMIT");   // then ack the delivery to the broker
//
// Two modes, chosen per message:
//   - a message with a stream_key and a stream_seq: a high-water mark per (consumer, stream).
//     Constant space, no eviction; seq <= mark is a duplicate. A seq beyond mark + 1 is a gap
//     (see below).
//   - otherwise: the message id is recorded per consumer and kept for a retention window
//     (Cleanup deletes older records in bounded chunks). A duplicate arriving after the window
//     would be processed again: choose the window longer than any redelivery can take.
//
// Gaps. A sequenced message beyond mark + 1 arrived before a predecessor, or its predecessors
// were abandoned (the relay gave up on them after max_attempts, or an operator abandoned them).
// The relay tells the two apart: when the messages just before one were abandoned, the delivery
// carries stream_prev_seq, the seq of the latest earlier message of its stream that was not.
//   - stream_prev_seq <= mark: the messages in between will not come. The message is processed,
//     the mark moves to its seq, and the seqs it passed (mark + 1 .. seq - 1) are remembered for
//     this consumer (table inbox_skipped, one row per gap). If an operator replays one of them
//     later, it arrives at or below the mark and is processed once, then forgotten, instead of
//     being dropped as a duplicate. (Not prev + 1 .. seq - 1: what the mark has passed was
//     processed, or remembered, already.)
//   - otherwise (no stream_prev_seq, or one above the mark): a predecessor is still on its way,
//     and GapPolicy decides. kProcessAnyway remembers only the seqs the delivery says were
//     abandoned (prev + 1 .. seq - 1); the others will count as duplicates.
// The relay reads abandoned rows when it claims, so a message claimed after its abandoned
// predecessors were purged (retention.abandoned) or deleted carries no stream_prev_seq.
//
// Sequence numbers a consumer can act on are 1 <= stream_seq <= kMaxStreamSeq (the outbox assigns
// 1, 2, 3, ... per stream) and 0 <= stream_prev_seq < stream_seq. A delivery outside these
// ranges, a stream_prev_seq without a stream_seq, or a delivery whose outbox headers could not be
// read (Delivery::malformed), is kInvalid: nothing runs, nothing is recorded, nothing is thrown.
// It can never become processable, so it must not be requeued: dead-letter it (see
// examples/rabbitmq_inbox_consumer.cpp).
//
// Concurrency: two consumers processing the same message at once serialize on its inbox row;
// exactly one runs the handler, the other gets kDuplicate once the first commits (or runs it, if
// the first rolls back).
//
// The rules live in the schema: Process calls outbox.inbox_begin (migration 15), which any other
// language calls the same way in its own transaction (README, "Consuming exactly once"). The
// inbox tables and functions come with the outbox schema (migrations 2, 8 and 15); run
// postgres::Migrate or `outboxctl migrate` on the consumer's database.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "outbox/core/uuid.h"

struct pg_conn;  // libpq's PGconn

namespace outbox::inbox {

// The largest stream_seq the inbox accepts: 2^62, far beyond any real stream, and low enough that
// mark + 1 and the other arithmetic on seqs can never overflow.
inline constexpr std::int64_t kMaxStreamSeq = std::int64_t{1} << 62;

// What the consumer received; FromAmqp (inbox/rabbitmq.h) reads it from a RabbitMQ delivery.
struct Delivery {
  MessageId id;
  std::optional<std::string> stream_key;
  std::optional<std::int64_t> stream_seq;  // 1 .. kMaxStreamSeq
  // Only when the messages just before this one were abandoned: the seq of the latest earlier
  // message of its stream that was not (0 if none); see Gaps above. 0 .. stream_seq - 1.
  std::optional<std::int64_t> stream_prev_seq;
  // The target that sent this copy (header outbox-target) and the database it came from (header
  // outbox-database, sent by a relay serving several): stream_seq counts per (database, target,
  // stream), so the marks are kept per (origin, target, stream). Unset: the delivery names none
  // ('').
  std::optional<std::string> target;
  std::optional<std::string> origin;
  // Not empty when an outbox header of the delivery was present but unreadable (e.g.
  // "header outbox-stream-seq is not an integer"): Process returns kInvalid.
  std::string malformed;
};

enum class Result {
  kProcessed,   // new: the handler ran
  kDuplicate,   // already processed by this consumer: the handler did not run; ack it
  kOutOfOrder,  // a gap before it and GapPolicy::kRefuse: nothing ran or was recorded; requeue it
                // (after a short delay: its predecessor has to get there first)
  kInvalid,     // its sequence numbers are out of range or unreadable (see Validate): nothing ran
                // or was recorded, and it will never be processable; dead-letter it, don't requeue
};

// Empty when Process can act on `delivery`; otherwise why not (Process returns kInvalid), e.g.
// "stream_seq -1 is out of range (1 to 4611686018427387904)". Needs no database.
std::string Validate(const Delivery& delivery);

std::string_view NameOf(Result result);  // "processed", "duplicate", "out of order", "invalid"

// What to do with a sequenced message that arrives before its predecessor.
enum class GapPolicy {
  // Refuse it (kOutOfOrder) so that the broker redelivers it later, after the missing one. The
  // relay republishes held-back successors after a failed message, so waiting is always safe;
  // predecessors the relay abandoned do not block: the delivery says so (see Gaps above).
  kRefuse,
  // Process it and move the mark past the gap: the missing messages will count as duplicates
  // (except the ones the delivery says were abandoned: a replay of those is processed).
  kProcessAnyway,
};

struct Options {
  std::string consumer;  // required: one inbox per consumer name
  std::string schema = "outbox";
  GapPolicy gap_policy = GapPolicy::kRefuse;
};

class Inbox {
 public:
  // Throws std::invalid_argument for an empty consumer name or a bad schema name.
  explicit Inbox(Options options);

  // Records `delivery` for this consumer and runs `handler` on `conn` if it is new, inside the
  // caller's open transaction (std::logic_error if there is none); never commits. An invalid
  // delivery (see Validate) returns kInvalid without touching the database. Both happen under a
  // savepoint: if the handler throws, its writes and the inbox record are rolled back (a replayed
  // skipped seq stays remembered) and the exception propagates, so the message can be processed
  // again. The handler may enqueue outgoing messages on `conn` (postgres::Writer) in the same
  // transaction. Throws StoreError for database failures.
  Result Process(pg_conn* conn, const Delivery& delivery,
                 const std::function<void(pg_conn*)>& handler) const;

  // Deletes id records of this consumer older than `retention`, at most `max_rows`, in its own
  // statement (autocommit; call it outside a transaction). Returns how many it deleted. Skipped
  // seqs (see Gaps) are not touched: they go when they are replayed.
  std::int64_t Cleanup(pg_conn* conn, std::chrono::seconds retention, int max_rows) const;

 private:
  Options options_;
  std::string begin_sql_;
  std::string cleanup_sql_;
};

}  // namespace outbox::inbox
