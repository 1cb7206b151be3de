// The MariaDB writer: the writer contract (tests/store/writer_contract.h) through CALL
// outbox.enqueue / enqueue_bytes / enqueue_batch and the C++ Writer, and what only MariaDB has
// (its procedures' names and arguments, errors with SQLSTATEs, a deadlock through the Writer).
#include <errmsg.h>
#include <gtest/gtest.h>
#include <mysqld_error.h>

#include <future>
#include <map>
#include <thread>

#include "../store/writer_contract.h"
#include "connection.h"
#include "outbox/core/error.h"
#include "outbox/core/partition.h"
#include "outbox/store/mariadb.h"
#include "support/mariadb_test_support.h"

namespace outbox::testing {
namespace {

using mariadb::Bytes;
using mariadb::Value;
using std::chrono::milliseconds;

std::string Quote(MYSQL* conn, std::string_view text) {
  std::string out(text.size() * 2 + 1, '\0');
  out.resize(mysql_real_escape_string(conn, out.data(), text.data(),
                                      static_cast<unsigned long>(text.size())));
  return "'" + out + "'";
}

std::string Hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out = "X'";
  for (const char c : bytes) {
    out += kHex[static_cast<unsigned char>(c) >> 4U];
    out += kHex[static_cast<unsigned char>(c) & 15U];
  }
  return out + "'";
}

// Runs `sql` on the text protocol and returns the rows of its result sets (CALL returns one).
// Throws EnqueueError with the server's message; a deadlock asks for a retry.
std::vector<std::vector<std::optional<std::string>>> Query(MYSQL* conn, const std::string& sql) {
  const auto fail = [&] {
    throw EnqueueError(mysql_error(conn), mysql_errno(conn) == ER_LOCK_DEADLOCK);
  };
  if (mysql_real_query(conn, sql.data(), sql.size()) != 0) fail();
  std::vector<std::vector<std::optional<std::string>>> rows;
  do {
    MYSQL_RES* result = mysql_store_result(conn);
    if (result == nullptr) {
      if (mysql_field_count(conn) != 0) fail();
      continue;
    }
    const unsigned fields = mysql_num_fields(result);
    while (MYSQL_ROW row = mysql_fetch_row(result)) {
      const unsigned long* lengths = mysql_fetch_lengths(result);
      auto& out = rows.emplace_back(fields);
      for (unsigned i = 0; i < fields; ++i) {
        if (row[i] != nullptr) out[i].emplace(row[i], lengths[i]);
      }
    }
    mysql_free_result(result);
  } while (mysql_next_result(conn) == 0);
  if (mysql_errno(conn) != 0) fail();
  return rows;
}

class MariaDbWriterSession final : public WriterSession {
 public:
  MariaDbWriterSession(std::string schema, milliseconds lock_timeout)
      : schema_(std::move(schema)), conn_(MariaDbConnect()) {
    // An application's session, not the store's: MariaDB's defaults (REPEATABLE READ, the
    // server's sql_mode) and a time zone other than UTC.
    const auto seconds = std::max<std::int64_t>(1, lock_timeout.count() / 1000);
    Query(conn_.Ready(), "SET SESSION innodb_lock_wait_timeout = " + std::to_string(seconds) +
                             ", sql_mode = DEFAULT, time_zone = '+05:00'");
    Query(conn_.Ready(), "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ");
  }
  MYSQL* conn() { return conn_.Ready(); }

  void Begin(Isolation isolation) override {
    Query(conn(),
          std::string{"SET TRANSACTION ISOLATION LEVEL "} +
              (isolation == Isolation::kReadCommitted ? "READ COMMITTED" : "REPEATABLE READ"));
    Query(conn(), "START TRANSACTION");
  }
  void Commit() override { Query(conn(), "COMMIT"); }
  void Rollback() override { Query(conn(), "ROLLBACK"); }

