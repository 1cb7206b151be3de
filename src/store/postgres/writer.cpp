#include <stdexcept>

#include "connection.h"
#include "outbox/core/error.h"
#include "outbox/store/postgres.h"

namespace outbox::postgres {
namespace {

// PostgreSQL's bytea type, for the binary payload parameter.
constexpr Oid kByteaOid = 17;
constexpr int kParamCount = 8;

void RequireOpenTransaction(PGconn* conn) {
  switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS:
      return;
    case PQTRANS_IDLE:
      throw std::logic_error(
          "outbox enqueue: no open transaction on this connection; call BEGIN first (the writer "
          "never commits for you)");
    case PQTRANS_INERROR:
      throw std::logic_error(
          "outbox enqueue: the transaction on this connection has failed; roll it back");
    case PQTRANS_ACTIVE:
      throw std::logic_error("outbox enqueue: the connection is busy with another command");
    case PQTRANS_UNKNOWN:
      break;
  }
  throw StoreError(FailureKind::kUnavailable, "outbox enqueue: the connection is bad");
}

// `names` as a PostgreSQL array literal, each element quoted: {"a","b \"c\""}.
std::string TextArrayLiteral(const std::vector<std::string>& names) {
  std::string literal = "{";
  for (const std::string& name : names) {
    if (literal.size() > 1) literal += ',';
    literal += '"';
    for (const char c : name) {
      if (c == '"' || c == '\\') literal += '\\';
      literal += c;
    }
    literal += '"';
  }
  return literal + "}";
}

// A uuid[] in PostgreSQL's text form, {id,id,...} (the statement's result is asked for as text).
std::vector<MessageId> ReadUuidArray(std::string_view text) {
  std::vector<MessageId> ids;
  if (text.size() < 2 || text.front() != '{' || text.back() != '}') {
    throw StoreError(FailureKind::kPermanent,
                     "outbox enqueue: unexpected reply " + std::string{text.substr(0, 80)});
  }
  text = text.substr(1, text.size() - 2);
  while (!text.empty()) {
    const auto comma = text.find(',');
    const auto id = Uuid::Parse(text.substr(0, comma));
    if (!id) {
      throw StoreError(FailureKind::kPermanent,
                       "outbox enqueue: unexpected id " + std::string{text.substr(0, 80)});
    }
    ids.push_back(*id);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return ids;
}

// The message's parameters, kept alive while libpq reads them.
struct EnqueueParams {
  std::string headers_json;
  std::string targets;
  std::string sequenced;
  std::array<const char*, kParamCount> values{};
  std::array<int, kParamCount> lengths{};
  std::array<int, kParamCount> formats{};
  std::array<Oid, kParamCount> types{};

  explicit EnqueueParams(const NewMessage& message) {
    headers_json = HeadersToJson(message.headers);
    if (message.sequenced) sequenced = *message.sequenced ? "true" : "false";
    Set(0, message.topic);
    Set(1, message.payload);
    formats[1] = 1;
    types[1] = kByteaOid;
    Set(2, message.content_type);
    if (message.stream_key) Set(3, *message.stream_key);
    if (message.type) Set(4, *message.type);
    Set(5, headers_json);
    if (!message.targets.empty()) {
      targets = TextArrayLiteral(message.targets);
      Set(6, targets);
    }
    if (message.sequenced) Set(7, sequenced);
  }

  void Set(std::size_t index, const std::string& value) {
    values[index] = value.data();
    lengths[index] = static_cast<int>(value.size());
  }
};

// Turns PostgreSQL's refusal of a message into InvalidMessage; other errors pass through.
[[noreturn]] void ThrowEnqueueError(PGconn* conn, const PGresult* result) {
  try {
    ThrowStatementError(conn, result, "outbox enqueue");
  } catch (const PgError& error) {
    // 22xxx: data exception (our RAISEs use 22023), 23xxx: integrity constraint violation.
    if (error.sqlstate().starts_with("22") || error.sqlstate().starts_with("23")) {
      throw InvalidMessage(error.what());
    }
    throw;
  }
}

}  // namespace

Writer::Writer(std::string schema, MessageLimits limits) : limits_(limits) {
  limits_.max_payload_bytes = SIZE_MAX;  // settings.max_payload_bytes decides
  const std::string quoted = QuoteSchema(schema);
  sql_ = "SELECT " + quoted + ".enqueue_messages($1, $2, $3, $4, $5, " + quoted +
         ".build_headers($6::jsonb, NULL, NULL), $7::text[], $8::boolean)";
}

MessageId Writer::Enqueue(pg_conn* conn, const NewMessage& message) const {
  return Enqueue(conn, std::span{&message, 1}).front();
}

std::vector<MessageId> Writer::Enqueue(pg_conn* conn, std::span<const NewMessage> messages) const {
  std::vector<MessageId> event_ids;
  event_ids.reserve(messages.size());
  for (auto& copies : EnqueueCopies(conn, messages)) event_ids.push_back(copies.front());
  return event_ids;
}

std::vector<std::vector<MessageId>> Writer::EnqueueCopies(
    pg_conn* conn, std::span<const NewMessage> messages) const {
  RequireOpenTransaction(conn);
  // Check what can be checked here first, so a bad message does not abort the caller's
  // transaction.
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (auto error = ValidateMessage(messages[i], limits_); !error.empty()) {
      throw InvalidMessage("outbox enqueue: message " + std::to_string(i) + ": " + error);
    }
  }
  std::vector<std::vector<MessageId>> ids;
  ids.reserve(messages.size());
  if (messages.empty()) return ids;

