#pragma once
// Helpers for tests against a real MariaDB: the server from scripts/services, or the one named by
// OUTBOX_TEST_MARIADB_URL. Each test works in a database (the outbox's "schema") of its own,
// dropped afterwards. Links outbox::store_mariadb and reaches its connection layer
// (src/store/mariadb/connection.h).

#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>

#include "connection.h"
#include "outbox/store/mariadb.h"

namespace outbox::testing {

inline std::string MariaDbUrl() {
  const char* url = std::getenv("OUTBOX_TEST_MARIADB_URL");
  return url != nullptr && url[0] != '\0' ? url
                                          : "mariadb://outbox:outbox@127.0.0.1:13306/outbox_test";
}

// A connection of the test's own (no deadline), or an exception telling how to start the server.
inline mariadb::Connection MariaDbConnect(const std::string& url = MariaDbUrl()) {
  try {
    return mariadb::Connection{url, std::chrono::milliseconds{0}};
  } catch (const StoreError& e) {
    throw std::runtime_error(std::string{"cannot connect to the test MariaDB (start it with "
                                         "scripts/services): "} +
                             e.what());
  }
}

// The first column of the first row of `sql`'s result, or nullopt for NULL or no row.
inline std::optional<std::string> MariaDbScalar(mariadb::Connection& conn, const std::string& sql,
                                                std::span<const mariadb::Value> params = {}) {
  auto result = conn.Run("test", sql, params);
  if (result.sets.empty() || result.sets[0].rows.empty()) return std::nullopt;
  return result.sets[0].rows[0].at(0);
}

// A database of its own, migrated; dropped when this object dies.
class MariaDbTestSchema {
 public:
  explicit MariaDbTestSchema(bool migrate = true) : conn_(MariaDbConnect()) {
    std::random_device device;
    name_ = "t_" + std::to_string(device()) + "_" + std::to_string(device() % 100000);
    if (!migrate) {
      conn_.Execute("test", "CREATE DATABASE " + name_);
      return;
    }
    try {
      mariadb::Migrate(conn_.Ready(), name_);
    } catch (...) {
      Drop();  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~MariaDbTestSchema() { Drop(); }
  MariaDbTestSchema(const MariaDbTestSchema&) = delete;
  MariaDbTestSchema& operator=(const MariaDbTestSchema&) = delete;

  [[nodiscard]] const std::string& name() const { return name_; }
  mariadb::Connection& conn() { return conn_; }

 private:
  void Drop() {
    try {
      conn_.Execute("test", "DROP DATABASE IF EXISTS " + name_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the server may be down on purpose
    }
  }

  mariadb::Connection conn_;
  std::string name_;
};

}  // namespace outbox::testing
