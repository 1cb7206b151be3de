// The SQL face of the store: migrations, outbox.enqueue from plain SQL (as any language would
// call it), its errors, stream_seq, partitions and the idle-relay wakeup.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "outbox/core/partition.h"
#include "outbox/store/postgres.h"
#include "support/header_limits.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

class PgSqlTest : public ::testing::Test {
 protected:
  TestSchema schema_;
  PGconn* conn() { return schema_.conn(); }
  std::string S() { return schema_.name(); }
  std::string Enqueue(const std::string& args) {
    return Scalar(conn(), "SELECT " + S() + ".enqueue(" + args + ")");
  }
  std::string Error(const std::string& args) {
    return RunExpectingError(conn(), "SELECT " + S() + ".enqueue(" + args + ")");
  }
};

TEST_F(PgSqlTest, MigrationIsIdempotentAndVersioned) {
  EXPECT_EQ(postgres::Migrate(conn(), S()), postgres::LatestSchemaVersion());
  EXPECT_EQ(postgres::Migrate(PgUrl(), S()), postgres::LatestSchemaVersion());
  EXPECT_EQ(Scalar(conn(), "SELECT max(version) FROM " + S() + ".schema_version"),
            std::to_string(postgres::LatestSchemaVersion()));
}

// The claim cursor's horizon relies on it (sql/005_id_after_xid.sql): a message id is read from
// the clock only after its transaction has a transaction id.
TEST_F(PgSqlTest, AnIdIsTakenOnlyOnceTheTransactionHasAnId) {
  Sql(conn(), "BEGIN");
  EXPECT_EQ(Scalar(conn(), "SELECT pg_current_xact_id_if_assigned() IS NULL"), "t");
  Scalar(conn(), "SELECT " + S() + ".uuid_v7()");
  EXPECT_EQ(Scalar(conn(), "SELECT pg_current_xact_id_if_assigned() IS NULL"), "f");
  Sql(conn(), "ROLLBACK");
  // Ids still follow the clock: one taken later sorts later.
  EXPECT_EQ(Scalar(conn(), "SELECT " + S() + ".uuid_v7() < " + S() + ".uuid_v7()"), "t");
}

TEST_F(PgSqlTest, ConcurrentMigrationsOfANewSchemaSerialize) {
  const std::string name = S() + "_c";
  std::vector<std::thread> threads;
  std::vector<int> before(4, -1);
  for (std::size_t i = 0; i < before.size(); ++i) {
    threads.emplace_back([&, i] { before[i] = postgres::Migrate(PgUrl(), name); });
  }
  for (auto& thread : threads) thread.join();
  std::sort(before.begin(), before.end());
  const int latest = postgres::LatestSchemaVersion();
  EXPECT_EQ(before, (std::vector<int>{0, latest, latest, latest}));  // one migrator did the work
  Sql(conn(), "DROP SCHEMA " + name + " CASCADE");
}

TEST_F(PgSqlTest, RejectsBadSchemaNames) {
  EXPECT_THROW(postgres::Migrate(conn(), "Outbox"), std::invalid_argument);
  EXPECT_THROW(postgres::Migrate(conn(), "x; DROP TABLE y"), std::invalid_argument);
  EXPECT_THROW(postgres::Migrate(conn(), ""), std::invalid_argument);
}

TEST_F(PgSqlTest, EnqueueWithNamedArgumentsFillsEveryColumn) {
  const std::string id = Enqueue(
      "topic => 'orders', payload => '{\"id\": 42}', stream_key => 'order-42', type => "
      "'OrderPlaced', headers => '{\"traceparent\": \"00-abc-def-01\"}', correlation_id => 'c-1', "
      "causation_id => 'k-1', target => 'kafka'");
  auto row = Sql(conn(),
                 "SELECT topic, stream_key, stream_seq, partition, target, type, "
                 "convert_from(payload, 'UTF8'), content_type, headers::text, status, "
                 "attempts FROM " +
                     S() + ".messages WHERE id = '" + id + "'");
  ASSERT_EQ(PQntuples(row.get()), 1);
  const auto col = [&](int c) { return std::string{PQgetvalue(row.get(), 0, c)}; };
  EXPECT_EQ(col(0), "orders");
  EXPECT_EQ(col(1), "order-42");
  EXPECT_EQ(col(2), "1");
  EXPECT_EQ(col(3), std::to_string(PartitionOf("order-42", 64)));
  EXPECT_EQ(col(4), "kafka");
  EXPECT_EQ(col(5), "OrderPlaced");
  EXPECT_EQ(col(6), "{\"id\": 42}");  // the JSON text as written, not re-rendered
  EXPECT_EQ(col(7), "application/json");
  EXPECT_EQ(col(8),
            R"({"traceparent": "00-abc-def-01", "causation_id": "k-1", "correlation_id": "c-1"})");
  EXPECT_EQ(col(9), "pending");
  EXPECT_EQ(col(10), "0");
  EXPECT_EQ(Uuid::Parse(id)->version(), 7);
}

TEST_F(PgSqlTest, MinimalAndBinaryEnqueue) {
  EXPECT_EQ(Uuid::Parse(Enqueue("'t', '[]'"))->version(), 7);
  const std::string id =
      Enqueue("topic => 'blobs', payload => '\\x00ff'::bytea, content_type => 'application/x-raw'");
  EXPECT_EQ(Scalar(conn(), "SELECT encode(payload, 'hex') || ' ' || content_type FROM " + S() +
                               ".messages WHERE id = '" + id + "'"),
            "00ff application/x-raw");
  // jsonb values are accepted too (cast to json).
  EXPECT_FALSE(Enqueue("'t', jsonb_build_object('a', 1)::json").empty());
}

