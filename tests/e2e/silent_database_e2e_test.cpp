// No silent stalls (issue #40): outboxd reaches the real PostgreSQL through a TCP proxy that
// freezes the connections open at one moment (they stay open, nothing is forwarded either way:
// a failed-over primary, a dropped route, a frozen VM) while new connections go through. The
// relay must notice within database.statement_deadline, reconnect and publish what was written
// meanwhile, in table mode and in WAL mode; and SIGTERM during the freeze must end it within
// relay.shutdown_timeout. The sink is a file (one JSON line per publish), so the database is the
// only server involved (label postgres).

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>

#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"
#include "support/tcp_proxy.h"
#include "support/wait.h"
#include "support/wal_slot.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// The test server's conninfo with host and port replaced by the proxy's.
std::string ThroughProxy(int port) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(PgUrl().c_str(), &error);
  if (options == nullptr) {
    PQfreemem(error);
    throw std::runtime_error("cannot parse the test server's URL");
  }
  std::string conninfo = "host=127.0.0.1 port=" + std::to_string(port);
  for (PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    const std::string key = option->keyword;
    if (option->val == nullptr || key == "host" || key == "hostaddr" || key == "port") continue;
    if (key != "dbname" && key != "user" && key != "password") continue;
    conninfo += " " + key + "='" + option->val + "'";
  }
  PQconninfoFree(options);
  return conninfo;
}

// The test server's host and port (where the proxy forwards to).
std::pair<std::string, int> Upstream() {
  const auto conn = Connect();
  return {PQhost(conn.get()), std::stoi(PQport(conn.get()))};
}

class SilentDatabaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto [host, port] = Upstream();
    proxy_ = std::make_unique<TcpProxy>(host, port);
    config_path_ = "/tmp/outboxd-silent-" + schema_.name() + ".toml";
    events_path_ = "/tmp/outboxd-silent-" + schema_.name() + ".jsonl";
  }
  void TearDown() override {
    relay_.reset();  // first: it reads the slot and holds connections through the proxy
    // Then the proxy: closing the frozen links ends the server's sessions behind them (a
    // walsender that still streams the slot would keep it from being dropped).
    proxy_.reset();
    slot_.reset();
    std::remove(config_path_.c_str());
    std::remove((config_path_ + ".log").c_str());
    std::remove(events_path_.c_str());
  }

  void WriteConfig(const std::string& deadline, const std::string& mode = "table",
                   const std::string& extra = "") {
    std::ofstream out(config_path_);
    out << "[database]\nurl = \"" << ThroughProxy(proxy_->port()) << "\"\nschema = \""
        << schema_.name() << "\"\nmode = \"" << mode << "\"\nstatement_deadline = \"" << deadline
        << "\"\n"
        << "[relay]\ninstance = \"silent\"\nlease = \"5s\"\npublish_timeout = \"2s\"\n"
        << "sweep_interval = \"500ms\"\nmax_backoff = \"500ms\"\nshutdown_timeout = \""
        << shutdown_timeout_.count() << "ms\"\n"
        << "[sinks.default]\ntype = \"file\"\npath = \"" << events_path_ << "\"\n"
        << extra;
    if (extra.find("[http]") == std::string::npos) out << "[http]\nlisten = \"\"\n";
  }

  void StartRelay() {
    relay_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{OUTBOXD_PATH, "--config", config_path_}, config_path_ + ".log",
        Ready::Notify());
    ASSERT_TRUE(relay_->WaitReady(seconds{30})) << Log();
  }

  // `count` messages written directly to the database (not through the proxy).
  void Enqueue(int count) {
    for (int i = 0; i < count; ++i) {
      Sql(schema_.conn(), "SELECT " + schema_.name() +
                              ".enqueue('silent', '{\"n\": " + std::to_string(written_++) +
                              "}', stream_key => 's" + std::to_string(i % 7) + "')");
    }
  }

  // Distinct message ids published so far.
  std::size_t Published() {
    std::ifstream in(events_path_);
    static const std::regex kId{R"re("id":"([0-9a-f-]{36})")re"};
    std::set<std::string> ids;
    for (std::string line; std::getline(in, line);) {
      std::smatch match;
      if (std::regex_search(line, match, kId)) ids.insert(match[1]);
    }
    return ids.size();
  }

  std::string Log() {
    std::ifstream in(config_path_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  // (a) and (c): publishes, freezes, writes more; returns the seconds until all were published,
  // or a negative number when they were not within `limit`.
  double FreezeAndMeasure(seconds limit) {
    Enqueue(50);
    if (!WaitUntil([&] { return Published() >= 50; }, seconds{30})) return -1;
    proxy_->SetMode(TcpProxy::Mode::kFreeze);
    const auto frozen = steady_clock::now();
    Enqueue(50);
    if (!WaitUntil([&] { return Published() >= 100; }, limit)) return -1;
    return std::chrono::duration<double>(steady_clock::now() - frozen).count();
  }

  // (b): with a deadline longer than the shutdown timeout, so that only the shutdown bounds it.
  void SigtermDuringTheFreezeEndsWithinShutdownTimeout() {
    Enqueue(20);
    ASSERT_TRUE(WaitUntil([&] { return Published() >= 20; }, seconds{30})) << Log();
    proxy_->SetMode(TcpProxy::Mode::kFreeze);
    Enqueue(20);  // its wake-up is lost; the next sweep's claim waits on the frozen connection
    std::this_thread::sleep_for(seconds{2});
    const auto signalled = steady_clock::now();
    const int code = relay_->Stop(SIGTERM, seconds{30});
    const double took = std::chrono::duration<double>(steady_clock::now() - signalled).count();
    std::printf(
        "[ silent ] SIGTERM during the freeze: exit %d after %.2f s (shutdown_timeout %.1f s)\n",
        code, took, static_cast<double>(shutdown_timeout_.count()) / 1000);
    EXPECT_TRUE(code == 0 || code == 1) << code << "\n" << Log();
    // The signal thread's timer plus the time to exit and be reaped.
    EXPECT_LT(took, std::chrono::duration<double>(shutdown_timeout_).count() + 1.5) << Log();
    relay_.reset();
  }

  TestSchema schema_;
  std::unique_ptr<TcpProxy> proxy_;
  std::unique_ptr<ChildProcess> relay_;
  std::optional<WalSlot> slot_;
  std::string config_path_;
  std::string events_path_;
  milliseconds shutdown_timeout_{3000};
  int written_ = 0;
};

// The bounds in the README, with statement_deadline = 2 s, sweep_interval = 500 ms and
// max_backoff = 500 ms, plus 2 s for a loaded machine: table mode, the sweep (an idle relay's
// wake-up is lost with its frozen LISTEN connection) + the deadline + a backoff; WAL mode, twice
// the deadline (the stream's silence, then the ledger's frozen connection) + a backoff.
constexpr milliseconds kTableBound{500 + 2000 + 500 + 2000};
constexpr milliseconds kWalBound{2 * 2000 + 500 + 2000};

TEST_F(SilentDatabaseTest, TableModePublishesWhatWasWrittenDuringAFreezeWithinTheDeadline) {
  WriteConfig("2s");
  StartRelay();
  const double took = FreezeAndMeasure(seconds{30});
  std::printf("[ silent ] table mode: published the 50 written during the freeze after %.2f s\n",
              took);
  ASSERT_GE(took, 0) << "not published within 30 s\n" << Log();
  EXPECT_LT(took, std::chrono::duration<double>(kTableBound).count()) << Log();
  EXPECT_NE(Log().find("statement_deadline"), std::string::npos) << Log();
  EXPECT_EQ(relay_->Stop(SIGTERM, seconds{15}), 0) << Log();
}

TEST_F(SilentDatabaseTest, SigtermDuringAFreezeEndsWithinShutdownTimeout) {
  // The HTTP listener too: its stats thread has a connection of its own through the proxy.
  WriteConfig("60s", "table",
              "[http]\nlisten = \"127.0.0.1:" + std::to_string(FreePort()) +
                  "\"\nallow_unauthenticated = true\nstats_interval = \"200ms\"\n");
  StartRelay();
  SigtermDuringTheFreezeEndsWithinShutdownTimeout();
}

TEST_F(SilentDatabaseTest, SigtermWhileStartingOnADatabaseThatNeverAnswersExitsAtOnce) {
  // New connections are accepted and never answered: outboxd waits in its first connect (for
  // connect_timeout, 60 s here) before it is ready.
  proxy_->SetMode(TcpProxy::Mode::kBlackhole);
  WriteConfig("60s");
  relay_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{OUTBOXD_PATH, "--config", config_path_}, config_path_ + ".log",
      Ready::None());
  std::this_thread::sleep_for(seconds{1});
  const auto signalled = steady_clock::now();
  EXPECT_EQ(relay_->Stop(SIGTERM, seconds{30}), 0) << Log();
  const double took = std::chrono::duration<double>(steady_clock::now() - signalled).count();
  std::printf("[ silent ] SIGTERM while starting: exit after %.2f s\n", took);
  EXPECT_LT(took, 1.5) << Log();
  EXPECT_NE(Log().find("while starting: exiting"), std::string::npos) << Log();
}

TEST_F(SilentDatabaseTest, WalModePublishesWhatWasWrittenDuringAFreezeWithinTheDeadline) {
  slot_.emplace(schema_.name());
  WriteConfig("2s", "wal");
  StartRelay();
  // The replication connection: a ping at half the deadline, given up at the whole of it; then
  // reconnect with backoff, as the table relay.
  const double took = FreezeAndMeasure(seconds{30});
  std::printf("[ silent ] WAL mode: published the 50 written during the freeze after %.2f s\n",
              took);
  ASSERT_GE(took, 0) << "not published within 30 s\n" << Log();
  EXPECT_LT(took, std::chrono::duration<double>(kWalBound).count()) << Log();
  EXPECT_EQ(relay_->Stop(SIGTERM, seconds{15}), 0) << Log();
}

TEST_F(SilentDatabaseTest, WalModeSigtermDuringAFreezeEndsWithinShutdownTimeout) {
  slot_.emplace(schema_.name());
  WriteConfig("60s", "wal");
  StartRelay();
  SigtermDuringTheFreezeEndsWithinShutdownTimeout();
}

}  // namespace
}  // namespace outbox::testing
