#include <algorithm>
#include <stdexcept>
#include <unordered_set>

#include "claim_cursor.h"
#include "connection.h"
#include "migrations.h"
#include "outbox/core/error.h"
#include "outbox/store/failure_plan.h"
#include "outbox/store/postgres.h"
#include "statements.h"

namespace outbox::postgres {
namespace {

std::string BoolArray(const std::vector<bool>& values) {
  std::string literal = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) literal += ',';
    literal += values[i] ? 't' : 'f';
  }
  return literal + '}';
}

// The (partition, epoch) pairs of a request as the integer[] and bigint[] parameters of the
// statements' `held` CTE; both NULL for every partition. `none`: an empty set, nothing to do.
struct HeldParams {
  explicit HeldParams(const std::optional<std::vector<PartitionLease>>& leases) {
    if (!leases) return;
    none = leases->empty();
    std::vector<int> numbers;
    std::vector<std::int64_t> lease_epochs;
    for (const auto& held : *leases) {
      numbers.push_back(held.partition);
      lease_epochs.push_back(held.epoch);
    }
    partition_text = NumberArray(numbers);
    epoch_text = NumberArray(lease_epochs);
    partitions = Param{partition_text};
    epochs = Param{epoch_text};
  }
  HeldParams(const HeldParams&) = delete;  // the Params view the strings
  HeldParams& operator=(const HeldParams&) = delete;

  bool none = false;
  std::string partition_text;
  std::string epoch_text;
  Param partitions;
  Param epochs;
};

class PostgresStore final : public Store {
 public:
  explicit PostgresStore(StoreOptions options)
      : options_(std::move(options)),
        connection_(options_.conninfo, std::string{kClaimPlanMode}),
        writer_(options_.schema),
        sql_(options_.schema, options_.retention.published.count() > 0),
        hold_targets_(TextArray(options_.retry.hold_targets)) {
    if (!options_.random) options_.random = DefaultRandom();
    RequireSchemaVersion(connection_.Ready(), options_.schema, connection_.description());
  }

  std::vector<MessageId> Enqueue(std::span<const NewMessage> messages) override {
    PGconn* conn = connection_.Ready();
    Exec(conn, "enqueue: begin", "BEGIN");
    try {
      // The enqueue's PL/pgSQL plans as on any other session, not under kClaimPlanMode.
      Exec(conn, "enqueue: plan mode", "SET LOCAL plan_cache_mode = auto");
      auto ids = writer_.Enqueue(conn, messages);
      Exec(conn, "enqueue: commit", "COMMIT");
      return ids;
    } catch (...) {
      RollbackQuietly(conn);
      throw;
    }
  }

