// The writer: messages enqueued in the caller's transaction through the schema's enqueue_batch
// procedure (sql/002_enqueue.sql): one CALL, one round trip, for a whole batch. Payloads go as
// base64 in the batch's JSON, so that their bytes are stored exactly.
#include <stdexcept>

#include "connection.h"
#include "outbox/core/error.h"
#include "outbox/core/utf8.h"
#include "outbox/store/mariadb.h"

namespace outbox::mariadb {
namespace {

// A CALL's text is kept under this many bytes: a bigger batch goes in several CALLs, so that it
// stays well under the server's max_allowed_packet (16 MiB by default). A message larger than
// this alone goes in a CALL of its own.
constexpr std::size_t kMaxCallBytes = std::size_t{4} << 20U;

struct ResultDeleter {
  void operator()(MYSQL_RES* result) const { mysql_free_result(result); }
};
using ResultPtr = std::unique_ptr<MYSQL_RES, ResultDeleter>;

void AppendJsonString(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20) {
      out += "\\u00";
      out += kHex[byte >> 4U];
      out += kHex[byte & 15U];
    } else {
      out += c;  // UTF-8 as it is (checked before)
    }
  }
  out += '"';
}

void AppendBase64(std::string& out, std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t n =
        (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16U) |
        (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8U) |
        static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(n >> 18U) & 63U];
    out += kAlphabet[(n >> 12U) & 63U];
    out += kAlphabet[(n >> 6U) & 63U];
    out += kAlphabet[n & 63U];
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    std::uint32_t n = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16U;
    if (rest == 2) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8U;
    out += kAlphabet[(n >> 18U) & 63U];
    out += kAlphabet[(n >> 12U) & 63U];
    out += rest == 2 ? kAlphabet[(n >> 6U) & 63U] : '=';
    out += '=';
  }
}

// One element of enqueue_batch's JSON array. The payload goes as base64 with its content type, so
// that its bytes are stored exactly whatever they are.
void AppendMessageJson(std::string& out, const NewMessage& message) {
  out += "{\"topic\":";
  AppendJsonString(out, message.topic);
  out += ",\"payload_base64\":\"";
  AppendBase64(out, message.payload);
  out += "\",\"content_type\":";
  AppendJsonString(out, message.content_type);
  if (message.stream_key) {
    out += ",\"stream_key\":";
    AppendJsonString(out, *message.stream_key);
  }
  if (message.type) {
    out += ",\"type\":";
    AppendJsonString(out, *message.type);
  }
  if (!message.headers.empty()) {
    out += ",\"headers\":{";
    bool first = true;
    for (const auto& [name, value] : message.headers) {
      if (!first) out += ',';
      first = false;
      AppendJsonString(out, name);
      out += ':';
      AppendJsonString(out, value);
    }
    out += '}';
  }
  if (!message.targets.empty()) {
    out += ",\"targets\":[";
    for (std::size_t i = 0; i < message.targets.size(); ++i) {
      if (i > 0) out += ',';
      AppendJsonString(out, message.targets[i]);
    }
    out += ']';
  }
  if (message.sequenced) out += *message.sequenced ? ",\"sequenced\":true" : ",\"sequenced\":false";
  out += '}';
}

// The text fields the database stores as utf8mb4: refused here when they are not UTF-8, which the
// server would refuse (or, on a connection in another character set, garble).
std::string CheckUtf8(const NewMessage& message) {
  const auto bad = [](std::string_view text) { return !IsValidUtf8(text); };
  if (bad(message.topic)) return "topic is not valid UTF-8";
  if (message.stream_key && bad(*message.stream_key)) return "stream_key is not valid UTF-8";
  if (message.type && bad(*message.type)) return "type is not valid UTF-8";
  if (bad(message.content_type)) return "content_type is not valid UTF-8";
  for (const std::string& target : message.targets) {
    if (bad(target)) return "target is not valid UTF-8";
  }
  for (const auto& [name, value] : message.headers) {
    if (bad(name)) return "header name is not valid UTF-8";
    if (bad(value)) return "header '" + name + "': value is not valid UTF-8";
  }
  return {};
}

