// The operator's side of the PostgreSQL store (outbox/store/postgres_admin.h).
#include <array>
#include <cstdlib>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "connection.h"
#include "migrations.h"
#include "outbox/store/postgres_admin.h"
#include "statements.h"

namespace outbox::postgres {
namespace {

constexpr std::array<std::string_view, 5> kStatusNames = {"pending", "processing", "failed",
                                                          "published", "abandoned"};

// The filter over `m`, on parameters $1 status, $2 topic, $3 stream_key, $4 target, $5
// older_than seconds, $6 ids (uuid[]); NULL means "any". Statements are unnamed, so each is
// planned with its values and the unset criteria fold away.
constexpr const char* kFilter = R"(
  ($1::text IS NULL OR m.status = $1::text)
  AND ($2::text IS NULL OR m.topic = $2::text)
  AND ($3::text IS NULL OR m.stream_key = $3::text)
  AND ($4::text IS NULL OR m.target = $4::text)
  AND ($5::bigint IS NULL OR m.created_at < now() - $5::bigint * interval '1 second')
  AND ($6::uuid[] IS NULL OR m.id = ANY($6::uuid[])))";

// The columns of a MessageSummary, in its order.
constexpr const char* kSummaryColumns = R"(
  m.id, m.topic, m.stream_key, m.stream_seq, m.partition, m.target, m.type, m.status, m.attempts,
  m.available_at, m.created_at, m.last_error, m.lease_owner, m.lease_until,
  octet_length(m.payload)::bigint)";
constexpr int kSummaryColumnCount = 15;

// $7 after (uuid or NULL), $8 limit. One row even when no message matches, for now().
constexpr const char* kList = R"(
SELECT page.*, n.db_now
FROM (SELECT now() AS db_now) n
LEFT JOIN LATERAL (
  SELECT __SUMMARY__ FROM __TABLE__ m
  WHERE __FILTER__ AND ($7::uuid IS NULL OR m.id > $7::uuid)
  ORDER BY m.id
  LIMIT $8::integer) page ON true
ORDER BY page.id)";

constexpr const char* kShow = R"(
SELECT __SUMMARY__, m.payload, m.content_type, m.headers, m.lease_epoch, m.published_at,
       m.abandoned_at, now()
FROM __TABLE__ m WHERE m.id = $1::uuid)";

// A chunk of Replay or Abandon: the next $8 candidates after $7 in id order, as of the statement's
// snapshot, then the change. The UPDATE re-checks the status of each row it locks, so a row a
// relay claimed in the meantime (now processing) is skipped. Returns the number of candidates, the
// last candidate's id (where the next chunk starts) and the changed ids.
constexpr const char* kChangeChunkSql = R"(
WITH candidates AS (
  SELECT m.id FROM __TABLE__ m
  WHERE __FILTER__ AND m.status IN (__ELIGIBLE__) AND ($7::uuid IS NULL OR m.id > $7::uuid)
  ORDER BY m.id
  LIMIT $8::integer),
changed AS (
  UPDATE __TABLE__ m SET __SET__
  FROM candidates c
  WHERE m.id = c.id AND m.status IN (__ELIGIBLE__)
  RETURNING m.id)
SELECT (SELECT count(*) FROM candidates),
       (SELECT c.id FROM candidates c ORDER BY c.id DESC LIMIT 1),
       array(SELECT id FROM changed ORDER BY id))";

// The same selection without the change, for dry runs.
constexpr const char* kChangeDryRun = R"(
WITH candidates AS (
  SELECT m.id FROM __TABLE__ m
  WHERE __FILTER__ AND m.status IN (__ELIGIBLE__) AND ($7::uuid IS NULL OR m.id > $7::uuid)
  ORDER BY m.id
  LIMIT $8::integer)
SELECT (SELECT count(*) FROM candidates),
       (SELECT c.id FROM candidates c ORDER BY c.id DESC LIMIT 1),
       array(SELECT id FROM candidates ORDER BY id))";

constexpr const char* kReplayEligible = "'abandoned', 'failed'";
// The old error is kept after the note; a second replay before any new attempt keeps the note as
// it is rather than nesting it. The epoch moves on so that the message counts as returned, never
// as fresh, even if it was abandoned before its first claim (sql/004_claim_cursor.sql).
constexpr const char* kReplaySet = R"(
  status = 'pending', attempts = 0, available_at = now(), abandoned_at = NULL,
  lease_owner = NULL, lease_until = NULL, lease_epoch = m.lease_epoch + 1,
  last_error = CASE
    WHEN m.last_error IS NULL THEN 'replayed by operator'
    WHEN m.last_error LIKE 'replayed by operator%' THEN m.last_error
    ELSE 'replayed by operator; was: ' || m.last_error END)";

