// WAL mode's PostgreSQL side (schema version 12): the guard on settings.delivery, the slot that
// EnsureWalSlot makes, enqueue emitting logical messages instead of rows (read back through the
// slot with pgoutput, as the relay reads them), and the record decoder.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "connection.h"
#include "migrations.h"
#include "outbox/core/partition.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_wal.h"
#include "support/pg_test_support.h"
#include "support/wait.h"
#include "wal_files.h"
#include "wal_record.h"

namespace outbox::testing {
namespace {

using postgres::DecodeWalRecord;

// ---- the decoder on bad input (no server) ----

// A record assembled field by field, for the decoder's bad-input tests; the good records come
// from PostgreSQL (below).
class RecordBytes {
 public:
  RecordBytes& U8(std::uint8_t value) {
    bytes_ += static_cast<char>(value);
    return *this;
  }
  RecordBytes& I32(std::int32_t value) { return BigEndian(static_cast<std::uint32_t>(value), 4); }
  RecordBytes& I64(std::int64_t value) { return BigEndian(static_cast<std::uint64_t>(value), 8); }
  RecordBytes& Raw(std::string_view raw) {
    bytes_ += raw;
    return *this;
  }
  RecordBytes& Str(std::string_view text) {
    I32(static_cast<std::int32_t>(text.size()));
    return Raw(text);
  }
  RecordBytes& Null() { return I32(-1); }
  [[nodiscard]] const std::string& bytes() const { return bytes_; }
  [[nodiscard]] std::size_t size() const { return bytes_.size(); }

