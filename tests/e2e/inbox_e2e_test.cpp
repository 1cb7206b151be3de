// Writers -> outboxd -> RabbitMQ -> a consumer with the inbox, while the broker restarts and both
// outboxd and the consumer are killed with SIGKILL: the consumer's table must hold every committed
// message exactly once, and nothing rolled back. The exactly-once tests run with each consumer:
// the C++ example (examples/rabbitmq_inbox_consumer.cpp, outbox::inbox::Inbox), its Python twin
// (examples/python/rabbitmq_inbox_consumer.py: psycopg, pika and the SQL inbox,
// outbox.inbox_begin) and its Go twin (examples/go/rabbitmq_inbox_consumer: pgx, amqp091-go).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "outbox/core/uuid.h"
#include "outbox/core/wire_names.h"
#include "outbox/store/postgres_admin.h"
#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The example consumer's start-up line, written once its signal handlers are in place.
Ready ConsumerReady() { return Ready::LogLine("rabbitmq_inbox_consumer: consuming queue"); }

// A consumer: the command that starts it, before its options.
struct ConsumerProgram {
  std::string name;
  std::vector<std::string> command;
};

class InboxConsumerE2eTest : public ::testing::TestWithParam<ConsumerProgram> {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(GetParam().command.front().c_str(), X_OK), 0)
        << GetParam().command.front()
        << " is missing: the Go consumer is built when go is installed (Debian: golang-go "
           "golang-github-jackc-pgx-v4-dev golang-github-rabbitmq-amqp091-go-dev; "
           "scripts/install-deps "
           "tools)";
  }

  // The consumer's command line: the program, then the example's options.
  static std::vector<std::string> Command(std::vector<std::string> options) {
    std::vector<std::string> args = GetParam().command;
    args.insert(args.end(), options.begin(), options.end());
    return args;
  }
};

INSTANTIATE_TEST_SUITE_P(
    Consumers, InboxConsumerE2eTest,
    ::testing::Values(ConsumerProgram{"Cpp", {CONSUMER_PATH}},
                      ConsumerProgram{"Python", {"/usr/bin/python3", PYTHON_CONSUMER_PATH}},
                      ConsumerProgram{"Go", {GO_CONSUMER_PATH}}),
    [](const auto& test) { return test.param.name; });