constexpr const char* kAbandonEligible = "'pending', 'failed'";
// $9 reason.
constexpr const char* kAbandonSet = R"(
  status = 'abandoned', abandoned_at = now(), lease_owner = NULL, lease_until = NULL,
  last_error = 'abandoned by operator: ' || $9::text)";

bool IsNull(const PGresult* result, int row, int column) {
  return PQgetisnull(result, row, column) != 0;
}

std::optional<TimePoint> OptionalTime(const PGresult* result, int row, int column) {
  if (IsNull(result, row, column)) return std::nullopt;
  return ReadTimestamp(PQgetvalue(result, row, column));
}

// Reads the kSummaryColumns of a binary-format row.
MessageSummary ReadSummary(const PGresult* rows, int row) {
  MessageSummary message;
  message.id = ReadUuid(PQgetvalue(rows, row, 0));
  message.topic = Column(rows, row, 1);
  message.stream_key = OptionalText(rows, row, 2);
  if (!IsNull(rows, row, 3)) message.stream_seq = ReadInt64(PQgetvalue(rows, row, 3));
  message.partition = ReadInt32(PQgetvalue(rows, row, 4));
  message.target = Column(rows, row, 5);
  message.type = OptionalText(rows, row, 6);
  message.status = ParseMessageStatus(Column(rows, row, 7));
  message.attempts = ReadInt32(PQgetvalue(rows, row, 8));
  message.available_at = ReadTimestamp(PQgetvalue(rows, row, 9));
  message.created_at = ReadTimestamp(PQgetvalue(rows, row, 10));
  message.last_error = OptionalText(rows, row, 11);
  message.lease_owner = OptionalText(rows, row, 12);
  message.lease_until = OptionalTime(rows, row, 13);
  message.payload_bytes = ReadInt64(PQgetvalue(rows, row, 14));
  return message;
}

// Parses a text-format uuid[] ("{a,b}").
std::vector<MessageId> ParseUuidArray(std::string_view literal) {
  std::vector<MessageId> ids;
  if (literal.size() < 2) return ids;
  literal = literal.substr(1, literal.size() - 2);
  while (!literal.empty()) {
    const std::size_t comma = literal.find(',');
    const std::string_view item = literal.substr(0, comma);
    if (auto id = Uuid::Parse(item)) {
      ids.push_back(*id);
    } else {
      throw StoreError(FailureKind::kPermanent, "unexpected uuid in result: " + std::string{item});
    }
    if (comma == std::string_view::npos) break;
    literal.remove_prefix(comma + 1);
  }
  return ids;
}

void ValidateFilter(std::string_view what, const MessageFilter& filter) {
  const auto prefix = std::string{what} + ": ";
  if (filter.status && static_cast<std::size_t>(*filter.status) >= kStatusNames.size()) {
    throw std::invalid_argument(prefix + "unknown status " +
                                std::to_string(static_cast<int>(*filter.status)));
  }
  if (filter.older_than && filter.older_than->count() < 0) {
    throw std::invalid_argument(prefix + "older_than must not be negative, got " +
                                std::to_string(filter.older_than->count()) + " s");
  }
  const auto non_empty = [&](const std::optional<std::string>& value, const char* name) {
    if (value && value->empty()) throw std::invalid_argument(prefix + name + " must not be empty");
  };
  non_empty(filter.topic, "topic");
  non_empty(filter.stream_key, "stream_key");
  non_empty(filter.target, "target");
}

// For Replay and Abandon: a selection is required, and a status filter must be one they act on.
void ValidateChange(std::string_view what, const MessageFilter& filter,
                    std::initializer_list<MessageStatus> eligible) {
  ValidateFilter(what, filter);
  if (filter.MatchesEverything()) {
    throw std::invalid_argument(std::string{what} +
                                ": refusing to act on every message; select by ids or a filter");
  }
  if (filter.status) {
    bool ok = false;
    std::string names;
    for (const MessageStatus status : eligible) {
      ok = ok || status == *filter.status;
      if (!names.empty()) names += " and ";
      names += MessageStatusName(status);
    }
    if (!ok) {
      throw std::invalid_argument(std::string{what} + ": acts only on " + names +
                                  " messages, not on " +
                                  std::string{MessageStatusName(*filter.status)} + " ones");
    }
  }
}

