#pragma once
// Where a claim starts walking fresh messages (never claimed, lease_epoch 0) in id order.
//
// A claim that walked from the oldest id stepped, on every call, over each message deleted since
// the oldest snapshot still open in the database: with vacuum held back by a long transaction,
// those stay in the index and the claim slowed in proportion to them (-86 % over ten minutes in
// bench/RESULTS.md). The cursor lets the walk start near the first message still to claim.
//
// It may not pass a message that will still become claimable. Two things could put one behind it:
// - a writer whose transaction is still open: its message becomes visible later, with an id (the
//   database clock at insert) older than messages already claimed. The cursor therefore never
//   passes the horizon: the time T of an earlier claim once every transaction that could have
//   been running at that claim has ended (the database's oldest running transaction id is past
//   that claim's own); every message written before T is then visible. That needs a writer to
//   hold its transaction id before it reads the clock for a message id (sql/005_id_after_xid.sql):
//   otherwise a transaction id newer than the claim's could carry an id older than T.
// - a message in a partition this relay did not hold: when a partition is gained, the walk starts
//   from the oldest id again. A partition asked for whose lease had expired (an outage longer
//   than the lease) is not passed either: the frontier counts every partition asked for, held or
//   not (statements.cpp), since renewed under the same epoch it is not "gained".
// - a message for a paused target (ClaimRequest::paused_targets): the frontier passes them, so that
//   a claim does not walk a paused target's backlog each time (issue #14, bench/RESULTS.md); when a
//   target leaves the paused set, the walk starts from the oldest id again.
// Messages given back after a claim (released, retried, voided, replayed) are "returned" and are
// found in their own index, not through the cursor. As a net for what this reasoning missed (a
// clock stepped backwards between two claims is caught; other steps are not), the walk starts from
// the oldest id once a minute. That walk steps over every index entry an old snapshot keeps (1 to
// 1.5 s per walk after 5 minutes of a held snapshot at 2,000 msg/s, bench/RESULTS.md), so each
// walk that finds nothing behind the cursor doubles the wait for the next, up to
// kLongestFullWalkInterval; one that does find something brings it back to a minute.

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/uuid.h"
#include "outbox/store/partitions.h"

namespace outbox::postgres {

// What a claim reports besides the messages, read in the claim's own statement.
struct ClaimObservation {
  std::optional<Uuid> frontier;  // first fresh message at or after the cursor in its partitions
  TimePoint database_now;        // the claim's now(): taken before its snapshot
  std::uint64_t oldest_running_xid = 0;  // pg_snapshot_xmin of the claim's snapshot
  std::optional<std::uint64_t> own_xid;  // the claim's transaction id, if it was given one
};

class ClaimCursor {
 public:
  using Partitions = std::optional<std::vector<PartitionLease>>;  // unset: every partition
  static constexpr std::chrono::seconds kFullWalkInterval{60};
  static constexpr std::chrono::seconds kLongestFullWalkInterval{16 * 60};
  static constexpr std::size_t kMaxWaiting = 256;

  // The cursor for a claim over `partitions` that excludes the `paused` targets, made at `now` (a
  // steady clock).
  Uuid Next(const Partitions& partitions, std::chrono::steady_clock::time_point now,
            const std::vector<std::string>& paused = {});
  // Moves the cursor after the claim that Next() was asked for.
  void Observe(const ClaimObservation& observation);

  // How long after the last walk from the oldest id the next one is due (the net's interval).
  [[nodiscard]] std::chrono::seconds full_walk_interval() const { return full_walk_interval_; }
  // Net walks that found a fresh message behind where the cursor had been.
  [[nodiscard]] std::uint64_t found_behind() const { return found_behind_; }

  // The smallest UUIDv7 of the millisecond `time` falls in.
  static Uuid Floor(TimePoint time);

 private:
  struct Waiting {
    TimePoint time;
    std::uint64_t xid = 0;
  };
  bool Gained(const Partitions& partitions) const;
  bool Resumed(const std::vector<std::string>& paused) const;

  Uuid cursor_;  // nil: from the oldest
  Partitions partitions_;
  std::vector<std::string> paused_;
  bool first_ = true;
  std::chrono::steady_clock::time_point last_full_walk_;
  std::chrono::seconds full_walk_interval_ = kFullWalkInterval;
  std::optional<Uuid> before_net_walk_;  // the cursor a net walk started back from
  std::uint64_t found_behind_ = 0;
  std::optional<TimePoint> horizon_;
  std::optional<TimePoint> last_database_now_;
  std::deque<Waiting> waiting_;  // claims whose running transactions may not all have ended
};

}  // namespace outbox::postgres
