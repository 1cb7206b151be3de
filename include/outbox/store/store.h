#pragma once
// The Store contract: where outbox messages live between the writer's commit and the broker's
// confirmation. Implementations: store/postgres (primary), store/sqlite (embedded default).
//
// Threading: a Store object is used by one thread at a time (it owns one database connection);
// a relay with several workers opens one Store per worker.
//
// Time: lease expiry and retry times are compared on the database's clock, never the caller's,
// so that relays on hosts with skewed clocks still agree.
//
// Errors: database outages are thrown as StoreError with kind kUnavailable (reconnect, then call
// again) or kOutcomeUnknown (a commit was sent but its result was lost; every settling method is
// idempotent, so calling it again is safe). Bad arguments throw std::invalid_argument.
// InvalidMessage is thrown by Enqueue for a message that breaks the store's limits.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "outbox/core/failure.h"
#include "outbox/core/message.h"
#include "outbox/store/partitions.h"

namespace outbox {

class StoreError : public std::runtime_error {
 public:
  StoreError(FailureKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  [[nodiscard]] FailureKind kind() const { return kind_; }

 private:
  FailureKind kind_;
};

enum class MessageStatus : std::uint8_t {
  kPending,     // waiting to be claimed
  kProcessing,  // claimed under a lease
  kFailed,      // a publish failed; claimable again at available_at
  kPublished,   // confirmed by the broker (kept only when published retention > 0)
  kAbandoned,   // given up on; kept until replayed or purged
};

// A message identified together with the lease epoch it was claimed under.
struct LeasedId {
  MessageId id;
  std::int64_t lease_epoch = 0;

  static LeasedId Of(const Envelope& envelope) { return {envelope.id, envelope.lease_epoch}; }
};

struct ClaimRequest {
  std::string owner;  // relay instance id; recorded as lease_owner
  int max_messages = 500;
  std::chrono::milliseconds lease_duration{std::chrono::seconds{30}};
  // Unset: every partition (one relay per database). Set: only these partitions, and only while
  // the caller still holds each one's lease under that epoch (see store/partitions.h); a claim
  // under a stale epoch gets nothing from that partition. Empty: nothing.
  std::optional<std::vector<PartitionLease>> partitions;
  // Targets whose sink is unavailable: none of their messages is claimed. They hold back no other
  // target's messages: a stream is ordered per target (stream_seq counts per target and stream
  // key), so another target's copies of the same stream go on. Their messages keep no lease and
  // spend no attempt while they wait.
  std::vector<std::string> paused_targets;
  // Messages to mark published in the same round trip, before anything is claimed, exactly as
  // Complete(owner, complete) would (fenced the same way): a relay settles one batch and claims the
  // next in one statement, which halves its statements under steady load.
  std::vector<LeasedId> complete;
};

// Which expired message leases to give back. A relay passes what it still has in flight, whose
// leases may have run out while it waited for the broker: those it settles itself. Partitions as
// in ClaimRequest: sharing a database, a relay reclaims only in partitions it holds, where an
// expired lease is one it lost track of (recording an outcome failed, a claim's reply was lost),
// never another relay's slow batch.
struct ReclaimRequest {
  std::string owner;
  std::optional<std::vector<PartitionLease>> partitions;
  std::vector<MessageId> in_flight;
  // Also the owner's leases that have not expired yet (in_flight excepted): after a claim whose
  // reply was lost, the owner holds messages it does not know, and a later message of their
  // streams must not be claimed before them.
  bool own_unexpired = false;
};

struct FailedMessage {
  LeasedId message;
  int attempts = 0;  // attempts spent before this one, as claimed (Envelope::attempts)
  Failure failure;