 private:
  RecordBytes& BigEndian(std::uint64_t value, int size) {
    for (int shift = (size - 1) * 8; shift >= 0; shift -= 8) {
      bytes_ += static_cast<char>((value >> shift) & 0xFFU);
    }
    return *this;
  }
  std::string bytes_;
};

constexpr std::string_view kId = "\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11";
constexpr std::string_view kEvent =
    "\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22";

// A valid version 1 record; `starts` gets the offset at which each field begins.
std::string ValidRecord(std::vector<std::pair<std::string, std::size_t>>* starts = nullptr,
                        std::string_view headers = R"({"a": "b", "n": 1})") {
  RecordBytes record;
  const auto field = [&](const char* name) {
    if (starts != nullptr) starts->emplace_back(name, record.size());
  };
  field("version");
  record.U8(1);
  field("id");
  record.Raw(kId);
  field("event_id");
  record.Raw(kEvent);
  field("created_at");
  record.I64(1'700'000'000'123'456);
  field("partition");
  record.I32(7);
  field("flags");
  record.U8(1);
  field("target");
  record.Str("kafka");
  field("topic");
  record.Str("orders");
  field("stream_key");
  record.Str("order-42");
  field("type");
  record.Null();
  field("content_type");
  record.Str("application/x-raw");
  field("headers");
  record.Str(headers);
  field("payload");
  record.Str(std::string{"\x00\xff\x00", 3});
  return record.bytes();
}

// The message DecodeWalRecord throws for `record` (empty when it throws nothing).
std::string DecodeError(std::string_view record) {
  try {
    DecodeWalRecord(record);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(WalRecordTest, DecodesEveryField) {
  const WalMessage message = DecodeWalRecord(ValidRecord());
  const Envelope& envelope = message.envelope;
  EXPECT_EQ(envelope.id.ToString(), "11111111-1111-1111-1111-111111111111");
  ASSERT_TRUE(envelope.event_id.has_value());
  EXPECT_EQ(envelope.event_id->ToString(), "22222222-2222-2222-2222-222222222222");
  EXPECT_EQ(
      std::chrono::duration_cast<std::chrono::microseconds>(envelope.created_at.time_since_epoch())
          .count(),
      1'700'000'000'123'456);
  EXPECT_EQ(envelope.partition, 7);
  EXPECT_TRUE(message.sequenced);
  EXPECT_EQ(envelope.target, "kafka");
  EXPECT_EQ(envelope.topic, "orders");
  EXPECT_EQ(envelope.stream_key, "order-42");
  EXPECT_EQ(envelope.type, std::nullopt);
  EXPECT_EQ(envelope.content_type, "application/x-raw");
  EXPECT_EQ(envelope.headers, (Headers{{"a", "b"}, {"n", "1"}}));  // not a string: its JSON text
  EXPECT_EQ(envelope.payload, std::string("\x00\xff\x00", 3));
  EXPECT_EQ(envelope.stream_seq, std::nullopt);
  EXPECT_EQ(envelope.attempts, 0);
  EXPECT_EQ(envelope.lease_epoch, 0);
}

TEST(WalRecordTest, RefusesEmptyAndOtherVersions) {
  EXPECT_EQ(DecodeError(""), "WAL record: empty");
  std::string record = ValidRecord();
  record[0] = 7;
  EXPECT_EQ(DecodeError(record), "WAL record version 7: this build reads version 1");
  record[0] = 0;
  EXPECT_EQ(DecodeError(record), "WAL record version 0: this build reads version 1");
}

TEST(WalRecordTest, NamesTheFieldARecordIsTruncatedIn) {
  std::vector<std::pair<std::string, std::size_t>> starts;
  const std::string record = ValidRecord(&starts);
  for (std::size_t i = 1; i < starts.size(); ++i) {
    const auto& [field, start] = starts[i];
    // Cut where the field starts and one byte into it: both are truncated in that field.
    const std::size_t end = i + 1 < starts.size() ? starts[i + 1].second : record.size();
    for (const std::size_t cut : {start, start + 1}) {
      if (cut >= end) continue;  // a one-byte field has no inside
      const std::string error = DecodeError(record.substr(0, cut));
      EXPECT_NE(error.find("WAL record: truncated in field " + field + " ("), std::string::npos)
          << "cut at " << cut << ": " << error;
    }
  }
  // Every shorter record is refused, none crashes.
  for (std::size_t cut = 0; cut < record.size(); ++cut) {
    EXPECT_FALSE(DecodeError(record.substr(0, cut)).empty()) << cut;
  }
  EXPECT_EQ(DecodeError(record), "");
}

TEST(WalRecordTest, RefusesNegativeLengthsTrailingBytesAndUnknownFlags) {
  std::vector<std::pair<std::string, std::size_t>> starts;
  const std::string record = ValidRecord(&starts);
  const auto start_of = [&](const std::string& field) {
    for (const auto& [name, start] : starts) {
      if (name == field) return start;
    }
    throw std::logic_error("no field " + field);
  };
  std::string bad = record;
  bad.replace(start_of("topic"), 4, std::string("\xff\xff\xff\xff", 4));  // -1: not nullable
  EXPECT_EQ(DecodeError(bad), "WAL record: negative length -1 in field topic");
  bad = record;
  bad.replace(start_of("type"), 4, std::string("\xff\xff\xff\xfe", 4));
  EXPECT_EQ(DecodeError(bad), "WAL record: negative length -2 in field type");
  bad = record;
  bad.replace(start_of("payload"), 4, std::string("\x80\x00\x00\x00", 4));
  EXPECT_EQ(DecodeError(bad), "WAL record: negative length -2147483648 in field payload");

  EXPECT_EQ(DecodeError(record + "x"), "WAL record: trailing bytes after the payload (1)");

  bad = record;
  bad[start_of("flags")] = 3;
  EXPECT_NE(DecodeError(bad).find("WAL record: unknown flags 3"), std::string::npos);
  bad = record;
  bad[start_of("partition")] = '\x80';
  EXPECT_NE(DecodeError(bad).find("WAL record: negative partition"), std::string::npos);
  bad = record;
  bad.replace(start_of("created_at"), 8, std::string("\x7f\xff\xff\xff\xff\xff\xff\xff", 8));
  EXPECT_NE(DecodeError(bad).find("created_at"), std::string::npos) << DecodeError(bad);
}

TEST(WalRecordTest, RefusesTextThatIsNotUtf8AndHeadersThatAreNotAnObject) {
  std::vector<std::pair<std::string, std::size_t>> starts;
  std::string bad = ValidRecord(&starts);
  for (const auto& [name, start] : starts) {
    if (name == "topic") bad[start + 4] = '\xc3';  // "orders" -> a lead byte, then 'r'
  }
  EXPECT_EQ(DecodeError(bad), "WAL record: field topic is not valid UTF-8");
  EXPECT_EQ(DecodeError(ValidRecord(nullptr, "{\"a\": \"\xff\"}")),
            "WAL record: field headers is not valid UTF-8");
  for (const std::string_view headers : {"[]", "\"text\"", "{\"a\": ", "", "null", "{} {}"}) {
    EXPECT_EQ(DecodeError(ValidRecord(nullptr, headers)),
              "WAL record: field headers is not a JSON object")
        << headers;
  }
  // The payload is bytes, never checked as text.
  EXPECT_EQ(DecodeError(ValidRecord()), "");
}

TEST(WalRecordTest, ASequencedFlagNeedsAStreamKeyAndZeroEventIdIsNone) {
  RecordBytes record;
  record.U8(1).Raw(kId).Raw(std::string(16, '\0')).I64(0).I32(0).U8(0);
  record.Str("default").Str("t").Null().Null().Str("application/json").Str("{}").Str("{}");
  const WalMessage message = DecodeWalRecord(record.bytes());
  EXPECT_EQ(message.envelope.event_id, std::nullopt);
  EXPECT_EQ(message.envelope.stream_key, std::nullopt);
  EXPECT_FALSE(message.sequenced);

  std::string sequenced = record.bytes();
  sequenced[1 + 16 + 16 + 8 + 4] = 1;
  EXPECT_EQ(DecodeError(sequenced), "WAL record: flagged sequenced without a stream_key");
}

// ---- against PostgreSQL ----

// One pgoutput logical message ('M'), as the relay would receive it.
struct LogicalMessage {
  bool transactional = false;  // flagged so, and between a Begin and a Commit
  std::string prefix;
  std::string content;
};

// Drops the schema's slot when the test ends, however it ends: a forgotten slot makes
// PostgreSQL keep WAL forever.
class SlotGuard {
 public:
  SlotGuard(PGconn* test_conn, std::string schema)
      : test_conn_(test_conn), schema_(std::move(schema)) {}
  SlotGuard(const SlotGuard&) = delete;
  SlotGuard& operator=(const SlotGuard&) = delete;
  ~SlotGuard() {
    // A failed test may have left a transaction open, holding locks the drop would wait for.
    if (PQtransactionStatus(test_conn_) != PQTRANS_IDLE) {
      const PgResult rollback{PQexec(test_conn_, "ROLLBACK")};
    }
    try {
      const auto conn = Connect();
      postgres::DropWalSlot(conn.get(), schema_);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "the WAL slot of " << schema_ << " was not dropped: " << error.what();
    }
  }

 private:
  PGconn* test_conn_;
  std::string schema_;
};

class PgWalTest : public ::testing::Test {
 protected:
  TestSchema schema_;
  SlotGuard slot_guard_{schema_.conn(), schema_.name()};  // dropped before the schema

  PgWalTest() {
    // The test server runs with synchronous_commit = off, and logical decoding reads only WAL
    // that is flushed: without this, a message committed here would show up a moment later.
    Sql(conn(), "SET synchronous_commit = on");
    // No relay reads the slots here (the tests read them with SQL): a switch out of WAL mode has
    // no one to wait for. The switch's own tests set it back.
    Sql(conn(), "SET outbox.switch_wait = 0");
  }

  PGconn* conn() { return schema_.conn(); }
  std::string S() { return schema_.name(); }

  // Creates the slot and switches the schema to WAL delivery.
  std::string EnableWal() {
    slot_ = postgres::EnsureWalSlot(conn(), S());
    Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
    return slot_;
  }

  // Runs `select` (one value) in a transaction of its own, committed; returns the value and the
  // transaction's now() in microseconds since 1970 (what created_at must be).
  std::pair<std::string, std::int64_t> Committed(const std::string& select) {
    Sql(conn(), "BEGIN");
    std::string value = Scalar(conn(), select);
    const std::int64_t now =
        std::stoll(Scalar(conn(), "SELECT (extract(epoch FROM now()) * 1000000)::bigint"));
    Sql(conn(), "COMMIT");
    return {std::move(value), now};
  }

  std::string Enqueue(const std::string& args) {
    return Scalar(conn(), "SELECT " + S() + ".enqueue(" + args + ")");
  }

  std::int64_t Rows() {
    return std::stoll(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"));
  }

  // This schema's logical messages decoded since the last call (consumed from the slot).
  std::vector<LogicalMessage> TakeMessages() {
    const auto result = postgres::Exec(
        conn(), "read the slot",
        "SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, 'proto_version', "
        "'1', 'publication_names', $2, 'messages', 'true')",
        {postgres::Param{slot_}, postgres::Param{postgres::kWalPublication}},
        /*binary_results=*/true);
    std::vector<LogicalMessage> messages;
    bool in_transaction = false;
    for (int row = 0; row < PQntuples(result.get()); ++row) {
      const std::string_view data = postgres::Column(result.get(), row, 0);
      if (data.empty()) continue;
      if (data[0] == 'B') in_transaction = true;
      if (data[0] == 'C') in_transaction = false;
      if (data[0] != 'M') continue;
      // 'M', u8 flags (1: transactional), i64 lsn, prefix (NUL-terminated), i32 length, content.
      LogicalMessage message;
      const auto flags = static_cast<std::uint8_t>(data[1]);
      const std::size_t prefix_end = data.find('\0', 10);
      message.prefix = std::string{data.substr(10, prefix_end - 10)};
      const auto length = postgres::ReadInt32(data.data() + prefix_end + 1);
      message.content = std::string{data.substr(prefix_end + 5)};
      EXPECT_EQ(message.content.size(), static_cast<std::size_t>(length));
      message.transactional = (flags & 1U) != 0 && in_transaction;
      // Every schema of the database emits into every slot: keep this schema's. A change of
      // delivery leaves its one-byte mark (counted, not returned).
      if (message.prefix != postgres::WalPrefix(S())) continue;
      if (message.content.size() == 1 &&
          static_cast<std::uint8_t>(message.content[0]) == postgres::kWalSwitchRecord) {
        ++switch_marks_;
        continue;
      }
      messages.push_back(message);
    }
    return messages;
  }

  // The decoded records of TakeMessages, checking that each is a transactional message.
  std::vector<WalMessage> TakeRecords() {
    std::vector<WalMessage> records;
    for (const auto& message : TakeMessages()) {
      EXPECT_TRUE(message.transactional);
      records.push_back(DecodeWalRecord(message.content));
    }
    return records;
  }

  std::string slot_;
  int switch_marks_ = 0;  // delivery switches TakeMessages saw
};

std::vector<std::string> IdsOf(const std::string& array) {  // "{a,b}"
  std::vector<std::string> ids;
  for (std::size_t at = 1; at + 36 <= array.size(); at += 37) ids.push_back(array.substr(at, 36));
  return ids;
}

std::int64_t Micros(TimePoint time) {
  return std::chrono::duration_cast<std::chrono::microseconds>(time.time_since_epoch()).count();
}

// The SQLSTATE of `sql`'s failure (empty when it succeeds).
std::string SqlState(PGconn* conn, const std::string& sql) {
  try {
    postgres::Exec(conn, "test", sql);
  } catch (const postgres::PgError& error) {
    return error.sqlstate();
  }
  return "";
}

TEST(PgWalNamesTest, PrefixAndSlotNames) {
  EXPECT_EQ(postgres::WalPrefix("outbox"), "outbox");
  EXPECT_EQ(postgres::WalPrefix("billing"), "outbox:billing");
  EXPECT_EQ(postgres::WalSlotName("outbox"), "outbox_outbox");
  EXPECT_EQ(postgres::WalSlotName("Bad-Name"), "outbox_bad_name");
  const std::string long_a(63, 'a');
  const std::string long_b = std::string(62, 'a') + "b";
  EXPECT_EQ(postgres::WalSlotName(long_a).size(), 63U);
  EXPECT_EQ(postgres::WalSlotName(long_a).substr(0, 54), "outbox_" + std::string(47, 'a'));
  EXPECT_NE(postgres::WalSlotName(long_a), postgres::WalSlotName(long_b));
  EXPECT_EQ(postgres::WalSlotName(std::string(56, 'a')), "outbox_" + std::string(56, 'a'));
}

TEST_F(PgWalTest, WalDeliveryIsRefusedUntilTheSlotExists) {
  const std::string settings = "UPDATE " + S() + ".settings SET delivery = 'wal'";
  const std::string topic =
      "INSERT INTO " + S() + ".topic_settings (topic, delivery) VALUES ('t', 'wal')";
  EXPECT_EQ(RunExpectingError(conn(), settings),
            "outbox: delivery 'wal' needs a logical replication slot and settings.wal_slot is not "
            "set: run outboxctl migrate --wal-slot first");
  EXPECT_EQ(SqlState(conn(), settings), "55000");
  EXPECT_EQ(RunExpectingError(conn(), topic),
            "outbox: delivery 'wal' needs a logical replication slot and settings.wal_slot is not "
            "set: run outboxctl migrate --wal-slot first");
  // A topic row made 'wal' by an update is refused as well.
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, sequenced) VALUES ('u', false)");
  EXPECT_EQ(SqlState(conn(), "UPDATE " + S() + ".topic_settings SET delivery = 'wal'"), "55000");
  // A slot name that no slot has.
  Sql(conn(), "UPDATE " + S() + ".settings SET wal_slot = 'outbox_no_such_slot'");
  EXPECT_EQ(RunExpectingError(conn(), settings),
            "outbox: delivery 'wal' needs the logical replication slot \"outbox_no_such_slot\", "
            "which this database does not have (or not with plugin pgoutput, or it is lost): run "
            "outboxctl migrate --wal-slot to create it");
  EXPECT_EQ(Scalar(conn(), "SELECT delivery FROM " + S() + ".settings"), "table");
  EXPECT_NE(RunExpectingError(conn(), "UPDATE " + S() + ".settings SET delivery = 'kafka'")
                .find("violates check constraint"),
            std::string::npos);

  // With the slot: accepted, and EnsureWalSlot again changes nothing.
  const std::string slot = postgres::EnsureWalSlot(conn(), S());
  EXPECT_EQ(slot, postgres::WalSlotName(S()));
  EXPECT_EQ(postgres::EnsureWalSlot(conn(), S()), slot);
  EXPECT_EQ(Scalar(conn(), "SELECT wal_slot FROM " + S() + ".settings"), slot);
  EXPECT_EQ(Scalar(conn(), "SELECT string_agg(slot || ' ' || " + S() +
                               ".wal_position(slot), ',') FROM " + S() + ".wal_progress"),
            slot + " 0/0");
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(slot_type || ' ' || plugin || ' ' || database, ',') "
                   "FROM pg_replication_slots WHERE slot_name = '" +
                       slot + "'"),
            "logical pgoutput " + Scalar(conn(), "SELECT current_database()"));
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM pg_publication WHERE pubname = 'outbox_wal'"),
            "1");
  Sql(conn(), settings);
  Sql(conn(), topic);
  Sql(conn(), "UPDATE " + S() + ".topic_settings SET delivery = 'wal' WHERE topic = 'u'");
  // Clearing the slot while something still delivers by WAL is refused too.
  EXPECT_EQ(SqlState(conn(), "UPDATE " + S() + ".settings SET wal_slot = NULL"), "55000");

  // DropWalSlot undoes it all: table delivery, no slot; 'wal' is refused again.
  postgres::DropWalSlot(conn(), S());
  EXPECT_EQ(
      Scalar(conn(), "SELECT delivery || ' ' || coalesce(wal_slot, '-') FROM " + S() + ".settings"),
      "table -");
  EXPECT_EQ(
      Scalar(conn(), "SELECT count(*) FROM " + S() + ".topic_settings WHERE delivery IS NOT NULL"),
      "0");
  EXPECT_EQ(
      Scalar(conn(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + slot + "'"),
      "0");
  EXPECT_EQ(SqlState(conn(), settings), "55000");
  postgres::DropWalSlot(conn(), S());  // idempotent too
}

TEST_F(PgWalTest, EnsureWalSlotNeedsAMigratedSchemaAndAnIdleConnection) {
  try {
    postgres::EnsureWalSlot(conn(), S() + "_none");
    ADD_FAILURE() << "no error";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string{error.what()}.find("not migrated"), std::string::npos) << error.what();
    EXPECT_NE(std::string{error.what()}.find("run outboxctl migrate"), std::string::npos);
  }
  Sql(conn(), "BEGIN");
  EXPECT_THROW(postgres::EnsureWalSlot(conn(), S()), std::logic_error);
  Sql(conn(), "ROLLBACK");
  EXPECT_THROW(postgres::EnsureWalSlot(conn(), "Bad"), std::invalid_argument);
}

TEST_F(PgWalTest, EnsureWalSlotRefusesARoleWithoutReplication) {
  const std::string role = S() + "_norepl";
  Sql(conn(), "CREATE ROLE " + role + " LOGIN NOREPLICATION NOSUPERUSER");
  Sql(conn(), "SET ROLE " + role);
  try {
    postgres::EnsureWalSlot(conn(), S());
    ADD_FAILURE() << "no error";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string{error.what()}.find("needs the REPLICATION attribute (as a superuser: "
                                             "ALTER ROLE " +
                                             role + " REPLICATION)"),
              std::string::npos)
        << error.what();
  }
  Sql(conn(), "RESET ROLE");
  Sql(conn(), "DROP ROLE " + role);
}

TEST_F(PgWalTest, AWalEnqueueWritesNoRowAndEmitsEveryFieldInItsRecord) {
  EnableWal();
  const auto [id, now] =
      Committed("SELECT " + S() +
                ".enqueue(topic => 'orders', payload => '{\"id\": 42}', stream_key => 'order-42', "
                "type => 'OrderPlaced', headers => '{\"traceparent\": \"00-abc-def-01\"}', "
                "correlation_id => 'c-1', target => 'kafka')");
  ASSERT_EQ(Uuid::Parse(id)->version(), 7);
  EXPECT_EQ(Rows(), 0);
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".stream_seqs"), "0");

