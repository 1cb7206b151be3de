// The statement deadline and silent-peer defaults of the relay's connections (issue #40,
// outbox/store/postgres_libpq.h), against the real PostgreSQL, directly and through a proxy that
// freezes the open connections.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "connection.h"
#include "support/pg_test_support.h"
#include "support/tcp_proxy.h"

namespace outbox::testing {
namespace {

using postgres::PgError;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// The options a connection was made with (PQconninfo), by keyword.
std::map<std::string, std::string> OptionsOf(PGconn* conn) {
  std::map<std::string, std::string> values;
  PQconninfoOption* options = PQconninfo(conn);
  for (PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    if (option->val != nullptr) values[option->keyword] = option->val;
  }
  PQconninfoFree(options);
  return values;
}

std::string ThroughProxy(int port) {
  const auto conn = Connect();
  return std::string{"host=127.0.0.1 port="} + std::to_string(port) + " dbname='" +
         PQdb(conn.get()) + "' user='" + PQuser(conn.get()) + "' password='" + PQpass(conn.get()) +
         "'";
}

std::pair<std::string, int> Upstream() {
  const auto conn = Connect();
  return {PQhost(conn.get()), std::stoi(PQport(conn.get()))};
}

double SecondsSince(steady_clock::time_point start) {
  return std::chrono::duration<double>(steady_clock::now() - start).count();
}

TEST(PgDeadlineTest, SilentPeerDefaultsFollowTheDeadline) {
  unsetenv("PGCONNECT_TIMEOUT");
  const auto defaults = postgres::SilentPeerDefaults(seconds{15});
  const std::map<std::string, std::string> got(defaults.begin(), defaults.end());
  const std::map<std::string, std::string> expected{
      {"connect_timeout", "15"},    {"keepalives", "1"},       {"keepalives_idle", "5"},
      {"keepalives_interval", "2"}, {"keepalives_count", "3"}, {"tcp_user_timeout", "15000"}};
  EXPECT_EQ(got, expected);
  const auto short_defaults = postgres::SilentPeerDefaults(seconds{1});
  const std::map<std::string, std::string> short_got(short_defaults.begin(), short_defaults.end());
  EXPECT_EQ(short_got.at("connect_timeout"), "2");  // libpq takes 1 as 2 anyway
  EXPECT_EQ(short_got.at("keepalives_idle"), "1");
  EXPECT_EQ(short_got.at("keepalives_interval"), "1");
  EXPECT_TRUE(postgres::SilentPeerDefaults(milliseconds{0}).empty());
}

TEST(PgDeadlineTest, WhatTheUrlSetsWinsOverTheDefaults) {
  const std::string url = PgUrl();
  const char* glue = url.find('?') == std::string::npos ? "?" : "&";
  const auto conn =
      postgres::Connect(url + glue + "keepalives_idle=42&tcp_user_timeout=1234", seconds{15});
  ASSERT_EQ(PQstatus(conn.get()), CONNECTION_OK) << PQerrorMessage(conn.get());
  const auto options = OptionsOf(conn.get());
  EXPECT_EQ(options.at("keepalives_idle"), "42");
  EXPECT_EQ(options.at("tcp_user_timeout"), "1234");
  EXPECT_EQ(options.at("keepalives_interval"), "2");  // the default, not set by the URL
  EXPECT_EQ(options.at("keepalives"), "1");
  EXPECT_EQ(postgres::DeadlineOf(conn.get()), seconds{15});
}

TEST(PgDeadlineTest, AConnectionOfTheCallersHasNoDeadlineUntilItIsGivenOne) {
  const auto conn = Connect();
  EXPECT_EQ(postgres::DeadlineOf(conn.get()), milliseconds{0});
  postgres::SetDeadline(conn.get(), milliseconds{2500});
  EXPECT_EQ(postgres::DeadlineOf(conn.get()), milliseconds{2500});
  postgres::SetDeadline(conn.get(), milliseconds{0});
  EXPECT_EQ(postgres::DeadlineOf(conn.get()), milliseconds{0});
}

TEST(PgDeadlineTest, ExecWithADeadlineReturnsResultsAndClassifiesServerErrors) {
  postgres::Connection connection(PgUrl(), {}, seconds{5});
  EXPECT_EQ(postgres::DeadlineOf(connection.get()), seconds{5});
  const auto result =
      postgres::Exec(connection.Ready(), "add", "SELECT $1::int + 1", {postgres::Param{"41"}});
  EXPECT_EQ(std::string{PQgetvalue(result.get(), 0, 0)}, "42");
  try {
    postgres::Exec(connection.Ready(), "divide", "SELECT 1/0");
    ADD_FAILURE() << "no error";
  } catch (const PgError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent) << error.what();
    EXPECT_EQ(error.sqlstate(), "22012");
  }
  // The connection is still usable after a server error.
  EXPECT_EQ(PQstatus(connection.get()), CONNECTION_OK);
  postgres::Exec(connection.Ready(), "again", "SELECT 1");
}

TEST(PgDeadlineTest, AStatementLongerThanTheDeadlineEndsAtItAndTheConnectionComesBack) {
  postgres::Connection connection(PgUrl(), {}, seconds{1});
  const auto start = steady_clock::now();
  try {
    postgres::Exec(connection.Ready(), "sleep", "SELECT pg_sleep(5)");
    ADD_FAILURE() << "no error";
  } catch (const PgError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kOutcomeUnknown) << error.what();
    EXPECT_NE(std::string{error.what()}.find("no answer from PostgreSQL within 1000 ms"),
              std::string::npos)
        << error.what();
  }
  const double took = SecondsSince(start);
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 2.0);
  EXPECT_NE(PQstatus(connection.get()), CONNECTION_OK);
  postgres::Exec(connection.Ready(), "after", "SELECT 1");  // reconnected
}

