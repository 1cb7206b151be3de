// The status service (outbox/observe/status.h) without servers: readiness from a database that is
// not there and from a SQLite file that is, broker probes, the relay's paused targets, the WAL
// check, draining and the rates ring.

#include "outbox/observe/status.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "outbox/store/postgres_type.h"
#include "outbox/store/sqlite.h"
#include "outbox/store/sqlite_type.h"
#include "support/free_port.h"
#include "support/wait.h"

namespace outbox::observe {
namespace {

using outbox::testing::FreePort;
using std::chrono::milliseconds;

std::shared_ptr<const StoreSettings> Unreachable() {
  return std::make_shared<const postgres::StoreSettings>(
      "postgresql://outbox:pw-canary-db@127.0.0.1:1/none", "outbox");
}

StatusOptions Fast() {
  return {
      .instance = "unit", .stats_interval = milliseconds{50}, .ready_max_age = milliseconds{1000}};
}

// A SQLite database in a fresh temporary directory, migrated; removed with it.
class SqliteFile {
 public:
  SqliteFile() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "outbox-status-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
    path_ = (std::filesystem::path{dir_} / "outbox.db").string();
    sqlite::Migrate(path_);
  }
  ~SqliteFile() { std::filesystem::remove_all(dir_); }
  SqliteFile(const SqliteFile&) = delete;
  SqliteFile& operator=(const SqliteFile&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

TEST(StatusTest, TcpProbeTellsAClosedPort) {
  EXPECT_FALSE(TcpReachable("127.0.0.1", FreePort(), milliseconds{500}));
  EXPECT_FALSE(TcpReachable("no-such-host.invalid", 5672, milliseconds{500}));
}

TEST(StatusTest, TcpProbeTellsAnOpenPort) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t size = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  EXPECT_TRUE(TcpReachable("127.0.0.1", ntohs(address.sin_port), milliseconds{500}));
  ::close(fd);
}

// A database and a broker that are not there: not ready, each named; outbox_ready 0; the error
// recorded for /api/outbox; no password anywhere.
TEST(StatusTest, NotReadyWithoutDatabaseAndBroker) {
  Registry registry;
  StatusService status(Fast(), Unreachable(),
                       {{.name = "default", .endpoint = {.host = "127.0.0.1", .port = FreePort()}}},
                       registry, LogFn{});
  status.Start();
  std::this_thread::sleep_for(milliseconds{300});
  const StatusService::Readiness readiness = status.CheckReadiness();
  EXPECT_FALSE(readiness.ready);
  EXPECT_NE(readiness.report.find("database: "), std::string::npos) << readiness.report;
  EXPECT_NE(readiness.report.find("sink default: broker"), std::string::npos) << readiness.report;
  EXPECT_EQ(readiness.report.find("pw-canary"), std::string::npos) << readiness.report;
  EXPECT_NE(registry.RenderPrometheus().find("\noutbox_ready 0\n"), std::string::npos);
  EXPECT_NE(registry.RenderPrometheus().find("outbox_sink_reachable{sink=\"default\"} 0"),
            std::string::npos);
  EXPECT_NE(registry.RenderJson().find("\"kind\":\"database\""), std::string::npos);
  EXPECT_EQ(registry.RenderJson().find("pw-canary"), std::string::npos);
}

// The store is read through its contract: a SQLite file makes the service ready, with its counts
// in outbox_messages; draining then fails readiness.
TEST(StatusTest, ReadyOnAStoreThatAnswersUntilDraining) {
  const SqliteFile file;
  Registry registry;
  StatusService status(Fast(), std::make_shared<const sqlite::StoreSettings>(file.path()), {},
                       registry, LogFn{});
  status.Start();
  ASSERT_TRUE(outbox::testing::WaitUntil([&] { return status.CheckReadiness().ready; },
                                         std::chrono::seconds{5}))
      << status.CheckReadiness().report;
  EXPECT_NE(status.CheckReadiness().report.find("database: ok (counts read "), std::string::npos);
  const std::string metrics = registry.RenderPrometheus();
  EXPECT_NE(metrics.find("outbox_messages{status=\"pending\"} 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\noutbox_messages_by_topic_skipped 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("outbox_info{version=\""), std::string::npos);
  status.BeginDrain();
  const StatusService::Readiness draining = status.CheckReadiness();
  EXPECT_FALSE(draining.ready);
  EXPECT_NE(draining.report.find("relay: draining"), std::string::npos) << draining.report;
}

// Without a listener nobody reads the counts: the database is not asked, brokers are probed.
TEST(StatusTest, NotServingReadsNoCounts) {
  std::atomic<int> errors{0};
  Registry registry;
  StatusOptions options = Fast();
  options.serving = false;
  StatusService status(options, Unreachable(),
                       {{.name = "default", .endpoint = {.host = "127.0.0.1", .port = FreePort()}}},
                       registry, [&](LogLevel, std::string_view text) {
                         if (text.find("outbox counts") != std::string_view::npos) ++errors;
                       });
  status.Start();
  std::this_thread::sleep_for(milliseconds{200});
  status.Stop();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_NE(status.CheckReadiness().report.find("database: not reached yet\n"), std::string::npos);
  EXPECT_NE(registry.RenderJson().find("refuses TCP connections"), std::string::npos);
}

TEST(StatusTest, ABrokerNeverReachedIsReportedOnceNotAtEveryInterval) {
  Registry registry;
  std::mutex mutex;
  std::vector<std::string> warnings;
  StatusService status(Fast(), Unreachable(),
                       {{.name = "default", .endpoint = {.host = "127.0.0.1", .port = FreePort()}}},
                       registry, [&](LogLevel level, std::string_view text) {
                         const std::lock_guard lock(mutex);
                         if (level == LogLevel::kWarn && text.find("sink default") == 0) {
                           warnings.emplace_back(text);
                         }
                       });
  status.Start();
  std::this_thread::sleep_for(milliseconds{600});  // a dozen stats intervals
  status.Stop();
  EXPECT_EQ(warnings.size(), 1U);
  const std::string body = registry.RenderJson();
  std::size_t reports = 0;
  for (auto at = body.find("refuses TCP connections"); at != std::string::npos;
       at = body.find("refuses TCP connections", at + 1)) {
    ++reports;
  }
  EXPECT_EQ(reports, 1U) << body;
}

// An endpoint without a host (a URL with none that can be probed) is never ready.
TEST(StatusTest, AnEndpointWithoutAHostIsNeverReady) {
  Registry registry;
  StatusService status(Fast(), Unreachable(), {{.name = "odd", .endpoint = {}}}, registry, LogFn{});
  status.Start();
  std::this_thread::sleep_for(milliseconds{150});
  EXPECT_NE(status.CheckReadiness().report.find("sink odd: broker not reached yet"),
            std::string::npos);
}

// A paused target is named, each on its own line, while the relay's flag is up.
TEST(StatusTest, ReadinessNamesEachPausedTarget) {
  Registry registry;
  std::atomic<bool> unavailable{false};
  std::vector<PausedTarget> paused{
      {"other", "the endpoint refuses the relay (its credentials): HTTP 401"}, {"audit-log", ""}};
  StatusService status(
      Fast(), Unreachable(), {}, registry, LogFn{},
      [&] { return RelayTotals{.broker_unavailable = unavailable.load()}; },
      [&paused] { return paused; });
  EXPECT_EQ(status.CheckReadiness().report.find("paused"), std::string::npos);
  unavailable = true;
  StatusService::Readiness readiness = status.CheckReadiness();
  EXPECT_FALSE(readiness.ready);
  EXPECT_NE(readiness.report.find("target other: paused, its last batch found no broker"),
            std::string::npos)
      << readiness.report;
  EXPECT_NE(readiness.report.find("target audit-log: paused"), std::string::npos)
      << readiness.report;
  // Why (issue #40): the reason of its last batch.
  EXPECT_NE(readiness.report.find(
                "found no broker (the endpoint refuses the relay (its credentials): HTTP 401)"),
            std::string::npos)
      << readiness.report;
  // Resumed between the flag and the names: still not ready, and it says so without a name.
  paused.clear();
  readiness = status.CheckReadiness();
  EXPECT_NE(readiness.report.find("relay: a target is paused"), std::string::npos)
      << readiness.report;
}

// WAL mode: readiness fails while the slot's check reports a problem, and names it.
TEST(StatusTest, ReadinessFailsWhileNoRelayReadsTheWalSlot) {
  Registry registry;
  StatusService status(Fast(), Unreachable(), {}, registry, LogFn{});
  std::optional<std::string> problem = "no relay is reading the replication slot";
  status.SetWalCheck([&problem] { return problem; });
  StatusService::Readiness readiness = status.CheckReadiness();
  EXPECT_FALSE(readiness.ready);
  EXPECT_NE(readiness.report.find("WAL slot: no relay is reading the replication slot"),
            std::string::npos)
      << readiness.report;
  problem.reset();
  readiness = status.CheckReadiness();
  EXPECT_NE(readiness.report.find("WAL slot: read by a relay"), std::string::npos)
      << readiness.report;
}

// One sample a second of how much the relay's counters grew.
TEST(StatusTest, RatesSampleTheRelaysCountersEverySecond) {
  Registry registry;
  std::atomic<std::uint64_t> published{0};
  StatusService status(Fast(), Unreachable(), {}, registry, LogFn{},
                       [&] { return RelayTotals{.published = published.load()}; });
  EXPECT_TRUE(status.RecentRates().published.empty());
  EXPECT_EQ(status.RatesJson(),
            R"({"step_seconds":1,"end_unix_ms":0,"published":[],"failed":[],"unconfirmed":[]})");
  status.Start();
  ASSERT_TRUE(outbox::testing::WaitUntil([&] { return !status.RecentRates().published.empty(); },
                                         std::chrono::seconds{3}));
  published = 7;
  const auto grew = [&] {
    const StatusService::Rates rates = status.RecentRates();
    std::uint64_t sum = 0;
    for (const std::uint64_t step : rates.published) sum += step;
    return sum == 7 && rates.published.back() == 7;
  };
  ASSERT_TRUE(outbox::testing::WaitUntil(grew, std::chrono::seconds{3}));
  const StatusService::Rates rates = status.RecentRates();
  EXPECT_EQ(rates.failed.back(), 0U);
  EXPECT_GT(rates.end_unix_ms, 0);
  EXPECT_EQ(status.Totals().published, 7U);
}

}  // namespace
}  // namespace outbox::observe
