// outboxd end to end over AMQP 1.0: real PostgreSQL (a schema per test), the real binary with
// [sinks.default] type = "amqp10", RabbitMQ's AMQP 1.0 plugin (scripts/services) with a durable
// queue of the test's own, and an independent reader in another language: npm's rhea on Node.js
// (rhea_reader.js), installed into the build directory on first use (npm install; the npm
// registry must be reachable once). Without node or npm the test fails and says so.
//
// Writers commit and roll back concurrently (8 threads, 500 streams, one transaction in five
// rolled back) while things break: outboxd is killed with SIGKILL holding claimed messages (a new
// one takes them over once their leases expire and publishes them again), then the broker is
// restarted (rabbitmqctl stop_app / start_app) while the new one publishes. What the queue holds
// must equal what was committed, by message id (0 lost), nothing else (0 phantom: no rolled-back
// or unknown id), each key's first deliveries in stream_seq order, nothing abandoned. Duplicates
// (what the killed relay had published without recording it) are counted and printed: the
// inbox removes them.
//
// Messages per test: 20,000, or OUTBOX_AMQP10_E2E_MESSAGES. The lease is 4 s, publish_timeout
// 2 s (at most half of it): the new relay waits out the killed one's leases before it publishes
// (it was 6 s).

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "amqp10_test_support.h"
#include "e2e/concurrent_writers.h"
#include "e2e/frozen_relay.h"
#include "rabbit_test_support.h"
#include "support/child_process.h"
#include "support/pg_test_support.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

constexpr int kStreams = 500;
constexpr int kWriters = 8;
// After rabbitmqctl stop_app, which itself takes 2 to 4 s here (and start_app 1 to 3 s): the
// broker is down 3 s or more in all (it was 2 s more).
constexpr seconds kBrokerOutage{1};

int Messages() {
  const char* text = std::getenv("OUTBOX_AMQP10_E2E_MESSAGES");
  return text != nullptr && std::atoi(text) > 0 ? std::atoi(text) : 20000;
}

// `command`'s exit status (0: success).
int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// rhea in RHEA_DIR (the build directory), installed there with npm on first use. Empty when it is
// there; else why not.
std::string EnsureRhea() {
  if (Shell("command -v node >/dev/null 2>&1") != 0) {
    return "node (Node.js) is not installed: the reader of this test is npm's rhea on Node.js "
           "(Debian: apt-get install nodejs npm)";
  }
  if (std::filesystem::exists(std::string{RHEA_DIR} + "/node_modules/rhea/package.json")) return {};
  if (Shell("command -v npm >/dev/null 2>&1") != 0) {
    return "npm is not installed, and rhea is not in " + std::string{RHEA_DIR};
  }
  std::filesystem::create_directories(RHEA_DIR);
  if (Shell("npm install --prefix '" + std::string{RHEA_DIR} +
            "' --no-audit --no-fund --silent rhea@3 >/dev/null 2>&1") != 0) {
    return "npm install rhea@3 into " + std::string{RHEA_DIR} +
           " failed (is the npm registry reachable?)";
  }
  return {};
}

struct Read {
  std::string id;
  std::string key;
  std::int64_t seq = 0;
};

// Everything in `queue`, read (and accepted) by rhea_reader.js.
std::vector<Read> ReadWithRhea(const std::string& queue, std::size_t expected) {
  const std::string command = "NODE_PATH='" + std::string{RHEA_DIR} + "/node_modules' node '" +
                              std::string{PROJECT_SOURCE_DIR} + "/tests/amqp10/rhea_reader.js' '" +
                              Amqp10Url() + "' '/amq/queue/" + queue + "' " +
                              std::to_string(expected) + " 2000 120000";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run node");
  std::vector<Read> reads;
  std::string line;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe.get()) != nullptr) {
    line += buffer;
    if (line.empty() || line.back() != '\n') continue;
    const auto json = nlohmann::json::parse(line);
    reads.push_back({.id = json.at("id").get<std::string>(),
                     .key = json.at("key").is_null() ? "" : json.at("key").get<std::string>(),
                     .seq = json.at("seq").is_null() ? 0 : json.at("seq").get<std::int64_t>()});
    line.clear();
  }
  const int status = pclose(pipe.release());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("rhea_reader.js failed (see its stderr above)");
  }
  return reads;
}

class Amqp10E2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string problem = EnsureRhea();
    ASSERT_TRUE(problem.empty()) << problem;
    queue_ = UniqueName("amqp10-e2e");
    admin_.DeclareQueue(queue_, {}, /*durable=*/true);  // survives the broker's restart
    config_ = "/tmp/outboxd-amqp10-" + schema_.name() + ".toml";
    std::ofstream(config_) << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \""
                           << schema_.name() << R"("