  ClaimResult ClaimRound(const ClaimRequest& request) override {
    if (request.owner.empty()) throw std::invalid_argument("claim: owner must not be empty");
    if (request.max_messages < 1) throw std::invalid_argument("claim: max_messages must be >= 1");
    if (request.lease_duration.count() < 1) {
      throw std::invalid_argument("claim: lease_duration must be positive");
    }
    const std::string limit = std::to_string(request.max_messages);
    const std::string lease = std::to_string(request.lease_duration.count());
    const HeldParams held{request.partitions};
    if (held.none) {  // no partition held: nothing to claim, only the completion
      ClaimResult round;
      round.completed = Complete(request.owner, request.complete);
      return round;
    }
    const std::string cursor =
        cursor_.Next(request.partitions, std::chrono::steady_clock::now(), request.paused_targets)
            .ToString();
    std::vector<MessageId> complete_ids;
    std::vector<std::int64_t> complete_epochs;
    for (const auto& message : request.complete) {
      complete_ids.push_back(message.id);
      complete_epochs.push_back(message.lease_epoch);
    }
    const std::string complete_id_array = UuidArray(complete_ids);
    const std::string complete_epoch_array = NumberArray(complete_epochs);
    // Named: a Param only views its text, which must outlive the statement below.
    const std::string paused_array = TextArray(request.paused_targets);
    const std::vector<Param> params{Param{limit},
                                    held.partitions,
                                    Param{request.owner},
                                    Param{lease},
                                    held.epochs,
                                    Param{cursor},
                                    Param{paused_array},
                                    Param{complete_id_array},
                                    Param{complete_epoch_array}};
    const auto result = RunClaim(params);
    const PGresult* rows = result.get();
    if (PQntuples(rows) < 1 || PQnfields(rows) != kClaimColumns) {
      throw StoreError(FailureKind::kUnavailable,
                       "claim: the database returned " + std::to_string(PQntuples(rows)) +
                           " rows of " + std::to_string(PQnfields(rows)) + " columns, expected " +
                           std::to_string(kClaimColumns) + " columns");
    }
    cursor_.Observe(ReadClaimObservation(rows));
    ClaimResult round;
    round.completed = ReadCompleted(rows);
    if (PQgetisnull(rows, 0, 21) == 0) {
      round.next_due = std::chrono::milliseconds{ReadInt64(PQgetvalue(rows, 0, 21))};
    }
    auto& batch = round.messages;
    batch.reserve(static_cast<std::size_t>(PQntuples(rows)));
    for (int row = 0; row < PQntuples(rows); ++row) {
      if (PQgetisnull(rows, row, 0) != 0) continue;  // the row that only carries the cursor
      Envelope envelope;
      envelope.id = ReadUuid(PQgetvalue(rows, row, 0));
      envelope.topic = Column(rows, row, 1);
      envelope.stream_key = OptionalText(rows, row, 2);
      if (PQgetisnull(rows, row, 3) == 0) envelope.stream_seq = ReadInt64(PQgetvalue(rows, row, 3));
      envelope.partition = ReadInt32(PQgetvalue(rows, row, 4));
      envelope.target = Column(rows, row, 5);
      envelope.type = OptionalText(rows, row, 6);
      envelope.payload = Column(rows, row, 7);
      envelope.content_type = Column(rows, row, 8);
      envelope.headers = ParseHeaders(Column(rows, row, 9));
      envelope.attempts = ReadInt32(PQgetvalue(rows, row, 10));
      envelope.created_at = ReadTimestamp(PQgetvalue(rows, row, 11));
      envelope.lease_epoch = ReadInt64(PQgetvalue(rows, row, 12));
      if (PQgetisnull(rows, row, 13) == 0) envelope.event_id = ReadUuid(PQgetvalue(rows, row, 13));
      if (PQgetisnull(rows, row, 18) == 0) {
        envelope.stream_prev_seq = ReadInt64(PQgetvalue(rows, row, 18));
      }
      batch.push_back(std::move(envelope));
    }
    // UPDATE ... RETURNING has no order; ids are time-ordered and, within a stream, in
    // stream_seq order.
    std::sort(batch.begin(), batch.end(),
              [](const Envelope& a, const Envelope& b) { return a.id < b.id; });
    last_claimed_ = batch.size();
    return round;
  }

  SettleResult Complete(std::string_view owner, std::span<const LeasedId> messages) override {
    return Settle(sql_.complete, "complete", owner, messages, {});
  }

  SettleResult Renew(std::string_view owner, std::span<const LeasedId> messages,
                     std::chrono::milliseconds lease_duration) override {
    if (lease_duration.count() < 1) {
      throw std::invalid_argument("renew: lease_duration must be positive");
    }
    return Settle(sql_.renew, "renew", owner, messages, {std::to_string(lease_duration.count())});
  }

  SettleResult Release(std::string_view owner, std::span<const LeasedId> messages) override {
    return Settle(sql_.release, "release", owner, messages, {});
  }

  SettleResult Fail(std::string_view owner, std::span<const FailedMessage> failures) override {
    std::vector<MessageId> ids;
    std::vector<std::int64_t> epochs;
    std::vector<bool> abandon;
    std::vector<bool> spend;
    std::vector<std::int64_t> delays;
    std::vector<std::string> errors;
    for (const auto& failed : failures) {
      const auto plan = PlanFailure(failed, options_.retry, options_.random);
      if (!plan) continue;  // lease lost: the new owner settles it
      ids.push_back(failed.message.id);
      epochs.push_back(failed.message.lease_epoch);
      abandon.push_back(plan->abandon);
      spend.push_back(plan->spend_attempt);
      delays.push_back(plan->delay.count());
      errors.push_back(failed.failure.Describe());
    }
    SettleResult outcome;
    if (ids.empty()) return outcome;
    const std::string owner_text{owner};
    const auto result =
        Exec(connection_.Ready(), "fail", sql_.fail,
             {Param{owner_text}, Param{UuidArray(ids)}, Param{NumberArray(epochs)},
              Param{BoolArray(abandon)}, Param{BoolArray(spend)}, Param{NumberArray(delays)},
              Param{TextArray(errors)}, Param{hold_targets_}});
    return Tally(result.get(), ids);
  }