// The filter as parameters $1..$6, owning their text.
class FilterParams {
 public:
  explicit FilterParams(const MessageFilter& filter) {
    if (filter.status) status_ = std::string{MessageStatusName(*filter.status)};
    if (filter.older_than) older_than_ = std::to_string(filter.older_than->count());
    if (filter.ids) ids_ = UuidArray(*filter.ids);
    params_ = {Text(status_),       Text(filter.topic), Text(filter.stream_key),
               Text(filter.target), Text(older_than_),  Text(ids_)};
  }
  // FilterParams holds views of its own strings: not copyable.
  FilterParams(const FilterParams&) = delete;
  FilterParams& operator=(const FilterParams&) = delete;

  [[nodiscard]] const std::vector<Param>& params() const { return params_; }

 private:
  static Param Text(const std::optional<std::string>& value) {
    return value ? Param{std::string_view{*value}} : Param{};
  }

  std::optional<std::string> status_;
  std::optional<std::string> older_than_;
  std::optional<std::string> ids_;
  std::vector<Param> params_;
};

}  // namespace

std::string_view MessageStatusName(MessageStatus status) {
  const auto index = static_cast<std::size_t>(status);
  return index < kStatusNames.size() ? kStatusNames[index] : "unknown";
}

MessageStatus ParseMessageStatus(std::string_view name) {
  for (std::size_t i = 0; i < kStatusNames.size(); ++i) {
    if (kStatusNames[i] == name) return static_cast<MessageStatus>(i);
  }
  std::string valid;
  for (const auto known : kStatusNames) {
    if (!valid.empty()) valid += ", ";
    valid += known;
  }
  throw std::invalid_argument("unknown status '" + std::string{name} + "' (expected one of " +
                              valid + ")");
}

class Admin::Impl {
 public:
  Impl(const std::string& conninfo, const std::string& schema)
      : schema_(schema), table_(QuoteSchema(schema) + ".messages"), connection_(conninfo) {
    RequireSchemaVersion(connection_.Ready(), schema_, connection_.description());
    list_ = Build(kList);
    show_ = Build(kShow);
    replay_ = Build(ReplaceAll(ReplaceAll(kChangeChunkSql, "__SET__", kReplaySet), "__ELIGIBLE__",
                               kReplayEligible));
    replay_dry_run_ = Build(ReplaceAll(kChangeDryRun, "__ELIGIBLE__", kReplayEligible));
    abandon_ = Build(ReplaceAll(ReplaceAll(kChangeChunkSql, "__SET__", kAbandonSet), "__ELIGIBLE__",
                                kAbandonEligible));
    abandon_dry_run_ = Build(ReplaceAll(kChangeDryRun, "__ELIGIBLE__", kAbandonEligible));
  }

  MessagePage List(const MessageFilter& filter, int limit, std::optional<MessageId> after) {
    ValidateFilter("list", filter);
    if (limit < 1 || limit > kMaxListLimit) {
      throw std::invalid_argument("list: limit must be between 1 and " +
                                  std::to_string(kMaxListLimit) + ", got " + std::to_string(limit));
    }
    const FilterParams filter_params{filter};
    auto params = filter_params.params();
    const std::string after_text = after ? after->ToString() : "";
    const std::string limit_text = std::to_string(limit + 1);  // one more: are there more?
    params.push_back(after ? Param{after_text} : Param{});
    params.push_back(Param{limit_text});
    const auto result = Exec(connection_.Ready(), "list", list_, params, /*binary_results=*/true);
    const PGresult* rows = result.get();
    MessagePage page;
    for (int row = 0; row < PQntuples(rows); ++row) {
      page.database_now = ReadTimestamp(PQgetvalue(rows, row, kSummaryColumnCount));
      if (IsNull(rows, row, 0)) continue;  // the one row of an empty page
      if (static_cast<int>(page.messages.size()) == limit) {
        page.more = true;
        break;
      }
      page.messages.push_back(ReadSummary(rows, row));
    }
    return page;
  }

  std::optional<MessageDetail> Show(const MessageId& id) {
    const std::string id_text = id.ToString();
    const auto result =
        Exec(connection_.Ready(), "show", show_, {Param{id_text}}, /*binary_results=*/true);
    const PGresult* rows = result.get();
    if (PQntuples(rows) == 0) return std::nullopt;
    MessageDetail detail;
    detail.summary = ReadSummary(rows, 0);
    constexpr int kFirst = kSummaryColumnCount;
    detail.payload = Column(rows, 0, kFirst);
    detail.content_type = Column(rows, 0, kFirst + 1);
    detail.headers = ParseHeaders(Column(rows, 0, kFirst + 2));
    detail.lease_epoch = ReadInt64(PQgetvalue(rows, 0, kFirst + 3));
    detail.published_at = OptionalTime(rows, 0, kFirst + 4);
    detail.abandoned_at = OptionalTime(rows, 0, kFirst + 5);
    detail.database_now = ReadTimestamp(PQgetvalue(rows, 0, kFirst + 6));
    return detail;
  }

