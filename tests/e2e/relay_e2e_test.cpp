// outboxd end to end: real PostgreSQL, real RabbitMQ, the real binary, and an independent
// consumer that records every delivery. Writers commit and roll back concurrently while things
// break: the broker restarts, the relay is killed with SIGKILL. What is delivered must equal what
// was committed, by id; nothing rolled back may appear; per-stream order of first deliveries must
// hold; nothing may be abandoned. A test that kills or stops the relay does so while it holds
// claimed messages (frozen_relay.h), so that what it checks about them is not vacuous.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "frozen_relay.h"
#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/pg_test_support.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string ServicesScript() { return std::string{PROJECT_SOURCE_DIR} + "/scripts/services"; }

class RelayE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    queue_ = "e2e_" + schema_.name();
    DeclareQueue(queue_);
    config_path_ = "/tmp/outboxd-" + schema_.name() + ".toml";
    app_name_ = "e2e_" + schema_.name();
  }
  void TearDown() override {
    DeleteQueue(queue_);
    std::remove(config_path_.c_str());
    std::remove((config_path_ + ".log").c_str());
  }

  void WriteConfig(int max_attempts = 10, const std::string& extra = "") {
    std::ofstream out(config_path_);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema_.name() << "\"\n"
        << "[relay]\ninstance = \"e2e\"\nbatch_size = 500\nlease = \"10s\"\n"
        << "publish_timeout = \"5s\"\nsweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << "[retry]\ninitial_delay = \"100ms\"\nmax_delay = \"200ms\"\nmax_attempts = "
        << max_attempts << "\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "routing_key = \"{topic}\"\n"
        << "[http]\nlisten = \"\"\n"  // several tests may run relays side by side
        << extra;
  }

  // 8 writers, `total` transactions over 500 streams, one in five rolled back. Records ids.
  void Write(int total) {
    constexpr int kWriters = 8;
    std::vector<std::thread> writers;
    std::atomic<int> next{0};
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        auto conn = ::outbox::testing::Connect();
        std::mt19937 random(static_cast<unsigned>(w));
        for (int i = next++; i < total; i = next++) {
          Sql(conn.get(), "BEGIN");
          const std::string id =
              Scalar(conn.get(), "SELECT " + schema_.name() + ".enqueue('" + queue_ +
                                     "', '{\"n\": " + std::to_string(i) + "}', stream_key => 's" +
                                     std::to_string(random() % 500) + "')");
          const bool commit = random() % 5 != 0;
          Sql(conn.get(), commit ? "COMMIT" : "ROLLBACK");
          std::lock_guard lock(mutex_);
          (commit ? committed_ : rolled_back_).insert(id);
        }
      });
    }
    for (auto& writer : writers) writer.join();
  }

  // Waits (bounded) until the consumer has seen every committed id.
  bool WaitForAll(Consumer& consumer, seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (consumer.count() >= committed_.size()) {
        std::set<std::string> seen;
        for (const auto& delivery : consumer.deliveries()) seen.insert(delivery.message_id);
        if (seen.size() >= committed_.size()) return true;
      }
      std::this_thread::sleep_for(milliseconds{100});
    }
    return false;
  }

  // The promises, checked on what the consumer received. Returns the number of duplicates.
  std::size_t CheckDeliveries(const Consumer& consumer) {
    std::set<std::string> first_seen;
    std::map<std::string, std::int64_t> last_first_seq;
    std::size_t duplicates = 0;
    for (const auto& delivery : consumer.deliveries()) {
      EXPECT_FALSE(rolled_back_.contains(delivery.message_id))
          << "rolled-back message delivered: " << delivery.message_id;
      if (!first_seen.insert(delivery.message_id).second) {
        ++duplicates;
        continue;
      }
      auto& last = last_first_seq[delivery.stream_key];
      EXPECT_GT(delivery.stream_seq, last)
          << "stream " << delivery.stream_key << ": first delivery of seq " << delivery.stream_seq
          << " after seq " << last;
      last = delivery.stream_seq;
    }
    EXPECT_EQ(first_seen, committed_)
        << first_seen.size() << " distinct delivered, " << committed_.size() << " committed";
    EXPECT_EQ(Count("status = 'abandoned'"), "0");
    return duplicates;
  }

  std::string Count(const std::string& where) {
    return Scalar(schema_.conn(),
                  "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where);
  }
  std::int64_t Processing() { return std::stoll(Count("status = 'processing'")); }

  // outboxd with the configuration, its backends named app_name_ in pg_stat_activity (so that
  // FreezeHoldingAClaim can tell them apart).
  std::unique_ptr<ChildProcess> StartRelay() {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/env", "PGAPPNAME=" + app_name_, OUTBOXD_PATH, "--config",
                                 config_path_},
        config_path_ + ".log");
  }
  // Stops `relay` (SIGSTOP) while it holds claimed messages (it is the only relay on the schema).
  Freeze FreezeWithAClaim(ChildProcess& relay) {
    return FreezeHoldingAClaim(relay, schema_.conn(), app_name_, [&] { return Processing(); });
  }

  std::string Log() {
    std::ifstream in(config_path_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  TestSchema schema_;
  std::string queue_;
  std::string config_path_;
  std::string app_name_;
  std::mutex mutex_;
  std::set<std::string> committed_;
  std::set<std::string> rolled_back_;
};

TEST_F(RelayE2eTest, FiftyThousandMessagesFromEightWritersArriveExactlyAsCommitted) {
  WriteConfig();
  Consumer consumer(queue_);
  Outboxd relay(config_path_);
  Write(50000);
  ASSERT_TRUE(WaitForAll(consumer, seconds{120})) << Log();
  relay.Signal(SIGTERM);
  EXPECT_EQ(relay.Wait(seconds{30}), 0) << Log();
  consumer.Stop();
  const auto duplicates = CheckDeliveries(consumer);
  EXPECT_EQ(duplicates, 0U);
  EXPECT_EQ(Count("true"), "0");  // all published and deleted, no lease left behind
  std::printf("[ e2e ] %zu committed, %zu rolled back, %zu duplicates\n", committed_.size(),
              rolled_back_.size(), duplicates);
}

TEST_F(RelayE2eTest, ABrokerRestartLosesNothingAndAbandonsNothing) {
  WriteConfig(/*max_attempts=*/2);  // an outage that spent attempts would abandon at once
  Consumer consumer(queue_);
  Outboxd relay(config_path_);
  // Writers go on until the broker is back (at least 10,000 messages, at most 100,000), so that
  // messages are written during the outage however long rabbitmqctl takes on a loaded machine.
  std::atomic<bool> broker_back{false};
  std::thread writers([&] {
    for (int written = 0; written < 100000 && (written < 10000 || !broker_back); written += 2000) {
      Write(2000);
    }
  });
  // The broker stops once the relay is publishing, for 3 s (a duration, not a wait for a state);
  // messages must be committed and still undelivered when it comes back, or nothing was at stake.
  const bool publishing = WaitUntil([&] { return consumer.count() > 0; }, seconds{60});
  const bool stopped =
      publishing &&
      std::system((ServicesScript() + " rabbitmqctl stop_app >/dev/null").c_str()) == 0;
  if (stopped) std::this_thread::sleep_for(seconds{3});
  const std::int64_t held_back = stopped ? std::stoll(Count("true")) : 0;
  const bool started =
      std::system((ServicesScript() + " rabbitmqctl start_app >/dev/null").c_str()) == 0;
  broker_back = true;
  writers.join();
  ASSERT_TRUE(publishing) << "nothing delivered 60 s after the start\n" << Log();
  ASSERT_TRUE(stopped) << "rabbitmqctl stop_app failed";
  ASSERT_TRUE(started) << "rabbitmqctl start_app failed";
  EXPECT_GT(held_back, 0) << "no message waiting in the outbox when the broker came back";
  ASSERT_TRUE(WaitForAll(consumer, seconds{120})) << Log();
  relay.Signal(SIGTERM);
  EXPECT_EQ(relay.Wait(seconds{30}), 0) << Log();
  consumer.Stop();
  const auto duplicates = CheckDeliveries(consumer);
  EXPECT_GE(consumer.reconnects(), 1) << "the broker restart was not noticed by the consumer";
  std::printf(
      "[ e2e ] broker restart: %lld messages held back by the outage, %zu committed, %zu "
      "duplicates\n",
      static_cast<long long>(held_back), committed_.size(), duplicates);
}

TEST_F(RelayE2eTest, KillingTheRelayLosesNothing) {
  WriteConfig();
  Consumer consumer(queue_);
  std::thread writers([&] { Write(20000); });
  // Killed while publishing, with claimed messages in hand (frozen holding them, then SIGKILL):
  // they are what the restarted relay must take over.
  bool publishing = false;
  Freeze freeze;
  int killed = 0;
  {
    auto first = StartRelay();
    publishing = WaitUntil([&] { return consumer.count() > 0; }, seconds{60});
    if (publishing) freeze = FreezeWithAClaim(*first);
    first->Signal(SIGKILL);
    killed = first->Wait(seconds{10});
  }
  if (!publishing || freeze.claimed == 0) writers.join();
  ASSERT_TRUE(publishing) << "nothing delivered 60 s after the start\n" << Log();
  ASSERT_GT(freeze.claimed, 0) << "the relay not caught holding a claim in " << freeze.attempts
                               << " attempts: " << freeze.problem << "\n"
                               << Log();
  EXPECT_EQ(killed, 128 + SIGKILL);
  // Its leases (10 s) expire; the restarted relay takes the messages over.
  Outboxd second(config_path_);
  writers.join();
  ASSERT_TRUE(WaitForAll(consumer, seconds{120})) << Log();
  second.Signal(SIGTERM);
  EXPECT_EQ(second.Wait(seconds{30}), 0) << Log();
  consumer.Stop();
  const auto duplicates = CheckDeliveries(consumer);
  std::printf("[ e2e ] kill -9 with %lld messages claimed: %zu committed, %zu duplicates\n",
              static_cast<long long>(freeze.claimed), committed_.size(), duplicates);
}

TEST_F(RelayE2eTest, APoisonMessageIsAbandonedWithItsReasonWhileOthersFlow) {
  // A queue that refuses everything: the broker nacks each publish to it.
  const std::string full = queue_ + "_full";
  DeclareQueue(full, {{"x-overflow", "reject-publish"}}, {{"x-max-length", 0}});
  WriteConfig(/*max_attempts=*/3);
  Consumer consumer(queue_);
  const std::string poison = Scalar(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" +
                                                        full + "', '{}', stream_key => 'p')");
  const std::string behind = Scalar(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" +
                                                        queue_ + "', '{}', stream_key => 'p')");
  const std::string other = Scalar(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" +
                                                       queue_ + "', '{}', stream_key => 'q')");
  committed_ = {behind, other};
  Outboxd relay(config_path_);
  ASSERT_TRUE(WaitForAll(consumer, seconds{60})) << Log();
  // Done when only the poison message is left, abandoned, and its stream's next message went.
  WaitUntil([&] { return Count("true") == "1"; }, seconds{30});
  relay.Signal(SIGTERM);
  EXPECT_EQ(relay.Wait(seconds{30}), 0) << Log();
  consumer.Stop();
  DeleteQueue(full);
  EXPECT_EQ(Count("true"), "1");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT status || ' ' || attempts || ' ' || last_error FROM " +
                                       schema_.name() + ".messages WHERE id = '" + poison + "'")
                .substr(0, 38),
            "abandoned 3 rejected: nacked by broker");
  const auto deliveries = consumer.deliveries();
  ASSERT_FALSE(deliveries.empty());
  EXPECT_EQ(deliveries.back().message_id, behind) << "its stream's next message went last";
}

