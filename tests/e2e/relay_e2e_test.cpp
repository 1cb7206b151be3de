// outboxd end to end: real PostgreSQL, real RabbitMQ, the real binary, and an independent
// consumer that records every delivery. Writers commit and roll back concurrently while things
// break: the broker restarts, the relay is killed with SIGKILL. What is delivered must equal what
// was committed, by id; nothing rolled back may appear; per-stream order of first deliveries must
// hold; nothing may be abandoned. A test that kills or stops the relay does so while it holds
// claimed messages (frozen_relay.h), so that what it checks about them is not vacuous.

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
#include "support/tcp_proxy.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string ServicesScript() { return std::string{PROJECT_SOURCE_DIR} + "/scripts/services"; }

// The service manager's end of sd_notify: a datagram socket that outboxd finds in NOTIFY_SOCKET,
// as systemd gives it to a Type=notify service.
class NotifySocket {
 public:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    path_.copy(address.sun_path, sizeof address.sun_path - 1);
    std::remove(path_.c_str());
    if (fd_ < 0 || bind(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
      throw std::runtime_error("cannot bind " + path_ + ": " + std::strerror(errno));
    }
  }
  ~NotifySocket() {
    close(fd_);
    std::remove(path_.c_str());
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  [[nodiscard]] const std::string& path() const { return path_; }

  // The next notification, or "" after `limit`.
  std::string Receive(milliseconds limit) {
    pollfd ready{.fd = fd_, .events = POLLIN, .revents = 0};
    if (poll(&ready, 1, static_cast<int>(limit.count())) != 1) return "";
    std::string message(4096, '\0');
    const ssize_t size = recv(fd_, message.data(), message.size(), 0);
    message.resize(size > 0 ? static_cast<std::size_t>(size) : 0);
    return message;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

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
        << "[relay]\ninstance = \"e2e\"\nbatch_size = 500\nlease = \"" << lease_ << "\"\n"
        << "publish_timeout = \"" << publish_timeout_ << "\"\nsweep_interval = \"200ms\"\n"
        << "max_backoff = \"500ms\"\nshutdown_timeout = \"" << shutdown_timeout_ << "\"\n"
        << "[retry]\ninitial_delay = \"100ms\"\nmax_delay = \"200ms\"\nmax_attempts = "
        << max_attempts << "\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << amqp_url_ << "\"\n"
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
  // `environment`: more NAME=value for it.
  std::unique_ptr<ChildProcess> StartRelay(const std::vector<std::string>& environment = {}) {
    std::vector<std::string> argv{"/usr/bin/env", "PGAPPNAME=" + app_name_};
    argv.insert(argv.end(), environment.begin(), environment.end());
    argv.insert(argv.end(), {OUTBOXD_PATH, "--config", config_path_});
    // A test that listens for the service manager's messages itself passes NOTIFY_SOCKET.
    const bool own_socket = std::any_of(environment.begin(), environment.end(), [](const auto& e) {
      return e.starts_with("NOTIFY_SOCKET=");
    });
    return std::make_unique<ChildProcess>(argv, config_path_ + ".log",
                                          own_socket ? Ready::None() : Ready::Notify());
  }
  // Stops `relay` (SIGSTOP) while it holds claimed messages (it is the only relay on the schema).
  Freeze FreezeWithAClaim(ChildProcess& relay) {
    return FreezeHoldingAClaim(relay, schema_.conn(), app_name_, [&] { return Processing(); });
  }

  std::string Log() {
    std::ifstream in(config_path_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  std::string lease_ = "10s";
  std::string publish_timeout_ = "5s";
  std::string shutdown_timeout_ = "10s";
  std::string amqp_url_ = AmqpUrl();
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
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
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
  // The broker stops once the relay is publishing, for 1 s (a duration, not a wait for a state;
  // it was 3 s: with what rabbitmqctl stop_app and start_app take, it is down 3 to 5 s); messages
  // must be committed and still undelivered when it comes back, or nothing was at stake.
  const bool publishing = WaitUntil([&] { return consumer.count() > 0; }, seconds{60});
  const bool stopped =
      publishing &&
      std::system((ServicesScript() + " rabbitmqctl stop_app >/dev/null").c_str()) == 0;
  if (stopped) std::this_thread::sleep_for(seconds{1});
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
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  consumer.Stop();
  const auto duplicates = CheckDeliveries(consumer);
  EXPECT_GE(consumer.reconnects(), 1) << "the broker restart was not noticed by the consumer";
  std::printf(
      "[ e2e ] broker restart: %lld messages held back by the outage, %zu committed, %zu "
      "duplicates\n",
      static_cast<long long>(held_back), committed_.size(), duplicates);
}

TEST_F(RelayE2eTest, KillingTheRelayLosesNothing) {
  // The restarted relay waits out the killed one's leases: 4 s (publish_timeout 2 s, at most half
  // of it), not the fixture's 10 s.
  lease_ = "4s";
  publish_timeout_ = "2s";
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
  // Its leases (4 s) expire; the restarted relay takes the messages over.
  Outboxd second(config_path_);
  writers.join();
  ASSERT_TRUE(WaitForAll(consumer, seconds{120})) << Log();
  EXPECT_EQ(second.Stop(SIGTERM, seconds{30}), 0) << Log();
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
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
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
  EXPECT_EQ(again.Stop(SIGTERM, seconds{30}), 0) << Log();
  consumer.Stop();
  std::set<std::string> seen;
  for (const auto& delivery : consumer.deliveries()) seen.insert(delivery.message_id);
  EXPECT_EQ(seen.size(), 20000U);
  EXPECT_EQ(consumer.count(), 20000U) << "a clean drain publishes nothing twice";
}

// outboxd as a systemd Type=notify service: READY=1 once it relays, STOPPING=1 with the time the
// drain may take when SIGTERM arrives. And a drain that cannot finish (the broker never confirms)
// ends after relay.shutdown_timeout with exit 1, long before publish_timeout, losing nothing: the
// message it held is published by the next relay once its lease expires.
TEST_F(RelayE2eTest, TellsTheServiceManagerAndEndsADrainAtShutdownTimeout) {
  TcpProxy broker("127.0.0.1", 5672);
  amqp_url_ = "amqp://guest:guest@127.0.0.1:" + std::to_string(broker.port()) + "/";
  // The lease as short as publish_timeout allows (twice it): the second relay waits it out.
  lease_ = "8s";
  publish_timeout_ = "4s";
  shutdown_timeout_ = "1s";
  WriteConfig();
  NotifySocket notify("/tmp/outboxd-notify-" + schema_.name() + ".sock");
  Consumer consumer(queue_);
  auto relay = StartRelay({"NOTIFY_SOCKET=" + notify.path()});
  const std::string ready = notify.Receive(seconds{30});
  EXPECT_NE(ready.find("READY=1\n"), std::string::npos) << "'" << ready << "'\n" << Log();
  EXPECT_NE(ready.find("STATUS=relaying schema " + schema_.name() + " as e2e to 1 sink(s)"),
            std::string::npos)
      << ready;

  // One message through, so that the sink's connection is up; then the broker's replies stop.
  const auto enqueue = [&] {
    return Scalar(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" + queue_ +
                                      "', '{}', stream_key => 's')");
  };
  const std::string first = enqueue();
  ASSERT_TRUE(WaitUntil([&] { return consumer.count() >= 1; }, seconds{30})) << Log();
  ASSERT_TRUE(WaitUntil([&] { return Count("true") == "0"; }, seconds{10})) << Log();
  broker.SetMode(TcpProxy::Mode::kHoldReplies);
  const std::string second = enqueue();
  ASSERT_TRUE(WaitUntil([&] { return Processing() == 1; }, seconds{30}))
      << "the relay did not claim the message\n"
      << Log();
  std::this_thread::sleep_for(milliseconds{300});  // published, waiting for its confirm

  const auto signalled = std::chrono::steady_clock::now();
  relay->Signal(SIGTERM);
  const std::string stopping = notify.Receive(seconds{10});
  EXPECT_NE(stopping.find("STOPPING=1\n"), std::string::npos) << "'" << stopping << "'";
  // shutdown_timeout and a 5 s margin, in microseconds.
  EXPECT_NE(stopping.find("EXTEND_TIMEOUT_USEC=6000000"), std::string::npos) << stopping;
  EXPECT_EQ(relay->Wait(seconds{30}), 1) << Log();
  const auto took = std::chrono::steady_clock::now() - signalled;
  EXPECT_LT(took, seconds{6}) << "the drain was not cut at shutdown_timeout (1 s; publish_timeout "
                                 "is 4 s)";
  EXPECT_NE(Log().find("the drain did not finish within relay.shutdown_timeout (1000 ms)"),
            std::string::npos)
      << Log();
  EXPECT_EQ(Processing(), 1) << "the held message's lease was given up or settled\n" << Log();

  // Nothing lost: the next relay publishes it once the lease has expired.
  broker.SetMode(TcpProxy::Mode::kForward);
  shutdown_timeout_ = "10s";
  WriteConfig();
  auto again = StartRelay();
  EXPECT_TRUE(WaitUntil([&] { return Count("true") == "0"; }, seconds{60}))
      << Count("true") << " left\n"
      << Log();
  EXPECT_EQ(again->Stop(SIGTERM, seconds{30}), 0) << Log();
  consumer.Stop();
  std::set<std::string> seen;
  for (const auto& delivery : consumer.deliveries()) seen.insert(delivery.message_id);
  EXPECT_EQ(seen, (std::set<std::string>{first, second}));
}

}  // namespace
}  // namespace outbox::testing