TEST_F(PgSqlTest, PartitionHashMatchesTheCoreVectors) {
  EXPECT_EQ(Scalar(conn(), "SELECT " + S() + ".fnv1a32(''::bytea)"), std::to_string(0x811c9dc5U));
  EXPECT_EQ(Scalar(conn(), "SELECT " + S() + ".fnv1a32('foobar'::bytea)"),
            std::to_string(0xbf9cf968U));
  EXPECT_EQ(Scalar(conn(), "SELECT " + S() + ".partition_of('order-42', 16)"), "4");
  EXPECT_EQ(Scalar(conn(), "SELECT " + S() + ".partition_of('customer/7', 64)"), "47");
  EXPECT_EQ(Scalar(conn(), "SELECT " + S() + ".partition_of('Grüße', 8)"),
            std::to_string(PartitionOf("Gr\xc3\xbc\xc3\x9f"
                                       "e",
                                       8)));
  // Unkeyed messages are placed by the text of their id, as PartitionFor does.
  const std::string id = Enqueue("'t', '{}'");
  EXPECT_EQ(Scalar(conn(), "SELECT partition FROM " + S() + ".messages WHERE id = '" + id + "'"),
            std::to_string(PartitionFor(std::nullopt, *Uuid::Parse(id), 64)));
}

TEST_F(PgSqlTest, BadInputGetsClearErrors) {
  EXPECT_EQ(Error("topic => '', payload => '{}'"), "outbox.enqueue: topic must not be empty");
  EXPECT_EQ(Error("topic => NULL, payload => '{}'"), "outbox.enqueue: topic must not be empty");
  EXPECT_EQ(Error("topic => E'a\\nb', payload => '{}'"),
            "outbox.enqueue: topic contains a control character");
  EXPECT_EQ(Error("topic => repeat('t', 256), payload => '{}'"),
            "outbox.enqueue: topic is 256 bytes, over the limit of 255");
  EXPECT_EQ(Error("topic => 't', payload => NULL::json"),
            "outbox.enqueue: payload must not be null");
  EXPECT_EQ(Error("topic => 't', payload => '{not json'"), "invalid input syntax for type json");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '[1]'"),
            "outbox.enqueue: headers must be a JSON object, got array");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '\"x\"'"),
            "outbox.enqueue: headers must be a JSON object, got string");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{\"a\\u0001\": \"v\"}'"),
            "outbox.enqueue: header name contains a control character");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{\"a\": \"line\\nbreak\"}'"),
            "outbox.enqueue: header \"a\" value contains a control character");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{\"\": \"v\"}'"),
            "outbox.enqueue: header name must not be empty");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{\"a\": 1}'"),
            "outbox.enqueue: header \"a\" must be a string, got number");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{\"Message_Id\": \"x\"}'"),
            "outbox.enqueue: header \"Message_Id\" is reserved (message_id, event_id and names "
            "starting with \"outbox-\" are set by the outbox)");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{\"event_id\": \"x\"}'"),
            "outbox.enqueue: header \"event_id\" is reserved (message_id, event_id and names "
            "starting with \"outbox-\" are set by the outbox)");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{\"outbox-stream-seq\": \"9\"}'"),
            "outbox.enqueue: header \"outbox-stream-seq\" is reserved (message_id, event_id and "
            "names starting with \"outbox-\" are set by the outbox)");
  EXPECT_EQ(Error("topic => 't', payload => '{}', stream_key => ''"),
            "outbox.enqueue: stream_key must not be empty");
  EXPECT_EQ(Error("topic => 't', payload => '{}', target => ''"),
            "outbox.enqueue: target must not be empty");
  EXPECT_EQ(Error("topic => 't', payload => '\\x00'::bytea, content_type => ''"),
            "outbox.enqueue: content_type must not be empty");
  Sql(conn(), "UPDATE " + S() + ".settings SET max_payload_bytes = 10");
  EXPECT_EQ(
      Error("topic => 't', payload => '\"0123456789\"'"),
      "outbox.enqueue: payload is 12 bytes, over the limit of 10 (settings.max_payload_bytes)");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"), "0");
}

TEST_F(PgSqlTest, BatchFormReturnsIdsInOrderAndRejectsBadElements) {
  auto rows = Sql(conn(), "SELECT ordinal, id FROM " + S() +
                              ".enqueue_batch('[{\"topic\": \"a\", \"payload\": {\"n\": 1}}, "
                              "{\"topic\": \"b\", \"payload\": [2], \"stream_key\": \"k\"}]')");
  ASSERT_EQ(PQntuples(rows.get()), 2);
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(topic || ':' || convert_from(payload, 'UTF8'), ' ' "
                   "ORDER BY id) FROM " +
                       S() + ".messages"),
            "a:{\"n\": 1} b:[2]");
  const auto batch_error = [&](const std::string& json) {
    return RunExpectingError(conn(), "SELECT * FROM " + S() + ".enqueue_batch('" + json + "')");
  };
  EXPECT_EQ(batch_error("{}"), "outbox.enqueue_batch: messages must be a JSON array");
  EXPECT_EQ(batch_error("[1]"), "outbox.enqueue_batch: element 1 must be a JSON object");
  EXPECT_EQ(batch_error("[{\"topic\": \"a\", \"payload\": 1}, {\"topic\": \"a\", \"pay\": 1}]"),
            "outbox.enqueue_batch: element 2: unknown key \"pay\"");
  EXPECT_EQ(batch_error("[{\"topic\": \"a\"}]"),
            "outbox.enqueue_batch: element 1: payload is missing");
  EXPECT_EQ(batch_error("[{\"topic\": \"\", \"payload\": 1}]"),
            "outbox.enqueue: topic must not be empty");
}