TEST_F(RelayE2eTest, SigtermDrainsCleanly) {
  WriteConfig();
  Sql(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" + queue_ +
                          "', '{}') FROM generate_series(1, 20000)");
  Consumer consumer(queue_);
  auto relay = StartRelay();
  // SIGTERM in the middle of the drain, with claimed messages in hand: sent while the relay is
  // frozen holding them, handled when it continues.
  ASSERT_TRUE(WaitUntil([&] { return consumer.count() >= 2000; }, seconds{60}))
      << consumer.count() << " delivered 60 s after the start\n"
      << Log();
  const Freeze freeze = FreezeWithAClaim(*relay);
  ASSERT_GT(freeze.claimed, 0) << "the relay not caught holding a claim in " << freeze.attempts
                               << " attempts: " << freeze.problem << "\n"
                               << Log();
  relay->Signal(SIGTERM);
  relay->Signal(SIGCONT);
  EXPECT_EQ(relay->Wait(seconds{30}), 0) << Log();
  EXPECT_EQ(Count("status = 'processing'"), "0")
      << "leases left behind (" << freeze.claimed << " claimed at SIGTERM)";
  EXPECT_GT(std::stoll(Count("true")), 0) << "it drained everything: nothing left for the restart";
  // Nothing published twice: restart, drain the rest, and count.
  Outboxd again(config_path_);
  WaitUntil([&] { return consumer.count() >= 20000; }, seconds{120});
  again.Signal(SIGTERM);
  EXPECT_EQ(again.Wait(seconds{30}), 0) << Log();
  consumer.Stop();
  std::set<std::string> seen;
  for (const auto& delivery : consumer.deliveries()) seen.insert(delivery.message_id);
  EXPECT_EQ(seen.size(), 20000U);
  EXPECT_EQ(consumer.count(), 20000U) << "a clean drain publishes nothing twice";
}

}  // namespace
}  // namespace outbox::testing
