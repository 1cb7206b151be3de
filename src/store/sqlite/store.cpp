#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stdexcept>

#include "handle.h"
#include "outbox/core/error.h"
#include "outbox/store/failure_plan.h"
#include "outbox/store/sqlite.h"

namespace outbox::sqlite {
namespace {

const std::string kNow = kNowMillis;

// Fenced by owner and epoch, like the PostgreSQL store.
const std::string kFence =
    " WHERE id = ?1 AND lease_epoch = ?2 AND lease_owner = ?3 AND status = 'processing'";

// Oldest first (commit order); a keyed message waits while an earlier message of its own target
// and stream is leased by another owner or waits for its retry. Head-of-line is per (target,
// stream), as stream_seq is: when one target fails or is paused, the other targets' copies of the
// same stream are claimed and published. The messages of a paused target (?5, a JSON array of the
// targets whose sink is unavailable) are not claimed; they hold back only the later messages of
// their own target and stream, which are paused too, so no other check is needed. The waiting
// check probes outbox_messages_in_flight (stream_key, position), filtering on the target.
const std::string kClaimableIds =
    "SELECT m.position FROM outbox_messages m"
    " WHERE m.status IN ('pending', 'failed') AND m.available_at <= " +
    kNow +
    "  AND m.target NOT IN (SELECT value FROM json_each(?5))"
    "  AND (m.stream_key IS NULL OR NOT EXISTS ("
    "   SELECT 1 FROM outbox_messages e WHERE e.stream_key = m.stream_key"
    "    AND e.position < m.position AND e.status IN ('processing', 'failed')"
    "    AND e.target = m.target"
    "    AND ((e.status = 'processing' AND e.lease_owner <> ?2) OR"
    "         (e.status = 'failed' AND e.available_at > " +
    kNow +
    "))))"
    " ORDER BY m.position LIMIT ?3";

// The stream_prev_seq of message ?2 of stream ?1 and target ?3 (Envelope::stream_prev_seq): only
// when the message just before it is abandoned, the seq just below the run of abandoned messages
// that ends there, 0 when the run starts at the stream's first message. Seqs count per (target,
// stream), so two targets' copies of a stream may have the same seq: every row matched is of the
// message's own target. Every lookup is one probe of the index of abandoned rows
// (outbox_messages_abandoned_streams, filtering on the target), one more per message of the run.
// (Not in the claim's RETURNING: there SQLite cannot use the outer row's values to search an
// index, and scanned every abandoned row for each claimed one.)
constexpr const char* kPrevSeq =
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox_messages a WHERE a.status = 'abandoned'"
    "  AND a.stream_key = ?1 AND a.stream_seq = ?2 - 1 AND a.target = ?3)"
    " THEN (SELECT a.stream_seq - 1 FROM outbox_messages a WHERE a.status = 'abandoned'"
    "  AND a.stream_key = ?1 AND a.stream_seq < ?2 AND a.target = ?3"
    "  AND NOT EXISTS (SELECT 1 FROM outbox_messages b WHERE b.status = 'abandoned'"
    "   AND b.stream_key = a.stream_key AND b.stream_seq = a.stream_seq - 1"
    "   AND b.target = a.target)"
    "  ORDER BY a.stream_seq DESC LIMIT 1) END";

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(StoreOptions options)
      : options_(std::move(options)),
        db_(Open(options_.path, options_.busy_timeout, /*create=*/false)),
        writer_(options_.limits) {
    if (!options_.random) options_.random = DefaultRandom();
    RequireTables(db_.get(), options_.path);
  }

  std::vector<MessageId> Enqueue(std::span<const NewMessage> messages) override {
    return InWriteTransaction(db_.get(), [&] { return writer_.Enqueue(db_.get(), messages); });
  }

