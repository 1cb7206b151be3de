#pragma once
// The operator's side of a store, whatever the database: list and inspect messages, replay
// abandoned ones, abandon stuck ones, purge old ones, and the backlog by topic. `outboxctl` and
// outboxd's admin API and metrics drive it. Implementations: postgres::OpenAdmin
// (outbox/store/postgres_admin.h) and sqlite::OpenAdmin (outbox/store/sqlite.h); both pass the
// same contract suite (tests/store/admin_contract.cpp).
//
// Threading: an Admin owns one database connection and is used by one thread at a time.
//
// Time: every age and retention is compared on the database's clock, never the caller's.
//
// Safety: replay and abandon never touch a `processing` row (it is leased by a relay, which will
// settle it), and a row that a relay claims while the operator's statement runs is skipped, not
// overwritten. Every value travels as a bound parameter.
//
// Errors: std::invalid_argument for a bad filter or argument (unknown status, negative duration,
// limit out of range, a filter that selects everything where a selection is required), checked
// here before any implementation sees it; StoreError when the database fails (kUnavailable: it
// cannot be reached or is busy) or refuses (kPermanent, e.g. the schema is not migrated).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/core/uuid.h"
#include "outbox/store/store.h"
#include "outbox/store/wal.h"

namespace outbox {

// The status's name in the database: "pending", "processing", "failed", "published",
// "abandoned" ("unknown" for a value outside the enum).
std::string_view MessageStatusName(MessageStatus status);
// The status named `name` (exactly as MessageStatusName spells it); throws std::invalid_argument
// naming the valid ones otherwise.
MessageStatus ParseMessageStatus(std::string_view name);

// Which messages an operation applies to. Every criterion that is set must hold (AND); an unset
// criterion matches everything.
struct MessageFilter {
  std::optional<MessageStatus> status;
  std::optional<std::string> topic;
  std::optional<std::string> stream_key;
  std::optional<std::string> target;
  // Only messages created more than this long ago (created_at < now - older_than); >= 0.
  std::optional<std::chrono::seconds> older_than;
  // Only these ids. nullopt: any id; an empty list matches nothing.
  std::optional<std::vector<MessageId>> ids;
  // Only the copies of one event: the messages whose event id is this (for a message written to
  // one target, its own id).
  std::optional<MessageId> event_id;
  // Only abandoned messages that hold their stream (on_abandon = "hold"; see Skip).
  bool held = false;

