// The relay's wake-up on MariaDB, which has no NOTIFY: Wait polls the messages table on a
// connection of its own, and Interrupt (the in-process hand-off from C++ writers, and Stop) ends a
// Wait at once.
//
// What a poll looks for: a change in the set of pending messages written since a little before
// the relay went idle (their count and a checksum of their ids, from the claim's (status, id)
// index). Not "is anything claimable": the relay may leave pending messages alone for good
// reasons (a paused target, another relay's partitions), and a poll that found those would wake it
// at every turn for nothing. A change means a writer committed (or another relay claimed): the
// relay claims and, finding nothing, announces again, which takes a new baseline.
//   - The set starts kLateCommitWindow before AnnounceIdle (by the ids' time, UUIDv7), so that a
//     writer whose transaction was open across the announcement, its message's id older than the
//     baseline, still changes it when it commits. A transaction open longer than that is found by
//     the relay's sweep.
//   - The baseline is taken before the relay's second claim (the protocol's step 2), so a commit
//     between the two is either in that claim or a change.
//   - The interval starts at min_poll and doubles after each poll that finds nothing, up to
//     max_poll; it starts again at min_poll when work was found (kNotified, Withdraw).
// The cost of an idle relay is one indexed statement per max_poll; the cost of a commit's latency
// is at most the interval (plus the claim).

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "connection.h"
#include "outbox/core/error.h"
#include "outbox/store/mariadb.h"

namespace outbox::mariadb {
namespace {

// How far before AnnounceIdle (by the ids' clock) the watched set starts.
constexpr std::chrono::milliseconds kLateCommitWindow{10000};
// After a failed reconnect, Wait pauses this long (or to its deadline) rather than spin.
constexpr std::chrono::milliseconds kRetryPause{500};

// What one poll saw: how many pending messages have ids at or after the bound, and a checksum of
// those ids.
struct Fingerprint {
  std::int64_t count = 0;
  std::int64_t checksum = 0;
  bool operator==(const Fingerprint&) const = default;
};

class MariaDbWakeup final : public Wakeup {
 public:
  explicit MariaDbWakeup(WakeupOptions options)
      : options_(std::move(options)),
        connection_(options_.url, options_.statement_deadline),
        interval_(options_.min_poll) {
    const std::string table = QuoteSchema(options_.schema) + ".messages";
    // The bound: the UUIDv7 prefix (unix milliseconds, 48 bits) of the database's clock less the
    // window; UNIX_TIMESTAMP(NOW(6)) reads it whatever the session's time_zone.
    announce_sql_ =
        "SELECT b.bound, COUNT(m.id), COALESCE(BIT_XOR(CRC32(m.id)), 0) FROM (SELECT UNHEX(CONCAT("
        "LPAD(HEX(GREATEST(0, FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) - ?)), 12, '0'), "
        "REPEAT('0', 20))) AS bound) b LEFT JOIN " +
        table +
        " m FORCE INDEX (messages_claimable) ON m.status = 'pending' AND m.id >= b.bound GROUP BY "
        "b.bound";
    // A range of the claim's (status, id) index, read from the index alone: without the hint the
    // optimizer took another index on status and walked every pending message.
    poll_sql_ = "SELECT COUNT(*), COALESCE(BIT_XOR(CRC32(id)), 0) FROM " + table +
                " FORCE INDEX (messages_claimable) WHERE status = 'pending' AND id >= ?";
    // Fails now, with a clear error, when the schema is not there.
    connection_.Run("wakeup: check schema", "SELECT 1 FROM " + table + " LIMIT 0");
  }

  void AnnounceIdle() override {
    const Value window{static_cast<std::int64_t>(kLateCommitWindow.count())};
    const auto result = connection_.Run("announce idle", announce_sql_, {&window, 1});
    if (result.sets.empty() || result.sets[0].rows.size() != 1) {
      throw MariaDbError(FailureKind::kPermanent, "announce idle: expected one row", 0, "HY000");
    }
    const auto& row = result.sets[0].rows[0];
    bound_ = Bytes{row.at(0).value_or("")};
    baseline_ =
        Fingerprint{ToInt64(row.at(1), "announce idle"), ToInt64(row.at(2), "announce idle")};
    announced_ = true;
    next_poll_ = std::chrono::steady_clock::now() + interval_;
  }