  std::vector<MessageId> Enqueue(const EnqueueCall& call) override {
    const auto text = [&](const std::optional<std::string>& value) {
      return value ? Quote(conn(), *value) : std::string{"NULL"};
    };
    const std::string topic = call.null_topic ? "NULL" : Quote(conn(), call.topic);
    const std::string sequenced =
        call.sequenced ? (*call.sequenced ? "TRUE" : "FALSE") : std::string{"NULL"};
    if (call.targets) return EnqueueTargets(call);
    std::string sql;
    if (call.bytes) {
      sql = "CALL " + schema_ + ".enqueue_bytes(" + topic + ", " +
            (call.null_payload ? "NULL" : Hex(call.payload)) + ", " + text(call.content_type) +
            ", ";
    } else {
      sql = "CALL " + schema_ + ".enqueue(" + topic + ", " +
            (call.null_payload ? "NULL" : Quote(conn(), call.payload)) + ", ";
    }
    sql += text(call.stream_key) + ", " + text(call.type) + ", " + text(call.headers) + ", " +
           text(call.target) + ", " + text(call.correlation_id) + ", " + text(call.causation_id) +
           ", " + sequenced + ")";
    const auto rows = Query(conn(), sql);
    if (rows.size() != 1 || !rows[0].at(0)) throw std::runtime_error("enqueue: not one id");
    return {Uuid::Parse(*rows[0][0]).value()};
  }

  std::vector<std::pair<std::int64_t, MessageId>> EnqueueBatch(const std::string& json) override {
    std::vector<std::pair<std::int64_t, MessageId>> out;
    for (const auto& row :
         Query(conn(), "CALL " + schema_ + ".enqueue_batch(" + Quote(conn(), json) + ")")) {
      out.emplace_back(std::stoll(row.at(0).value()), Uuid::Parse(row.at(1).value()).value());
    }
    return out;
  }

  std::vector<std::vector<MessageId>> WriterEnqueue(std::span<const NewMessage> messages) override {
    return mariadb::Writer{schema_}.EnqueueCopies(conn(), messages);
  }

 private:
  // MariaDB's fan-out from SQL: enqueue_batch with "targets".
  std::vector<MessageId> EnqueueTargets(const EnqueueCall& call) {
    std::string targets = "JSON_ARRAY(";
    for (std::size_t i = 0; i < call.targets->size(); ++i) {
      targets += (i > 0 ? ", " : "") + Quote(conn(), (*call.targets)[i]);
    }
    targets += ")";
    std::string object =
        "JSON_OBJECT('topic', " + Quote(conn(), call.topic) + ", 'targets', " + targets;
    if (call.bytes) {
      object += ", 'payload_base64', TO_BASE64(" + Hex(call.payload) + ")";
      if (call.content_type) object += ", 'content_type', " + Quote(conn(), *call.content_type);
    } else {
      object += ", 'payload', JSON_EXTRACT(" + Quote(conn(), call.payload) + ", '$')";
    }
    const auto add = [&](const char* key, const std::optional<std::string>& value) {
      if (value) object += std::string{", '"} + key + "', " + Quote(conn(), *value);
    };
    add("stream_key", call.stream_key);
    add("type", call.type);
    add("correlation_id", call.correlation_id);
    add("causation_id", call.causation_id);
    if (call.headers)
      object += ", 'headers', JSON_EXTRACT(" + Quote(conn(), *call.headers) + ", '$')";
    if (call.sequenced)
      object += std::string{", 'sequenced', "} + (*call.sequenced ? "TRUE" : "FALSE");
    std::vector<MessageId> ids;
    for (const auto& row :
         Query(conn(), "CALL " + schema_ + ".enqueue_batch(JSON_ARRAY(" + object + ")))")) {
      ids.push_back(Uuid::Parse(row.at(1).value()).value());
    }
    return ids;
  }