// Which overload a payload picks, and the content type it gets (sql/007_enqueue_input.sql).
TEST_F(PgSqlTest, PayloadsOfEveryTypeAndTheirContentTypes) {
  const auto stored = [&](const std::string& args) {
    const std::string id = Enqueue(args);
    return Scalar(conn(),
                  "SELECT content_type || ' ' || CASE WHEN content_type = "
                  "'application/json' THEN convert_from(payload, 'UTF8') ELSE "
                  "encode(payload, 'hex') END FROM " +
                      S() + ".messages WHERE id = '" + id + "'");
  };
  // Untyped: JSON, stored as written (it resolves to the text overload).
  EXPECT_EQ(stored("topic => 't', payload => '{\"a\":  1}'"), "application/json {\"a\":  1}");
  EXPECT_EQ(stored("'t', '[1, 2]'"), "application/json [1, 2]");
  EXPECT_EQ(stored("'t', '{}', 'key'"), "application/json {}");  // the third is the stream key
  EXPECT_EQ(Scalar(conn(), "SELECT stream_key FROM " + S() + ".messages ORDER BY id DESC LIMIT 1"),
            "key");
  EXPECT_EQ(stored("topic => 't', payload => '{\"a\":  1}'::json"), "application/json {\"a\":  1}");
  EXPECT_EQ(stored("topic => 't', payload => '{\"b\": 2, \"a\":  1}'::jsonb"),
            "application/json {\"a\": 1, \"b\": 2}");  // jsonb's text form
  EXPECT_EQ(stored("topic => 't', payload => '{\"a\":  1}'::text"), "application/json {\"a\":  1}");
  EXPECT_EQ(stored("topic => 't', payload => '\"x\"'::varchar"), "application/json \"x\"");
  EXPECT_EQ(stored("topic => 't', payload => '\\x00ff'::bytea"), "application/octet-stream 00ff");
  EXPECT_EQ(stored("topic => 't', payload => '\\x00ff'::bytea, content_type => 'image/png'"),
            "image/png 00ff");
  // Untyped with a content type: bytea, as before.
  EXPECT_EQ(stored("topic => 't', payload => '\\x00ff', content_type => 'image/png'"),
            "image/png 00ff");
  EXPECT_EQ(stored("topic => 't', payload => convert_to('hi', 'UTF8'), content_type => "
                   "'text/plain; charset=utf-8'"),
            "text/plain; charset=utf-8 6869");
  // Text is JSON text; other text goes as bytea (above).
  EXPECT_EQ(Error("topic => 't', payload => 'hello'::text"), "invalid input syntax for type json");
  EXPECT_EQ(Error("topic => 't', payload => 'hello'::text, content_type => 'text/plain'"),
            "function " + S() +
                ".enqueue(topic => unknown, payload => text, content_type => unknown) does not "
                "exist");
  for (const char* type : {"json", "jsonb", "text", "bytea"}) {
    EXPECT_EQ(Error("topic => 't', payload => NULL::" + std::string{type}),
              "outbox.enqueue: payload must not be null")
        << type;
  }
}

// The case jsonb was added for: a trigger that enqueues the row it sees.
TEST_F(PgSqlTest, ATriggerEnqueuesToJsonbOfTheRow) {
  Sql(conn(), "CREATE TABLE " + S() + ".orders (id int, total numeric)");
  Sql(conn(), "CREATE FUNCTION " + S() +
                  ".order_placed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM " + S() +
                  ".enqueue(topic => 'orders', payload => to_jsonb(NEW), stream_key => 'order-' "
                  "|| NEW.id, type => 'OrderPlaced'); RETURN NEW; END $$");
  Sql(conn(), "CREATE TRIGGER order_placed AFTER INSERT ON " + S() +
                  ".orders FOR EACH ROW EXECUTE FUNCTION " + S() + ".order_placed()");
  Sql(conn(), "INSERT INTO " + S() + ".orders VALUES (42, 99.50)");
  EXPECT_EQ(Scalar(conn(),
                   "SELECT stream_key || ' ' || content_type || ' ' || "
                   "convert_from(payload, 'UTF8') FROM " +
                       S() + ".messages"),
            "order-42 application/json {\"id\": 42, \"total\": 99.50}");
}

// The header limits are settings with the same defaults as the C++ MessageLimits.
TEST_F(PgSqlTest, HeaderLimitsAreSettingsWithTheCoreDefaults) {
  const MessageLimits limits;
  EXPECT_EQ(Scalar(conn(),
                   "SELECT concat_ws(' ', max_header_count, max_header_name_bytes, "
                   "max_header_value_bytes, max_headers_bytes) FROM " +
                       S() + ".settings"),
            std::to_string(limits.max_header_count) + " " +
                std::to_string(limits.max_header_name_bytes) + " " +
                std::to_string(limits.max_header_value_bytes) + " " +
                std::to_string(limits.max_headers_bytes));
  for (const char* bad : {"max_header_count = -1", "max_header_name_bytes = 0",
                          "max_header_value_bytes = -1", "max_headers_bytes = -1"}) {
    EXPECT_NE(RunExpectingError(conn(), "UPDATE " + S() + ".settings SET " + bad)
                  .find("violates check constraint"),
              std::string::npos)
        << bad;
  }
}

