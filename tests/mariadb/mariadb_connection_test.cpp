// The MariaDB store's connection layer and migrations against the real server: URLs, bound
// parameters and bytes, errors and their kinds, the deadline on a busy and on a silent server, the
// lost session ended before a reconnect, migrations run twice and printed.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "migrations.h"
#include "support/mariadb_test_support.h"
#include "support/tcp_proxy.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

double SecondsSince(steady_clock::time_point start) {
  return std::chrono::duration<double>(steady_clock::now() - start).count();
}

// The test server's URL with its host and port replaced by the proxy's.
std::string ThroughProxy(int port) {
  auto url = mariadb::ParseUrl(MariaDbUrl());
  return "mariadb://" + url.user + ":" + url.password + "@127.0.0.1:" + std::to_string(port) + "/" +
         url.database;
}

TEST(MariaDbUrlTest, ReadsEveryPart) {
  const auto url = mariadb::ParseUrl(
      "mysql://app%40x:p%3Ass@db.example:3307/shop?connect_timeout=3&ssl_mode=required");
  EXPECT_EQ(url.user, "app@x");
  EXPECT_EQ(url.password, "p:ss");
  EXPECT_EQ(url.host, "db.example");
  EXPECT_EQ(url.port, 3307U);
  EXPECT_EQ(url.database, "shop");
  EXPECT_EQ(url.connect_timeout_seconds, 3U);
  EXPECT_EQ(url.ssl_mode, "required");
  EXPECT_EQ(mariadb::DescribeUrl(url), "db.example:3307/shop user app@x");
  const auto v6 = mariadb::ParseUrl("mariadb://u@[::1]:13306/");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 13306U);
  EXPECT_EQ(mariadb::ParseUrl("mariadb://h").port, 3306U);
}

TEST(MariaDbUrlTest, RefusesBadUrlsByName) {
  const auto message = [](const char* url) {
    try {
      mariadb::ParseUrl(url);
    } catch (const std::invalid_argument& e) {
      return std::string{e.what()};
    }
    return std::string{"<accepted>"};
  };
  EXPECT_NE(message("postgresql://h/db").find("mariadb://"), std::string::npos);
  EXPECT_NE(message("mariadb://h:99999/db").find("bad port"), std::string::npos);
  EXPECT_NE(message("mariadb://h:x/db").find("bad port"), std::string::npos);
  EXPECT_NE(message("mariadb://h/db?ssl_mode=maybe").find("ssl_mode"), std::string::npos);
  EXPECT_NE(message("mariadb://h/db?colour=red").find("unknown URL option 'colour'"),
            std::string::npos);
  EXPECT_NE(message("mariadb://h/db?connect_timeout=0").find("connect_timeout"), std::string::npos);
  EXPECT_NE(message("mariadb://u:%zz@h/db").find("password"), std::string::npos);
}

TEST(MariaDbConnectionTest, AWrongPasswordIsUnavailableAndNeverQuoted) {
  auto url = mariadb::ParseUrl(MariaDbUrl());
  const std::string secret = "not-the-Secret-42";
  const std::string bad = "mariadb://" + url.user + ":" + secret + "@" + url.host + ":" +
                          std::to_string(url.port) + "/" + url.database;
  try {
    mariadb::Connection conn{bad, seconds{2}};
    FAIL() << "connected with a wrong password";
  } catch (const mariadb::MariaDbError& e) {
    EXPECT_EQ(e.kind(), FailureKind::kUnavailable);
    EXPECT_EQ(std::string{e.what()}.find(secret), std::string::npos) << e.what();
    EXPECT_NE(std::string{e.what()}.find("cannot connect to MariaDB at"), std::string::npos);
  }
}

TEST(MariaDbConnectionTest, NothingListeningIsUnavailable) {
  TcpProxy proxy("127.0.0.1", 1);  // forwards to a port where nothing listens
  try {
    mariadb::Connection conn{ThroughProxy(proxy.port()), seconds{2}};
    FAIL() << "connected to nothing";
  } catch (const mariadb::MariaDbError& e) {
    EXPECT_EQ(e.kind(), FailureKind::kUnavailable) << e.what();
  }
}