  std::string schema_;
  mariadb::Connection conn_;
};

class MariaDbWriterHarness final : public WriterHarness {
 public:
  void Reset() override {
    schema_.reset();
    schema_ = std::make_unique<MariaDbTestSchema>();
  }
  std::unique_ptr<WriterSession> Connect(milliseconds lock_timeout) override {
    return std::make_unique<MariaDbWriterSession>(schema_->name(), lock_timeout);
  }
  std::vector<StoredMessage> Messages() override {
    auto& conn = schema_->conn();
    const std::string s = schema_->name();
    std::map<std::string, Headers> headers;
    const auto header_rows =
        conn.Run("headers",
                 "SELECT m.id, k.name, JSON_VALUE(m.headers, CONCAT('$.', JSON_QUOTE(k.name))) "
                 "FROM " +
                     s +
                     ".messages m, JSON_TABLE(JSON_KEYS(m.headers), '$[*]' COLUMNS (name "
                     "VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) k");
    for (const auto& row : header_rows.sets.at(0).rows) {
      headers[row.at(0).value()][row.at(1).value()] = row.at(2).value_or("<null>");
    }
    std::vector<StoredMessage> out;
    const auto rows = conn.Run("messages",
                               "SELECT id, event_id, topic, stream_key, stream_seq, partition_no, "
                               "target, type, payload, content_type, status, attempts FROM " +
                                   s + ".messages ORDER BY id");
    for (const auto& row : rows.sets.at(0).rows) {
      StoredMessage message;
      message.id = mariadb::ToId(row[0], "id");
      if (row[1]) message.event_id = mariadb::ToId(row[1], "event_id");
      message.topic = row[2].value();
      message.stream_key = row[3];
      if (row[4]) message.stream_seq = mariadb::ToInt64(row[4], "stream_seq");
      message.partition = static_cast<int>(mariadb::ToInt64(row[5], "partition_no"));
      message.target = row[6].value();
      message.type = row[7];
      message.payload = row[8].value();
      message.content_type = row[9].value();
      message.status = row[10].value();
      message.attempts = static_cast<int>(mariadb::ToInt64(row[11], "attempts"));
      if (auto it = headers.find(*row[0]); it != headers.end()) message.headers = it->second;
      out.push_back(std::move(message));
    }
    return out;
  }
  void SetSetting(const std::string& column, std::int64_t value) override {
    const Value param{value};
    schema_->conn().Run("setting", "UPDATE " + schema_->name() + ".settings SET " + column + " = ?",
                        {&param, 1});
  }
  std::int64_t Setting(const std::string& column) override {
    return mariadb::ToInt64(MariaDbScalar(schema_->conn(), "SELECT " + column + " FROM " +
                                                               schema_->name() + ".settings"),
                            column);
  }
  void SetTopic(const std::string& topic, std::optional<bool> sequenced,
                std::optional<std::vector<std::string>> targets) override {
    std::string json;
    if (targets) {
      json = "[";
      for (const auto& target : *targets) json += (json.size() > 1 ? ",\"" : "\"") + target + "\"";
      json += "]";
    }
    const Value params[] = {
        Value{topic},
        sequenced ? Value{std::int64_t{*sequenced ? 1 : 0}} : Value{},
        targets ? Value{json} : Value{},
    };
    try {
      schema_->conn().Run("topic",
                          "REPLACE INTO " + schema_->name() +
                              ".topic_settings (topic, sequenced, targets) VALUES (?, ?, ?)",
                          params);
    } catch (const mariadb::MariaDbError& e) {
      const std::string message = e.what();
      throw EnqueueError(message.substr(message.find(": ") + 2), false);
    }
  }
  void SetStreamLastId(const std::string& target, const std::string& stream_key,
                       const MessageId& id) override {
    const Value params[] = {mariadb::IdBytes(id), Value{target}, Value{stream_key}};
    schema_->conn().Run("last id",
                        "UPDATE " + schema_->name() +
                            ".target_streams SET last_id = ? WHERE target = ? AND "
                            "stream_key = ?",
                        params);
  }

 private:
  std::unique_ptr<MariaDbTestSchema> schema_;
};

MariaDbWriterHarness harness;
INSTANTIATE_TEST_SUITE_P(MariaDb, WriterContractTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"ConnectorC"}; });

// What only MariaDB has.
class MariaDbWriterTest : public ::testing::Test {
 protected:
  MariaDbTestSchema schema_;
  std::string S() { return schema_.name(); }
};