// Headers at the default limits are taken by every form of enqueue; one header or byte more is
// refused, naming the setting. (tests/rabbitmq shows the RabbitMQ sink carries the maximum.)
TEST_F(PgSqlTest, HeadersAtTheLimitsAreTakenAndOneMoreIsRefusedNamingTheSetting) {
  // The names and values of HeadersAtTheLimits need no JSON escaping.
  const auto json = [](const Headers& headers) {
    std::string text;
    for (const auto& [name, value] : headers) {
      text += (text.empty() ? "{\"" : ", \"") + name + "\": \"" + value + "\"";
    }
    return text + "}";
  };
  const Headers at_limits = HeadersAtTheLimits();
  const std::string longest(128, 'n');
  const std::string id = Enqueue("'t', '{}', headers => '" + json(at_limits) + "'");
  EXPECT_EQ(Scalar(conn(), "SELECT headers = '" + json(at_limits) + "'::jsonb FROM " + S() +
                               ".messages WHERE id = '" + id + "'"),
            "t");

  Headers more = at_limits;
  more["x-one-more"] = "";
  EXPECT_EQ(Error("'t', '{}', headers => '" + json(more) + "'"),
            "outbox.enqueue: 65 headers, over the limit of 64 (settings.max_header_count)");
  more = at_limits;
  more.at("x-010") += 'h';
  const std::string over_total =
      "outbox.enqueue: headers take 8193 bytes (names and values), over the limit of 8192 "
      "(settings.max_headers_bytes)";
  EXPECT_EQ(Error("'t', '{}', headers => '" + json(more) + "'"), over_total);
  more = at_limits;
  more.erase(longest);
  more[longest + 'n'] = std::string(4095, 'v');
  EXPECT_EQ(Error("'t', '{}', headers => '" + json(more) + "'"),
            "outbox.enqueue: header name is 129 bytes, over the limit of 128 "
            "(settings.max_header_name_bytes)");
  more = at_limits;
  more.at(longest) += 'v';
  more.at("x-010").pop_back();
  EXPECT_EQ(Error("'t', '{}', headers => '" + json(more) + "'"),
            "outbox.enqueue: header \"" + longest +
                "\" value is 4097 bytes, over the limit of 4096 "
                "(settings.max_header_value_bytes)");

  // correlation_id and causation_id count with the headers.
  Headers without = at_limits;
  const std::string correlation_id = without.at("correlation_id");
  without.erase("correlation_id");
  const std::string headers_arg = "headers => '" + json(without) + "'";
  EXPECT_FALSE(Enqueue("'t', '{}', " + headers_arg + ", correlation_id => '" + correlation_id + "'")
                   .empty());
  EXPECT_EQ(Error("'t', '{}', " + headers_arg + ", correlation_id => '" + correlation_id + "h'"),
            over_total);
  EXPECT_EQ(Error("'t', '{}', " + headers_arg + ", correlation_id => 'c', causation_id => 'c'"),
            "outbox.enqueue: 65 headers, over the limit of 64 (settings.max_header_count)");

  // Every overload and the batch form go through the same check.
  more = at_limits;
  more.at("x-010") += 'h';
  const std::string over = "headers => '" + json(more) + "'";
  EXPECT_EQ(Error("'t', '{}'::jsonb, " + over), over_total);
  EXPECT_EQ(Error("'t', '{}'::json, " + over), over_total);
  EXPECT_EQ(Error("'t', '{}'::text, " + over), over_total);
  EXPECT_EQ(Error("'t', '\\x00'::bytea, " + over), over_total);
  EXPECT_EQ(RunExpectingError(conn(), "SELECT * FROM " + S() +
                                          ".enqueue_batch(jsonb_build_array(jsonb_build_object("
                                          "'topic', 't', 'payload', 1, 'headers', '" +
                                          json(more) + "'::jsonb)))"),
            over_total);
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"), "2");

  // An operator whose sinks all carry more may raise the limits.
  Sql(conn(), "UPDATE " + S() + ".settings SET max_headers_bytes = 8193");
  EXPECT_FALSE(Enqueue("'t', '{}', " + over).empty());
}

TEST_F(PgSqlTest, StreamSeqCanBeSwitchedOffPerCallAndPerTopic) {
  Enqueue("'t', '{}', stream_key => 'k'");
  Enqueue("'t', '{}', stream_key => 'k', sequenced => false");
  Sql(conn(), "INSERT INTO " + S() + ".topic_settings VALUES ('fast', false)");
  Enqueue("'fast', '{}', stream_key => 'k'");
  Enqueue("'t', '{}', stream_key => 'k'");
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(coalesce(stream_seq::text, '-'), ',' ORDER BY id) "
                   "FROM " +
                       S() + ".messages"),
            "1,-,-,2");
}