  const auto messages = TakeMessages();
  ASSERT_EQ(messages.size(), 1U);
  EXPECT_EQ(messages[0].prefix, "outbox:" + S());
  EXPECT_TRUE(messages[0].transactional);
  const WalMessage message = DecodeWalRecord(messages[0].content);
  const Envelope& envelope = message.envelope;
  EXPECT_EQ(envelope.id.ToString(), id);
  EXPECT_EQ(envelope.event_id, std::nullopt);
  EXPECT_EQ(envelope.topic, "orders");
  EXPECT_EQ(envelope.stream_key, "order-42");
  EXPECT_EQ(envelope.stream_seq, std::nullopt);
  EXPECT_EQ(envelope.partition, PartitionOf("order-42", 64));
  EXPECT_EQ(envelope.target, "kafka");
  EXPECT_EQ(envelope.type, "OrderPlaced");
  EXPECT_EQ(envelope.payload, "{\"id\": 42}");  // the JSON text as written
  EXPECT_EQ(envelope.content_type, "application/json");
  EXPECT_EQ(envelope.headers,
            (Headers{{"traceparent", "00-abc-def-01"}, {"correlation_id", "c-1"}}));
  EXPECT_EQ(Micros(envelope.created_at), now);
  EXPECT_TRUE(message.sequenced);  // settings.sequenced_by_default
  EXPECT_EQ(envelope.attempts, 0);
}

// The record holds what the table row would: the same message written to the table (a topic
// override) and to the WAL reads back the same through ParseHeaders and the row's columns.
TEST_F(PgWalTest, ARecordMatchesTheRowTheTableWouldHold) {
  EnableWal();
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, delivery) VALUES ('tbl', 'table')");
  const std::string args =
      ", payload => '\\x00ff0000'::bytea, content_type => 'application/x-raw', "
      "headers => '{\"x-h\": \"v \\u00e9\", \"b\": \"\"}', causation_id => 'k'";
  const std::string row_id = Enqueue("topic => 'tbl'" + args);
  const std::string wal_id = Enqueue("topic => 'wal'" + args);
  const auto records = TakeRecords();
  ASSERT_EQ(records.size(), 1U);
  const Envelope& wal = records[0].envelope;
  EXPECT_EQ(wal.id.ToString(), wal_id);
  const auto row = postgres::Exec(
      conn(), "row",
      "SELECT headers, payload, content_type, type, stream_key, partition::text::bytea, target "
      "FROM " +
          S() + ".messages WHERE id = $1",
      {postgres::Param{row_id}}, /*binary_results=*/true);
  ASSERT_EQ(PQntuples(row.get()), 1);
  EXPECT_EQ(wal.headers, postgres::ParseHeaders(postgres::Column(row.get(), 0, 0)));
  EXPECT_EQ(wal.headers, (Headers{{"x-h", "v \xc3\xa9"}, {"b", ""}, {"causation_id", "k"}}));
  EXPECT_EQ(wal.payload, postgres::Column(row.get(), 0, 1));
  EXPECT_EQ(wal.payload, std::string("\x00\xff\x00\x00", 4));  // zero bytes kept
  EXPECT_EQ(wal.content_type, postgres::Column(row.get(), 0, 2));
  EXPECT_TRUE(PQgetisnull(row.get(), 0, 3) == 1 && !wal.type.has_value());
  EXPECT_TRUE(PQgetisnull(row.get(), 0, 4) == 1 && !wal.stream_key.has_value());
  EXPECT_FALSE(records[0].sequenced);
  EXPECT_EQ(wal.target, postgres::Column(row.get(), 0, 6));
  // Unkeyed: placed by the text of the id, as the row is.
  EXPECT_EQ(wal.partition, PartitionFor(std::nullopt, wal.id, 64));
  EXPECT_EQ(std::string{postgres::Column(row.get(), 0, 5)},
            std::to_string(PartitionFor(std::nullopt, *Uuid::Parse(row_id), 64)));
  EXPECT_EQ(Rows(), 1);
}