TEST_P(InboxConsumerE2eTest, TheConsumersTableEqualsTheCommittedSetThroughRestartsAndKills) {
  TestSchema schema;
  const std::string queue = "inbox_e2e_" + schema.name();
  const std::string table = schema.name() + ".applied";
  const std::string config = "/tmp/outboxd-" + schema.name() + ".toml";
  const std::string log = config + ".log";
  // As the consumer declares it: dead-lettering to <queue>.dead-letter.
  DeclareQueue(queue, {{"x-dead-letter-exchange", queue + ".dead-letter"}});
  {
    std::ofstream out(config);
    // The restarted relay waits out the killed one's leases: 4 s (it was 5 s), publish_timeout
    // 2 s (at most half of it).
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema.name() << "\"\n"
        << "[relay]\ninstance = \"inbox-e2e\"\nlease = \"4s\"\npublish_timeout = \"2s\"\n"
        << "sweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "[http]\nlisten = \"\"\n";
  }
  const std::vector<std::string> relay_args{OUTBOXD_PATH, "--config", config};
  const std::vector<std::string> consumer_args =
      Command({"--amqp", AmqpUrl(), "--queue", queue, "--db", PgUrl(), "--schema", schema.name(),
               "--table", table});
  std::set<std::string> committed;
  std::mutex mutex;
  std::thread writers([&] {
    std::vector<std::thread> threads;
    for (int w = 0; w < 4; ++w) {
      threads.emplace_back([&, w] {
        auto conn = Connect();
        std::mt19937 random(static_cast<unsigned>(w));
        for (int i = 0; i < 2500; ++i) {
          Sql(conn.get(), "BEGIN");
          const std::string id = Scalar(conn.get(), "SELECT " + schema.name() + ".enqueue('" +
                                                        queue + "', '{}', stream_key => 's" +
                                                        std::to_string(random() % 100) + "')");
          const bool commit = random() % 5 != 0;
          Sql(conn.get(), commit ? "COMMIT" : "ROLLBACK");
          if (commit) {
            std::lock_guard lock(mutex);
            committed.insert(id);
          }
          if (i % 50 == 0) std::this_thread::sleep_for(milliseconds{10});  // spread over time
        }
      });
    }
    for (auto& thread : threads) thread.join();
  });
  auto relay = std::make_unique<ChildProcess>(relay_args, log, Ready::Notify());
  auto consumer = std::make_unique<ChildProcess>(consumer_args, log, ConsumerReady());
  std::this_thread::sleep_for(seconds{1});
  // The broker restarts.
  ASSERT_EQ(std::system((std::string{PROJECT_SOURCE_DIR} +
                         "/scripts/services rabbitmqctl stop_app >/dev/null")
                            .c_str()),
            0);
  // 1 s more (it was 2 s): with what rabbitmqctl stop_app and start_app take, it is down 3 to 5 s.
  std::this_thread::sleep_for(seconds{1});
  ASSERT_EQ(std::system((std::string{PROJECT_SOURCE_DIR} +
                         "/scripts/services rabbitmqctl start_app >/dev/null")
                            .c_str()),
            0);
  std::this_thread::sleep_for(seconds{1});
  // The relay and the consumer die without a chance to clean up, and come back.
  EXPECT_EQ(relay->Stop(SIGKILL), 128 + SIGKILL);
  EXPECT_EQ(consumer->Stop(SIGKILL), 128 + SIGKILL);
  relay = std::make_unique<ChildProcess>(relay_args, log, Ready::Notify());
  consumer = std::make_unique<ChildProcess>(consumer_args, log, ConsumerReady());
  writers.join();

  const auto applied = [&] {
    return Scalar(schema.conn(), "SELECT count(DISTINCT id) FROM " + table);
  };
  for (int i = 0; i < 1200 && applied() != std::to_string(committed.size()); ++i) {
    std::this_thread::sleep_for(milliseconds{100});
  }
  EXPECT_EQ(relay->Stop(SIGTERM), 0);
  EXPECT_EQ(consumer->Stop(SIGTERM), 0);
  std::ifstream in(log);
  const std::string output{std::istreambuf_iterator<char>(in), {}};

  ASSERT_EQ(applied(), std::to_string(committed.size())) << output;
  // Exactly once: as many rows as distinct ids, and every id is a committed one.
  EXPECT_EQ(Scalar(schema.conn(), "SELECT count(*) FROM " + table), applied()) << output;
  auto rows = Sql(schema.conn(), "SELECT id FROM " + table);
  for (int r = 0; r < PQntuples(rows.get()); ++r) {
    EXPECT_TRUE(committed.contains(PQgetvalue(rows.get(), r, 0))) << PQgetvalue(rows.get(), r, 0);
  }
  // Per stream, rows were applied in seq order with no seq missing.
  EXPECT_EQ(Scalar(schema.conn(),
                   "SELECT count(*) FROM (SELECT stream_seq, row_number() OVER "
                   "(PARTITION BY stream_key ORDER BY stream_seq) AS n FROM " +
                       table + ") x WHERE stream_seq <> n"),
            "0");
  std::printf("[ e2e ] inbox: %zu committed, applied exactly once; consumer said: %s\n",
              committed.size(), output.substr(output.rfind("processed")).c_str());
  DeleteQueue(queue);
  DeleteQueue(queue + ".dead-letter");
  DeleteExchange(queue + ".dead-letter");
  std::remove(config.c_str());
  std::remove(log.c_str());
}

