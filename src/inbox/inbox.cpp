#include "outbox/inbox/inbox.h"

#include <stdexcept>

#include "connection.h"  // src/store/postgres: RAII and error classification over libpq

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
    const std::string seq = std::to_string(*delivery.stream_seq);
    return UnderSavepoint(conn, [&] {
      const auto mark = Exec(conn, "inbox: lock stream", lock_stream_sql_,
                             {Param{consumer}, Param{*delivery.stream_key}});
      const std::int64_t last = std::stoll(PQgetvalue(mark.get(), 0, 0));
      if (*delivery.stream_seq <= last) return Result::kDuplicate;
      if (*delivery.stream_seq > last + 1 && options_.gap_policy == GapPolicy::kRefuse) {
        return Result::kOutOfOrder;
      }
      handler(conn);
      Exec(conn, "inbox: advance stream", advance_stream_sql_,
           {Param{consumer}, Param{*delivery.stream_key}, Param{seq}});
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

std::int64_t Inbox::Cleanup(pg_conn* conn, std::chrono::seconds retention, int max_rows) const {
  if (retention.count() < 0) throw std::invalid_argument("inbox cleanup: negative retention");
  if (max_rows < 1) throw std::invalid_argument("inbox cleanup: max_rows must be >= 1");
  const auto result = Exec(conn, "inbox: cleanup", cleanup_sql_,
                           {Param{options_.consumer}, Param{std::to_string(retention.count())},
                            Param{std::to_string(max_rows)}});
  return std::stoll(PQcmdTuples(result.get()));
}

}  // namespace outbox::inbox