TEST_F(MariaDbWriterTest, ErrorsCarrySqlstate22023AndBadJsonIsRefused) {
  MariaDbWriterSession session{S(), milliseconds{1000}};
  try {
    Query(session.conn(),
          "CALL " + S() + ".enqueue('', '{}', NULL, NULL, NULL, NULL, NULL, NULL, NULL)");
    ADD_FAILURE() << "no error";
  } catch (const EnqueueError&) {
    EXPECT_STREQ(mysql_sqlstate(session.conn()), "22023");
  }
  EXPECT_THROW(Query(session.conn(), "CALL " + S() +
                                         ".enqueue('t', '{not json', NULL, NULL, NULL, NULL, "
                                         "NULL, NULL, NULL)"),
               EnqueueError);
  EXPECT_STREQ(mysql_error(session.conn()), "outbox.enqueue: payload is not valid JSON");
  EXPECT_EQ(MariaDbScalar(schema_.conn(), "SELECT COUNT(*) FROM " + S() + ".messages"), "0");
}

// A CALL outside a transaction (autocommit) is a transaction of its own: all of a fan-out or
// nothing.
TEST_F(MariaDbWriterTest, ACallWithAutocommitIsItsOwnTransaction) {
  MariaDbWriterSession session{S(), milliseconds{1000}};
  Query(session.conn(), "CALL " + S() +
                            ".enqueue_batch('[{\"topic\": \"t\", \"payload\": 1, \"targets\": "
                            "[\"a\", \"b\"]}]')");
  EXPECT_THROW(Query(session.conn(), "CALL " + S() +
                                         ".enqueue_batch('[{\"topic\": \"t\", \"payload\": 1}, "
                                         "{\"topic\": \"\", \"payload\": 1}]')"),
               EnqueueError);
  EXPECT_EQ(MariaDbScalar(schema_.conn(), "SELECT COUNT(*) FROM " + S() + ".messages"), "2");
  // Inside the caller's transaction, a refused CALL takes back its own writes only.
  Query(session.conn(), "START TRANSACTION");
  Query(session.conn(),
        "CALL " + S() + ".enqueue('t', '1', NULL, NULL, NULL, NULL, NULL, NULL, NULL)");
  EXPECT_THROW(Query(session.conn(), "CALL " + S() +
                                         ".enqueue_batch('[{\"topic\": \"t\", \"payload\": 1}, "
                                         "{\"topic\": \"\", \"payload\": 1}]')"),
               EnqueueError);
  Query(session.conn(), "COMMIT");
  EXPECT_EQ(MariaDbScalar(schema_.conn(), "SELECT COUNT(*) FROM " + S() + ".messages"), "3");
}

// The Writer's deadlock is StoreError(kUnavailable): the caller rolls back and runs it again.
TEST_F(MariaDbWriterTest, ADeadlockThroughTheWriterIsUnavailableAndARetrySucceeds) {
  MariaDbWriterSession t1{S(), milliseconds{10000}};
  MariaDbWriterSession t2{S(), milliseconds{10000}};
  const mariadb::Writer writer{S()};
  NewMessage a;
  a.topic = "t";
  a.payload = "{}";
  a.stream_key = "a";
  NewMessage b = a;
  b.stream_key = "b";
  t1.Begin(Isolation::kRepeatableRead);
  writer.Enqueue(t1.conn(), a);
  t2.Begin(Isolation::kRepeatableRead);
  writer.Enqueue(t2.conn(), b);
  auto first = std::async(std::launch::async, [&]() -> std::optional<FailureKind> {
    try {
      writer.Enqueue(t1.conn(), b);
    } catch (const StoreError& e) {
      return e.kind();
    }
    return std::nullopt;
  });
  ASSERT_EQ(first.wait_for(milliseconds{200}), std::future_status::timeout);
  std::optional<FailureKind> second;
  try {
    writer.Enqueue(t2.conn(), a);
  } catch (const StoreError& e) {
    second = e.kind();
  }
  const auto first_kind = first.get();
  ASSERT_NE(first_kind.has_value(), second.has_value()) << "exactly one is the victim";
  EXPECT_EQ(first_kind.value_or(second.value_or(FailureKind::kPermanent)),
            FailureKind::kUnavailable);
  MariaDbWriterSession& victim = first_kind ? t1 : t2;
  MariaDbWriterSession& winner = first_kind ? t2 : t1;
  victim.Rollback();
  winner.Commit();
  victim.Begin(Isolation::kRepeatableRead);
  writer.Enqueue(victim.conn(), std::vector<NewMessage>{a, b});
  victim.Commit();
  EXPECT_EQ(MariaDbScalar(schema_.conn(),
                          "SELECT GROUP_CONCAT(stream_key, stream_seq ORDER BY "
                          "stream_key, stream_seq) FROM " +
                              S() + ".messages"),
            "a1,a2,b1,b2");
}