  // All statements go out in one pipeline: one round trip for the batch.
  const bool pipelined = messages.size() > 1;
  if (pipelined && PQenterPipelineMode(conn) != 1) {
    throw StoreError(FailureKind::kUnavailable, "outbox enqueue: cannot enter pipeline mode");
  }
  struct PipelineExit {
    PGconn* conn;
    bool active;
    ~PipelineExit() {
      if (active) PQexitPipelineMode(conn);
    }
  } pipeline_exit{conn, pipelined};

  for (const auto& message : messages) {
    const EnqueueParams params{message};
    if (PQsendQueryParams(conn, sql_.c_str(), kParamCount, params.types.data(),
                          params.values.data(), params.lengths.data(), params.formats.data(),
                          0) != 1) {
      ThrowStatementError(conn, nullptr, "outbox enqueue: send");
    }
  }
  if (pipelined && PQpipelineSync(conn) != 1) {
    ThrowStatementError(conn, nullptr, "outbox enqueue: sync");
  }

  // Read every result, even after an error, so the connection is left idle; report the first
  // error.
  ResultPtr first_error;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    ResultPtr result{PQgetResult(conn)};
    if (!result) ThrowStatementError(conn, nullptr, "outbox enqueue: read");
    const auto status = PQresultStatus(result.get());
    if (status == PGRES_TUPLES_OK && PQntuples(result.get()) == 1) {
      ids.push_back(ReadUuidArray(PQgetvalue(result.get(), 0, 0)));
    } else if (!first_error && status != PGRES_PIPELINE_ABORTED) {
      first_error = std::move(result);
    }
    // Each statement's results end with a null result.
    while (ResultPtr rest{PQgetResult(conn)}) {
    }
  }
  if (pipelined) {
    ResultPtr sync{PQgetResult(conn)};
    if (!sync || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC) {
      ThrowStatementError(conn, sync.get(), "outbox enqueue: pipeline sync");
    }
    pipeline_exit.active = false;
    if (PQexitPipelineMode(conn) != 1) {
      ThrowStatementError(conn, nullptr, "outbox enqueue: leave pipeline mode");
    }
  }
  if (first_error) ThrowEnqueueError(conn, first_error.get());
  if (ids.size() != messages.size()) {
    ThrowStatementError(conn, nullptr, "outbox enqueue: fewer ids than messages");
  }
  return ids;
}

}  // namespace outbox::postgres