// Issues #13 and #44: the relay abandons the head of stream a (too large for the sink), an operator
// abandons a message in the middle of stream b (its 5th) before the relay starts. The rest of each
// stream reaches the consumer with outbox-stream-prev-seq and is applied once, in order, instead
// of being requeued forever; when the operator replays b's 5th, it is applied once too.
TEST_P(InboxConsumerE2eTest, AbandonedMessagesAreSteppedOverAndAReplayIsAppliedOnce) {
  TestSchema schema;
  const std::string queue = "inbox_e2e_abandoned_" + schema.name();
  const std::string table = schema.name() + ".applied";
  const std::string config = "/tmp/outboxd-" + schema.name() + ".toml";
  const std::string log = config + ".log";
  DeclareQueue(queue, {{"x-dead-letter-exchange", queue + ".dead-letter"}});
  {
    std::ofstream out(config);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema.name() << "\"\n"
        << "[relay]\ninstance = \"inbox-e2e-abandoned\"\nsweep_interval = \"200ms\"\n"
        << "[retry]\ninitial_delay = \"10ms\"\nmax_delay = \"100ms\"\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "max_message_bytes = 1000\n"
        << "[http]\nlisten = \"\"\n";
  }
  // The consumer's table, created ahead with a column that records the order of application.
  Sql(schema.conn(),
      "CREATE TABLE " + table +
          " (id uuid, stream_key text, stream_seq bigint, payload text, n bigserial)");
  const auto enqueue = [&](const std::string& key, const std::string& payload) {
    return Scalar(schema.conn(), "SELECT " + schema.name() + ".enqueue('" + queue + "', '" +
                                     payload + "', stream_key => '" + key + "')");
  };
  const std::string a_head = enqueue("a", R"({"big": ")" + std::string(2000, 'x') + R"("})");
  for (int i = 2; i <= 10; ++i) enqueue("a", "{}");
  std::string b_fifth;
  for (int i = 1; i <= 10; ++i) {
    const std::string id = enqueue("b", "{}");
    if (i == 5) b_fifth = id;
  }
  auto admin = postgres::OpenAdmin(PgUrl(), schema.name());
  const MessageFilter b_fifth_only{.ids = std::vector<MessageId>{*Uuid::Parse(b_fifth)}};
  ASSERT_EQ(admin->Abandon(b_fifth_only, "e2e: the 5th of b", /*dry_run=*/false).count, 1);

  ChildProcess relay({OUTBOXD_PATH, "--config", config}, log, Ready::Notify());
  ChildProcess consumer(Command({"--amqp", AmqpUrl(), "--queue", queue, "--db", PgUrl(), "--schema",
                                 schema.name(), "--table", table}),
                        log, ConsumerReady());
  const auto applied = [&] { return Scalar(schema.conn(), "SELECT count(*) FROM " + table); };
  for (int i = 0; i < 600 && applied() != "18"; ++i) std::this_thread::sleep_for(milliseconds{100});
  EXPECT_EQ(Scalar(schema.conn(),
                   "SELECT status FROM " + schema.name() + ".messages WHERE id = '" + a_head + "'"),
            "abandoned");
  ASSERT_EQ(applied(), "18");
  ASSERT_EQ(admin->Replay(b_fifth_only, /*dry_run=*/false).count, 1);
  for (int i = 0; i < 300 && applied() != "19"; ++i) std::this_thread::sleep_for(milliseconds{100});
  std::this_thread::sleep_for(seconds{1});  // a second application would show by now
  EXPECT_EQ(relay.Stop(SIGTERM), 0);
  EXPECT_EQ(consumer.Stop(SIGTERM), 0);
  std::ifstream in(log);
  const std::string output{std::istreambuf_iterator<char>(in), {}};

  EXPECT_EQ(Scalar(schema.conn(), "SELECT count(*) || ' ' || count(DISTINCT id) FROM " + table),
            "19 19")
      << output;
  const auto order = [&](const std::string& key) {
    return Scalar(schema.conn(), "SELECT string_agg(stream_seq::text, ',' ORDER BY n) FROM " +
                                     table + " WHERE stream_key = '" + key + "'");
  };
  EXPECT_EQ(order("a"), "2,3,4,5,6,7,8,9,10") << output;
  EXPECT_EQ(order("b"), "1,2,3,4,6,7,8,9,10,5") << output;  // the replay last
  // a's head is still remembered as skipped, b's 5th was replayed.
  EXPECT_EQ(Scalar(schema.conn(),
                   "SELECT string_agg(stream_key || first_seq || '-' || last_seq, "
                   "',') FROM " +
                       schema.name() + ".inbox_skipped"),
            "a1-1");
  EXPECT_NE(output.find("processed 19, "), std::string::npos) << output;
  EXPECT_NE(output.find("dead-lettered 0"), std::string::npos) << output;
  std::printf("[ e2e ] abandoned messages: consumer said: %s\n",
              output.substr(output.rfind("processed")).c_str());
  DeleteQueue(queue);
  DeleteQueue(queue + ".dead-letter");
  DeleteExchange(queue + ".dead-letter");
  std::remove(config.c_str());
  std::remove(log.c_str());
}