// Whether `conn`'s character set is one in which no byte of a multi-byte character is a quote or
// a backslash, so that an escaped literal ends where mysql_real_escape_string meant it to.
bool EscapingIsSafe(MYSQL* conn) {
  const std::string_view name = mysql_character_set_name(conn);
  return name == "utf8mb4" || name == "utf8mb3" || name == "utf8" || name == "latin1" ||
         name == "ascii" || name == "binary";
}

// One text-protocol round trip. The JSON goes as a utf8mb4 literal whatever the connection's
// character set (the introducer): escaped in the usual character sets, and as a hex literal in
// the others (GBK, Big5, SJIS...), where a multi-byte character may end in a byte that looks like
// a quote or a backslash and escaping is not to be trusted.
std::string CallText(MYSQL* conn, const std::string& quoted_schema, std::string_view json) {
  std::string sql;
  sql.reserve(json.size() * 2 + quoted_schema.size() + 64);
  sql += "CALL ";
  sql += quoted_schema;
  if (EscapingIsSafe(conn)) {
    sql += ".enqueue_batch(_utf8mb4'";
    const std::size_t at = sql.size();
    sql.resize(at + json.size() * 2 + 1);
    const unsigned long written = mysql_real_escape_string(conn, sql.data() + at, json.data(),
                                                           static_cast<unsigned long>(json.size()));
    sql.resize(at + written);
    sql += "')";
    return sql;
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  sql += ".enqueue_batch(CONVERT(X'";
  for (const char c : json) {
    const auto byte = static_cast<unsigned char>(c);
    sql += kHex[byte >> 4U];
    sql += kHex[byte & 15U];
  }
  sql += "' USING utf8mb4))";
  return sql;
}

// The error of the last statement on `conn`: a message the database refused (SQLSTATE class 22,
// data exception: the procedures' 22023 and the server's own; 23, a constraint) is
// InvalidMessage; the rest MariaDbError classified by KindOfError (a deadlock, 1213, is
// kUnavailable: roll back and run the transaction again).
[[noreturn]] void ThrowCallError(MYSQL* conn) {
  const unsigned error = mysql_errno(conn);
  const std::string sqlstate = mysql_sqlstate(conn);
  const std::string message = mysql_error(conn);
  if (sqlstate.starts_with("22") || sqlstate.starts_with("23")) throw InvalidMessage(message);
  throw MariaDbError(KindOfError(error), "outbox enqueue: " + message, error, sqlstate);
}

// Runs one CALL of enqueue_batch for `messages` and appends each one's copy ids to `ids`.
void CallBatch(MYSQL* conn, const std::string& sql, std::span<const NewMessage> messages,
               std::vector<std::vector<MessageId>>& ids) {
  if (mysql_real_query(conn, sql.data(), sql.size()) != 0) ThrowCallError(conn);
  const std::size_t first = ids.size();
  ids.resize(first + messages.size());
  std::string unexpected;
  // Every result is read, so that the connection is left ready for the caller's next statement.
  do {
    ResultPtr result{mysql_store_result(conn)};
    if (!result) {
      if (mysql_field_count(conn) != 0) ThrowCallError(conn);
      continue;
    }
    if (mysql_num_fields(result.get()) != 2) {
      unexpected = "a result of " + std::to_string(mysql_num_fields(result.get())) + " columns";
      continue;
    }
    while (MYSQL_ROW row = mysql_fetch_row(result.get())) {
      const unsigned long* lengths = mysql_fetch_lengths(result.get());
      const std::string_view ordinal_text{row[0] != nullptr ? row[0] : "",
                                          row[0] != nullptr ? lengths[0] : 0};
      std::size_t ordinal = 0;
      for (const char c : ordinal_text) {
        if (c < '0' || c > '9' || ordinal > messages.size()) {
          ordinal = 0;
          break;
        }
        ordinal = ordinal * 10 + static_cast<std::size_t>(c - '0');
      }
      const auto id =
          row[1] != nullptr ? Uuid::Parse(std::string_view{row[1], lengths[1]}) : std::nullopt;
      if (ordinal == 0 || ordinal > messages.size() || !id) {
        unexpected = "the row (" + std::string{ordinal_text} + ", " +
                     (row[1] != nullptr ? std::string{row[1], lengths[1]} : "NULL") + ")";
        continue;
      }
      ids[first + ordinal - 1].push_back(*id);
    }
  } while (mysql_next_result(conn) == 0);
  if (mysql_errno(conn) != 0) ThrowCallError(conn);
  for (std::size_t i = 0; i < messages.size() && unexpected.empty(); ++i) {
    const std::size_t expected = messages[i].targets.empty() ? 0 : messages[i].targets.size();
    if (ids[first + i].empty() || (expected > 0 && ids[first + i].size() != expected)) {
      unexpected =
          std::to_string(ids[first + i].size()) + " ids for message " + std::to_string(first + i);
    }
  }
  if (!unexpected.empty()) {
    throw MariaDbError(FailureKind::kPermanent,
                       "outbox enqueue: unexpected reply from enqueue_batch: " + unexpected, 0,
                       "HY000");
  }
}

}  // namespace