  std::int64_t ReclaimExpired(const ReclaimRequest& request) override {
    const HeldParams held{request.partitions};
    if (held.none && !request.own_unexpired) return 0;
    const std::string in_flight = UuidArray(request.in_flight);
    const auto result = Exec(connection_.Ready(), "reclaim expired leases", sql_.reclaim_expired,
                             {Param{in_flight}, held.partitions, Param{request.owner}, held.epochs,
                              Param{request.own_unexpired ? "true" : "false"}});
    return std::stoll(PQcmdTuples(result.get()));
  }

  std::int64_t Purge(const RetentionPolicy& retention, int max_rows) override {
    if (max_rows < 1) throw std::invalid_argument("purge: max_rows must be >= 1");
    const auto result =
        Exec(connection_.Ready(), "purge", sql_.purge,
             {Param{std::to_string(retention.published.count())},
              Param{std::to_string(retention.abandoned.count())}, Param{std::to_string(max_rows)}});
    // The stream_seq numbers that have a successor are of no use any more (sql/011): removed here
    // rather than by each writer, which would wait on the others' locks.
    Exec(connection_.Ready(), "purge stream numbers", sql_.purge_stream_seqs);
    return std::stoll(PQcmdTuples(result.get()));
  }

  StoreStats Stats() override {
    const auto result = Exec(connection_.Ready(), "stats", sql_.stats,
                             {Param{std::to_string(options_.exact_count_limit)}});
    const PGresult* row = result.get();
    const auto number = [row](int column) -> std::int64_t {
      return PQgetisnull(row, 0, column) != 0 ? 0 : std::stoll(PQgetvalue(row, 0, column));
    };
    StoreStats stats;
    stats.pending = number(0);
    stats.processing = number(1);
    stats.failed = number(2);
    stats.abandoned = number(3);
    stats.published = number(4);
    if (PQgetisnull(row, 0, 5) == 0) {
      stats.oldest_pending_age = std::chrono::milliseconds{std::max<std::int64_t>(0, number(5))};
    }
    stats.active_leases = number(6);
    stats.live_relays = number(12);
    stats.unowned_partitions = number(13);
    stats.streams_held = number(14);
    // A capped count is replaced by the planner's estimate of the table's rows in that state.
    const auto limit = options_.exact_count_limit;
    std::int64_t* counts[] = {&stats.pending, &stats.processing, &stats.failed, &stats.abandoned,
                              &stats.published};
    for (int i = 0; i < 5; ++i) {
      if (*counts[i] >= limit) {
        stats.counts_estimated = true;
        *counts[i] = std::max(limit, number(7 + i));
      }
    }
    return stats;
  }

  // Runs a fenced statement over (ids, epochs) and reports which rows it touched.
  SettleResult Settle(const std::string& sql, std::string_view what, std::string_view owner,
                      std::span<const LeasedId> messages, const std::vector<std::string>& extra) {
    SettleResult outcome;
    if (messages.empty()) return outcome;
    std::vector<MessageId> ids;
    std::vector<std::int64_t> epochs;
    for (const auto& message : messages) {
      ids.push_back(message.id);
      epochs.push_back(message.lease_epoch);
    }
    // Param holds views: the strings must outlive the call.
    const std::string owner_text{owner};
    const std::string id_array = UuidArray(ids);
    const std::string epoch_array = NumberArray(epochs);
    std::vector<Param> params{Param{owner_text}, Param{id_array}, Param{epoch_array}};
    for (const auto& value : extra) params.push_back(Param{value});
    const auto result = Exec(connection_.Ready(), what, sql, params);
    return Tally(result.get(), ids);
  }

  // Rows returned by a fenced statement are settled; the rest of `ids` had lost their lease.
  static SettleResult Tally(const PGresult* result, const std::vector<MessageId>& ids) {
    SettleResult outcome;
    std::unordered_set<MessageId> touched;
    for (int row = 0; row < PQntuples(result); ++row) {
      if (auto id = Uuid::Parse(PQgetvalue(result, row, 0))) touched.insert(*id);
    }
    outcome.settled = static_cast<std::int64_t>(touched.size());
    for (const auto& id : ids) {
      if (!touched.contains(id)) outcome.lease_lost.push_back(id);
    }
    return outcome;
  }

  // The claim's 14 message columns, then frontier, now(), oldest running xid, own xid, the
  // message's stream_prev_seq, then how many of request.complete were settled, the ids of those
  // that were not (text, comma-separated; null when all were) and next_due in ms.
  static constexpr int kClaimColumns = 22;