  ChangeResult Replay(const MessageFilter& filter, bool dry_run) {
    ValidateChange("replay", filter, {MessageStatus::kAbandoned, MessageStatus::kFailed});
    return Change("replay", dry_run ? replay_dry_run_ : replay_, filter, std::nullopt);
  }

  ChangeResult Abandon(const MessageFilter& filter, const std::string& reason, bool dry_run) {
    ValidateChange("abandon", filter, {MessageStatus::kPending, MessageStatus::kFailed});
    if (reason.empty()) throw std::invalid_argument("abandon: a reason is required");
    return dry_run ? Change("abandon", abandon_dry_run_, filter, std::nullopt)
                   : Change("abandon", abandon_, filter, reason);
  }

  std::int64_t Purge(const RetentionPolicy& retention, int chunk) {
    if (retention.published.count() < 0 || retention.abandoned.count() < 0) {
      throw std::invalid_argument("purge: retention must not be negative");
    }
    if (chunk < 1) throw std::invalid_argument("purge: chunk must be >= 1");
    const Statements statements{schema_, /*keep_published=*/false};
    const std::string published = std::to_string(retention.published.count());
    const std::string abandoned = std::to_string(retention.abandoned.count());
    const std::string chunk_text = std::to_string(chunk);
    std::int64_t total = 0;
    for (;;) {
      // Each chunk is a statement, and a transaction, of its own.
      const auto result = Exec(connection_.Ready(), "purge", statements.purge,
                               {Param{published}, Param{abandoned}, Param{chunk_text}});
      const std::int64_t deleted = std::stoll(PQcmdTuples(result.get()));
      total += deleted;
      if (deleted < chunk) return total;
    }
  }

 private:
  std::string Build(const std::string& sql) const {
    return ReplaceAll(
        ReplaceAll(ReplaceAll(sql, "__SUMMARY__", kSummaryColumns), "__FILTER__", kFilter),
        "__TABLE__", table_);
  }

  // Runs a change (or dry-run) statement chunk by chunk until the candidates run out.
  ChangeResult Change(std::string_view what, const std::string& sql, const MessageFilter& filter,
                      const std::optional<std::string>& reason) {
    ChangeResult outcome;
    if (filter.ids && filter.ids->empty()) return outcome;
    const FilterParams filter_params{filter};
    const std::string chunk_text = std::to_string(kChangeChunk);
    std::optional<std::string> after;
    for (;;) {
      auto params = filter_params.params();
      params.push_back(after ? Param{std::string_view{*after}} : Param{});
      params.push_back(Param{chunk_text});
      if (reason) params.push_back(Param{std::string_view{*reason}});
      const auto result = Exec(connection_.Ready(), what, sql, params);
      const PGresult* row = result.get();
      const std::int64_t candidates = std::stoll(PQgetvalue(row, 0, 0));
      for (const auto& id : ParseUuidArray(Column(row, 0, 2))) outcome.ids.push_back(id);
      if (candidates < kChangeChunk) break;
      after = std::string{Column(row, 0, 1)};
    }
    outcome.count = static_cast<std::int64_t>(outcome.ids.size());
    return outcome;
  }

  std::string schema_;
  std::string table_;
  Connection connection_;
  std::string list_;
  std::string show_;
  std::string replay_;
  std::string replay_dry_run_;
  std::string abandon_;
  std::string abandon_dry_run_;
};

std::unique_ptr<Admin> Admin::Open(const std::string& conninfo, const std::string& schema) {
  QuoteSchema(schema);  // std::invalid_argument before connecting
  return std::unique_ptr<Admin>{new Admin{std::make_unique<Impl>(conninfo, schema)}};
}

Admin::Admin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Admin::~Admin() = default;

MessagePage Admin::List(const MessageFilter& filter, int limit, std::optional<MessageId> after) {
  return impl_->List(filter, limit, after);
}

std::optional<MessageDetail> Admin::Show(const MessageId& id) { return impl_->Show(id); }

ChangeResult Admin::Replay(const MessageFilter& filter, bool dry_run) {
  return impl_->Replay(filter, dry_run);
}

ChangeResult Admin::Abandon(const MessageFilter& filter, const std::string& reason, bool dry_run) {
  return impl_->Abandon(filter, reason, dry_run);
}

std::int64_t Admin::Purge(const RetentionPolicy& retention, int chunk) {
  return impl_->Purge(retention, chunk);
}

}  // namespace outbox::postgres