TEST_F(PgWalTest, FanOutEmitsOneRecordPerTargetSharingTheEventId) {
  EnableWal();
  const auto [ids_text, now] =
      Committed("SELECT " + S() +
                ".enqueue(topic => 'orders', payload => '{}', stream_key => 'o-1', "
                "targets => ARRAY['partner', 'default'])");
  const auto ids = IdsOf(ids_text);
  ASSERT_EQ(ids.size(), 2U) << ids_text;
  const auto records = TakeRecords();
  ASSERT_EQ(records.size(), 2U);
  for (std::size_t i = 0; i < 2; ++i) {
    const Envelope& envelope = records[i].envelope;
    EXPECT_EQ(envelope.id.ToString(), ids[i]);
    ASSERT_TRUE(envelope.event_id.has_value());
    EXPECT_EQ(envelope.event_id->ToString(), ids[0]);
    EXPECT_EQ(envelope.target, i == 0 ? "partner" : "default");
    EXPECT_EQ(envelope.partition, PartitionOf("o-1", 64));
    EXPECT_EQ(Micros(envelope.created_at), now);
    EXPECT_TRUE(records[i].sequenced);
  }
  EXPECT_EQ(Rows(), 0);
}

TEST_F(PgWalTest, TheSequencedFlagFollowsTheCallTheTopicAndTheDefault) {
  EnableWal();
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, sequenced) VALUES ('loose', false)");
  Enqueue("topic => 'strict', payload => '{}', stream_key => 'k'");
  Enqueue("topic => 'loose', payload => '{}', stream_key => 'k'");
  Enqueue("topic => 'loose', payload => '{}', stream_key => 'k', sequenced => true");
  Enqueue("topic => 'strict', payload => '{}', sequenced => true");  // no key: nothing to order
  Sql(conn(), "UPDATE " + S() + ".settings SET sequenced_by_default = false");
  Enqueue("topic => 'strict', payload => '{}', stream_key => 'k'");
  const auto records = TakeRecords();
  ASSERT_EQ(records.size(), 5U);
  std::string flags;
  for (const auto& record : records) flags += record.sequenced ? '1' : '0';
  EXPECT_EQ(flags, "10100");
}

TEST_F(PgWalTest, ARolledBackEnqueueEmitsNothing) {
  EnableWal();
  Sql(conn(), "BEGIN");
  Enqueue("'t', '{\"n\": 1}'");
  Sql(conn(), "ROLLBACK");
  EXPECT_TRUE(TakeMessages().empty());
  // A savepoint rolled back takes its messages with it; the rest of the transaction commits.
  Sql(conn(), "BEGIN");
  Sql(conn(), "SAVEPOINT s");
  Enqueue("'t', '{\"n\": 2}'");
  Sql(conn(), "ROLLBACK TO SAVEPOINT s");
  const std::string kept = Enqueue("'t', '{\"n\": 3}'");
  Sql(conn(), "COMMIT");
  const auto records = TakeRecords();
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].envelope.id.ToString(), kept);
  EXPECT_EQ(records[0].envelope.payload, "{\"n\": 3}");
}

// Writers of one sequenced stream take turns until commit, so that a stream's ids follow its
// commit order (the relay numbers it in commit order; the table relay publishes what is parked in
// id order). Other streams and unsequenced messages do not wait.
TEST_F(PgWalTest, AWalModeStreamsWritersTakeTurnsSoItsIdsFollowItsCommitOrder) {
  EnableWal();
  auto first = Connect();
  Sql(first.get(), "BEGIN");
  const std::string a =
      Scalar(first.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'p')");
  // Another stream, and the same key unsequenced, go on at once.
  Enqueue("'t', '{}', stream_key => 'q'");
  Enqueue("'t', '{}', stream_key => 'p', sequenced => false");
  std::atomic<bool> done{false};
  std::string b;
  std::thread second([&] {
    auto conn = Connect();
    b = Scalar(conn.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'p')");
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds{300});
  EXPECT_FALSE(done) << "the second writer of stream p did not wait for the first's commit";
  Sql(first.get(), "COMMIT");
  second.join();
  EXPECT_TRUE(done);
  EXPECT_LT(a, b) << "ids of one stream follow its commit order";
}

TEST_F(PgWalTest, DeliveryIsChosenPerTopic) {
  postgres::EnsureWalSlot(conn(), S());
  slot_ = postgres::WalSlotName(S());
  // Settings say table, one topic says wal.
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, delivery) VALUES ('w', 'wal')");
  const std::string to_wal = Enqueue("'w', '{}'");
  const std::string to_table = Enqueue("'other', '{}'");
  auto records = TakeRecords();
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].envelope.id.ToString(), to_wal);
  EXPECT_EQ(Scalar(conn(), "SELECT string_agg(id::text, ',') FROM " + S() + ".messages"), to_table);
  // The reverse: settings say wal, one topic says table.
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, delivery) VALUES ('t', 'table')");
  const std::string to_wal_too = Enqueue("'other', '{}'");
  const std::string to_table_too = Enqueue("'t', '{}'");
  records = TakeRecords();
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].envelope.id.ToString(), to_wal_too);
  EXPECT_EQ(
      Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages WHERE id = '" + to_table_too + "'"),
      "1");
  // A topic row without a delivery follows the settings; its other settings still apply.
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, targets) VALUES ('d', '{x,y}')");
  EXPECT_EQ(Enqueue("'d', '{}'").size(), 36U);  // the first copy's id
  records = TakeRecords();
  ASSERT_EQ(records.size(), 2U);
  EXPECT_EQ(records[0].envelope.target + records[1].envelope.target, "xy");
  EXPECT_EQ(Rows(), 2);
}

TEST_F(PgWalTest, ValidationIsTheSameInBothModes) {
  postgres::EnsureWalSlot(conn(), S());
  slot_ = postgres::WalSlotName(S());
  Sql(conn(), "UPDATE " + S() + ".settings SET max_payload_bytes = 8");
  const std::string f = S() + ".enqueue_messages";
  const std::vector<std::string> bad = {
      "SELECT " + S() + ".enqueue('t', '{\"long\": \"payload\"}')",
      "SELECT " + S() + ".enqueue('', '{}')",
      "SELECT " + S() + ".enqueue(topic => 't', payload => '{}', type => '')",
      "SELECT " + S() + ".enqueue(topic => 't', payload => '{}', stream_key => repeat('k', 256))",
      "SELECT " + S() + ".enqueue(topic => 't', payload => '{}', targets => ARRAY['a', 'a'])",
      "SELECT " + S() + ".enqueue(topic => 't', payload => '{}', headers => '{\"n\": 1}')",
      "SELECT " + f + "('t', '\\x00', 'application/x', NULL, NULL, '[]', NULL, NULL)",
      "SELECT " + f + "('t', NULL, 'application/x', NULL, NULL, '{}', NULL, NULL)",
  };
  std::vector<std::string> table_errors;
  table_errors.reserve(bad.size());
  for (const auto& sql : bad) table_errors.push_back(RunExpectingError(conn(), sql));
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
  for (std::size_t i = 0; i < bad.size(); ++i) {
    EXPECT_NE(table_errors[i], "<no error>") << bad[i];
    EXPECT_EQ(RunExpectingError(conn(), bad[i]), table_errors[i]) << bad[i];
  }
  EXPECT_EQ(
      table_errors[0],
      "outbox.enqueue: payload is 19 bytes, over the limit of 8 (settings.max_payload_bytes)");
  EXPECT_TRUE(TakeMessages().empty());
  EXPECT_EQ(Rows(), 0);
}