TEST_F(PgSqlTest, WritersOfOneStreamSerializeUntilCommit) {
  auto other = Connect();
  Sql(conn(), "BEGIN");
  Enqueue("'t', '{}', stream_key => 's'");
  std::atomic<bool> second_done{false};
  std::string second_seq;
  std::thread second([&] {
    Sql(other.get(), "BEGIN");
    const std::string id =
        Scalar(other.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 's')");
    second_seq =
        Scalar(other.get(), "SELECT stream_seq FROM " + S() + ".messages WHERE id = '" + id + "'");
    second_done = true;
    Sql(other.get(), "COMMIT");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds{300});
  EXPECT_FALSE(second_done.load()) << "the second writer did not wait for the first to commit";
  Sql(conn(), "COMMIT");
  second.join();
  EXPECT_EQ(second_seq, "2");
  // A writer of another stream never waits.
  Sql(conn(), "BEGIN");
  Enqueue("'t', '{}', stream_key => 's'");
  Sql(other.get(), "BEGIN");
  Scalar(other.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'other')");
  Sql(other.get(), "COMMIT");
  Sql(conn(), "ROLLBACK");
}

TEST_F(PgSqlTest, IdsOfAStreamSortInSeqOrderEvenIfTheClockGoesBack) {
  EXPECT_EQ(
      Scalar(conn(), "SELECT " + S() + ".uuid_successor('01890a5d-ac96-774b-bcce-b302099a80ff')"),
      "01890a5d-ac96-774b-bcce-b302099a8100");
  Enqueue("'t', '{}', stream_key => 'k'");
  // Pretend the previous message of the stream got an id from a clock an hour ahead.
  Sql(conn(), "UPDATE " + S() +
                  ".stream_seqs SET last_id = 'ffff0000-0000-7000-8000-000000000000' "
                  "WHERE target = 'default' AND stream_key = 'k'");
  const std::string id = Enqueue("'t', '{}', stream_key => 'k'");
  EXPECT_EQ(id, "ffff0000-0000-7000-8000-000000000001");
  EXPECT_EQ(Scalar(conn(), "SELECT string_agg(stream_seq::text, ',' ORDER BY id) FROM " + S() +
                               ".messages"),
            "1,2");
  // Unsequenced messages take the clock as it is.
  EXPECT_LT(Enqueue("'t', '{}', stream_key => 'k', sequenced => false"), std::string{"ffff"});
}

TEST_F(PgSqlTest, StreamSeqIsGapFreeAndInIdOrderUnderEightWriters) {
  constexpr int kWriters = 8;
  constexpr int kPerWriter = 100;
  std::vector<std::thread> writers;
  std::atomic<int> committed{0};
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      auto conn = Connect();
      for (int i = 0; i < kPerWriter; ++i) {
        Sql(conn.get(), "BEGIN");
        Sql(conn.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'hot')");
        if ((i + w) % 5 == 0) {
          Sql(conn.get(), "ROLLBACK");  // 20 % roll back: their numbers are reused, no gaps
        } else {
          Sql(conn.get(), "COMMIT");
          ++committed;
        }
      }
    });
  }
  for (auto& writer : writers) writer.join();
  // Gap-free: exactly 1..committed; ordered: sorting by id gives the same order as by seq.
  EXPECT_EQ(Scalar(conn(),
                   "SELECT count(*) || ' ' || min(stream_seq) || ' ' || max(stream_seq) || "
                   "' ' || count(DISTINCT stream_seq) FROM " +
                       S() + ".messages"),
            std::to_string(committed) + " 1 " + std::to_string(committed) + " " +
                std::to_string(committed));
  EXPECT_EQ(Scalar(conn(),
                   "SELECT count(*) FROM (SELECT stream_seq, row_number() OVER (ORDER BY "
                   "id) AS n FROM " +
                       S() + ".messages) x WHERE stream_seq <> n"),
            "0");
}

TEST_F(PgSqlTest, EnqueueNotifiesOnlyWhileARelaySleeps) {
  auto relay = Connect();
  const std::string channel = postgres::WakeupChannel(S());
  Sql(relay.get(), "LISTEN \"" + channel + "\"");
  // The payloads of the notifications received so far (each one an idle generation).
  const auto notifications = [&] {
    PQconsumeInput(relay.get());
    std::vector<std::string> payloads;
    while (PGnotify* notify = PQnotifies(relay.get())) {
      payloads.emplace_back(notify->extra);
      PQfreemem(notify);
    }
    return payloads;
  };
  const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds{50}); };
  // Busy relay: no notifications at all.
  Enqueue("'t', '{}'");
  Enqueue("'t', '{}'");
  settle();
  EXPECT_TRUE(notifications().empty());
  // A relay goes to sleep: its idle generation, and no writer in flight.
  EXPECT_EQ(Scalar(relay.get(), "SELECT writers FROM " + S() + ".relay_idle()"), "{}");
  const std::string latest =
      Scalar(relay.get(), "SELECT last_value FROM " + S() + ".wakeup_idle_gen");
  Sql(conn(), "BEGIN");
  Enqueue("'t', '{}'");
  Enqueue("'t', '{}'");
  settle();
  EXPECT_TRUE(notifications().empty()) << "NOTIFY must wait for the commit";
  Sql(conn(), "COMMIT");
  settle();
  EXPECT_EQ(notifications(), std::vector<std::string>{latest}) << "one per transaction";
  // Until a relay says it is woken, each committing writer notifies; then none does.
  Enqueue("'t', '{}'");
  settle();
  EXPECT_EQ(notifications().size(), 1U);
  Sql(relay.get(), "SELECT " + S() + ".relay_woken(" + latest + ")");
  Enqueue("'t', '{}'");
  settle();
  EXPECT_TRUE(notifications().empty());
  // A rolled-back enqueue wakes nobody.
  Scalar(relay.get(), "SELECT gen FROM " + S() + ".relay_idle()");
  Sql(conn(), "BEGIN");
  Enqueue("'t', '{}'");
  Sql(conn(), "ROLLBACK");
  settle();
  EXPECT_TRUE(notifications().empty());
  // A relay that takes its mark back (it found work) silences writers, and notifies only when an
  // older generation may still be asleep.
  const std::string mine = Scalar(relay.get(), "SELECT gen FROM " + S() + ".relay_idle()");
  Sql(conn(), "SELECT " + S() + ".relay_withdraw(" + mine + ")");
  settle();
  EXPECT_EQ(notifications(), std::vector<std::string>{mine}) << "the rolled-back spell's sleeper";
  Enqueue("'t', '{}'");
  settle();
  EXPECT_TRUE(notifications().empty());
  const std::string next = Scalar(relay.get(), "SELECT gen FROM " + S() + ".relay_idle()");
  Sql(conn(), "SELECT " + S() + ".relay_withdraw(" + next + ")");
  settle();
  EXPECT_TRUE(notifications().empty()) << "no older generation was left asleep";
}