amqp_basic_properties_t Properties(const std::string& id,
                                   std::vector<amqp_table_entry_t>& headers) {
  amqp_basic_properties_t properties{};
  properties._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
  properties.delivery_mode = AMQP_DELIVERY_PERSISTENT;
  if (!id.empty()) {
    properties._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    properties.message_id = AmqpBytes(id);
  }
  properties.headers = {static_cast<int>(headers.size()), headers.data()};
  return properties;
}

amqp_table_entry_t Entry(std::string_view key, std::int64_t value) {
  amqp_table_entry_t entry{};
  entry.key = AmqpBytes(key);
  entry.value.kind = AMQP_FIELD_KIND_I64;
  entry.value.value.i64 = value;
  return entry;
}

amqp_table_entry_t Entry(std::string_view key, std::string_view value) {
  amqp_table_entry_t entry{};
  entry.key = AmqpBytes(key);
  entry.value.kind = AMQP_FIELD_KIND_UTF8;
  entry.value.value.bytes = AmqpBytes(value);
  return entry;
}

// Deliveries the inbox can never process (a seq out of range or unreadable, or no outbox id) are
// dead-lettered by the example consumer: each lands once in its dead-letter queue, is logged
// once and never comes back, and a valid message behind them is processed.
TEST(InboxE2eTest, InvalidDeliveriesAreDeadLetteredOnceAndNotRedelivered) {
  TestSchema schema;
  const std::string queue = "inbox_e2e_invalid_" + schema.name();
  const std::string dead_letter = queue + ".dead-letter";
  const std::string table = schema.name() + ".applied";
  const std::string log = "/tmp/inbox-e2e-" + schema.name() + ".log";
  DeclareQueue(queue, {{"x-dead-letter-exchange", dead_letter}});
  struct Bad {
    std::string id;
    std::vector<amqp_table_entry_t> headers;
  };
  std::vector<Bad> bad{
      {NewUuidV7().ToString(),
       {Entry(wire::kStreamKeyHeader, "s"), Entry(wire::kStreamSeqHeader, -1)}},
      {NewUuidV7().ToString(),
       {Entry(wire::kStreamKeyHeader, "s"),
        Entry(wire::kStreamSeqHeader, std::numeric_limits<std::int64_t>::max())}},
      {NewUuidV7().ToString(),
       {Entry(wire::kStreamKeyHeader, "s"), Entry(wire::kStreamSeqHeader, "7x")}},
      {"", {Entry(wire::kStreamKeyHeader, "s"), Entry(wire::kStreamSeqHeader, 1)}},  // no id
  };
  for (auto& message : bad) PublishRaw(queue, Properties(message.id, message.headers));
  const std::string good_id = NewUuidV7().ToString();
  std::vector<amqp_table_entry_t> good{Entry(wire::kStreamKeyHeader, "s"),
                                       Entry(wire::kStreamSeqHeader, 1)};
  PublishRaw(queue, Properties(good_id, good), R"({"good":true})");

  auto consumer = std::make_unique<ChildProcess>(
      std::vector<std::string>{CONSUMER_PATH, "--amqp", AmqpUrl(), "--queue", queue, "--db",
                               PgUrl(), "--schema", schema.name(), "--table", table},
      log, ConsumerReady());
  const auto applied = [&] {
    const auto exists = Scalar(schema.conn(), "SELECT to_regclass('" + table + "') IS NOT NULL");
    return exists == "t" ? Scalar(schema.conn(), "SELECT count(*) FROM " + table) : "0";
  };
  for (int i = 0; i < 300 && (applied() != "1" || ReadyMessages(dead_letter) != 4U); ++i) {
    std::this_thread::sleep_for(milliseconds{100});
  }
  // Time for a redelivery loop to show itself, if there were one.
  std::this_thread::sleep_for(seconds{2});
  EXPECT_EQ(consumer->Stop(SIGTERM), 0);
  std::ifstream in(log);
  const std::string output{std::istreambuf_iterator<char>(in), {}};
  EXPECT_EQ(Scalar(schema.conn(), "SELECT id FROM " + table), good_id) << output;
  EXPECT_EQ(ReadyMessages(queue), 0U) << output;
  Consumer dead(dead_letter);
  for (int i = 0; i < 50 && dead.count() < 4; ++i) std::this_thread::sleep_for(milliseconds{100});
  std::this_thread::sleep_for(milliseconds{300});
  dead.Stop();
  std::multiset<std::string> dead_ids;
  for (const auto& delivery : dead.deliveries()) dead_ids.insert(delivery.message_id);
  EXPECT_EQ(dead_ids, (std::multiset<std::string>{bad[0].id, bad[1].id, bad[2].id, ""})) << output;
  // Each logged once, as dead-lettered, with the reason.
  const auto count = [&](const std::string& text) {
    std::size_t n = 0;
    for (auto at = output.find(text); at != std::string::npos; at = output.find(text, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("dead-lettering"), 4U) << output;
  EXPECT_EQ(count("dead-lettering message " + bad[0].id +
                  ": stream_seq -1 is out of range (1 to 4611686018427387904)"),
            1U)
      << output;
  EXPECT_EQ(count("dead-lettering message " + bad[1].id + ": stream_seq 9223372036854775807"), 1U)
      << output;
  EXPECT_EQ(
      count("dead-lettering message " + bad[2].id + ": header outbox-stream-seq is not an integer"),
      1U)
      << output;
  EXPECT_EQ(count("dead-lettering a message that is not from an outbox"), 1U) << output;
  EXPECT_EQ(count("processed 1, duplicates 0, requeued out of order 0, dead-lettered 4"), 1U)
      << output;
  DeleteQueue(queue);
  DeleteQueue(dead_letter);
  DeleteExchange(dead_letter);
  std::remove(log.c_str());
}

// The consumer declares its queue with the dead-letter exchange; one declared otherwise makes it
// stop at once with a clear message, rather than drop invalid deliveries.
TEST(InboxE2eTest, AQueueWithoutTheDeadLetterExchangeStopsTheConsumer) {
  TestSchema schema;
  const std::string queue = "inbox_e2e_plain_" + schema.name();
  const std::string log = "/tmp/inbox-e2e-" + schema.name() + ".log";
  DeclareQueue(queue);  // no x-dead-letter-exchange
  ChildProcess consumer({CONSUMER_PATH, "--amqp", AmqpUrl(), "--queue", queue, "--db", PgUrl(),
                         "--schema", schema.name(), "--table", schema.name() + ".applied"},
                        log);
  const int status = consumer.Wait(seconds{10});
  std::ifstream in(log);
  const std::string output{std::istreambuf_iterator<char>(in), {}};
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("x-dead-letter-exchange = \"" + queue + ".dead-letter\""),
            std::string::npos)
      << output;
  DeleteQueue(queue);
  DeleteQueue(queue + ".dead-letter");
  DeleteExchange(queue + ".dead-letter");
  std::remove(log.c_str());
}

}  // namespace
}  // namespace outbox::testing