// The C++ Writer calls the same enqueue_messages: it needs no change for WAL mode.
TEST_F(PgWalTest, TheWriterEnqueuesInWalModeToo) {
  EnableWal();
  postgres::Writer writer{S()};
  NewMessage message = TestMessage("orders", "o-9");
  message.type = "Placed";
  message.headers = {{"tenant_id", "t-1"}};
  message.targets = {"a", "b"};
  Sql(conn(), "BEGIN");
  const auto copies = writer.EnqueueCopies(conn(), std::span<const NewMessage>{&message, 1});
  Sql(conn(), "COMMIT");
  ASSERT_EQ(copies.size(), 1U);
  ASSERT_EQ(copies[0].size(), 2U);
  const auto records = TakeRecords();
  ASSERT_EQ(records.size(), 2U);
  for (std::size_t i = 0; i < 2; ++i) {
    const Envelope& envelope = records[i].envelope;
    EXPECT_EQ(envelope.id, copies[0][i]);
    EXPECT_EQ(envelope.EventId(), copies[0][0]);
    EXPECT_EQ(envelope.target, message.targets[i]);
    EXPECT_EQ(envelope.payload, message.payload);
    EXPECT_EQ(envelope.headers, message.headers);
    EXPECT_EQ(envelope.type, message.type);
    EXPECT_EQ(envelope.stream_key, message.stream_key);
  }
  EXPECT_EQ(Rows(), 0);
}

// Every prefix of a real record is refused (never a crash), and the whole one decodes.
TEST_F(PgWalTest, EveryTruncationOfARealRecordIsRefused) {
  EnableWal();
  Enqueue(
      "topic => 'orders', payload => '{\"a\": 1}', stream_key => 'k', type => 'T', "
      "correlation_id => 'c'");
  const auto messages = TakeMessages();
  ASSERT_EQ(messages.size(), 1U);
  const std::string& record = messages[0].content;
  for (std::size_t cut = 0; cut < record.size(); ++cut) {
    EXPECT_THROW(DecodeWalRecord(std::string_view{record}.substr(0, cut)), std::invalid_argument)
        << cut;
  }
  EXPECT_NO_THROW(DecodeWalRecord(record));
}

// Version 12 applies to a version 11 schema holding data.
// A schema of its own migrated up to `version` only (dropped at the end), for upgrade tests.
class SchemaAtVersion {
 public:
  explicit SchemaAtVersion(int version) : conn_(Connect()) {
    std::random_device random;
    name_ = "t_up_" + std::to_string(random() % 1000000000U);
    std::string script = postgres::MigrationScript(name_, 0);
    const auto cut = script.find("\n-- version " + std::to_string(version + 1) + ":");
    if (cut == std::string::npos) throw std::runtime_error("no migration after the version");
    script.resize(cut);
    Sql(conn_.get(), "BEGIN");
    Sql(conn_.get(), script);
    Sql(conn_.get(), "COMMIT");
  }
  ~SchemaAtVersion() {
    const PgResult dropped{
        PQexec(conn_.get(), ("DROP SCHEMA IF EXISTS " + name_ + " CASCADE").c_str())};
  }
  SchemaAtVersion(const SchemaAtVersion&) = delete;
  SchemaAtVersion& operator=(const SchemaAtVersion&) = delete;

  PGconn* conn() const { return conn_.get(); }
  const std::string& name() const { return name_; }

 private:
  PgConn conn_;
  std::string name_;
};

TEST(PgWalUpgradeTest, Version12AppliesToAVersion11SchemaWithData) {
  const SchemaAtVersion schema(11);
  const std::string& name = schema.name();
  ASSERT_EQ(Scalar(schema.conn(), "SELECT max(version) FROM " + name + ".schema_version"), "11");
  Sql(schema.conn(),
      "INSERT INTO " + name + ".topic_settings (topic, sequenced) VALUES ('t', false)");
  Scalar(schema.conn(), "SELECT " + name + ".enqueue('orders', '{}', 'k')");
  Scalar(schema.conn(), "SELECT " + name + ".enqueue('t', '{}', 'k')");

  EXPECT_EQ(postgres::Migrate(schema.conn(), name), 11);
  EXPECT_EQ(Scalar(schema.conn(), "SELECT max(version) FROM " + name + ".schema_version"),
            std::to_string(postgres::LatestSchemaVersion()));
  EXPECT_EQ(Scalar(schema.conn(),
                   "SELECT delivery || ' ' || coalesce(wal_slot, '-') FROM " + name + ".settings"),
            "table -");
  EXPECT_EQ(Scalar(schema.conn(), "SELECT coalesce(delivery, '-') || ' ' || sequenced FROM " +
                                      name + ".topic_settings"),
            "- false");
  Scalar(schema.conn(), "SELECT " + name + ".enqueue('orders', '{}', 'k')");
  EXPECT_EQ(Scalar(schema.conn(),
                   "SELECT string_agg(topic || coalesce(stream_seq::text, '-'), ',' "
                   "ORDER BY id) FROM " +
                       name + ".messages"),
            "orders1,t-,orders2");
  EXPECT_EQ(Scalar(schema.conn(), "SELECT count(*) FROM " + name + ".wal_progress"), "0");
}

// ---- the ledger (sql/013_wal_ledger_log.sql) ----

constexpr std::chrono::milliseconds kLease{30000};

WalCommit Reached(Lsn position, std::vector<std::pair<WalStream, std::int64_t>> seqs = {}) {
  return WalCommit{.position = position, .seqs = std::move(seqs), .parked = {}};
}

const WalStream kOne{"default", "one"};
const WalStream kTwo{"default", "two"};

TEST_F(PgWalTest, TheLedgerCommitsPositionsAndNumbersAndReadsBackTheLatest) {
  EnableWal();
  auto ledger = postgres::OpenWalLedger(PgUrl(), S());
  const auto epoch = ledger->Acquire("a", kLease);
  ASSERT_TRUE(epoch.has_value());
  EXPECT_EQ(ledger->Position(), 0U);
  EXPECT_EQ(ledger->Seqs({kOne, kTwo}), (std::vector<std::int64_t>{0, 0}));
  ASSERT_TRUE(ledger->Commit("a", *epoch, Reached(0x100, {{kOne, 3}, {kTwo, 1}})));
  ASSERT_TRUE(ledger->Commit("a", *epoch, Reached(0x200, {{kOne, 5}})));
  EXPECT_EQ(ledger->Position(), 0x200U);
  EXPECT_EQ(ledger->Seqs({kTwo, kOne}), (std::vector<std::int64_t>{1, 5}));
  // As another relay (after a restart) reads them, and as people see them.
  auto other = postgres::OpenWalLedger(PgUrl(), S());
  EXPECT_EQ(other->Position(), 0x200U);
  EXPECT_EQ(other->Seqs({kOne, kTwo}), (std::vector<std::int64_t>{5, 1}));
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(stream_key || ' ' || seq, ',' ORDER BY stream_key) "
                   "FROM " +
                       S() + ".wal_stream_seqs"),
            "one 5,two 1");
  EXPECT_EQ(Scalar(conn(), "SELECT " + S() + ".wal_position(wal_slot) FROM " + S() + ".settings"),
            "0/200");
}

