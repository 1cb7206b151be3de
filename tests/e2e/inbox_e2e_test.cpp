// Writers -> outboxd -> RabbitMQ -> a consumer with the inbox (examples/rabbitmq_inbox_consumer),
// while the broker restarts and both outboxd and the consumer are killed with SIGKILL: the
// consumer's table must hold every committed message exactly once, and nothing rolled back.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <set>

#include "../postgres/pg_test_support.h"
#include "amqp_test_client.h"
#include "child_process.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(InboxE2eTest, TheConsumersTableEqualsTheCommittedSetThroughRestartsAndKills) {
  TestSchema schema;
  const std::string queue = "inbox_e2e_" + schema.name();
  const std::string table = schema.name() + ".applied";
  const std::string config = "/tmp/outboxd-" + schema.name() + ".toml";
  const std::string log = config + ".log";
  DeclareQueue(queue);
  {
    std::ofstream out(config);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema.name() << "\"\n"
        << "[relay]\ninstance = \"inbox-e2e\"\nlease = \"5s\"\npublish_timeout = \"2s\"\n"
        << "sweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "[http]\nlisten = \"\"\n";
  }
  const std::vector<std::string> relay_args{OUTBOXD_PATH, "--config", config};
  const std::vector<std::string> consumer_args{CONSUMER_PATH, "--amqp",  AmqpUrl(), "--queue",
                                               queue,         "--db",    PgUrl(),   "--schema",
                                               schema.name(), "--table", table};
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
  auto relay = std::make_unique<ChildProcess>(relay_args, log);
  auto consumer = std::make_unique<ChildProcess>(consumer_args, log);
  std::this_thread::sleep_for(seconds{1});
  // The broker restarts.
  ASSERT_EQ(std::system((std::string{PROJECT_SOURCE_DIR} +
                         "/scripts/services rabbitmqctl stop_app >/dev/null")
                            .c_str()),
            0);
  std::this_thread::sleep_for(seconds{2});
  ASSERT_EQ(std::system((std::string{PROJECT_SOURCE_DIR} +
                         "/scripts/services rabbitmqctl start_app >/dev/null")
                            .c_str()),
            0);
  std::this_thread::sleep_for(seconds{1});
  // The relay and the consumer die without a chance to clean up, and come back.
  EXPECT_EQ(relay->Stop(SIGKILL), 128 + SIGKILL);
  EXPECT_EQ(consumer->Stop(SIGKILL), 128 + SIGKILL);
  relay = std::make_unique<ChildProcess>(relay_args, log);
  consumer = std::make_unique<ChildProcess>(consumer_args, log);
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
  std::remove(config.c_str());
  std::remove(log.c_str());
}

}  // namespace
}  // namespace outbox::testing