[relay]
instance = "amqp10-e2e"
batch_size = 500
lease = "4s"
publish_timeout = "2s"
sweep_interval = "200ms"
max_backoff = "500ms"
[retry]
initial_delay = "100ms"
max_delay = "200ms"
max_attempts = 10
[sinks.default]
type = "amqp10"
url = ")" << Amqp10Url() << R"("
address = "/amq/queue/{topic}"
[http]
listen = ""
)";
  }
  void TearDown() override {
    std::remove(config_.c_str());
    std::remove((config_ + ".log").c_str());
  }

  std::unique_ptr<ChildProcess> StartOutboxd() {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/env", "PGAPPNAME=" + schema_.name(), OUTBOXD_PATH,
                                 "--config", config_},
        config_ + ".log", Ready::Notify());
  }

  std::int64_t Rows(const std::string& where = "true") {
    return std::stoll(Scalar(
        schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where));
  }

  // Messages in the queue; 0 while the broker is away.
  std::uint32_t Stored() {
    try {
      return admin_.Count(queue_);
    } catch (const std::exception&) {
      return 0;
    }
  }

  std::string LogTail() {
    std::ifstream in(config_ + ".log");
    const std::string log{std::istreambuf_iterator<char>(in), {}};
    return log.size() > 4000 ? "..." + log.substr(log.size() - 4000) : log;
  }

  static void Services(const std::string& args) {
    ASSERT_EQ(Shell(std::string{PROJECT_SOURCE_DIR} + "/scripts/services " + args + " >/dev/null"),
              0)
        << args;
  }

  TestSchema schema_;
  Admin admin_;
  std::string queue_;
  std::string config_;
  Written written_;
};

TEST_F(Amqp10E2eTest, KillAndBrokerRestartLoseNothingReadByRhea) {
  const int messages = Messages();
  const auto started = SteadyClock::now();
  std::jthread writers(
      [&] { written_ = WriteConcurrently(schema_.name(), queue_, messages, kWriters, kStreams); });

  auto relay = StartOutboxd();
  const bool publishing = WaitUntil([&] { return Stored() > 0; }, seconds{60});
  ASSERT_TRUE(publishing) << "nothing published 60 s after the start\n" << LogTail();
  const Freeze freeze = FreezeHoldingAClaim(*relay, schema_.conn(), schema_.name(),
                                            [&] { return Rows("status = 'processing'"); });
  relay->Signal(SIGKILL);
  EXPECT_EQ(relay->Wait(seconds{10}), 128 + SIGKILL);
  EXPECT_GT(freeze.claimed, 0) << "outboxd not caught holding a claim in " << freeze.attempts
                               << " attempts: " << freeze.problem;
  relay = StartOutboxd();

  const auto third = static_cast<std::uint32_t>(messages * 4 / 5 / 3);
  EXPECT_TRUE(WaitUntil([&] { return Stored() >= third; }, seconds{90}))
      << "fewer than " << third << " stored after 90 s\n"
      << LogTail();
  const std::uint32_t stored_at_restart = Stored();
  Services("rabbitmqctl stop_app");
  std::this_thread::sleep_for(kBrokerOutage);  // a duration, not a wait for a state
  Services("rabbitmqctl start_app");

  writers.join();
  EXPECT_TRUE(WaitUntil([&] { return Rows() == 0; }, seconds{120}, milliseconds{200}))
      << Rows() << " rows left\n"
      << LogTail();
  const double elapsed = std::chrono::duration<double>(SteadyClock::now() - started).count();
  EXPECT_EQ(relay->Stop(), 0) << LogTail();

  const std::vector<Read> reads = ReadWithRhea(queue_, written_.committed.size());
  std::set<std::string> seen;
  std::map<std::string, std::int64_t> last_seq;  // by key, of first deliveries
  std::size_t duplicates = 0;
  std::size_t phantom = 0;
  std::size_t out_of_order = 0;
  for (const Read& read : reads) {
    if (!written_.committed.contains(read.id) && ++phantom <= 5) {
      ADD_FAILURE() << (written_.rolled_back.contains(read.id) ? "rolled back, yet in the queue: "
                                                               : "an id no writer enqueued: ")
                    << read.id;
    }
    if (!seen.insert(read.id).second) {
      ++duplicates;
      continue;
    }
    std::int64_t& last = last_seq[read.key];
    if (read.seq <= last && ++out_of_order <= 5) {
      ADD_FAILURE() << "key " << read.key << ": first delivery of seq " << read.seq << " after seq "
                    << last;
    }
    last = read.seq;
  }
  std::size_t lost = 0;
  for (const std::string& id : written_.committed) {
    if (!seen.contains(id) && ++lost <= 5) ADD_FAILURE() << "committed, not in the queue: " << id;
  }
  EXPECT_EQ(lost, 0U) << "lost";
  EXPECT_EQ(phantom, 0U) << "phantom (rolled back or unknown) messages";
  EXPECT_EQ(out_of_order, 0U) << "first deliveries out of stream order";
  EXPECT_EQ(last_seq.size(), written_.committed_keys.size());
  EXPECT_EQ(Rows("status = 'abandoned'"), 0);
  std::printf(
      "[ e2e ] amqp10 (RabbitMQ %s plugin, read by rhea): %zu committed, %zu rolled back, %zu "
      "read, %zu lost, %zu phantom, %zu duplicates; outboxd killed holding %lld claimed, broker "
      "restarted with %u stored; %.1f s\n",
      "3.10 AMQP 1.0", written_.committed.size(), written_.rolled_back.size(), reads.size(), lost,
      phantom, duplicates, static_cast<long long>(freeze.claimed), stored_at_restart, elapsed);
}

}  // namespace
}  // namespace outbox::testing