  // True when no criterion is set (the filter matches every message).
  [[nodiscard]] bool MatchesEverything() const {
    return !status && !topic && !stream_key && !target && !older_than && !ids && !event_id && !held;
  }
};

// One message as List shows it: everything but the payload and headers.
struct MessageSummary {
  MessageId id;
  // Shared by every copy of a message written to several targets (the first copy's id); for a
  // message written to one target, its own id.
  MessageId event_id;
  std::string topic;
  std::optional<std::string> stream_key;
  std::optional<std::int64_t> stream_seq;
  int partition = 0;
  std::string target;
  std::optional<std::string> type;
  MessageStatus status = MessageStatus::kPending;
  int attempts = 0;
  // Abandoned under on_abandon = "hold": its (target, stream) publishes nothing after it until an
  // operator replays or skips it.
  bool holds_stream = false;
  TimePoint available_at;  // when it is (or was) next claimable
  TimePoint created_at;
  std::optional<std::string> last_error;
  std::optional<std::string> lease_owner;  // set while processing
  std::optional<TimePoint> lease_until;
  std::int64_t payload_bytes = 0;
};

// One message in full, as Show returns it.
struct MessageDetail {
  MessageSummary summary;
  std::string payload;  // the stored bytes, as given
  std::string content_type;
  Headers headers;  // non-string JSON values are rendered as JSON text
  std::int64_t lease_epoch = 0;
  std::optional<TimePoint> published_at;
  std::optional<TimePoint> abandoned_at;
  TimePoint database_now;  // now on the database, for showing ages
};

// A page of List: messages in id (= creation) order.
struct MessagePage {
  std::vector<MessageSummary> messages;
  // True when further messages match after the last one: pass its id as `after` for the next
  // page.
  bool more = false;
  TimePoint database_now;  // now on the database, for showing ages
};

// What Replay or Abandon did (or, with dry_run, would do).
struct ChangeResult {
  std::int64_t count = 0;
  std::vector<MessageId> ids;  // in id order
};

// One series of the backlog by topic: messages that are not published, by status, target and
// topic. Target and topic are kOtherTopics for the sum of the groups beyond the largest ones.
struct TopicCount {
  MessageStatus status = MessageStatus::kPending;
  std::string target;
  std::string topic;
  std::int64_t messages = 0;
};

// A relay that shares the database's partitions (PostgreSQL), as Relays lists it.
struct RelayStatus {
  std::string owner;  // "<instance>/<run>": the lease owner of the messages it holds
  TimePoint started_at;
  TimePoint heartbeat_at;
  TimePoint expires_at;         // it counts as gone unless a heartbeat renews this first
  std::vector<int> partitions;  // the partitions it holds a live lease on, ascending
  std::optional<TimePoint> next_lease_expiry;  // the earliest lease_until among them
};

// The relays and partition leases of a store, as Relays returns them.
struct RelayOverview {
  std::vector<RelayStatus> relays;  // live relays (expires_at in the future), by owner
  // 0 when the store has no partition leases (SQLite: one relay per database file).
  std::int64_t partition_count = 0;
  std::int64_t unowned_partitions = 0;  // no owner, or its lease expired
  // Lease acquisitions since the schema was created (the sum of the partitions' epochs): every
  // join, hand-over and takeover adds one per partition moved.
  std::int64_t lease_acquisitions = 0;
  TimePoint database_now;
};

class Admin {
 public:
  // The largest page List returns.
  static constexpr int kMaxListLimit = 10000;
  // Rows changed per statement (and transaction) by Replay and Abandon, so that no statement
  // holds many row locks, or the write lock, for long.
  static constexpr int kChangeChunk = 1000;
  // CountByTopic: this many (status, target, topic) groups, the rest summed per status.
  static constexpr int kTopicGroups = 50;
  // The target and topic of a status's sum of the smaller groups.
  static constexpr std::string_view kOtherTopics = "_other";
  // Callers skip CountByTopic while a status that is not published holds this many rows or more
  // (Store::Stats tells): grouping that many rows would take seconds.
  static constexpr std::int64_t kTopicCountRowLimit = 100000;

  virtual ~Admin() = default;
  Admin() = default;
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  // Up to `limit` (1..kMaxListLimit) messages matching `filter`, in id order, starting after the
  // id `after` (keyset pagination: pass the last id of the previous page). Pages taken one after
  // another list every matching message exactly once, even while new ones are written (those
  // appear on later pages; UUIDv7 ids grow with time).
  MessagePage List(const MessageFilter& filter, int limit,
                   std::optional<MessageId> after = std::nullopt);

  // The message with this id in full, or nullopt when there is none.
  std::optional<MessageDetail> Show(const MessageId& id) { return Find(id); }

  // Lets the streams held by abandoned messages matching `filter` go on past them (on_abandon =
  // "hold"): each stays abandoned, no longer holding, as if the policy had been "continue"; the
  // stream's next message is published with stream_prev_seq naming the gap. Only abandoned
  // messages that hold their stream are touched (SQLite holds none). A filter status other than
  // abandoned, or a filter that matches everything, throws std::invalid_argument. With `dry_run`,
  // changes nothing and returns what it would skip. (Replay, the other way out, publishes the
  // message again first.)
  ChangeResult Skip(const MessageFilter& filter, bool dry_run);