  static SettleResult ReadCompleted(const PGresult* rows) {
    SettleResult completed;
    completed.settled = ReadInt64(PQgetvalue(rows, 0, 19));
    if (PQgetisnull(rows, 0, 20) != 0) return completed;
    const std::string lost{PQgetvalue(rows, 0, 20),
                           static_cast<std::size_t>(PQgetlength(rows, 0, 20))};
    for (std::size_t at = 0; at < lost.size();) {
      const auto end = std::min(lost.find(',', at), lost.size());
      if (const auto id = Uuid::Parse(lost.substr(at, end - at))) {
        completed.lease_lost.push_back(*id);
      }
      at = end + 1;
    }
    return completed;
  }

  static ClaimObservation ReadClaimObservation(const PGresult* rows) {
    ClaimObservation observation;
    if (PQgetisnull(rows, 0, 14) == 0) observation.frontier = ReadUuid(PQgetvalue(rows, 0, 14));
    observation.database_now = ReadTimestamp(PQgetvalue(rows, 0, 15));
    observation.oldest_running_xid = static_cast<std::uint64_t>(ReadInt64(PQgetvalue(rows, 0, 16)));
    if (PQgetisnull(rows, 0, 17) == 0) {
      observation.own_xid = static_cast<std::uint64_t>(ReadInt64(PQgetvalue(rows, 0, 17)));
    }
    return observation;
  }

  // The claim, prepared once with one generic plan: planning it for each call's parameters cost
  // 2-3 ms, more than running it for a few messages and a fifth of a claim of 500. But a cached
  // plan is made for the table as it was when it was made: made on an empty table, it scanned the
  // whole table for each batch once a backlog of 200,000 had arrived (0.8 s a claim, until an
  // ANALYZE replaced it). So the statement is prepared again whenever claims turn from small to
  // large (its plan is then made on the backlog) or back; only the first claim of a backlog runs
  // on a plan made for a smaller table.
  ResultPtr RunClaim(const std::vector<Param>& params) {
    PGconn* conn = connection_.Ready();
    const bool large = last_claimed_ >= kLargeClaim;
    const bool prepared = claim_prepared_in_ == connection_.generation();
    if (!prepared || large != claim_prepared_large_) {
      if (prepared) {
        Exec(conn, "claim: deallocate", std::string{"DEALLOCATE "} + kClaimStatementName);
      }
      claim_prepared_in_ = 0;
      Prepare(conn, "claim: prepare", kClaimStatementName, sql_.claim);
      claim_prepared_in_ = connection_.generation();
      claim_prepared_large_ = large;
    }
    return ExecPrepared(conn, "claim", kClaimStatementName, params, /*binary_results=*/true);
  }

  StoreOptions options_;
  Connection connection_;
  Writer writer_;
  Statements sql_;
  std::string hold_targets_;  // options_.retry.hold_targets as a text[] literal, for kFail's $8
  ClaimCursor cursor_;
  // The store's session keeps one generic plan of each statement it prepares (the claim, see
  // RunClaim). Only on this connection: PL/pgSQL caches its statements' plans the same way, and
  // the functions other connections call (heartbeats, wake-ups, admin) keep their own choice.
  static constexpr std::string_view kClaimPlanMode = "SET plan_cache_mode = force_generic_plan";
  static constexpr const char* kClaimStatementName = "outbox_claim";
  // RunClaim's state: the server session (Connection::generation) where the claim is prepared
  // (0: none), whether it was prepared after a large claim, how many the last claim returned.
  static constexpr std::size_t kLargeClaim = 64;
  std::uint64_t claim_prepared_in_ = 0;
  bool claim_prepared_large_ = false;
  std::size_t last_claimed_ = 0;
};

}  // namespace

std::unique_ptr<Store> OpenStore(StoreOptions options) {
  if (auto error = options.retry.Validate()) throw ConfigError("retry", *error);
  if (options.retention.published.count() < 0) {
    throw ConfigError("retention.published", "must not be negative");
  }
  if (options.retention.abandoned.count() < 0) {
    throw ConfigError("retention.abandoned", "must not be negative");
  }
  if (options.exact_count_limit < 1) throw ConfigError("exact_count_limit", "must be >= 1");
  CheckSchemaOption(options.schema);
  return std::make_unique<PostgresStore>(std::move(options));
}

}  // namespace outbox::postgres