// The promise of docs/writing-messages.md: writers of different streams never wait for each
// other, whatever the relay is doing. Before schema v6 the first enqueue after the relay went idle
// held a row lock that every other writer queued behind until its transaction ended.
TEST_F(PgSqlTest, AnOpenTransactionDelaysNoWriterOfAnotherStream) {
  auto relay = Connect();
  Scalar(relay.get(), "SELECT gen FROM " + S() + ".relay_idle()");  // the relay sleeps
  auto slow = Connect();
  Sql(slow.get(), "BEGIN");
  Sql(slow.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'H')");
  auto other = Connect();
  Sql(other.get(), "SET statement_timeout = '2s'");
  for (int i = 0; i < 20; ++i) {
    Sql(other.get(), "BEGIN");
    Sql(other.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'OTHER')");
    Sql(other.get(), "SELECT " + S() + ".enqueue('t', '{}')");
    Sql(other.get(), "COMMIT");  // Sql fails the test on a statement timeout
  }
  Sql(slow.get(), "COMMIT");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"), "41");
}

// Two writers that take their streams in sorted order cannot deadlock: T2 no longer waits for T1
// on a shared row, only T1 waits for T2 on stream b (same stream, by design).
TEST_F(PgSqlTest, WritersTakingStreamsInOrderDoNotDeadlock) {
  auto relay = Connect();
  Scalar(relay.get(), "SELECT gen FROM " + S() + ".relay_idle()");
  auto t1 = Connect();
  auto t2 = Connect();
  Sql(t2.get(), "SET statement_timeout = '5s'");
  Sql(t1.get(), "BEGIN");
  Sql(t1.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'a')");
  Sql(t2.get(), "BEGIN");
  Sql(t2.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'b')");
  // T1 now waits for T2's stream b; T2 commits and T1 goes on.
  ASSERT_EQ(
      PQsendQuery(t1.get(), ("SELECT " + S() + ".enqueue('t', '{}', stream_key => 'b')").c_str()),
      1);
  Sql(t2.get(), "COMMIT");
  std::vector<PgResult> results;
  while (PGresult* result = PQgetResult(t1.get())) results.emplace_back(result);
  ASSERT_EQ(results.size(), 1U);
  EXPECT_EQ(PQresultStatus(results[0].get()), PGRES_TUPLES_OK)
      << PQresultErrorMessage(results[0].get());
  Sql(t1.get(), "COMMIT");
  EXPECT_EQ(Scalar(conn(), "SELECT string_agg(stream_key || stream_seq, ',' ORDER BY id) FROM " +
                               S() + ".messages"),
            "a1,b1,b2");
}

// Issue #24: targets => ARRAY[...] writes one message per target and returns their ids in the
// order given; each copy has its own stream_seq per (target, stream), and all share the first
// copy's id as event_id. A message for one target has none (its event id is its own id).
TEST_F(PgSqlTest, EnqueueWithTargetsWritesOneMessagePerTarget) {
  const std::string ids = Enqueue(
      "topic => 'orders', payload => '{\"n\": 1}', stream_key => 'o-1', type => 'Placed', "
      "headers => '{\"x\": \"y\"}', correlation_id => 'c-1', "
      "targets => ARRAY['partner', 'default']");
  Enqueue(
      "topic => 'orders', payload => '{\"n\": 2}', stream_key => 'o-1', "
      "targets => ARRAY['default', 'partner']");
  Enqueue(
      "topic => 'orders', payload => '\\x0102'::bytea, stream_key => 'o-1', "
      "target => 'partner'");
  const auto rows = [&](const std::string& what) {
    return Scalar(conn(), "SELECT string_agg(" + what + ", ',' ORDER BY payload, target) FROM " +
                              S() + ".messages");
  };
  EXPECT_EQ(rows("target || stream_seq"), "partner3,default1,partner1,default2,partner2");
  const std::string first_id = ids.substr(1, 36);
  const std::string second_id = ids.substr(38, 36);
  EXPECT_EQ(ids.size(), 2 + 36 * 2 + 1U) << ids;
  EXPECT_EQ(Scalar(conn(), "SELECT target || ',' || coalesce(event_id::text, '-') FROM " + S() +
                               ".messages WHERE id = '" + first_id + "'"),
            "partner," + first_id);
  EXPECT_EQ(Scalar(conn(), "SELECT target || ',' || event_id FROM " + S() +
                               ".messages WHERE id = '" + second_id + "'"),
            "default," + first_id);
  EXPECT_EQ(Scalar(conn(),
                   "SELECT count(DISTINCT (type, headers, content_type, topic, payload)) "
                   "FROM " +
                       S() + ".messages WHERE event_id = '" + first_id + "'"),
            "1")
      << "the copies carry the same message";
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages WHERE event_id IS NULL"),
            "1");
  // Every payload form takes targets; positional calls still mean the single-target forms.
  EXPECT_EQ(Enqueue("topic => 't', payload => '{}'::jsonb, targets => ARRAY['a', 'b']").size(),
            2 + 36 * 2 + 1U);
  EXPECT_EQ(Enqueue("topic => 't', payload => '\\x00'::bytea, targets => '{a}'").size(), 38U);
  EXPECT_EQ(Enqueue("'t', '{}', 'key'").size(), 36U);
}