// The Writer's statement means the same on a connection in any character set: text is stored as
// the UTF-8 it was given (escaped in latin1, a hex literal in GBK, whose characters may end in a
// byte that looks like a backslash).
TEST_F(MariaDbWriterTest, TheWriterIsRightWhateverTheConnectionCharacterSet) {
  for (const char* charset : {"latin1", "gbk", "utf8mb4"}) {
    MariaDbWriterSession session{S(), milliseconds{1000}};
    ASSERT_EQ(mysql_set_character_set(session.conn(), charset), 0) << charset;
    NewMessage message;
    message.topic = std::string{"t-"} + charset;
    message.stream_key = "\xe4\xb8\xad\xe6\x96\x87'\\\"";  // 中文'\"
    message.payload = "\xe5\x5c'";  // bytes only: in GBK, 0xe5 0x5c is one character
    message.headers = {{"x-\xe4\xb8\xad\\", "\xc3\xa9'\\"}};  // x-中\ in GBK: ..., 0xad 0x5c
    session.Begin(Isolation::kReadCommitted);
    const MessageId id = mariadb::Writer{S()}.Enqueue(session.conn(), message);
    session.Commit();
    const Value param = mariadb::IdBytes(id);
    const auto row =
        schema_.conn()
            .Run("read",
                 "SELECT stream_key, payload, headers FROM " + S() + ".messages WHERE id = ?",
                 {&param, 1})
            .sets.at(0)
            .rows.at(0);
    EXPECT_EQ(row[0], message.stream_key) << charset;
    EXPECT_EQ(row[1], message.payload) << charset;
    EXPECT_EQ(MariaDbScalar(schema_.conn(),
                            "SELECT JSON_VALUE(headers, CONCAT('$.', JSON_QUOTE(?))) FROM " + S() +
                                ".messages WHERE id = ?",
                            std::vector<Value>{Value{std::string{"x-\xe4\xb8\xad\\"}}, param}),
              "\xc3\xa9'\\")
        << charset;
  }
}

// One CALL for the batch, whatever its size, until the statement would pass 4 MiB.
TEST_F(MariaDbWriterTest, ABatchIsOneRoundTripUntilItIsLarge) {
  MariaDbWriterSession session{S(), milliseconds{1000}};
  const auto questions = [&] {
    return std::stoll(
        Query(session.conn(), "SHOW SESSION STATUS LIKE 'Questions'").at(0).at(1).value());
  };
  std::vector<NewMessage> messages(100);
  for (auto& message : messages) {
    message.topic = "t";
    message.payload = std::string(256, 'p');
  }
  session.Begin(Isolation::kRepeatableRead);
  const auto before = questions();
  EXPECT_EQ(mariadb::Writer{S()}.Enqueue(session.conn(), messages).size(), 100U);
  EXPECT_EQ(questions() - before, 2) << "the CALL and SHOW STATUS";
  // 3 MiB payloads: one CALL each.
  std::vector<NewMessage> large(2, messages[0]);
  for (auto& message : large) message.payload = std::string(size_t{3} << 20U, 'x');
  Query(session.conn(), "UPDATE " + S() + ".settings SET max_payload_bytes = 4194304");
  const auto before_large = questions();
  EXPECT_EQ(mariadb::Writer{S()}.Enqueue(session.conn(), large).size(), 2U);
  EXPECT_EQ(questions() - before_large, 3);
  session.Commit();
  EXPECT_EQ(MariaDbScalar(schema_.conn(), "SELECT COUNT(*) FROM " + S() + ".messages"), "102");
}

}  // namespace
}  // namespace outbox::testing