Writer::Writer(std::string schema, MessageLimits limits)
    : schema_(QuoteSchema(schema)), limits_(limits) {
  limits_.max_payload_bytes = SIZE_MAX;  // settings.max_payload_bytes decides
}

MessageId Writer::Enqueue(st_mysql* conn, const NewMessage& message) const {
  return Enqueue(conn, std::span{&message, 1}).front();
}

std::vector<MessageId> Writer::Enqueue(st_mysql* conn, std::span<const NewMessage> messages) const {
  std::vector<MessageId> event_ids;
  event_ids.reserve(messages.size());
  for (auto& copies : EnqueueCopies(conn, messages)) event_ids.push_back(copies.front());
  return event_ids;
}

std::vector<std::vector<MessageId>> Writer::EnqueueCopies(
    st_mysql* conn, std::span<const NewMessage> messages) const {
  if (conn == nullptr) throw std::logic_error("outbox enqueue: no connection");
  if (!InTransaction(conn)) {
    throw std::logic_error(
        "outbox enqueue: no open transaction on this connection; call START TRANSACTION first "
        "(the writer never commits for you)");
  }
  // What can be checked here is checked first, so that a bad message writes nothing.
  for (std::size_t i = 0; i < messages.size(); ++i) {
    std::string error = ValidateMessage(messages[i], limits_);
    if (error.empty()) error = CheckUtf8(messages[i]);
    if (!error.empty()) {
      throw InvalidMessage("outbox enqueue: message " + std::to_string(i) + ": " + error);
    }
  }
  std::vector<std::vector<MessageId>> ids;
  ids.reserve(messages.size());
  std::string json;
  std::size_t batch_start = 0;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::size_t before = json.size();
    json += json.empty() ? '[' : ',';
    AppendMessageJson(json, messages[i]);
    // Over the bound with this message: the ones before it go first.
    if (i > batch_start && 2 * json.size() > kMaxCallBytes) {
      json.resize(before);
      json += ']';
      CallBatch(conn, CallText(conn, schema_, json), messages.subspan(batch_start, i - batch_start),
                ids);
      batch_start = i;
      json = "[";
      AppendMessageJson(json, messages[i]);
    }
  }
  if (batch_start < messages.size()) {
    json += ']';
    CallBatch(conn, CallText(conn, schema_, json), messages.subspan(batch_start), ids);
  }
  return ids;
}

}  // namespace outbox::mariadb
