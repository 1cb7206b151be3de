#include "outbox/inbox/inbox.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "outbox/core/error.h"
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
  // The rules are the schema's (sql/015_inbox_functions.sql): one implementation for every
  // language.
  begin_sql_ =
      "SELECT " + schema + ".inbox_begin($1, $2::uuid, $3, $4::bigint, $5::bigint, $6, $7, $8)";
  cleanup_sql_ =
      "SELECT " + schema + ".inbox_cleanup($1, $2::bigint * interval '1 second', " + "$3::integer)";
}

Result Inbox::Process(pg_conn* conn, const Delivery& delivery,
                      const std::function<void(pg_conn*)>& handler) const {
  RequireOpenTransaction(conn);
  if (!Validate(delivery).empty()) return Result::kInvalid;
  const std::string id = delivery.id.ToString();
  const std::string seq =
      delivery.stream_seq ? std::to_string(*delivery.stream_seq) : std::string{};
  const std::string prev_seq =
      delivery.stream_prev_seq ? std::to_string(*delivery.stream_prev_seq) : std::string{};
  const auto optional = [](const std::optional<std::string>& value) {
    return value ? Param{*value} : Param{};
  };
  const std::vector<Param> params{
      Param{options_.consumer},
      Param{id},
      optional(delivery.stream_key),
      delivery.stream_seq ? Param{seq} : Param{},
      delivery.stream_prev_seq ? Param{prev_seq} : Param{},
      optional(delivery.target),
      Param{options_.gap_policy == GapPolicy::kRefuse ? "refuse" : "process"},
      optional(delivery.origin)};
  return UnderSavepoint(conn, [&] {
    const auto decided = Exec(conn, "inbox: begin", begin_sql_, params);
    const std::string_view what{PQgetvalue(decided.get(), 0, 0)};
    if (what == "duplicate") return Result::kDuplicate;
    if (what == "gap") return Result::kOutOfOrder;
    if (what == "invalid") return Result::kInvalid;  // Validate said otherwise: a newer schema
    if (what != "process") {
      throw StoreError(FailureKind::kPermanent,
                       "inbox: outbox.inbox_begin answered '" + std::string{what} + "'");
    }
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
  return std::stoll(PQgetvalue(result.get(), 0, 0));
}

}  // namespace outbox::inbox