TEST_F(PgSqlTest, BadTargetsGetClearErrors) {
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => ARRAY['a', 'a']"),
            "outbox.enqueue: targets: \"a\" is named twice");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => ARRAY[]::text[]"),
            "outbox.enqueue: targets must name at least one target");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => NULL"),
            "outbox.enqueue: targets must name at least one target");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => ARRAY['a', NULL]"),
            "outbox.enqueue: target must not be empty");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => ARRAY['a', E'b\\n']"),
            "outbox.enqueue: target contains a control character");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => ARRAY[['a'], ['b']]"),
            "outbox.enqueue: targets must be a one-dimensional array");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => "
                  "(SELECT array_agg('t' || n) FROM generate_series(1, 33) n)"),
            "outbox.enqueue: targets: 33 targets, over the limit of 32");
  EXPECT_EQ(Error("topic => 't', payload => '{}', target => ''"),
            "outbox.enqueue: target must not be empty");
  EXPECT_EQ(RunExpectingError(conn(), "INSERT INTO " + S() +
                                          ".topic_settings (topic, targets) VALUES ('t', '{}')"),
            "outbox.enqueue: targets must name at least one target");
  EXPECT_EQ(RunExpectingError(conn(), "SELECT * FROM " + S() +
                                          ".enqueue_batch('[{\"topic\": \"t\", \"payload\": "
                                          "1, \"targets\": [\"a\"], \"target\": \"b\"}]')"),
            "outbox.enqueue_batch: element 1: give \"target\" or \"targets\", not both");
  EXPECT_EQ(RunExpectingError(conn(), "SELECT * FROM " + S() +
                                          ".enqueue_batch('[{\"topic\": \"t\", \"payload\": "
                                          "1, \"targets\": [\"a\", 2]}]')"),
            "outbox.enqueue_batch: element 1: targets must be a JSON array of strings");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"), "0");
}

// A topic's default targets apply when the call names none; `target => x` still means x alone.
// The batch form gives one row per copy, with the message's ordinal.
TEST_F(PgSqlTest, ATopicsDefaultTargetsApplyWhenTheCallNamesNone) {
  Sql(conn(), "INSERT INTO " + S() +
                  ".topic_settings (topic, targets) VALUES ('evt', ARRAY['default', 'partner'])");
  const std::string event = Enqueue("topic => 'evt', payload => '{}', stream_key => 'k'");
  Enqueue("topic => 'evt', payload => '{}', stream_key => 'k', target => 'default'");
  EXPECT_EQ(Scalar(conn(), "SELECT string_agg(target || stream_seq, ',' ORDER BY id) FROM " + S() +
                               ".messages"),
            "default1,partner1,default2");
  EXPECT_EQ(
      Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages WHERE event_id = '" + event + "'"),
      "2")
      << "the single-target form returns the event id";
  EXPECT_EQ(
      Scalar(conn(), "SELECT string_agg(ordinal::text, ',' ORDER BY ordinal, id) FROM " + S() +
                         ".enqueue_batch('[{\"topic\": \"evt\", \"payload\": 1}, "
                         "{\"topic\": \"evt\", \"payload\": 2, \"target\": \"a\"}, "
                         "{\"topic\": \"o\", \"payload\": 3, \"targets\": [\"a\", "
                         "\"b\", \"c\"]}]')"),
      "1,1,2,3,3,3");
}

// Schema version 9 counted stream_seq per stream across targets; version 10 counts per (target,
// stream) and continues each pair from its stream's old counter, so that no consumer sees a seq
// it has already seen.
TEST_F(PgSqlTest, StreamSeqPerTargetContinuesFromTheOldPerStreamCounter) {
  Sql(conn(), "INSERT INTO " + S() + ".streams VALUES ('s', 17, " + S() + ".uuid_v7())");
  Enqueue("topic => 't', payload => '{}', stream_key => 's', targets => ARRAY['b', 'a']");
  Enqueue("topic => 't', payload => '{}', stream_key => 's', target => 'a'");
  Enqueue("topic => 't', payload => '{}', stream_key => 'fresh', target => 'a'");
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(target || stream_key || stream_seq, ',' ORDER BY "
                   "stream_key, stream_seq, target) FROM " +
                       S() + ".messages"),
            "afresh1,as18,bs18,as19");
}

