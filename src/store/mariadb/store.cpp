// The relay-side Store on MariaDB. Every call is one statement on the store's connection: the
// claim round, the settling calls, ReclaimExpired and the heartbeat are stored procedures of the
// schema (sql/003_relay.sql), each a transaction of its own on the database's clock, so that a
// round trip is all a call costs. Lists go to them as JSON (read with JSON_TABLE). The rules are
// PostgreSQL's (src/store/postgres/statements.cpp); the procedures' comments say where MariaDB
// needs another way to keep them.

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_set>

#include "connection.h"
#include "migrations.h"
#include "outbox/core/error.h"
#include "outbox/store/failure_plan.h"
#include "outbox/store/mariadb.h"

namespace outbox::mariadb {
namespace {

using Json = nlohmann::json;

// Counts above this are not taken exactly (a capped index walk each) but estimated.
constexpr std::int64_t kExactCountLimit = 100000;
// last_error is TEXT (64 KiB): longer failure texts are cut, at a character boundary.
constexpr std::size_t kMaxErrorBytes = 16384;

std::string Dump(const Json& json) {
  // Invalid UTF-8 (a broker's error text may carry any bytes) becomes U+FFFD, never an error.
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Hex(const MessageId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(32, '0');
  for (std::size_t i = 0; i < 16; ++i) {
    hex[2 * i] = kDigits[id.bytes()[i] >> 4];
    hex[2 * i + 1] = kDigits[id.bytes()[i] & 0x0f];
  }
  return hex;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Ids as the procedures list them: hex, comma-separated. Throws MariaDbError for anything else.
std::vector<MessageId> ParseHexIds(std::string_view list, std::string_view what) {
  std::vector<MessageId> ids;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const auto hex = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    Uuid::Bytes bytes{};
    bool good = hex.size() == 32;
    for (std::size_t i = 0; good && i < 16; ++i) {
      const int high = HexDigit(hex[2 * i]);
      const int low = HexDigit(hex[2 * i + 1]);
      good = high >= 0 && low >= 0;
      bytes[i] = static_cast<std::uint8_t>(high * 16 + low);
    }
    if (!good) {
      throw MariaDbError(FailureKind::kPermanent,
                         std::string{what} + ": not a hex id: '" + std::string{hex} + "'", 0,
                         "HY000");
    }
    ids.emplace_back(bytes);
  }
  return ids;
}

// [[id hex, epoch], ...] of `messages`, each id once.
Json LeaseItems(std::span<const LeasedId> messages) {
  Json items = Json::array();
  std::unordered_set<MessageId> seen;
  for (const auto& message : messages) {
    if (seen.insert(message.id).second) items.push_back({Hex(message.id), message.lease_epoch});
  }
  return items;
}

// The partitions of a request as relay_held_partitions reads them: [[partition, epoch], ...];
// NULL for every partition.
Value PartitionsParam(const std::optional<std::vector<PartitionLease>>& partitions) {
  if (!partitions) return std::monostate{};
  Json held = Json::array();
  for (const auto& lease : *partitions) held.push_back({lease.partition, lease.epoch});
  return Dump(held);
}

// `text` cut to at most `max_bytes`, before a UTF-8 continuation byte.
std::string CutText(std::string text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  std::size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  text.resize(end);
  return text;
}

const ResultSet& FirstSet(const StatementResult& result, std::string_view what) {
  if (result.sets.empty() || result.sets[0].rows.empty()) {
    throw MariaDbError(FailureKind::kPermanent, std::string{what} + ": no result row", 0, "HY000");
  }
  return result.sets[0];
}

class MariaDbStore final : public Store {
 public:
  explicit MariaDbStore(StoreOptions options)
      : options_(std::move(options)),
        connection_(options_.url, options_.statement_deadline),
        writer_(options_.schema),
        keep_published_(options_.retention.published.count() > 0 ? 1 : 0),
        hold_targets_(Dump(Json(options_.retry.hold_targets))) {
    if (!options_.random) options_.random = DefaultRandom();
    const std::string schema = QuoteSchema(options_.schema);
    claim_sql_ = "CALL " + schema + ".relay_claim(?, ?, ?, ?, ?, ?, ?)";
    settle_sql_ = "CALL " + schema + ".relay_settle(?, ?, ?, ?, ?, ?)";
    reclaim_sql_ = "CALL " + schema + ".relay_reclaim(?, ?, ?, ?)";
    const std::string table = schema + ".messages";
    purge_published_sql_ = "DELETE FROM " + table +
                           " WHERE status = 'published' AND published_at < UTC_TIMESTAMP(6) - "
                           "INTERVAL ? SECOND LIMIT ?";
    // A message that holds its stream is never purged: that would release the stream behind the
    // operator's back; it waits for a replay or a skip.
    purge_abandoned_sql_ = "DELETE FROM " + table +
                           " WHERE status = 'abandoned' AND NOT holds_stream AND abandoned_at < "
                           "UTC_TIMESTAMP(6) - INTERVAL ? SECOND LIMIT ?";
    const auto capped = [&](const std::string& where) {
      return "(SELECT COUNT(*) FROM (SELECT 1 FROM " + table + " WHERE " + where + " LIMIT ?) x)";
    };
    // Exact counts up to the limit (a capped index walk each); the oldest due message's age from
    // the two ends of the claim's index; the table's row estimate for counts past the limit.
    stats_sql_ =
        "SELECT " + capped("status = 'pending'") + ", " + capped("status = 'processing'") + ", " +
        capped("status = 'failed'") + ", " + capped("status = 'abandoned'") + ", " +
        capped("status = 'published'") +
        ", (SELECT TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) DIV 1000 FROM " +
        table + " WHERE id = LEAST(COALESCE(o.pending, o.failed), COALESCE(o.failed, o.pending)))" +
        ", (SELECT COUNT(DISTINCT lease_owner) FROM " + table +
        " WHERE status = 'processing' AND lease_until > UTC_TIMESTAMP(6))" +
        ", (SELECT COUNT(*) FROM " + schema +
        ".relay_instances WHERE expires_at > UTC_TIMESTAMP(6))" +
        ", (SELECT CASE WHEN EXISTS (SELECT 1 FROM " + schema +
        ".relay_instances WHERE expires_at > UTC_TIMESTAMP(6)) THEN COUNT(*) ELSE 0 END FROM " +
        schema +
        ".partition_leases WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= "
        "UTC_TIMESTAMP(6))" +
        ", (SELECT COUNT(*) FROM (SELECT DISTINCT target, stream_key FROM " + table +
        " WHERE status = 'abandoned' AND holds_stream LIMIT ?) x)" +
        ", (SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND "
        "TABLE_NAME = 'messages')" +
        " FROM (SELECT (SELECT MIN(id) FROM " + table +
        " WHERE status = 'pending') AS pending, (SELECT MIN(id) FROM " + table +
        " WHERE status = 'failed') AS failed) o";
    RequireSchemaVersion(connection_, options_.schema);
  }

  std::vector<MessageId> Enqueue(std::span<const NewMessage> messages) override {
    connection_.Execute("enqueue: begin", "START TRANSACTION");
    try {
      auto ids = writer_.Enqueue(connection_.Ready(), messages);
      connection_.Execute("enqueue: commit", "COMMIT", /*commits=*/true);
      return ids;
    } catch (...) {
      try {
        connection_.Execute("enqueue: roll back", "ROLLBACK");
      } catch (const StoreError&) {  // NOLINT(bugprone-empty-catch): the session ends with it
      }
      throw;
    }
  }

  ClaimResult ClaimRound(const ClaimRequest& request) override {
    if (request.owner.empty()) throw std::invalid_argument("claim: owner must not be empty");
    if (request.max_messages < 1) throw std::invalid_argument("claim: max_messages must be >= 1");
    if (request.lease_duration.count() < 1) {
      throw std::invalid_argument("claim: lease_duration must be positive");
    }
    if (request.partitions && request.partitions->empty()) {
      ClaimResult round;  // no partition held: nothing to claim, only the completion
      round.completed = Complete(request.owner, request.complete);
      return round;
    }
    const Json complete = LeaseItems(request.complete);
    const Value params[] = {
        request.owner,
        std::int64_t{request.max_messages},
        static_cast<std::int64_t>(request.lease_duration.count()),
        PartitionsParam(request.partitions),
        request.paused_targets.empty() ? Value{} : Value{Dump(Json(request.paused_targets))},
        complete.empty() ? Value{} : Value{Dump(complete)},
        keep_published_};
    const auto result = connection_.Run("claim", claim_sql_, params);
    if (result.sets.size() < 2 || result.sets[0].rows.size() != 1 ||
        result.sets[1].columns.size() != kClaimColumns) {
      throw MariaDbError(FailureKind::kPermanent,
                         "claim: the procedure returned an unexpected result (is the schema at "
                         "the version this build expects?)",
                         0, "HY000");
    }
    const auto& round_row = result.sets[0].rows[0];
    ClaimResult round;
    round.completed.settled = ToInt64(round_row[0], "claim: settled");
    if (round_row[1]) round.completed.lease_lost = ParseHexIds(*round_row[1], "claim: lease_lost");
    if (round_row[2]) {
      round.next_due = std::chrono::milliseconds{
          std::max<std::int64_t>(0, ToInt64(round_row[2], "claim: next_due"))};
    }
    round.messages.reserve(result.sets[1].rows.size());
    for (const auto& row : result.sets[1].rows) round.messages.push_back(ReadEnvelope(row));
    return round;
  }

  SettleResult Complete(std::string_view owner, std::span<const LeasedId> messages) override {
    return Settle("complete", owner, LeaseItems(messages), 0);
  }

  SettleResult Renew(std::string_view owner, std::span<const LeasedId> messages,
                     std::chrono::milliseconds lease_duration) override {
    if (lease_duration.count() < 1) {
      throw std::invalid_argument("renew: lease_duration must be positive");
    }
    return Settle("renew", owner, LeaseItems(messages), lease_duration.count());
  }

  SettleResult Release(std::string_view owner, std::span<const LeasedId> messages) override {
    return Settle("release", owner, LeaseItems(messages), 0);
  }

  SettleResult Fail(std::string_view owner, std::span<const FailedMessage> failures) override {
    Json items = Json::array();
    std::unordered_set<MessageId> seen;
    for (const auto& failed : failures) {
      const auto plan = PlanFailure(failed, options_.retry, options_.random);
      if (!plan) continue;  // lease lost: the new owner settles it
      if (!seen.insert(failed.message.id).second) continue;
      items.push_back({Hex(failed.message.id), failed.message.lease_epoch, plan->abandon ? 1 : 0,
                       plan->spend_attempt ? 1 : 0, plan->delay.count(),
                       CutText(failed.failure.Describe(), kMaxErrorBytes)});
    }
    return Settle("fail", owner, items, 0);
  }

  std::int64_t ReclaimExpired(const ReclaimRequest& request) override {
    if (request.partitions && request.partitions->empty() && !request.own_unexpired) return 0;
    Json in_flight = Json::array();
    for (const auto& id : request.in_flight) in_flight.push_back(Hex(id));
    const Value params[] = {request.owner, PartitionsParam(request.partitions), Dump(in_flight),
                            std::int64_t{request.own_unexpired ? 1 : 0}};
    const auto result = connection_.Run("reclaim expired leases", reclaim_sql_, params);
    return ToInt64(FirstSet(result, "reclaim expired leases").rows[0].at(0),
                   "reclaim expired leases");
  }

  std::int64_t Purge(const RetentionPolicy& retention, int max_rows) override {
    if (max_rows < 1) throw std::invalid_argument("purge: max_rows must be >= 1");
    if (retention.published.count() < 0 || retention.abandoned.count() < 0) {
      throw std::invalid_argument("purge: retention must not be negative");
    }
    // Two short statements, each its own transaction; together at most max_rows rows. Nothing
    // else to tidy: target_streams keeps one counter row per (target, stream), which the next
    // message of the stream needs (PostgreSQL's purge removes its log of taken numbers instead).
    const Value published[] = {static_cast<std::int64_t>(retention.published.count()),
                               std::int64_t{max_rows}};
    const std::int64_t deleted =
        connection_.Run("purge published", purge_published_sql_, published).affected_rows;
    if (deleted >= max_rows) return deleted;
    const Value abandoned[] = {static_cast<std::int64_t>(retention.abandoned.count()),
                               std::int64_t{max_rows - deleted}};
    return deleted +
           connection_.Run("purge abandoned", purge_abandoned_sql_, abandoned).affected_rows;
  }

  StoreStats Stats() override {
    const Value limit{kExactCountLimit};
    const Value schema{options_.schema};
    const Value params[] = {limit, limit, limit, limit, limit, limit, schema};
    const auto result = connection_.Run("stats", stats_sql_, params);
    const auto& row = FirstSet(result, "stats").rows[0];
    const auto number = [&row](std::size_t column) -> std::int64_t {
      return row.at(column) ? ToInt64(row[column], "stats") : 0;
    };
    StoreStats stats;
    stats.pending = number(0);
    stats.processing = number(1);
    stats.failed = number(2);
    stats.abandoned = number(3);
    stats.published = number(4);
    if (row.at(5)) {
      stats.oldest_pending_age = std::chrono::milliseconds{std::max<std::int64_t>(0, number(5))};
    }
    stats.active_leases = number(6);
    stats.live_relays = number(7);
    stats.unowned_partitions = number(8);
    stats.streams_held = number(9);
    // A capped count is replaced by an estimate: the table's estimated rows less the exact
    // counts of the other states (InnoDB keeps no statistics per status).
    const std::int64_t table_rows = number(10);
    std::int64_t* counts[] = {&stats.pending, &stats.processing, &stats.failed, &stats.abandoned,
                              &stats.published};
    std::int64_t exact = 0;
    for (const auto* count : counts) exact += *count < kExactCountLimit ? *count : 0;
    for (auto* count : counts) {
      if (*count >= kExactCountLimit) {
        stats.counts_estimated = true;
        *count = std::max(kExactCountLimit, table_rows - exact);
      }
    }
    return stats;
  }

 private:
  // The claim's message columns (relay_claim's second result set).
  static constexpr std::size_t kClaimColumns = 15;

  static Envelope ReadEnvelope(const std::vector<std::optional<std::string>>& row) {
    Envelope envelope;
    envelope.id = ToId(row[0], "claim: id");
    envelope.topic = row[1].value_or("");
    envelope.stream_key = row[2];
    if (row[3]) envelope.stream_seq = ToInt64(row[3], "claim: stream_seq");
    envelope.partition = static_cast<int>(ToInt64(row[4], "claim: partition"));
    envelope.target = row[5].value_or("");
    envelope.type = row[6];
    envelope.payload = row[7].value_or("");
    envelope.content_type = row[8].value_or("");
    envelope.headers = ParseHeadersColumn(row[9], "claim: headers");
    envelope.attempts = static_cast<int>(ToInt64(row[10], "claim: attempts"));
    envelope.created_at = ToTime(row[11], "claim: created_at");
    envelope.lease_epoch = ToInt64(row[12], "claim: lease_epoch");
    if (row[13]) envelope.event_id = ToId(row[13], "claim: event_id");
    if (row[14]) envelope.stream_prev_seq = ToInt64(row[14], "claim: stream_prev_seq");
    return envelope;
  }

  // One relay_settle call; `items` as relay_settle_leases reads them.
  SettleResult Settle(std::string_view action, std::string_view owner, const Json& items,
                      std::int64_t lease_ms) {
    SettleResult outcome;
    if (items.empty()) return outcome;
    if (owner.empty()) throw std::invalid_argument(std::string{action} + ": owner is empty");
    const Value params[] = {std::string{action}, std::string{owner}, Dump(items), lease_ms,
                            keep_published_,     hold_targets_};
    const auto result = connection_.Run(action, settle_sql_, params);
    const auto& row = FirstSet(result, action).rows[0];
    outcome.settled = ToInt64(row.at(0), action);
    if (row.at(1)) outcome.lease_lost = ParseHexIds(*row[1], action);
    return outcome;
  }

  StoreOptions options_;
  Connection connection_;
  Writer writer_;
  std::int64_t keep_published_;  // 1 when published rows are kept (retention > 0)
  std::string hold_targets_;     // RetryPolicy::hold_targets as a JSON array
  std::string claim_sql_;
  std::string settle_sql_;
  std::string reclaim_sql_;
  std::string purge_published_sql_;
  std::string purge_abandoned_sql_;
  std::string stats_sql_;
};

}  // namespace

std::unique_ptr<Store> OpenStore(StoreOptions options) {
  CheckConnectionOptions(options.url, options.schema, options.statement_deadline);
  if (auto error = options.retry.Validate()) throw ConfigError("retry", *error);
  if (options.retention.published.count() < 0) {
    throw ConfigError("retention.published", "must not be negative");
  }
  if (options.retention.abandoned.count() < 0) {
    throw ConfigError("retention.abandoned", "must not be negative");
  }
  return std::make_unique<MariaDbStore>(std::move(options));
}

}  // namespace outbox::mariadb