TEST(MariaDbConnectionTest, ParametersAndBytesRoundTrip) {
  auto conn = MariaDbConnect();
  std::string bytes{"\0\xff\xfe not utf-8 \x80", 16};
  const mariadb::Value params[] = {std::int64_t{-42}, 2.5, std::string{"zürich ✓"},
                                   mariadb::Bytes{bytes}, std::monostate{}};
  const auto result = conn.Run("round trip", "SELECT ?, ?, ?, ?, ?", params);
  ASSERT_EQ(result.sets.size(), 1U);
  const auto& row = result.sets[0].rows.at(0);
  EXPECT_EQ(row[0], "-42");
  EXPECT_EQ(row[1], "2.5");
  EXPECT_EQ(row[2], "zürich ✓");
  EXPECT_EQ(row[3], bytes);
  EXPECT_FALSE(row[4].has_value());
  // A long value (past the first buffer) and a DATETIME(6), read as UTC text.
  const mariadb::Value long_text[] = {std::string(100000, 'x')};
  EXPECT_EQ(conn.Run("long", "SELECT ?", long_text).sets[0].rows[0][0]->size(), 100000U);
  const auto now = conn.Run("now", "SELECT UTC_TIMESTAMP(6), NOW(6)").sets[0].rows[0];
  EXPECT_EQ(now[0]->size(), 26U);
  const auto db_now = mariadb::ToTime(now[0], "now");
  EXPECT_LT(std::chrono::abs(db_now - std::chrono::system_clock::now()), seconds{5});
  // The session is UTC, so NOW() agrees with UTC_TIMESTAMP().
  EXPECT_LT(std::chrono::abs(mariadb::ToTime(now[1], "now") - db_now), seconds{1});
}

TEST(MariaDbConnectionTest, TimesAndIdsConvertBothWays) {
  const auto time = std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} +
                    std::chrono::hours{7} + std::chrono::microseconds{123456};
  const auto text = mariadb::TimeText(time);
  EXPECT_EQ(text, "2026-11-29 07:00:00.123456");
  EXPECT_EQ(mariadb::ToTime(text, "t"), time);
  EXPECT_EQ(mariadb::ToTime(std::string{"2026-11-29 07:00:00"}, "t"),
            std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{7});
  EXPECT_THROW(mariadb::ToTime(std::string{"2026-13-29 07:00:00"}, "t"), mariadb::MariaDbError);
  EXPECT_THROW(mariadb::ToTime(std::nullopt, "t"), mariadb::MariaDbError);
  const auto id = NewUuidV7();
  EXPECT_EQ(mariadb::ToId(mariadb::IdBytes(id).data, "id"), id);
  EXPECT_THROW(mariadb::ToId(std::string{"short"}, "id"), mariadb::MariaDbError);
}

TEST(MariaDbConnectionTest, ErrorsAreClassified) {
  auto conn = MariaDbConnect();
  try {
    conn.Run("bad", "SELECT * FROM no_such_database_x.no_such_table");
    FAIL();
  } catch (const mariadb::MariaDbError& e) {
    EXPECT_EQ(e.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{e.what()}.find("bad: "), std::string::npos);
  }
  EXPECT_EQ(mariadb::KindOfError(1213), FailureKind::kUnavailable);  // deadlock: run again
  EXPECT_EQ(mariadb::KindOfError(1205), FailureKind::kUnavailable);  // lock wait timeout
  EXPECT_EQ(mariadb::KindOfError(2013), FailureKind::kUnavailable);  // lost connection
  EXPECT_EQ(mariadb::KindOfError(1064), FailureKind::kPermanent);    // syntax
  // The connection is still good after a failed statement.
  EXPECT_EQ(MariaDbScalar(conn, "SELECT 1"), "1");
}

TEST(MariaDbConnectionTest, ABusyServerIsGivenUpAtTheDeadline) {
  mariadb::Connection conn{MariaDbUrl(), seconds{1}};
  const auto start = steady_clock::now();
  try {
    conn.Run("sleep", "SELECT SLEEP(5)");
    // MariaDB ends SLEEP at max_statement_time with the result 1 rather than an error.
  } catch (const mariadb::MariaDbError& e) {
    EXPECT_EQ(e.kind(), FailureKind::kUnavailable) << e.what();
  }
  EXPECT_LT(SecondsSince(start), 2.5);
  EXPECT_EQ(conn.Run("after", "SELECT 1").sets[0].rows[0][0], "1");
}

TEST(MariaDbConnectionTest, ASilentServerIsGivenUpAndItsSessionEndedBeforeTheReconnect) {
  MariaDbTestSchema schema{false};
  schema.conn().Execute("test", "CREATE TABLE " + schema.name() + ".late (v INT)");
  const auto url = mariadb::ParseUrl(MariaDbUrl());
  TcpProxy proxy(url.host, static_cast<int>(url.port));
  mariadb::Connection conn{ThroughProxy(proxy.port()), seconds{1}};
  const auto old_session = MariaDbScalar(conn, "SELECT CONNECTION_ID()");
  const std::string insert = "INSERT INTO " + schema.name() + ".late VALUES (?)";
  const mariadb::Value first[] = {std::int64_t{1}};
  conn.Run("prepared", insert, first);  // prepared now: the frozen call only executes
  proxy.SetMode(TcpProxy::Mode::kFreeze);
  const auto start = steady_clock::now();
  try {
    const mariadb::Value second[] = {std::int64_t{2}};
    conn.Run("frozen", insert, second);
    FAIL() << "no error through a frozen proxy";
  } catch (const mariadb::MariaDbError& e) {
    // Autocommitted: it may have committed.
    EXPECT_EQ(e.kind(), FailureKind::kOutcomeUnknown) << e.what();
  }
  const double took = SecondsSince(start);
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 4.0);  // the read timeout: the deadline rounded up to seconds, plus one
  // Reconnected (new connections go through); the old session is gone before that returns.
  EXPECT_NE(MariaDbScalar(conn, "SELECT CONNECTION_ID()"), old_session);
  const mariadb::Value id[] = {std::int64_t{std::stoll(*old_session)}};
  EXPECT_EQ(MariaDbScalar(schema.conn(),
                          "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id),
            "0");
  // Thawed: the frozen INSERT's bytes reach a session that no longer exists.
  proxy.SetMode(TcpProxy::Mode::kForward);
  std::this_thread::sleep_for(milliseconds{300});
  EXPECT_EQ(MariaDbScalar(schema.conn(), "SELECT COUNT(*) FROM " + schema.name() + ".late"), "1");
}

