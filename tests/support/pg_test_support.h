#pragma once
// Helpers for tests against a real PostgreSQL: the server from scripts/services, or the one named
// by OUTBOX_TEST_PG_URL. Each test works in a schema of its own, dropped afterwards.

#include <libpq-fe.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "outbox/store/postgres.h"
#include "outbox/store/postgres_libpq.h"

namespace outbox::testing {

inline std::string PgUrl() {
  const char* url = std::getenv("OUTBOX_TEST_PG_URL");
  return url != nullptr && url[0] != '\0'
             ? url
             : "postgresql://outbox:outbox@127.0.0.1:15432/outbox_test";
}

// PgUrl's host and port, for a proxy in front of the server; throws std::runtime_error unless
// PgUrl is a URI naming both.
inline std::pair<std::string, int> PgHostPort() {
  const std::string url = PgUrl();
  const auto at = url.find("://");
  if (at == std::string::npos) throw std::runtime_error("OUTBOX_TEST_PG_URL must be a URI: " + url);
  const auto user = url.find('@', at);
  const auto authority = user != std::string::npos ? user + 1 : at + 3;
  const auto colon = url.find(':', authority);
  const auto slash = url.find('/', authority);
  if (colon == std::string::npos || colon > slash) {
    throw std::runtime_error("no port in OUTBOX_TEST_PG_URL: " + url);
  }
  return {url.substr(authority, colon - authority),
          std::stoi(url.substr(colon + 1, slash - colon - 1))};
}

// PgUrl with further URI parameters ("port=5433&application_name=x").
inline std::string PgUrlWith(const std::string& parameters) {
  const std::string url = PgUrl();
  return url + (url.find('?') == std::string::npos ? "?" : "&") + parameters;
}

// The store's own RAII handles (outbox/store/postgres_libpq.h).
using PgConn = postgres::ConnPtr;
using PgResult = postgres::ResultPtr;

inline PgConn Connect(const std::string& conninfo = PgUrl()) {
  PgConn conn{PQconnectdb(conninfo.c_str())};
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    throw std::runtime_error(
        "cannot connect to the test PostgreSQL (start it with "
        "scripts/services): " +
        std::string{PQerrorMessage(conn.get())});
  }
  PgResult quiet{PQexec(conn.get(), "SET client_min_messages = warning")};
  return conn;
}

// Runs `sql` and throws with the server's message if it fails.
inline PgResult Sql(PGconn* conn, const std::string& sql) {
  PgResult result{PQexec(conn, sql.c_str())};
  const auto status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    throw std::runtime_error(sql.substr(0, 200) + ": " + PQerrorMessage(conn));
  }
  return result;
}

// Runs `sql` expecting it to fail; returns the server's primary error message.
inline std::string RunExpectingError(PGconn* conn, const std::string& sql) {
  PgResult result{PQexec(conn, sql.c_str())};
  if (PQresultStatus(result.get()) != PGRES_FATAL_ERROR) return "<no error>";
  const char* message = PQresultErrorField(result.get(), PG_DIAG_MESSAGE_PRIMARY);
  return message != nullptr ? message : "";
}

inline std::string Scalar(PGconn* conn, const std::string& sql) {
  auto result = Sql(conn, sql);
  if (PQntuples(result.get()) != 1) throw std::runtime_error("expected one row: " + sql);
  return PQgetvalue(result.get(), 0, 0);
}

// A schema of its own, migrated; dropped when this object dies.
class TestSchema {
 public:
  TestSchema() : conn_(Connect()) {
    std::random_device device;
    name_ = "t_" + std::to_string(device()) + "_" + std::to_string(device() % 100000);
    postgres::Migrate(conn_.get(), name_);
  }
  ~TestSchema() {
    PgResult dropped{PQexec(conn_.get(), ("DROP SCHEMA IF EXISTS " + name_ + " CASCADE").c_str())};
  }
  TestSchema(const TestSchema&) = delete;
  TestSchema& operator=(const TestSchema&) = delete;

  const std::string& name() const { return name_; }
  PGconn* conn() const { return conn_.get(); }

 private:
  PgConn conn_;
  std::string name_;
};

// The relay-side store on `schema`, default options.
inline std::unique_ptr<Store> OpenTestStore(const TestSchema& schema) {
  postgres::StoreOptions options;
  options.conninfo = PgUrl();
  options.schema = schema.name();
  return postgres::OpenStore(std::move(options));
}

// A small JSON message on `topic`, keyed when `key` is given.
inline NewMessage TestMessage(std::string topic, std::optional<std::string> key = std::nullopt) {
  NewMessage message;
  message.topic = std::move(topic);
  message.stream_key = std::move(key);
  message.payload = R"({"ok":true})";
  return message;
}

}  // namespace outbox::testing