  void Withdraw() override {
    // Nothing on the server to take back: the relay found work, so the next idle spell starts
    // polling fast again.
    announced_ = false;
    interval_ = options_.min_poll;
  }

  WakeReason Wait(Deadline deadline) override {
    for (;;) {
      if (TakeInterrupt()) return WakeReason::kInterrupted;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return WakeReason::kTimeout;
      if (now >= next_poll_) {
        try {
          if (!announced_) {
            AnnounceIdle();  // no baseline yet: this look only takes one
            continue;
          }
          const Fingerprint seen = Poll();
          if (seen != baseline_) {
            announced_ = false;
            interval_ = options_.min_poll;
            return WakeReason::kNotified;
          }
          interval_ = std::min(interval_ * 2, options_.max_poll);
          next_poll_ = std::chrono::steady_clock::now() + interval_;
        } catch (const StoreError&) {
          return Reconnect(deadline);
        }
        continue;
      }
      Sleep(std::min(deadline, next_poll_));
    }
  }

  void Interrupt() override {
    {
      const std::lock_guard lock(mutex_);
      interrupted_ = true;
    }
    interrupt_.notify_all();
  }

 private:
  Fingerprint Poll() {
    const Value bound{bound_};
    const auto result = connection_.Run("wakeup poll", poll_sql_, {&bound, 1});
    if (result.sets.empty() || result.sets[0].rows.size() != 1) {
      throw MariaDbError(FailureKind::kPermanent, "wakeup poll: expected one row", 0, "HY000");
    }
    const auto& row = result.sets[0].rows[0];
    return {ToInt64(row.at(0), "wakeup poll"), ToInt64(row.at(1), "wakeup poll")};
  }

  // A poll failed: the connection is re-established (kReconnected: whatever was committed
  // meanwhile is the relay's next claim's), or, when that fails too, waited out without spinning.
  WakeReason Reconnect(Deadline deadline) {
    announced_ = false;
    interval_ = options_.min_poll;
    next_poll_ = {};
    try {
      connection_.Ready();
      return WakeReason::kReconnected;
    } catch (const StoreError&) {
      // The relay's next database call reports the outage; here, just don't spin.
      Sleep(std::min(deadline, std::chrono::steady_clock::now() + kRetryPause));
      if (TakeInterrupt()) return WakeReason::kInterrupted;
      return std::chrono::steady_clock::now() < deadline ? WakeReason::kReconnected
                                                         : WakeReason::kTimeout;
    }
  }

  bool TakeInterrupt() {
    const std::lock_guard lock(mutex_);
    return std::exchange(interrupted_, false);
  }

  // Until `until` or an Interrupt.
  void Sleep(Deadline until) {
    std::unique_lock lock(mutex_);
    interrupt_.wait_until(lock, until, [this] { return interrupted_; });
  }

  WakeupOptions options_;
  Connection connection_;
  std::string announce_sql_;
  std::string poll_sql_;
  Bytes bound_;
  Fingerprint baseline_;
  bool announced_ = false;
  std::chrono::milliseconds interval_;
  Deadline next_poll_{};
  std::mutex mutex_;
  std::condition_variable interrupt_;
  bool interrupted_ = false;
};

}  // namespace

std::unique_ptr<Wakeup> OpenWakeup(WakeupOptions options) {
  CheckConnectionOptions(options.url, options.schema, options.statement_deadline);
  if (options.min_poll.count() < 1) throw ConfigError("min_poll", "must be at least 1 ms");
  if (options.max_poll < options.min_poll) {
    throw ConfigError("max_poll", "must not be below min_poll");
  }
  return std::make_unique<MariaDbWakeup>(std::move(options));
}

}  // namespace outbox::mariadb