// A commit says whether the table holds anything that could hold a stream back (the relay then
// skips StreamStates): a leased, failed or abandoned message, or one of a stream waiting in the
// table (parked, or written in table mode before a change of delivery: issue #39); a message
// without a stream holds nothing back.
TEST_F(PgWalTest, ACommitSaysWhetherTheTableHoldsAnythingThatCanHoldAStreamBack) {
  EnableWal();
  auto ledger = postgres::OpenWalLedger(PgUrl(), S());
  const auto epoch = ledger->Acquire("a", kLease);
  ASSERT_TRUE(epoch.has_value());
  Lsn position = 0x100;
  const auto clear = [&] {
    const WalCommitted written = ledger->Commit("a", *epoch, Reached(position++, {}));
    EXPECT_TRUE(written.committed);
    return written.table_clear;
  };
  EXPECT_TRUE(clear());
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, delivery) VALUES ('t', 'table')");
  Scalar(conn(), "SELECT " + S() + ".enqueue('t', '{}')");
  EXPECT_TRUE(clear()) << "a table-mode message without a stream";
  Sql(conn(), "DELETE FROM " + S() + ".messages");
  const std::string id = Scalar(conn(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'k')");
  EXPECT_FALSE(clear()) << "a table-mode message of a stream";
  const std::string row = S() + ".messages SET ";
  const std::string where = " WHERE id = '" + id + "'";
  for (const std::string& set :
       {std::string{"status = 'processing', lease_epoch = 1"}, std::string{"status = 'failed'"},
        std::string{"status = 'abandoned', abandoned_at = now()"},
        std::string{"status = 'pending', abandoned_at = NULL"}}) {
    Sql(conn(), "UPDATE " + row + set + where);
    EXPECT_FALSE(clear()) << set;
  }
  Sql(conn(), "DELETE FROM " + S() + ".messages");
  EXPECT_TRUE(clear());
  // Refused for want of the lease: not committed, whatever the table holds.
  EXPECT_FALSE(ledger->Commit("b", *epoch, Reached(position++, {})).committed);
}

// ---- issue #39: no WAL-mode enqueue without its slot; one numbering across delivery switches ----

// The slot dropped under a WAL-mode schema (an operator's clean-up, a failover to a replica
// without it): every enqueue after that fails with 55000 and writes nothing, instead of emitting a
// message no one will ever decode; made again, enqueues work again.
TEST_F(PgWalTest, AnEnqueueInWalModeFailsOnceItsSlotIsGone) {
  const std::string slot = EnableWal();
  Enqueue("'t', '{}', stream_key => 'k'");
  EXPECT_EQ(TakeRecords().size(), 1U);
  Sql(conn(), "SELECT pg_drop_replication_slot('" + slot + "')");
  const std::string error = RunExpectingError(conn(), "SELECT " + S() + ".enqueue('t', '{}')");
  EXPECT_NE(error.find("the logical replication slot \"" + slot + "\" is gone"), std::string::npos)
      << error;
  EXPECT_NE(error.find("outboxctl migrate --wal-slot"), std::string::npos) << error;
  EXPECT_EQ(SqlState(conn(), "SELECT " + S() + ".enqueue('t', '{}')"), "55000");
  // In a transaction, as a service writes: the business change rolls back with it.
  Sql(conn(), "BEGIN");
  EXPECT_EQ(SqlState(conn(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'k')"), "55000");
  Sql(conn(), "ROLLBACK");
  EXPECT_EQ(Rows(), 0);
  // Back to the table without a slot: nothing to wait for.
  Sql(conn(), "RESET outbox.switch_wait");
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  EXPECT_EQ(Enqueue("'t', '{}'").size(), 36U);
  EXPECT_EQ(Rows(), 1);
  // Made again (outboxctl migrate --wal-slot), WAL mode works again.
  postgres::EnsureWalSlot(conn(), S());
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
  const std::string id = Enqueue("'t', '{}'");
  const auto records = TakeRecords();
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].envelope.id.ToString(), id);
}

// One numbering per (target, stream) whatever the mode: table mode continues from the WAL relay's
// counter, and the WAL relay's counter (the ledger's Seqs) from the table's.
TEST_F(PgWalTest, BothModesContinueOneNumberingPerStream) {
  EnableWal();
  auto ledger = postgres::OpenWalLedger(PgUrl(), S());
  const auto epoch = ledger->Acquire("a", kLease);
  ASSERT_TRUE(epoch.has_value());
  // WAL mode: the relay numbered 'one' up to 41.
  ASSERT_TRUE(ledger->Commit("a", *epoch, Reached(0x100, {{kOne, 41}})));
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  const auto seq_of = [&](const std::string& id) {
    return Scalar(conn(), "SELECT stream_seq FROM " + S() + ".messages WHERE id = '" + id + "'");
  };
  EXPECT_EQ(seq_of(Enqueue("'t', '{}', stream_key => 'one'")), "42");
  EXPECT_EQ(seq_of(Enqueue("'t', '{}', stream_key => 'one'")), "43");
  EXPECT_EQ(seq_of(Enqueue("'t', '{}', stream_key => 'two'")), "1");
  // Back in WAL mode, the relay's counters start from the table's.
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
  EXPECT_EQ(ledger->Seqs({kOne, kTwo}), (std::vector<std::int64_t>{43, 1}));
  // Fan-out copies are numbered per target, the same way.
  ASSERT_TRUE(ledger->Commit("a", *epoch, Reached(0x200, {{kOne, 50}})));
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  const std::string ids = Scalar(conn(), "SELECT " + S() +
                                             ".enqueue('t', '{}', stream_key => 'one', targets => "
                                             "ARRAY['default', 'other'])::text");
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(target || ' ' || stream_seq, ',' ORDER BY target) "
                   "FROM " +
                       S() + ".messages WHERE id = ANY ('" + ids + "'::uuid[])"),
            "default 51,other 1");
}

