// The SQL face of the store: migrations, outbox.enqueue from plain SQL (as any language would
// call it), its errors, stream_seq, partitions and the idle-relay wakeup. What every SQL store's
// enqueue promises is the writer contract (tests/store/writer_contract.h), run here through
// PostgreSQL's named arguments and the libpq Writer (PostgresWriterHarness below); the tests here
// are PostgreSQL's own (overloads, triggers, the legacy counters, NOTIFY).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "../store/writer_contract.h"
#include "connection.h"
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
  // What enqueue writes: WriterContractTest.PartitionsFollowTheCoreHash.
}

// The enqueue's SQL helpers run inlined into the expression that calls them (schema version 17):
// not inlined, each call is a SQL function of its own, parsed and planned again in every
// transaction (half of a WAL-mode enqueue's server time, bench/RESULTS.md). A generic plan keeps
// the parameter, so the plan shows the call itself when it is not inlined.
TEST_F(PgSqlTest, TheEnqueueHelpersAreInlined) {
  Sql(conn(), "SET plan_cache_mode = force_generic_plan");
  const auto plan_of = [&](const std::string& call, const std::string& types,
                           const std::string& args) {
    Sql(conn(), "PREPARE helper" + types + " AS SELECT " + call);
    const PgResult result{
        PQexec(conn(), ("EXPLAIN (VERBOSE, COSTS OFF) EXECUTE helper" + args).c_str())};
    EXPECT_EQ(PQresultStatus(result.get()), PGRES_TUPLES_OK) << PQerrorMessage(conn());
    std::string plan;
    for (int row = 0; row < PQntuples(result.get()); ++row)
      plan += PQgetvalue(result.get(), row, 0);
    Sql(conn(), "DEALLOCATE helper");
    return plan;
  };
  const std::string wal_text = plan_of(S() + ".wal_text($1)", "(text)", "('k')");
  EXPECT_EQ(wal_text.find("wal_text"), std::string::npos) << wal_text;
  EXPECT_NE(wal_text.find("convert_to"), std::string::npos) << wal_text;
  const std::string partition =
      plan_of(S() + ".partition_of($1, $2)", "(text, integer)", "('k', 8)");
  EXPECT_EQ(partition.find("partition_of"), std::string::npos) << partition;
  EXPECT_NE(partition.find("fnv1a32"), std::string::npos) << partition;
  Sql(conn(), "RESET plan_cache_mode");
}

// The errors every store shares: WriterContractTest.BadInputGetsClearErrors.
TEST_F(PgSqlTest, BadJsonIsRefusedByItsCast) {
  EXPECT_EQ(Error("topic => 't', payload => '{not json'"), "invalid input syntax for type json");
  EXPECT_EQ(Error("topic => 't', payload => '{}', headers => '{x'"),
            "invalid input syntax for type json");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"), "0");
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

// The header limits are settings with the same defaults as the C++ MessageLimits
// (WriterContractTest.HeaderLimitsAreSettingsWithTheCoreDefaults), and no nonsense.
TEST_F(PgSqlTest, HeaderLimitSettingsRefuseNegativeValues) {
  for (const char* bad : {"max_header_count = -1", "max_header_name_bytes = 0",
                          "max_header_value_bytes = -1", "max_headers_bytes = -1"}) {
    EXPECT_NE(RunExpectingError(conn(), "UPDATE " + S() + ".settings SET " + bad)
                  .find("violates check constraint"),
              std::string::npos)
        << bad;
  }
}

// Every overload checks the header limits (the limits themselves: WriterContractTest.
// HeadersAtTheLimitsAreTakenAndOneMoreIsRefusedNamingTheSetting).
TEST_F(PgSqlTest, EveryOverloadChecksTheHeaderLimits) {
  // The names and values of HeadersAtTheLimits need no JSON escaping.
  const auto json = [](const Headers& headers) {
    std::string text;
    for (const auto& [name, value] : headers) {
      text += (text.empty() ? "{\"" : ", \"") + name + "\": \"" + value + "\"";
    }
    return text + "}";
  };
  const Headers at_limits = HeadersAtTheLimits();
  const std::string over_total =
      "outbox.enqueue: headers take 8193 bytes (names and values), over the limit of 8192 "
      "(settings.max_headers_bytes)";
  Headers more = at_limits;
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
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"), "0");
}

// The successor that keeps a stream's ids in seq order when the clock goes back
// (WriterContractTest.IdsOfAStreamSortInSeqOrderEvenIfTheClockGoesBack).
TEST_F(PgSqlTest, UuidSuccessorAddsOneToTheLastEightBytes) {
  EXPECT_EQ(
      Scalar(conn(), "SELECT " + S() + ".uuid_successor('01890a5d-ac96-774b-bcce-b302099a80ff')"),
      "01890a5d-ac96-774b-bcce-b302099a8100");
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

// Issue #24, what only PostgreSQL has (the rest: WriterContractTest.
// EnqueueWithTargetsWritesOneMessagePerTarget and BadTargetsGetClearErrors): every payload form
// takes targets as a text[], and positional calls still mean the single-target forms.
TEST_F(PgSqlTest, EveryPayloadFormTakesATargetsArray) {
  EXPECT_EQ(Enqueue("topic => 't', payload => '{}'::jsonb, targets => ARRAY['a', 'b']").size(),
            2 + 36 * 2 + 1U);
  EXPECT_EQ(Enqueue("topic => 't', payload => '\\x00'::bytea, targets => '{a}'").size(), 38U);
  EXPECT_EQ(Enqueue("'t', '{}', 'key'").size(), 36U);
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => NULL"),
            "outbox.enqueue: targets must name at least one target");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => ARRAY['a', NULL]"),
            "outbox.enqueue: target must not be empty");
  EXPECT_EQ(Error("topic => 't', payload => '{}', targets => ARRAY[['a'], ['b']]"),
            "outbox.enqueue: targets must be a one-dimensional array");
  EXPECT_EQ(Scalar(conn(), "SELECT count(*) FROM " + S() + ".messages"), "4");
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

// The writer contract through PostgreSQL's outbox.enqueue (named arguments) and the libpq Writer.
std::string Literal(PGconn* conn, std::string_view text) {
  char* quoted = PQescapeLiteral(conn, text.data(), text.size());
  if (quoted == nullptr) throw std::runtime_error(PQerrorMessage(conn));
  std::string out{quoted};
  PQfreemem(quoted);
  return out;
}

std::string ByteaLiteral(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'\\x";
  for (const char c : bytes) {
    out += kHex[static_cast<unsigned char>(c) >> 4U];
    out += kHex[static_cast<unsigned char>(c) & 15U];
  }
  return out + "'::bytea";
}

// Runs `sql`; throws EnqueueError with the primary message (a deadlock or serialization failure
// asks for a retry).
PgResult Run(PGconn* conn, const std::string& sql) {
  PgResult result{PQexec(conn, sql.c_str())};
  const auto status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    const char* message = PQresultErrorField(result.get(), PG_DIAG_MESSAGE_PRIMARY);
    const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
    const std::string sqlstate = state != nullptr ? state : "";
    throw EnqueueError(message != nullptr ? message : PQerrorMessage(conn),
                       sqlstate == "40P01" || sqlstate == "40001");
  }
  return result;
}