TEST(PgDeadlineTest, AFrozenPeerIsGivenUpAtTheDeadlineAndANewConnectionGoesThrough) {
  const auto [host, port] = Upstream();
  TcpProxy proxy(host, port);
  postgres::Connection connection(ThroughProxy(proxy.port()), {}, seconds{1});
  postgres::Exec(connection.Ready(), "before", "SELECT 1");
  proxy.SetMode(TcpProxy::Mode::kFreeze);
  const auto start = steady_clock::now();
  try {
    postgres::Exec(connection.Ready(), "frozen", "SELECT 1");
    ADD_FAILURE() << "no error through a frozen proxy";
  } catch (const PgError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kOutcomeUnknown) << error.what();
  }
  const double took = SecondsSince(start);
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 2.0);
  std::printf("[ deadline ] frozen peer given up after %.2f s (deadline 1 s)\n", took);
  // Still frozen for the old connections; a new one is forwarded.
  const auto result = postgres::Exec(connection.Ready(), "after", "SELECT 7");
  EXPECT_EQ(std::string{PQgetvalue(result.get(), 0, 0)}, "7");
}

// A statement given up at its deadline may still be in the network (here: in the frozen proxy)
// and reach its server session later, where it would run after the caller has moved on: a claim
// leasing messages its relay no longer knows of, so that later messages of their streams went
// first (bench/chaos, freeze-db). The reconnect ends the old session first (pg_terminate_backend,
// waiting for it to go), so what it had not run yet never runs.
TEST(PgDeadlineTest, AStatementGivenUpAtTheDeadlineNeverRunsAfterTheReconnect) {
  TestSchema schema;
  Sql(schema.conn(), "CREATE TABLE " + schema.name() + ".late (n int)");
  const auto [host, port] = Upstream();
  TcpProxy proxy(host, port);
  postgres::Connection connection(ThroughProxy(proxy.port()), {}, seconds{1});
  const int old_backend = PQbackendPID(connection.Ready());
  proxy.SetMode(TcpProxy::Mode::kFreeze);
  EXPECT_THROW(postgres::Exec(connection.Ready(), "frozen",
                              "INSERT INTO " + schema.name() + ".late VALUES (1)"),
               PgError);
  // Reconnected (new connections go through); the old session is gone before it returns.
  postgres::Exec(connection.Ready(), "after", "SELECT 1");
  EXPECT_NE(PQbackendPID(connection.get()), old_backend);
  EXPECT_EQ(Scalar(schema.conn(), "SELECT count(*) FROM pg_stat_activity WHERE pid = " +
                                      std::to_string(old_backend)),
            "0");
  // Thawed: the frozen INSERT's bytes are forwarded now, to a session that no longer exists.
  proxy.SetMode(TcpProxy::Mode::kForward);
  std::this_thread::sleep_for(milliseconds{500});
  EXPECT_EQ(Scalar(schema.conn(), "SELECT count(*) FROM " + schema.name() + ".late"), "0")
      << "the statement given up at its deadline ran after the reconnect";
}

TEST(PgDeadlineTest, TheProxysOtherModesStillWorkAfterAFreeze) {
  const auto [host, port] = Upstream();
  TcpProxy proxy(host, port);
  postgres::Connection connection(ThroughProxy(proxy.port()), {}, seconds{1});
  proxy.SetMode(TcpProxy::Mode::kFreeze);
  proxy.SetMode(TcpProxy::Mode::kForward);  // thaws the frozen connections
  postgres::Exec(connection.Ready(), "thawed", "SELECT 1");
  EXPECT_EQ(PQstatus(connection.get()), CONNECTION_OK);
  proxy.DropAll();
  EXPECT_THROW(postgres::Exec(connection.get(), "dropped", "SELECT 1"), PgError);
  postgres::Exec(connection.Ready(), "reconnected", "SELECT 1");
}

}  // namespace
}  // namespace outbox::testing
