#pragma once
// The operator's side of the PostgreSQL store: list and inspect messages, replay abandoned ones,
// abandon stuck ones, purge old ones. This is what `outboxctl` drives; a service may use it too.
//
// Threading: an Admin owns one database connection and is used by one thread at a time.
//
// Time: every age and retention is compared on the database's clock (now()), never the caller's.
//
// Safety: replay and abandon never touch a `processing` row (it is leased by a relay, which will
// settle it), and a row that a relay claims while the operator's statement runs is skipped, not
// overwritten. Every value travels as a bound parameter.
//
// Errors: std::invalid_argument for a bad filter or argument (unknown status, negative duration,
// limit out of range, a filter that selects everything where a selection is required); StoreError
// when the database fails (kUnavailable: it cannot be reached) or refuses (kPermanent, e.g. the
// schema is not migrated).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/core/uuid.h"
#include "outbox/store/postgres.h"
#include "outbox/store/store.h"

namespace outbox::postgres {

// The status's name in the database: "pending", "processing", "failed", "published",
// "abandoned".
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
  // Only messages created more than this long ago (created_at < now() - older_than); >= 0.
  std::optional<std::chrono::seconds> older_than;
  // Only these ids. nullopt: any id; an empty list matches nothing.
  std::optional<std::vector<MessageId>> ids;

  // True when no criterion is set (the filter matches every message).
  [[nodiscard]] bool MatchesEverything() const {
    return !status && !topic && !stream_key && !target && !older_than && !ids;
  }
};

// One message as List shows it: everything but the payload and headers.
struct MessageSummary {
  MessageId id;
  std::string topic;
  std::optional<std::string> stream_key;
  std::optional<std::int64_t> stream_seq;
  int partition = 0;
  std::string target;
  std::optional<std::string> type;
  MessageStatus status = MessageStatus::kPending;
  int attempts = 0;
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
  TimePoint database_now;  // now() on the database, for showing ages
};

// A page of List: messages in id (= creation) order.
struct MessagePage {
  std::vector<MessageSummary> messages;
  // True when further messages match after the last one: pass its id as `after` for the next
  // page.
  bool more = false;
  TimePoint database_now;  // now() on the database, for showing ages
};

// What Replay or Abandon did (or, with dry_run, would do).
struct ChangeResult {
  std::int64_t count = 0;
  std::vector<MessageId> ids;  // in id order
};

class Admin {
 public:
  // The largest page List returns.
  static constexpr int kMaxListLimit = 10000;
  // Rows changed per statement by Replay and Abandon, so that no statement holds many row locks
  // for long.
  static constexpr int kChangeChunk = 1000;

  // Connects on a connection of its own and checks that `schema` is migrated. Throws
  // StoreError(kUnavailable) when the database cannot be reached, StoreError(kPermanent) naming
  // `outboxctl migrate` when the schema is missing or older than this build, and
  // std::invalid_argument for a schema name that is not a plain identifier.
  static std::unique_ptr<Admin> Open(const std::string& conninfo,
                                     const std::string& schema = std::string{kDefaultSchema});

  ~Admin();
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  // Up to `limit` (1..kMaxListLimit) messages matching `filter`, in id order, starting after the
  // id `after` (keyset pagination: pass the last id of the previous page). Pages taken one after
  // another list every matching message exactly once, even while new ones are written (those
  // appear on later pages; UUIDv7 ids grow with time).
  MessagePage List(const MessageFilter& filter, int limit,
                   std::optional<MessageId> after = std::nullopt);

  // The message with this id in full, or nullopt when there is none.
  std::optional<MessageDetail> Show(const MessageId& id);

  // Makes abandoned and failed messages matching `filter` pending again: attempts = 0,
  // available_at = now(), abandoned_at cleared, last_error = "replayed by operator; was: <old
  // error>". The id (and stream_key and stream_seq) stay the same, so consumers deduplicate a
  // replay like any redelivery. Failed messages are included so that an operator can retry them
  // now instead of after their backoff. Pending, processing and published rows are never touched.
  // A filter status other than abandoned or failed, or a filter that matches everything, throws
  // std::invalid_argument. With `dry_run`, changes nothing and returns what it would replay.
  ChangeResult Replay(const MessageFilter& filter, bool dry_run);

  // Gives up on pending and failed messages matching `filter`: status abandoned, abandoned_at =
  // now(), last_error = "abandoned by operator: <reason>". Processing rows are never touched
  // (a relay holds them; abandon them after it settles them, if they fail again). Abandoned rows
  // are purged after the abandoned retention, or replayed. `reason` must not be empty; a filter
  // status other than pending or failed, or a filter that matches everything, throws
  // std::invalid_argument. With `dry_run`, changes nothing and returns what it would abandon.
  ChangeResult Abandon(const MessageFilter& filter, const std::string& reason, bool dry_run);

  // Deletes published and abandoned messages older than their retention (published_at /
  // abandoned_at < now() - retention), the same rows the relay-side Store::Purge deletes, in
  // statements of at most `chunk` rows so that each holds its locks briefly, until none are
  // left. Returns how many were deleted. Throws std::invalid_argument for a negative retention or
  // chunk < 1.
  std::int64_t Purge(const RetentionPolicy& retention, int chunk = 1000);

 private:
  class Impl;
  explicit Admin(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::postgres