// A change of delivery leaves its mark in the slot (which the relay reads as "numbers and stream
// states read before are out of date"); leaving WAL mode without a relay confirming the slot
// fails after outbox.switch_wait (or 5 s without any reader) and changes nothing.
TEST_F(PgWalTest, ASwitchOutOfWalModeWaitsForTheRelayAndChangesNothingWithoutOne) {
  EnableWal();
  TakeMessages();
  EXPECT_EQ(switch_marks_, 1) << "settings.delivery = 'wal' after the slot was made";
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings (topic, delivery) VALUES ('w', 'wal')");
  TakeMessages();
  EXPECT_EQ(switch_marks_, 1) << "a topic set to the mode it had already is no switch";
  Sql(conn(), "SET outbox.switch_wait = 1500");
  const auto started = std::chrono::steady_clock::now();
  const std::string error =
      RunExpectingError(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_NE(error.find("delivery was not changed: the WAL relay has confirmed the slot"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("outbox.switch_wait"), std::string::npos) << error;
  EXPECT_GE(took, std::chrono::milliseconds{1400});
  EXPECT_LT(took, std::chrono::seconds{10});
  EXPECT_EQ(Scalar(conn(), "SELECT delivery FROM " + S() + ".settings"), "wal");
  // A topic leaving WAL mode waits the same way.
  EXPECT_EQ(SqlState(conn(), "UPDATE " + S() + ".topic_settings SET delivery = 'table'"), "55000");
  // Without the wait, on purpose.
  Sql(conn(), "SET outbox.switch_wait = 0");
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  TakeMessages();
  EXPECT_EQ(switch_marks_, 2);
  // Topic 'w' still says wal: removing its override takes it out of WAL mode, a switch too.
  Sql(conn(), "SET outbox.switch_wait = 1500");
  EXPECT_EQ(SqlState(conn(), "DELETE FROM " + S() + ".topic_settings WHERE topic = 'w'"), "55000");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".topic_settings"), "1");
  // Bad input: a wait that is not a number is refused by PostgreSQL's own cast.
  Sql(conn(), "SET outbox.switch_wait = 'soon'");
  EXPECT_EQ(SqlState(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'"), "22P02");
}

// A switch waits for the enqueues in flight (their transactions hold its lock shared) and holds
// new ones until it commits; a REPEATABLE READ transaction whose snapshot predates a committed
// switch is told to retry (40001) rather than enqueue by the old mode.
TEST_F(PgWalTest, ASwitchWaitsForEnqueuesInFlightAndOldSnapshotsRetry) {
  EnableWal();
  Sql(conn(), "SET outbox.switch_wait = 0");
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  auto writer = Connect();
  Sql(writer.get(), "BEGIN");
  Scalar(writer.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'k')");
  std::atomic<bool> switched{false};
  std::thread to_wal([&] {
    auto admin = Connect();
    Sql(admin.get(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
    switched = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds{500});
  EXPECT_FALSE(switched) << "the switch did not wait for the enqueue in flight";
  Sql(writer.get(), "COMMIT");
  to_wal.join();
  EXPECT_TRUE(switched);
  // A snapshot older than a switch.
  Sql(writer.get(), "BEGIN ISOLATION LEVEL REPEATABLE READ");
  Scalar(writer.get(), "SELECT 1");  // the snapshot is taken here
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  EXPECT_EQ(SqlState(writer.get(), "SELECT " + S() + ".enqueue('t', '{}')"), "40001");
  Sql(writer.get(), "ROLLBACK");
  Sql(writer.get(), "BEGIN ISOLATION LEVEL REPEATABLE READ");
  EXPECT_EQ(Scalar(writer.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'k')").size(),
            36U)
      << "a snapshot taken after the switch";
  Sql(writer.get(), "COMMIT");
  EXPECT_EQ(Scalar(conn(), "SELECT string_agg(stream_seq::text, ',' ORDER BY stream_seq) FROM " +
                               S() + ".messages"),
            "1,2");
}

// ---- reading back from the WAL files once the slot is gone (pg_walinspect's descriptions) ----

TEST(WalFilesTest, AMessagesPayloadIsReadFromItsDescription) {
  using postgres::MessagePayload;
  EXPECT_EQ(
      MessagePayload("transactional, prefix \"outbox\"; payload (3 bytes): 01 0A ff", "outbox"),
      std::optional<std::string>(std::string{"\x01\x0a\xff", 3}));
  EXPECT_EQ(MessagePayload("transactional, prefix \"outbox\"; payload (0 bytes): ", "outbox"),
            std::optional<std::string>(""));
  // Another schema's prefix, one that merely starts the same, a non-transactional message.
  EXPECT_FALSE(
      MessagePayload("transactional, prefix \"outbox:s\"; payload (1 bytes): 01", "outbox"));
  EXPECT_FALSE(
      MessagePayload("transactional, prefix \"outbox\"; payload (1 bytes): 01", "outbox:s"));
  EXPECT_FALSE(
      MessagePayload("non-transactional, prefix \"outbox\"; payload (1 bytes): 01", "outbox"));
  // Bad input: what is not the server's form is refused, never half-read.
  for (const std::string_view bad : {
           "transactional, prefix \"outbox\"; payload (2 bytes): 01",     // short
           "transactional, prefix \"outbox\"; payload (1 bytes): 01 02",  // long
           "transactional, prefix \"outbox\"; payload (1 bytes): 0G",     // not hex
           "transactional, prefix \"outbox\"; payload (1 bytes):01",      // no space
           "transactional, prefix \"outbox\"; payload (x bytes): 01",     // no number
           "transactional, prefix \"outbox\"; payload (1 bytes) 01",      // no colon
           "transactional, prefix \"outbox\"; payload (1",                // cut
       }) {
    EXPECT_THROW(MessagePayload(bad, "outbox"), std::invalid_argument) << bad;
  }
}

TEST(WalFilesTest, ATransactionsRecordsCountOnlyOnceItCommitsAfterThePosition) {
  using postgres::CommitsAfter;
  using postgres::WalFileRecord;
  const auto message = [](Lsn at, std::uint64_t xid, const std::string& hex) {
    return WalFileRecord{at,        at + 1,
                         xid,       "LogicalMessage",
                         "MESSAGE", "transactional, prefix \"outbox\"; payload (1 bytes): " + hex};
  };
  const auto end = [](Lsn at, std::uint64_t xid, const char* type, const std::string& tail) {
    return WalFileRecord{at, at + 8, xid, "Transaction", type, "2026-11-27 21:20:33+00" + tail};
  };
  const std::vector<WalFileRecord> records = {
      message(10, 100, "01"),  // committed before the position: not taken
      end(11, 100, "COMMIT", ""),
      message(20, 200, "02"),  // top level
      message(21, 201, "03"),  // a savepoint rolled back
      end(22, 201, "ABORT", ""),
      message(23, 202, "04"),  // a savepoint kept
      message(24, 300, "05"),  // another transaction, committed first
      end(25, 300, "COMMIT", "; inval msgs: catcache 80"),
      end(30, 200, "COMMIT", "; subxacts: 201 202; inval msgs: catcache 7"),
      message(31, 400, "06"),  // rolled back with its subtransaction
      message(32, 401, "07"),
      end(33, 400, "ABORT", "; subxacts: 401"),
      message(34, 500, "08"),  // still open at the end
      WalFileRecord{35, 36, 600, "Heap", "INSERT", "off 3"},
  };
  const auto found = CommitsAfter(records, "outbox", /*after=*/19);
  ASSERT_EQ(found.commits.size(), 2U);
  EXPECT_EQ(found.commits[0].end_lsn, 33U);
  EXPECT_EQ(found.commits[0].contents, (std::vector<std::string>{"\x05"}));
  EXPECT_EQ(found.commits[1].end_lsn, 38U);
  EXPECT_EQ(found.commits[1].contents, (std::vector<std::string>{"\x02", "\x04"}));
  EXPECT_EQ(found.open_records, 1U);
  EXPECT_EQ(postgres::Subxacts("2026; subxacts: 7 8 9; inval"),
            (std::vector<std::uint64_t>{7, 8, 9}));
  EXPECT_THROW(postgres::Subxacts("2026; subxacts: 7 x"), std::invalid_argument);
}

// The slot dropped with messages in it nobody read: they are read back from the WAL files, in
// commit order, without what was rolled back (whole, or to a savepoint) and without what came
// before the position.
TEST_F(PgWalTest, WhatADroppedSlotHeldIsReadBackFromTheWalFiles) {
  const std::string slot = EnableWal();
  Sql(conn(), "SET outbox.switch_wait = 0");
  const std::string before = Enqueue("'t', '{}', stream_key => 'k'");
  const Lsn after = *ParseLsn(Scalar(conn(), "SELECT pg_current_wal_insert_lsn()::text"));
  auto source = postgres::OpenWalSource(PgUrl(), S());
  const std::string first = Enqueue("'t', '{\"n\": 1}', stream_key => 'k'");
  Sql(conn(), "BEGIN");
  const std::string rolled_back = Enqueue("'t', '{}'");
  Sql(conn(), "ROLLBACK");
  Sql(conn(), "BEGIN");
  const std::string kept = Enqueue("'t', '{\"n\": 2}', stream_key => 'k'");
  Sql(conn(), "SAVEPOINT s");
  const std::string undone = Enqueue("'t', '{}'");
  Sql(conn(), "ROLLBACK TO SAVEPOINT s");
  const std::string also_kept = Enqueue("'u', '{\"n\": 3}'");
  Sql(conn(), "COMMIT");
  Sql(conn(), "SELECT pg_drop_replication_slot('" + slot + "')");
  WalRecovery recovery;
  try {
    recovery = source->ReadWalFiles(after);
  } catch (const StoreError& error) {
    FAIL() << error.what();
  }
  ASSERT_EQ(recovery.transactions.size(), 2U);
  std::vector<std::string> ids;
  for (const auto& transaction : recovery.transactions) {
    EXPECT_GT(transaction.end_lsn, after);
    for (const auto& message : transaction.messages) ids.push_back(message.envelope.id.ToString());
  }
  EXPECT_EQ(ids, (std::vector<std::string>{first, kept, also_kept}));
  EXPECT_EQ(recovery.transactions[1].messages[1].envelope.payload, R"({"n": 3})");
  EXPECT_EQ(recovery.open_messages, 0U);
  EXPECT_GE(recovery.until, recovery.transactions.back().end_lsn);
  // Nothing after a position past them all.
  EXPECT_TRUE(source->ReadWalFiles(recovery.until).transactions.empty());
}

// A writer's transaction left open after an enqueue holds a switch off, and the switch (queued
// for its lock) holds every new enqueue back: bounded by outbox.switch_wait, after which the switch
// fails, changes nothing, and the writers go on. The caller's own lock_timeout is kept.
TEST_F(PgWalTest, ASwitchHeldOffByAnOpenTransactionGivesUpAfterTheWait) {
  EnableWal();
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'table'");
  auto open = Connect();
  Sql(open.get(), "BEGIN");
  Scalar(open.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'k')");
  Sql(conn(), "SET outbox.switch_wait = 1000");
  const auto started = std::chrono::steady_clock::now();
  const std::string error =
      RunExpectingError(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_NE(error.find("enqueues in transactions still open held the switch off for 1000 ms"),
            std::string::npos)
      << error;
  EXPECT_GE(took, std::chrono::milliseconds{900});
  EXPECT_LT(took, std::chrono::seconds{10});
  EXPECT_EQ(Scalar(conn(), "SELECT delivery FROM " + S() + ".settings"), "table");
  auto other = Connect();
  EXPECT_EQ(Scalar(other.get(), "SELECT " + S() + ".enqueue('t', '{}')").size(), 36U);
  Sql(open.get(), "COMMIT");
  // Once nothing holds it off, it goes through, and the caller's lock_timeout is its own again.
  Sql(conn(), "BEGIN");
  Sql(conn(), "SET LOCAL lock_timeout = '7s'");
  Sql(conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
  EXPECT_EQ(Scalar(conn(), "SHOW lock_timeout"), "7s");
  Sql(conn(), "COMMIT");
  EXPECT_EQ(Scalar(conn(), "SELECT delivery FROM " + S() + ".settings"), "wal");
}

TEST_F(PgWalTest, ACommitWithoutTheLeaseWritesNothing) {
  EnableWal();
  auto a = postgres::OpenWalLedger(PgUrl(), S());
  auto b = postgres::OpenWalLedger(PgUrl(), S());
  const auto epoch = a->Acquire("a", kLease);
  ASSERT_TRUE(epoch.has_value());
  ASSERT_TRUE(a->Commit("a", *epoch, Reached(0x100, {{kOne, 1}})));
  EXPECT_FALSE(b->Acquire("b", kLease).has_value()) << "a's lease is live";
  EXPECT_FALSE(b->Commit("b", *epoch, Reached(0x200, {{kOne, 2}})));
  EXPECT_FALSE(a->Commit("a", *epoch + 1, Reached(0x200, {{kOne, 2}})));
  // a's lease runs out: a may no longer commit, b takes it over under a new epoch.
  Sql(conn(), "UPDATE " + S() + ".wal_progress SET lease_until = now() - interval '1 second'");
  EXPECT_FALSE(a->Commit("a", *epoch, Reached(0x200, {{kOne, 2}})));
  const auto taken = b->Acquire("b", kLease);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(*taken, *epoch + 1);
  EXPECT_FALSE(a->Commit("a", *epoch, Reached(0x200, {{kOne, 2}})));
  EXPECT_EQ(b->Position(), 0x100U);
  EXPECT_EQ(b->Seqs({kOne}), std::vector<std::int64_t>{1});
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".wal_seqs"), "1");
}

// The fence holds while a takeover is in flight: a commit that meets the new owner's uncommitted
// update of the lease waits for it, then sees the lease gone and writes nothing.
TEST_F(PgWalTest, ACommitRacingATakeoverWaitsForItAndIsRefused) {
  EnableWal();
  auto a = postgres::OpenWalLedger(PgUrl(), S());
  const auto epoch = a->Acquire("a", kLease);
  ASSERT_TRUE(epoch.has_value());
  const auto taker = Connect();
  Sql(taker.get(), "BEGIN");
  Sql(taker.get(), "UPDATE " + S() + ".wal_progress SET owner = 'b', epoch = epoch + 1");
  std::atomic<int> committed{-1};
  std::thread commit([&] {
    committed = a->Commit("a", *epoch, Reached(0x300, {{kOne, 7}})) ? 1 : 0;
  });
  const bool waiting = WaitUntil(
      [&] {
        return Scalar(conn(),
                      "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s USING (pid) "
                      "WHERE NOT l.granted AND s.datname = current_database() AND s.query LIKE "
                      "'%wal_positions%'") != "0";
      },
      std::chrono::milliseconds{10000});
  EXPECT_TRUE(waiting) << "the commit did not wait for the takeover";
  EXPECT_EQ(committed.load(), -1);
  Sql(taker.get(), "COMMIT");
  commit.join();
  EXPECT_EQ(committed.load(), 0);
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".wal_positions"), "0");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".wal_seqs"), "0");
}

// What later commits superseded goes; the latest of each stays, so reads do not change. A relay
// that stopped before its purge leaves numbers behind: the next ledger's first purge takes them.
TEST_F(PgWalTest, PurgeKeepsTheLatestOfEachAndSweepsWhatAStoppedRelayLeft) {
  EnableWal();
  const auto count = [&](const std::string& table) {
    return std::stoll(Scalar(conn(), "SELECT count(*) FROM " + S() + "." + table));
  };
  {
    auto ledger = postgres::OpenWalLedger(PgUrl(), S());
    const auto epoch = ledger->Acquire("a", kLease);
    ASSERT_TRUE(epoch.has_value());
    EXPECT_EQ(ledger->Seqs({kOne, kTwo}), (std::vector<std::int64_t>{0, 0}));
    for (int i = 1; i <= 40; ++i) {
      const WalStream& stream = i % 2 == 0 ? kTwo : kOne;
      ASSERT_TRUE(ledger->Commit("a", *epoch,
                                 Reached(0x1000 + static_cast<Lsn>(i), {{stream, (i + 1) / 2}})));
    }
    EXPECT_EQ(count("wal_positions"), 40);
    EXPECT_EQ(count("wal_seqs"), 40);
    EXPECT_EQ(ledger->Purge(), 39 + 38);
    EXPECT_EQ(count("wal_positions"), 1);
    EXPECT_EQ(count("wal_seqs"), 2);
    EXPECT_EQ(ledger->Purge(), 0);
    EXPECT_EQ(ledger->Position(), 0x1000U + 40);
    EXPECT_EQ(ledger->Seqs({kOne, kTwo}), (std::vector<std::int64_t>{20, 20}));
    // Three more, and the relay stops before purging them.
    for (int i = 41; i <= 43; ++i) {
      ASSERT_TRUE(ledger->Commit("a", *epoch, Reached(0x1000 + static_cast<Lsn>(i), {{kOne, i}})));
    }
  }
  auto next = postgres::OpenWalLedger(PgUrl(), S());
  const auto epoch = next->Acquire("a", kLease);
  ASSERT_TRUE(epoch.has_value());
  EXPECT_EQ(next->Seqs({kOne}), std::vector<std::int64_t>{43});
  ASSERT_TRUE(next->Commit("a", *epoch, Reached(0x2000, {{kOne, 44}})));
  EXPECT_EQ(next->Purge(), 4 + 4);  // positions 40 to 43; numbers 20, 41, 42, 43 of 'one'
  EXPECT_EQ(count("wal_positions"), 1);
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(stream_key || ' ' || seq, ',' ORDER BY stream_key) "
                   "FROM " +
                       S() + ".wal_seqs"),
            "one 44,two 20");
}