// Schema version 11 takes a number by inserting it into stream_seqs (nothing is updated, so an old
// snapshot held open slows no writer): one live row per pair is left, a pair continues from the
// version 10 counter, a writer that rolls back leaves no gap, and a REPEATABLE READ writer that
// cannot see the writer before it is told to retry (40001), never given a number twice.
TEST_F(PgSqlTest, StreamSeqIsTakenByInsertingAndContinuesFromTheVersion10Counter) {
  Sql(conn(), "INSERT INTO " + S() + ".target_streams VALUES ('default', 'old', 41, " + S() +
                  ".uuid_v7())");
  Enqueue("'t', '{}', stream_key => 'old'");
  for (int i = 0; i < 5; ++i) Enqueue("'t', '{}', stream_key => 'k'");
  Sql(conn(), "BEGIN");
  Enqueue("'t', '{}', stream_key => 'k'");
  Sql(conn(), "ROLLBACK");
  Enqueue("'t', '{}', stream_key => 'k'");
  EXPECT_EQ(Scalar(conn(), "SELECT string_agg(stream_key || stream_seq, ',' ORDER BY id) FROM " +
                               S() + ".messages"),
            "old42,k1,k2,k3,k4,k5,k6");
  // Every number is a row; the store's purge leaves each pair its first row (the counter it
  // continued from) and its latest.
  const auto numbers = [&] {
    return Scalar(conn(),
                  "SELECT string_agg(stream_key || ':' || seq || ':' || taken, ',' ORDER "
                  "BY stream_key, seq) FROM " +
                      S() + ".stream_seqs");
  };
  EXPECT_EQ(numbers(),
            "k:0:true,k:1:true,k:2:true,k:3:true,k:4:true,k:5:true,k:6:false,old:41:true,old:42:"
            "false");
  postgres::StoreOptions options;
  options.conninfo = PgUrl();
  options.schema = S();
  EXPECT_EQ(postgres::OpenStore(options)->Purge(RetentionPolicy{}, 1000), 0);
  EXPECT_EQ(numbers(), "k:0:true,k:6:false,old:41:true,old:42:false");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".target_streams"), "1")
      << "version 10's counters are read, never written";

  auto repeatable = Connect();
  Sql(repeatable.get(), "BEGIN ISOLATION LEVEL REPEATABLE READ");
  Scalar(repeatable.get(), "SELECT 1");  // its snapshot, taken before the next writer commits
  Enqueue("'t', '{}', stream_key => 'k'");
  PgResult refused{PQexec(repeatable.get(),
                          ("SELECT " + S() + ".enqueue('t', '{}', stream_key => 'k')").c_str())};
  EXPECT_EQ(PQresultStatus(refused.get()), PGRES_FATAL_ERROR);
  const char* state = PQresultErrorField(refused.get(), PG_DIAG_SQLSTATE);
  EXPECT_STREQ(state == nullptr ? "" : state, "40001") << PQresultErrorMessage(refused.get());
  Sql(repeatable.get(), "ROLLBACK");
  EXPECT_EQ(Scalar(conn(), "SELECT max(stream_seq) FROM " + S() + ".messages"), "42");
  EXPECT_EQ(
      Scalar(conn(), "SELECT max(stream_seq) FROM " + S() + ".messages WHERE stream_key = 'k'"),
      "7");
}

// Writers fanning one stream out to the same targets, named in opposite orders, take the
// counters in one order (target name) and so wait for each other instead of deadlocking.
TEST_F(PgSqlTest, WritersFanningOutOneStreamInOppositeOrdersDoNotDeadlock) {
  auto t1 = Connect();
  auto t2 = Connect();
  Sql(t2.get(), "SET deadlock_timeout = '100ms'");
  Sql(t1.get(), "BEGIN");
  Sql(t1.get(), "SELECT " + S() + ".enqueue('t', '{}'::json, ARRAY['a', 'b'], stream_key => 's')");
  Sql(t2.get(), "BEGIN");
  ASSERT_EQ(PQsendQuery(t2.get(), ("SELECT " + S() +
                                   ".enqueue('t', '{}'::json, ARRAY['b', 'a'], stream_key => 's')")
                                      .c_str()),
            1);
  std::this_thread::sleep_for(std::chrono::milliseconds{300});
  Sql(t1.get(), "COMMIT");
  std::vector<PgResult> results;
  while (PGresult* result = PQgetResult(t2.get())) results.emplace_back(result);
  ASSERT_EQ(results.size(), 1U);
  EXPECT_EQ(PQresultStatus(results[0].get()), PGRES_TUPLES_OK)
      << PQresultErrorMessage(results[0].get());
  Sql(t2.get(), "COMMIT");
  EXPECT_EQ(Scalar(conn(),
                   "SELECT string_agg(target || stream_seq, ',' ORDER BY stream_seq, "
                   "target) FROM " +
                       S() + ".messages"),
            "a1,b1,a2,b2");
}

// relay_idle lists the writers in flight (which may have read the state from before it), and
// writers_running tells which of them are still running.
TEST_F(PgSqlTest, ARelayGoingIdleListsTheWritersInFlight) {
  auto relay = Connect();
  auto writer = Connect();
  Sql(writer.get(), "BEGIN");
  Sql(writer.get(), "SELECT " + S() + ".enqueue('t', '{}')");
  const std::string vxid = Scalar(writer.get(),
                                  "SELECT virtualtransaction FROM pg_locks WHERE "
                                  "pid = pg_backend_pid() AND locktype = 'virtualxid'");
  const std::string listed = Scalar(relay.get(), "SELECT writers FROM " + S() + ".relay_idle()");
  EXPECT_EQ(listed, "{" + vxid + "}");
  EXPECT_EQ(Scalar(relay.get(), "SELECT " + S() + ".writers_running('" + listed + "')"), listed);
  Sql(writer.get(), "COMMIT");
  EXPECT_EQ(Scalar(relay.get(), "SELECT " + S() + ".writers_running('" + listed + "')"), "{}");
  // Bad input: not an array.
  EXPECT_NE(RunExpectingError(relay.get(), "SELECT " + S() + ".writers_running('x')"), "");
}

}  // namespace
}  // namespace outbox::testing