class PostgresWriterSession final : public WriterSession {
 public:
  PostgresWriterSession(std::string schema, std::chrono::milliseconds lock_timeout)
      : schema_(std::move(schema)), conn_(Connect()) {
    Run(conn_.get(), "SET lock_timeout = '" + std::to_string(lock_timeout.count()) +
                         "ms'; SET deadlock_timeout = '100ms'");
  }
  void Begin(Isolation isolation) override {
    Run(conn_.get(),
        std::string{"BEGIN ISOLATION LEVEL "} +
            (isolation == Isolation::kReadCommitted ? "READ COMMITTED" : "REPEATABLE READ"));
  }
  void Commit() override { Run(conn_.get(), "COMMIT"); }
  void Rollback() override { Run(conn_.get(), "ROLLBACK"); }

  std::vector<MessageId> Enqueue(const EnqueueCall& call) override {
    PGconn* conn = conn_.get();
    std::string args = "topic => " + (call.null_topic ? "NULL" : Literal(conn, call.topic));
    if (call.bytes) {
      args += ", payload => " + (call.null_payload ? "NULL::bytea" : ByteaLiteral(call.payload));
      if (call.content_type) args += ", content_type => " + Literal(conn, *call.content_type);
    } else {
      args += ", payload => " + (call.null_payload ? "NULL::json" : Literal(conn, call.payload));
    }
    const auto add = [&](const char* name, const std::optional<std::string>& value) {
      if (value) args += std::string{", "} + name + " => " + Literal(conn, *value);
    };
    add("stream_key", call.stream_key);
    add("type", call.type);
    add("headers", call.headers);
    add("target", call.target);
    add("correlation_id", call.correlation_id);
    add("causation_id", call.causation_id);
    if (call.sequenced)
      args += std::string{", sequenced => "} + (*call.sequenced ? "true" : "false");
    if (call.targets) {
      args += ", targets => ARRAY[";
      for (std::size_t i = 0; i < call.targets->size(); ++i) {
        args += (i > 0 ? ", " : "") + Literal(conn, (*call.targets)[i]);
      }
      args += "]::text[]";
    }
    const auto result = Run(conn, "SELECT " + schema_ + ".enqueue(" + args + ")::text");
    std::string_view text = PQgetvalue(result.get(), 0, 0);
    std::vector<MessageId> ids;
    if (text.starts_with('{')) {
      text = text.substr(1, text.size() - 2);
      while (!text.empty()) {
        ids.push_back(Uuid::Parse(text.substr(0, 36)).value());
        text.remove_prefix(std::min<std::size_t>(text.size(), 37));
      }
    } else {
      ids.push_back(Uuid::Parse(text).value());
    }
    return ids;
  }

