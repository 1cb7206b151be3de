#include "outbox/inbox/inbox.h"

#include <algorithm>
#include <stdexcept>

#include "outbox/store/postgres_libpq.h"

namespace outbox::inbox {
namespace {

using postgres::Exec;
using postgres::Param;

void RequireOpenTransaction(PGconn* conn) {
  if (PQtransactionStatus(conn) != PQTRANS_INTRANS) {
    throw std::logic_error(
        "outbox inbox: Process needs an open transaction on the connection (call BEGIN first; the "
        "inbox never commits for you)");
  }
}

// Runs `body` under a savepoint; on an exception rolls back to it and rethrows.
template <typename Body>
auto UnderSavepoint(PGconn* conn, Body&& body) {
  Exec(conn, "inbox: savepoint", "SAVEPOINT outbox_inbox");
  try {
    auto result = body();
    Exec(conn, "inbox: release", "RELEASE SAVEPOINT outbox_inbox");
    return result;
  } catch (...) {
    postgres::ResultPtr undo{PQexec(conn, "ROLLBACK TO SAVEPOINT outbox_inbox")};
    postgres::ResultPtr release{PQexec(conn, "RELEASE SAVEPOINT outbox_inbox")};
    throw;
  }
}

}  // namespace

std::string Validate(const Delivery& delivery) {
  if (!delivery.malformed.empty()) return delivery.malformed;
  if (delivery.stream_seq && (*delivery.stream_seq < 1 || *delivery.stream_seq > kMaxStreamSeq)) {
    return "stream_seq " + std::to_string(*delivery.stream_seq) + " is out of range (1 to " +
           std::to_string(kMaxStreamSeq) + ")";
  }
  if (delivery.stream_prev_seq) {
    if (!delivery.stream_seq) return "stream_prev_seq without a stream_seq";
    if (*delivery.stream_prev_seq < 0 || *delivery.stream_prev_seq >= *delivery.stream_seq) {
      return "stream_prev_seq " + std::to_string(*delivery.stream_prev_seq) +
             " is out of range (0 to stream_seq - 1 = " + std::to_string(*delivery.stream_seq - 1) +
             ")";
    }
  }
  return {};
}

std::string_view NameOf(Result result) {
  switch (result) {
    case Result::kProcessed:
      return "processed";
    case Result::kDuplicate:
      return "duplicate";
    case Result::kOutOfOrder:
      return "out of order";
    case Result::kInvalid:
      return "invalid";
  }
  return "unknown";
}

Inbox::Inbox(Options options) : options_(std::move(options)) {
  if (options_.consumer.empty()) throw std::invalid_argument("inbox: consumer must not be empty");
  const std::string schema = postgres::QuoteSchema(options_.schema);
  record_id_sql_ = "INSERT INTO " + schema +
                   ".inbox_messages (consumer, message_id) VALUES ($1, $2::uuid) "
                   "ON CONFLICT DO NOTHING";
  // Creates the stream's mark at 0 or locks the existing one, and returns it: concurrent
  // consumers of one stream take turns here until commit.
  lock_stream_sql_ = "INSERT INTO " + schema +
                     ".inbox_streams AS s (consumer, stream_key, last_seq) VALUES ($1, $2, 0) "
                     "ON CONFLICT (consumer, stream_key) DO UPDATE SET last_seq = s.last_seq "
                     "RETURNING s.last_seq";
  advance_stream_sql_ = "UPDATE " + schema +
                        ".inbox_streams SET last_seq = $3::bigint, updated_at = now() "
                        "WHERE consumer = $1 AND stream_key = $2";
  // Skipped seqs (see inbox.h, Gaps): ranges that never overlap, since each begins above the mark
  // of its time. All four run after lock_stream_sql_, so the stream's consumers take turns.
  find_skipped_sql_ = "SELECT first_seq, last_seq FROM (SELECT first_seq, last_seq FROM " + schema +
                      ".inbox_skipped WHERE consumer = $1 AND stream_key = $2 AND first_seq <= "
                      "$3::bigint ORDER BY first_seq DESC LIMIT 1) r WHERE last_seq >= $3::bigint";
  add_skipped_sql_ = "INSERT INTO " + schema +
                     ".inbox_skipped (consumer, stream_key, first_seq, last_seq) "
                     "VALUES ($1, $2, $3::bigint, $4::bigint)";
  shorten_skipped_sql_ = "UPDATE " + schema +
                         ".inbox_skipped SET last_seq = $4::bigint WHERE consumer = $1 AND "
                         "stream_key = $2 AND first_seq = $3::bigint";
  drop_skipped_sql_ = "DELETE FROM " + schema +
                      ".inbox_skipped WHERE consumer = $1 AND stream_key = $2 AND first_seq = "
                      "$3::bigint";
  cleanup_sql_ = "DELETE FROM " + schema +
                 ".inbox_messages WHERE (consumer, message_id) IN ("
                 "SELECT consumer, message_id FROM " +
                 schema +
                 ".inbox_messages WHERE consumer = $1 AND processed_at < now() - $2::bigint * "
                 "interval '1 second' LIMIT $3::integer)";
}

Result Inbox::Process(pg_conn* conn, const Delivery& delivery,
                      const std::function<void(pg_conn*)>& handler) const {
  RequireOpenTransaction(conn);
  if (!Validate(delivery).empty()) return Result::kInvalid;
  const std::string& consumer = options_.consumer;
  if (delivery.stream_key && delivery.stream_seq) {
    const std::string& key = *delivery.stream_key;
    const std::int64_t seq = *delivery.stream_seq;
    return UnderSavepoint(conn, [&] {
      const auto mark =
          Exec(conn, "inbox: lock stream", lock_stream_sql_, {Param{consumer}, Param{key}});
      const std::int64_t last = std::stoll(PQgetvalue(mark.get(), 0, 0));
      if (seq <= last) {
        // A duplicate, unless the mark skipped it as abandoned and an operator replayed it.
        if (!TakeSkipped(conn, key, seq)) return Result::kDuplicate;
        handler(conn);
        return Result::kProcessed;
      }
      // Seqs the mark passes that the relay said were abandoned: a replay of them is processed.
      std::int64_t skip_from = seq;
      if (seq > last + 1) {
        const auto& prev = delivery.stream_prev_seq;
        const bool abandoned_gap = prev && *prev <= last;
        if (!abandoned_gap && options_.gap_policy == GapPolicy::kRefuse) {
          return Result::kOutOfOrder;
        }
        if (prev) skip_from = std::max(last, *prev) + 1;
      }
      handler(conn);
      if (skip_from < seq) {
        Exec(conn, "inbox: remember skipped", add_skipped_sql_,
             {Param{consumer}, Param{key}, Param{std::to_string(skip_from)},
              Param{std::to_string(seq - 1)}});
      }
      Exec(conn, "inbox: advance stream", advance_stream_sql_,
           {Param{consumer}, Param{key}, Param{std::to_string(seq)}});
      return Result::kProcessed;
    });
  }
  const std::string id = delivery.id.ToString();
  return UnderSavepoint(conn, [&] {
    const auto inserted =
        Exec(conn, "inbox: record id", record_id_sql_, {Param{consumer}, Param{id}});
    if (std::string_view{PQcmdTuples(inserted.get())} == "0") return Result::kDuplicate;
    handler(conn);
    return Result::kProcessed;
  });
}

bool Inbox::TakeSkipped(pg_conn* conn, const std::string& stream_key, std::int64_t seq) const {
  const std::string& consumer = options_.consumer;
  const auto found = Exec(conn, "inbox: find skipped", find_skipped_sql_,
                          {Param{consumer}, Param{stream_key}, Param{std::to_string(seq)}});
  if (PQntuples(found.get()) == 0) return false;
  const std::int64_t first = std::stoll(PQgetvalue(found.get(), 0, 0));
  const std::int64_t last = std::stoll(PQgetvalue(found.get(), 0, 1));
  // first .. last becomes first .. seq - 1 and seq + 1 .. last, leaving out the empty ones.
  if (first < seq) {
    Exec(conn, "inbox: shorten skipped", shorten_skipped_sql_,
         {Param{consumer}, Param{stream_key}, Param{std::to_string(first)},
          Param{std::to_string(seq - 1)}});
  } else {
    Exec(conn, "inbox: drop skipped", drop_skipped_sql_,
         {Param{consumer}, Param{stream_key}, Param{std::to_string(first)}});
  }
  if (seq < last) {
    Exec(conn, "inbox: remember skipped", add_skipped_sql_,
         {Param{consumer}, Param{stream_key}, Param{std::to_string(seq + 1)},
          Param{std::to_string(last)}});
  }
  return true;
}

std::int64_t Inbox::Cleanup(pg_conn* conn, std::chrono::seconds retention, int max_rows) const {
  if (retention.count() < 0) throw std::invalid_argument("inbox cleanup: negative retention");
  if (max_rows < 1) throw std::invalid_argument("inbox cleanup: max_rows must be >= 1");
  const auto result = Exec(conn, "inbox: cleanup", cleanup_sql_,
                           {Param{options_.consumer}, Param{std::to_string(retention.count())},
                            Param{std::to_string(max_rows)}});
  return std::stoll(PQcmdTuples(result.get()));
}

}  // namespace outbox::inbox