TEST(MariaDbConnectionTest, AStatementNeverPreparedIsUnavailableWhenTheServerIsSilent) {
  // Lost while being prepared, it cannot have run: plain unavailable, not outcome unknown.
  const auto url = mariadb::ParseUrl(MariaDbUrl());
  TcpProxy proxy(url.host, static_cast<int>(url.port));
  mariadb::Connection conn{ThroughProxy(proxy.port()), seconds{1}};
  proxy.SetMode(TcpProxy::Mode::kFreeze);
  try {
    conn.Run("frozen", "SELECT 42");
    FAIL() << "no error through a frozen proxy";
  } catch (const mariadb::MariaDbError& e) {
    EXPECT_EQ(e.kind(), FailureKind::kUnavailable) << e.what();
  }
  proxy.SetMode(TcpProxy::Mode::kForward);
  EXPECT_EQ(MariaDbScalar(conn, "SELECT 42"), "42");
}

TEST(MariaDbMigrationsTest, MigrateTwiceIsANoOpAndRecordsTheVersion) {
  MariaDbTestSchema schema{false};
  auto& conn = schema.conn();
  EXPECT_EQ(mariadb::Migrate(conn.Ready(), schema.name()), 0);
  EXPECT_EQ(mariadb::Migrate(conn.Ready(), schema.name()), mariadb::LatestSchemaVersion());
  EXPECT_EQ(MariaDbScalar(conn, "SELECT MAX(version) FROM " + schema.name() + ".schema_version"),
            std::to_string(mariadb::LatestSchemaVersion()));
  EXPECT_EQ(MariaDbScalar(conn, "SELECT partition_count FROM " + schema.name() + ".settings"),
            "64");
}

TEST(MariaDbMigrationsTest, RefusesABadSchemaNameAndAVersionOutOfRange) {
  EXPECT_THROW(mariadb::Migrate(MariaDbUrl(), "outbox; DROP DATABASE x"), std::invalid_argument);
  EXPECT_THROW(mariadb::MigrationScript("outbox", -1), std::invalid_argument);
  EXPECT_THROW(mariadb::MigrationScript("outbox", mariadb::LatestSchemaVersion() + 1),
               std::invalid_argument);
  EXPECT_THROW(mariadb::MigrationScript("1abc"), std::invalid_argument);
}

TEST(MariaDbMigrationsTest, ThePrintedScriptReadsAsItsStatements) {
  const std::string script = mariadb::MigrationScript("billing_outbox");
  EXPECT_NE(script.find("CREATE DATABASE IF NOT EXISTS `billing_outbox`"), std::string::npos);
  EXPECT_EQ(script.find("__SCHEMA__"), std::string::npos);
  // What Migrate runs is what the script says: the same statements, split the same way.
  std::size_t statements = 0;
  for (const auto& migration : mariadb::Migrations()) {
    statements += mariadb::SplitStatements(migration.sql, "`billing_outbox`").size();
  }
  EXPECT_GT(statements, 5U);
  const auto split = mariadb::SplitStatements(
      "-- a comment\nSELECT 1;\nDELIMITER //\nCREATE PROCEDURE __SCHEMA__.p() BEGIN\n  SELECT "
      "1;\nEND //\nDELIMITER ;\nSELECT 2;\n",
      "`s`");
  ASSERT_EQ(split.size(), 3U);
  EXPECT_EQ(split[0], "SELECT 1\n");
  EXPECT_NE(split[1].find("CREATE PROCEDURE `s`.p() BEGIN\n  SELECT 1;\nEND"), std::string::npos);
  EXPECT_EQ(split[2], "SELECT 2\n");
  EXPECT_THROW(mariadb::SplitStatements("SELECT 1", "`s`"), std::logic_error);
}

}  // namespace
}  // namespace outbox::testing