  // Makes abandoned and failed messages matching `filter` pending again: attempts = 0,
  // available_at = now, abandoned_at cleared, last_error = "replayed by operator; was: <old
  // error>". The id (and stream_key and stream_seq) stay the same, so consumers deduplicate a
  // replay like any redelivery. Failed messages are included so that an operator can retry them
  // now instead of after their backoff. Pending, processing and published rows are never touched.
  // A filter status other than abandoned or failed, or a filter that matches everything, throws
  // std::invalid_argument. With `dry_run`, changes nothing and returns what it would replay.
  ChangeResult Replay(const MessageFilter& filter, bool dry_run);

  // Gives up on pending and failed messages matching `filter`: status abandoned, abandoned_at =
  // now, last_error = "abandoned by operator: <reason>". Processing rows are never touched (a
  // relay holds them; abandon them after it settles them, if they fail again). Abandoned rows are
  // purged after the abandoned retention, or replayed. `reason` must not be empty; a filter
  // status other than pending or failed, or a filter that matches everything, throws
  // std::invalid_argument. With `dry_run`, changes nothing and returns what it would abandon.
  ChangeResult Abandon(const MessageFilter& filter, const std::string& reason, bool dry_run);

  // Deletes published and abandoned messages older than their retention (published_at /
  // abandoned_at < now - retention), the same rows the relay-side Store::Purge deletes, in
  // statements of at most `chunk` rows so that each holds its locks briefly, until none are
  // left. Returns how many were deleted. Throws std::invalid_argument for a negative retention or
  // chunk < 1.
  std::int64_t Purge(const RetentionPolicy& retention, int chunk = 1000);

  // The backlog by topic: the messages that are not published, grouped by (status, target,
  // topic); the kTopicGroups largest groups (ties broken by status name, target, topic), and the
  // rest summed into one series per status with target and topic kOtherTopics (so at most
  // kTopicGroups + 4 series). Largest first. Retained published rows are never read. nullopt
  // when the count ran longer than `timeout` and was cancelled (try again later, not at once).
  // Throws std::invalid_argument for a timeout < 1 ms.
  std::optional<std::vector<TopicCount>> CountByTopic(std::chrono::milliseconds timeout);

  // The live relays, the partitions each holds and when their leases expire; read in one
  // snapshot.
  RelayOverview Relays() { return ListRelays(); }

  // WAL mode (outbox/store/wal.h): the delivery setting, the slot and the relay reading it;
  // nullopt where the store has no WAL mode (SQLite).
  std::optional<WalStatus> Wal() { return ReadWal(); }

 protected:
  enum class ChangeKind : std::uint8_t { kReplay, kAbandon, kSkip };

  // One chunk of Replay or Abandon: the next `limit` candidates (rows matching `filter` whose
  // status the change acts on) after the id `after`, in id order, and unless `dry_run` the change
  // of those that still qualify when their row is changed.
  struct ChunkResult {
    std::int64_t candidates = 0;
    std::optional<MessageId> last_candidate;
    std::vector<MessageId> changed;  // with dry_run: the candidates; in id order
  };

  // What the implementations provide; arguments are already checked. `reason` is set for
  // kAbandon. A group of CountGroups is one row per (status, target, topic), any order.
  virtual MessagePage ListPage(const MessageFilter& filter, int limit,
                               const std::optional<MessageId>& after) = 0;
  virtual std::optional<MessageDetail> Find(const MessageId& id) = 0;
  virtual ChunkResult ChangeChunk(ChangeKind kind, const MessageFilter& filter,
                                  const std::optional<MessageId>& after, int limit,
                                  const std::string& reason, bool dry_run) = 0;
  virtual std::int64_t PurgeChunk(const RetentionPolicy& retention, int chunk) = 0;
  virtual std::optional<std::vector<TopicCount>> CountGroups(std::chrono::milliseconds timeout) = 0;
  virtual RelayOverview ListRelays() = 0;
  virtual std::optional<WalStatus> ReadWal() { return std::nullopt; }

 private:
  ChangeResult Change(ChangeKind kind, const MessageFilter& filter, const std::string& reason,
                      bool dry_run);
};

}  // namespace outbox