  std::vector<std::pair<std::int64_t, MessageId>> EnqueueBatch(const std::string& json) override {
    const auto result = Run(conn_.get(), "SELECT ordinal, id FROM " + schema_ + ".enqueue_batch(" +
                                             Literal(conn_.get(), json) + ")");
    std::vector<std::pair<std::int64_t, MessageId>> rows;
    for (int i = 0; i < PQntuples(result.get()); ++i) {
      rows.emplace_back(std::stoll(PQgetvalue(result.get(), i, 0)),
                        Uuid::Parse(PQgetvalue(result.get(), i, 1)).value());
    }
    return rows;
  }

  std::vector<std::vector<MessageId>> WriterEnqueue(std::span<const NewMessage> messages) override {
    return postgres::Writer{schema_}.EnqueueCopies(conn_.get(), messages);
  }

 private:
  std::string schema_;
  PgConn conn_;
};

class PostgresWriterHarness final : public WriterHarness {
 public:
  void Reset() override {
    schema_.reset();
    schema_ = std::make_unique<TestSchema>();
  }
  std::unique_ptr<WriterSession> Connect(std::chrono::milliseconds lock_timeout) override {
    return std::make_unique<PostgresWriterSession>(schema_->name(), lock_timeout);
  }
  std::vector<StoredMessage> Messages() override {
    const auto result =
        Sql(schema_->conn(),
            "SELECT id, event_id, topic, stream_key, stream_seq, partition, target, type, "
            "encode(payload, 'hex'), content_type, headers::text, status, attempts FROM " +
                schema_->name() + ".messages ORDER BY id");
    std::vector<StoredMessage> out;
    for (int i = 0; i < PQntuples(result.get()); ++i) {
      const auto text = [&](int column) -> std::optional<std::string> {
        if (PQgetisnull(result.get(), i, column) != 0) return std::nullopt;
        return PQgetvalue(result.get(), i, column);
      };
      StoredMessage message;
      message.id = Uuid::Parse(*text(0)).value();
      if (auto event = text(1)) message.event_id = Uuid::Parse(*event).value();
      message.topic = *text(2);
      message.stream_key = text(3);
      if (auto seq = text(4)) message.stream_seq = std::stoll(*seq);
      message.partition = std::stoi(*text(5));
      message.target = *text(6);
      message.type = text(7);
      const std::string hex = *text(8);
      for (std::size_t at = 0; at + 1 < hex.size(); at += 2) {
        message.payload += static_cast<char>(std::stoi(hex.substr(at, 2), nullptr, 16));
      }
      message.content_type = *text(9);
      message.headers = postgres::HeadersFromJson(*text(10)).value();
      message.status = *text(11);
      message.attempts = std::stoi(*text(12));
      out.push_back(std::move(message));
    }
    return out;
  }
  void SetSetting(const std::string& column, std::int64_t value) override {
    const std::string text =
        column == "sequenced_by_default" ? (value != 0 ? "true" : "false") : std::to_string(value);
    Sql(schema_->conn(), "UPDATE " + schema_->name() + ".settings SET " + column + " = " + text);
  }
  std::int64_t Setting(const std::string& column) override {
    return std::stoll(
        Scalar(schema_->conn(), "SELECT " + column + " FROM " + schema_->name() + ".settings"));
  }
  void SetTopic(const std::string& topic, std::optional<bool> sequenced,
                std::optional<std::vector<std::string>> targets) override {
    PGconn* conn = schema_->conn();
    std::string array = "NULL::text[]";
    if (targets) {
      array = "ARRAY[";
      for (std::size_t i = 0; i < targets->size(); ++i) {
        array += (i > 0 ? ", " : "") + Literal(conn, (*targets)[i]);
      }
      array += "]::text[]";
    }
    Run(conn, "INSERT INTO " + schema_->name() +
                  ".topic_settings (topic, sequenced, targets) VALUES (" + Literal(conn, topic) +
                  ", " + (sequenced ? (*sequenced ? "true" : "false") : "NULL") + ", " + array +
                  ") ON CONFLICT (topic) DO UPDATE SET sequenced = EXCLUDED.sequenced, "
                  "targets = EXCLUDED.targets");
  }
  void SetStreamLastId(const std::string& target, const std::string& stream_key,
                       const MessageId& id) override {
    PGconn* conn = schema_->conn();
    Sql(conn, "UPDATE " + schema_->name() + ".stream_seqs SET last_id = '" + id.ToString() +
                  "' WHERE target = " + Literal(conn, target) +
                  " AND stream_key = " + Literal(conn, stream_key));
  }

 private:
  std::unique_ptr<TestSchema> schema_;
};

PostgresWriterHarness writer_harness;
INSTANTIATE_TEST_SUITE_P(Postgres, WriterContractTest, ::testing::Values(&writer_harness),
                         [](const auto&) { return std::string{"libpq"}; });

}  // namespace
}  // namespace outbox::testing