// Version 13 keeps what a version 12 relay recorded: its position and its counters.
TEST(PgWalUpgradeTest, Version13KeepsTheRecordedPositionAndCounters) {
  const SchemaAtVersion schema(12);
  const std::string& name = schema.name();
  ASSERT_EQ(Scalar(schema.conn(), "SELECT max(version) FROM " + name + ".schema_version"), "12");
  Sql(schema.conn(), "INSERT INTO " + name +
                         ".wal_progress (slot, position, owner, epoch) VALUES "
                         "('s1', '0/1234', 'relay', 3), ('s2', '0/0', NULL, 0)");
  Sql(schema.conn(), "INSERT INTO " + name +
                         ".wal_stream_seqs (target, stream_key, seq) VALUES "
                         "('default', 'a', 7), ('default', 'b', 1), ('kafka', 'a', 2)");

  EXPECT_EQ(postgres::Migrate(schema.conn(), name), 12);
  EXPECT_EQ(Scalar(schema.conn(), "SELECT max(version) FROM " + name + ".schema_version"),
            std::to_string(postgres::LatestSchemaVersion()));
  EXPECT_EQ(
      Scalar(schema.conn(), "SELECT " + name + ".wal_position('s1') || ' ' || " + name +
                                ".wal_position('s2') || ' ' || " + name + ".wal_position('none')"),
      "0/1234 0/0 0/0");
  EXPECT_EQ(
      Scalar(schema.conn(), "SELECT string_agg(slot || ' ' || owner || ' ' || epoch, ',') FROM " +
                                name + ".wal_progress WHERE owner IS NOT NULL"),
      "s1 relay 3");
  EXPECT_EQ(Scalar(schema.conn(),
                   "SELECT string_agg(target || ' ' || stream_key || ' ' || seq, ',' "
                   "ORDER BY target, stream_key) FROM " +
                       name + ".wal_stream_seqs"),
            "default a 7,default b 1,kafka a 2");
}

}  // namespace
}  // namespace outbox::testing