  static FailedMessage Of(const Envelope& envelope, Failure failure) {
    return {LeasedId::Of(envelope), envelope.attempts, std::move(failure)};
  }
};

// What a settling call did. Messages whose lease had been lost (expired and reclaimed, or
// fenced by a newer epoch) are left untouched and listed in `lease_lost`.
struct SettleResult {
  std::int64_t settled = 0;
  std::vector<MessageId> lease_lost;
};

// What Store::ClaimRound did.
struct ClaimResult {
  std::vector<Envelope> messages;  // as Claim returns them
  SettleResult completed;          // of ClaimRequest::complete, as Complete reports it
  // Only when nothing was claimed: how long until the first message that waits for its retry
  // (in the claimed partitions, of a target not paused) is due, on the database's clock; unset
  // when none waits. An idle relay sleeps no longer than this, so a retry's backoff is kept
  // without looking every second.
  std::optional<std::chrono::milliseconds> next_due;
};

struct RetentionPolicy {
  // 0: published rows are deleted on completion (the fast default).
  std::chrono::seconds published{0};
  std::chrono::seconds abandoned{std::chrono::hours{24 * 30}};
};

struct StoreStats {
  std::int64_t pending = 0;
  std::int64_t processing = 0;
  std::int64_t failed = 0;
  std::int64_t abandoned = 0;
  std::int64_t published = 0;  // retained published rows
  std::optional<std::chrono::milliseconds> oldest_pending_age;
  std::int64_t active_leases = 0;  // distinct lease owners with unexpired leases
  // Relays sharing the database's partitions (store/partitions.h): how many heartbeat, and how
  // many partitions no live relay holds (nobody publishes those; 0 with no relay sharing).
  std::int64_t live_relays = 0;
  std::int64_t unowned_partitions = 0;
  // (target, stream) pairs held by an abandoned message under on_abandon = "hold": none of their
  // later messages is published until an operator replays or skips it (Admin::Skip).
  std::int64_t streams_held = 0;
  // True when a count was too large to take exactly and is the database's estimate.
  bool counts_estimated = false;
};

class Store {
 public:
  virtual ~Store() = default;

  // Enqueues `messages` in a transaction of the store's own and returns, per message, its event
  // id (the id of its first copy; its only one when it goes to one target). For
  // writing messages in the same transaction as business data, use the store's writer API.
  virtual std::vector<MessageId> Enqueue(std::span<const NewMessage> messages) = 0;

  // Claims up to request.max_messages due messages (pending, or failed whose retry time has
  // come), oldest first, in one statement: each gets lease_owner = request.owner, lease_until =
  // now + lease_duration and a new lease_epoch. No row lock is held after the call returns.
  // Within one stream (of one target), a message is not returned while an earlier one is leased by
  // another owner or waits for its retry; behind the caller's own leases it may be (the caller then
  // publishes in order and holds back what follows a failure). Owners must therefore be unique per
  // running process. request.complete is settled first, in the same round trip; when the call
  // throws, neither the completion nor the claim is known to have happened (both are safe to
  // repeat: completing is fenced, and a lost claim's leases are given back by ReclaimExpired).
  virtual ClaimResult ClaimRound(const ClaimRequest& request) = 0;
  // ClaimRound's messages alone (request.complete, if any, is settled and its result dropped).
  std::vector<Envelope> Claim(const ClaimRequest& request) { return ClaimRound(request).messages; }

  // Marks messages published (deleted, or kept when published retention > 0). Fenced: only rows
  // still leased by `owner` under the given epoch are touched.
  virtual SettleResult Complete(std::string_view owner, std::span<const LeasedId> messages) = 0;

  // Records failed publishes according to each failure's FailureTreatment and the store's
  // RetryPolicy: back to claimable at now + backoff, or abandoned with the reason. Fenced like
  // Complete. kLeaseLost failures are ignored.
  virtual SettleResult Fail(std::string_view owner, std::span<const FailedMessage> failures) = 0;

  // Extends the leases of messages still held by `owner` to now + lease_duration.
  virtual SettleResult Renew(std::string_view owner, std::span<const LeasedId> messages,
                             std::chrono::milliseconds lease_duration) = 0;

  // Gives back leased messages unpublished (graceful shutdown): claimable again at once, no
  // attempt spent.
  virtual SettleResult Release(std::string_view owner, std::span<const LeasedId> messages) = 0;

  // Makes messages whose lease expired (and, with own_unexpired, the owner's) claimable again,
  // except the request's in-flight ones, without spending an attempt; returns how many. Cheap
  // when none are. With partitions, expired leases only in those the caller still holds; the
  // owner's own (own_unexpired) wherever they are, its partition leases expired or not.
  virtual std::int64_t ReclaimExpired(const ReclaimRequest& request) = 0;

  // Deletes published and abandoned rows older than their retention, at most `max_rows` per
  // call so that each call is a short transaction; returns how many were deleted. Also removes
  // what the store keeps for its own bookkeeping and no longer needs (PostgreSQL: stream_seq
  // numbers that have a successor).
  virtual std::int64_t Purge(const RetentionPolicy& retention, int max_rows) = 0;

  // Counts by status and the age of the oldest pending message; cheap enough to scrape often.
  virtual StoreStats Stats() = 0;
};

}  // namespace outbox