  ClaimResult ClaimRound(const ClaimRequest& request) override {
    if (request.owner.empty()) throw std::invalid_argument("claim: owner must not be empty");
    if (request.max_messages < 1) throw std::invalid_argument("claim: max_messages must be >= 1");
    if (request.lease_duration.count() < 1) {
      throw std::invalid_argument("claim: lease_duration must be positive");
    }
    if (request.partitions) {
      // One relay owns an embedded database; partition leases live in PostgreSQL only.
      throw std::invalid_argument(
          "claim: the SQLite store serves a single relay and has no partition leases");
    }
    return InWriteTransaction(db_.get(), [&] {
      ClaimResult round;
      round.completed =
          SettleInTransaction(CompleteSql(), request.owner, request.complete, [](Statement&) {});
      Statement claim{
          db_.get(),
          "UPDATE outbox_messages SET status = 'processing', lease_owner = ?2,"
          " lease_until = " +
              kNow +
              " + ?4, lease_epoch = lease_epoch + 1"
              " WHERE position IN (" +
              kClaimableIds +
              ")"
              " RETURNING id, topic, stream_key, stream_seq, partition, target, type,"
              " payload, content_type, headers, attempts, created_at, lease_epoch, position,"
              " event_id"};
      claim.Bind(2, request.owner)
          .Bind(3, std::int64_t{request.max_messages})
          .Bind(4, static_cast<std::int64_t>(request.lease_duration.count()))
          .Bind(5, JsonStrings(request.paused_targets));
      std::vector<std::pair<std::int64_t, Envelope>> rows;
      while (claim.Step()) {
        Envelope envelope;
        envelope.id = Uuid::Parse(claim.Text(0)).value_or(Uuid{});
        envelope.topic = claim.Text(1);
        envelope.stream_key = claim.OptionalText(2);
        if (!claim.IsNull(3)) envelope.stream_seq = claim.Int(3);
        envelope.partition = static_cast<int>(claim.Int(4));
        envelope.target = claim.Text(5);
        envelope.type = claim.OptionalText(6);
        envelope.payload = claim.Text(7);
        envelope.content_type = claim.Text(8);
        envelope.headers = ParseHeaders(claim.Text(9));
        envelope.attempts = static_cast<int>(claim.Int(10));
        envelope.created_at = FromMillis(claim.Int(11));
        envelope.lease_epoch = claim.Int(12);
        if (!claim.IsNull(14)) envelope.event_id = Uuid::Parse(claim.Text(14));
        rows.emplace_back(claim.Int(13), std::move(envelope));
      }
      std::sort(rows.begin(), rows.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      FillStreamPrevSeq(rows);
      round.messages.reserve(rows.size());
      for (auto& row : rows) round.messages.push_back(std::move(row.second));
      if (round.messages.empty()) round.next_due = NextDue(request.paused_targets);
      return round;
    });
  }

  SettleResult Complete(std::string_view owner, std::span<const LeasedId> messages) override {
    return Settle(CompleteSql(), owner, messages, [](Statement&) {});
  }

  SettleResult Renew(std::string_view owner, std::span<const LeasedId> messages,
                     std::chrono::milliseconds lease_duration) override {
    if (lease_duration.count() < 1) {
      throw std::invalid_argument("renew: lease_duration must be positive");
    }
    return Settle("UPDATE outbox_messages SET lease_until = " + kNow + " + ?4" + kFence, owner,
                  messages, [&](Statement& statement) {
                    statement.Bind(4, static_cast<std::int64_t>(lease_duration.count()));
                  });
  }

  SettleResult Release(std::string_view owner, std::span<const LeasedId> messages) override {
    return Settle(
        "UPDATE outbox_messages SET status = 'pending', lease_owner = NULL,"
        " lease_until = NULL" +
            kFence,
        owner, messages, [](Statement&) {});
  }

  SettleResult Fail(std::string_view owner, std::span<const FailedMessage> failures) override {
    return InWriteTransaction(db_.get(), [&] {
      Statement fail{db_.get(),
                     "UPDATE outbox_messages SET"
                     " status = CASE WHEN ?4 THEN 'abandoned' WHEN ?5 OR ?6 > 0 THEN 'failed'"
                     "  ELSE 'pending' END,"
                     " attempts = attempts + ?5, available_at = " +
                         kNow +
                         " + ?6,"
                         " abandoned_at = CASE WHEN ?4 THEN " +
                         kNow +
                         " END,"
                         " last_error = ?7, lease_owner = NULL, lease_until = NULL" +
                         kFence};
      SettleResult result;
      for (const auto& failed : failures) {
        const auto plan = PlanFailure(failed, options_.retry, options_.random);
        if (!plan) continue;  // lease lost: the new owner settles it
        fail.Bind(1, failed.message.id.ToString())
            .Bind(2, failed.message.lease_epoch)
            .Bind(3, owner)
            .Bind(4, std::int64_t{plan->abandon ? 1 : 0})
            .Bind(5, std::int64_t{plan->spend_attempt ? 1 : 0})
            .Bind(6, static_cast<std::int64_t>(plan->delay.count()))
            .Bind(7, failed.failure.Describe());
        fail.Step();
        if (fail.Changes() == 1) {
          ++result.settled;
        } else {
          result.lease_lost.push_back(failed.message.id);
        }
        fail.Reset();
      }
      return result;
    });
  }

  std::int64_t ReclaimExpired(const ReclaimRequest& request) override {
    if (request.partitions) {
      throw std::invalid_argument(
          "reclaim: the SQLite store serves a single relay and has no partition leases");
    }
    std::vector<std::string> in_flight;
    in_flight.reserve(request.in_flight.size());
    for (const auto& id : request.in_flight) in_flight.push_back(id.ToString());
    Statement reclaim{db_.get(),
                      "UPDATE outbox_messages SET status = 'pending', lease_owner = NULL,"
                      " lease_until = NULL WHERE status = 'processing' AND (lease_until < " +
                          kNow +
                          " OR (?2 AND lease_owner = ?3))"
                          " AND id NOT IN (SELECT value FROM json_each(?1))"};
    const std::string in_flight_text = JsonStrings(in_flight);
    reclaim.Bind(1, in_flight_text)
        .Bind(2, std::int64_t{request.own_unexpired ? 1 : 0})
        .Bind(3, request.owner);
    reclaim.Step();
    return reclaim.Changes();
  }

  std::int64_t Purge(const RetentionPolicy& retention, int max_rows) override {
    if (max_rows < 1) throw std::invalid_argument("purge: max_rows must be >= 1");
    return PurgeChunk(db_.get(), retention, max_rows);
  }

  StoreStats Stats() override {
    StoreStats stats;
    Statement counts{db_.get(), "SELECT status, count(*) FROM outbox_messages GROUP BY status"};
    while (counts.Step()) {
      const std::string status = counts.Text(0);
      const std::int64_t count = counts.Int(1);
      if (status == "pending") stats.pending = count;
      if (status == "processing") stats.processing = count;
      if (status == "failed") stats.failed = count;
      if (status == "abandoned") stats.abandoned = count;
      if (status == "published") stats.published = count;
    }
    Statement oldest{db_.get(), "SELECT " + kNow +
                                    " - created_at FROM outbox_messages WHERE "
                                    "status IN ('pending', 'failed') ORDER BY position LIMIT 1"};
    if (oldest.Step()) {
      stats.oldest_pending_age =
          std::chrono::milliseconds{std::max<std::int64_t>(0, oldest.Int(0))};
    }
    Statement leases{db_.get(),
                     "SELECT count(DISTINCT lease_owner) FROM outbox_messages WHERE "
                     "status = 'processing' AND lease_until > " +
                         kNow};
    leases.Step();
    stats.active_leases = leases.Int(0);
    return stats;
  }

 private:
  template <typename BindExtra>
  SettleResult Settle(const std::string& sql, std::string_view owner,
                      std::span<const LeasedId> messages, BindExtra&& bind_extra) {
    if (messages.empty()) return {};
    return InWriteTransaction(db_.get(), [&] {
      return SettleInTransaction(sql, owner, messages, std::forward<BindExtra>(bind_extra));
    });
  }

  template <typename BindExtra>
  SettleResult SettleInTransaction(const std::string& sql, std::string_view owner,
                                   std::span<const LeasedId> messages, BindExtra&& bind_extra) {
    SettleResult result;
    if (messages.empty()) return result;
    Statement statement{db_.get(), sql};
    for (const auto& message : messages) {
      statement.Bind(1, message.id.ToString()).Bind(2, message.lease_epoch).Bind(3, owner);
      bind_extra(statement);
      statement.Step();
      if (statement.Changes() == 1) {
        ++result.settled;
      } else {
        result.lease_lost.push_back(message.id);
      }
      statement.Reset();
    }
    return result;
  }

  [[nodiscard]] std::string CompleteSql() const {
    return options_.retention.published.count() == 0
               ? "DELETE FROM outbox_messages" + kFence
               : "UPDATE outbox_messages SET status = 'published', published_at = " + kNow +
                     ", lease_owner = NULL, lease_until = NULL" + kFence;
  }

  // Milliseconds until the first failed message of a target not paused is due; unset when none
  // waits (see ClaimResult::next_due).
  std::optional<std::chrono::milliseconds> NextDue(const std::vector<std::string>& paused) {
    Statement next{db_.get(), "SELECT min(available_at) - " + kNow +
                                  " FROM outbox_messages WHERE status = 'failed'"
                                  " AND available_at > " +
                                  kNow + " AND target NOT IN (SELECT value FROM json_each(?1))"};
    next.Bind(1, JsonStrings(paused));
    if (!next.Step() || next.IsNull(0)) return std::nullopt;
    return std::chrono::milliseconds{next.Int(0)};
  }

  // Sets stream_prev_seq on the claimed messages whose predecessor is abandoned; one probe when
  // no message at all is abandoned.
  void FillStreamPrevSeq(std::vector<std::pair<std::int64_t, Envelope>>& rows) {
    const auto follows = [](const Envelope& envelope) {
      return envelope.stream_key && envelope.stream_seq && *envelope.stream_seq > 1;
    };
    if (std::none_of(rows.begin(), rows.end(),
                     [&](const auto& row) { return follows(row.second); })) {
      return;
    }
    Statement any{db_.get(),
                  "SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE status = 'abandoned')"};
    if (!any.Step() || any.Int(0) == 0) return;
    Statement prev{db_.get(), kPrevSeq};
    for (auto& [position, envelope] : rows) {
      if (!follows(envelope)) continue;
      prev.Bind(1, *envelope.stream_key).Bind(2, *envelope.stream_seq).Bind(3, envelope.target);
      if (prev.Step() && !prev.IsNull(0)) envelope.stream_prev_seq = prev.Int(0);
      prev.Reset();
    }
  }

  StoreOptions options_;
  DbPtr db_;
  Writer writer_;
};

// Sleeps until Interrupt() or the deadline: SQLite has no notifications; in-process writers wake
// the relay through the hand-off queue, the others are found by the sweep.
class LocalWakeup final : public Wakeup {
 public:
  void AnnounceIdle() override {}
  void Withdraw() override {}
  WakeReason Wait(Deadline deadline) override {
    std::unique_lock lock(mutex_);
    const bool woken = changed_.wait_until(lock, deadline, [this] { return interrupted_; });
    interrupted_ = false;
    return woken ? WakeReason::kInterrupted : WakeReason::kTimeout;
  }
  void Interrupt() override {
    {
      std::lock_guard lock(mutex_);
      interrupted_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool interrupted_ = false;  // guarded by mutex_
};

}  // namespace

std::unique_ptr<Store> OpenStore(StoreOptions options) {
  if (options.path.empty()) throw ConfigError("database.path", "must not be empty");
  if (auto error = options.retry.Validate()) throw ConfigError("retry", *error);
  // A held stream needs the claim's check and the operator's skip, which only the PostgreSQL
  // store has.
  if (!options.retry.hold_targets.empty()) {
    throw ConfigError("sinks." + options.retry.hold_targets.front() + ".on_abandon",
                      "\"hold\" needs the PostgreSQL store; the SQLite store only continues "
                      "a stream past an abandoned message (on_abandon = \"continue\")");
  }
  if (options.retention.published.count() < 0 || options.retention.abandoned.count() < 0) {
    throw ConfigError("retention", "must not be negative");
  }
  return std::make_unique<SqliteStore>(std::move(options));
}

std::unique_ptr<Wakeup> OpenWakeup() { return std::make_unique<LocalWakeup>(); }

}  // namespace outbox::sqlite
