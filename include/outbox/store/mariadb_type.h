#pragma once
// The MariaDB (and MySQL 8) store type for outboxd's [database] table (store/registry.h):
//
//   [database]
//   type = "mariadb"
//   url = "mariadb://user:password@host:3306/app"   # required, or OUTBOX_DATABASE_URL (wins);
//                       # mysql:// is the same; options: outbox/store/mariadb.h
//   schema = "outbox"   # the database the outbox's tables live in, beside the application's
//                       # (a plain identifier); migrated by `outboxctl migrate`
//   statement_deadline = "15s"  # the longest wait for any answer of the server before the
//                       # statement is given up and the connection opened again (1s..1h)
//
// MariaDB has no WAL mode: `mode = "wal"` is refused (`mode = "table"`, the only mode, is
// accepted). Several relays may share one database: outboxd always takes partition leases here.

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "outbox/store/registry.h"

namespace outbox::mariadb {

// The environment variable that wins over [database] url (as for type = "postgres").
inline constexpr const char* kDatabaseUrlEnv = "OUTBOX_DATABASE_URL";
// [database] idle_poll's default: an idle relay asks for new messages 5 times a second, so a
// message written by another process waits 100 ms on average (bench/RESULTS.md).
inline constexpr std::chrono::milliseconds kDefaultIdlePoll{200};

class StoreSettings final : public outbox::StoreSettings {
 public:
  // `url` and `schema` as Parse checks them; throws std::invalid_argument otherwise.
  // `idle_poll`: the longest the wake-up waits between two looks for new messages (it looks every
  // 5 ms just after work and backs off to this while idle).
  StoreSettings(std::string url, std::string schema,
                std::chrono::milliseconds statement_deadline = std::chrono::seconds{15},
                std::chrono::milliseconds idle_poll = kDefaultIdlePoll);
  void Describe(config::TomlWriter& out) const override;
  // "MariaDB database <schema> on <host>:<port>" (no secret).
  [[nodiscard]] std::string Description() const override;
  // `outboxctl migrate`: mariadb::Migrate and MigrationScript on this schema.
  [[nodiscard]] std::optional<SchemaVersions> MigrateSchema() const override;
  [[nodiscard]] std::optional<std::string> MigrationScript(int from) const override;
  [[nodiscard]] std::unique_ptr<Store> OpenStore(const RetryPolicy& retry,
                                                 const RetentionPolicy& retention) const override;
  [[nodiscard]] std::unique_ptr<Wakeup> OpenWakeup() const override;
  // The wake-up polls for new messages, so a writer in any process wakes the relay; the sweep
  // finds what the poll cannot see: messages an operator replays or un-holds (older ids), and a
  // writer's transaction open longer than the poll's window.
  [[nodiscard]] std::chrono::milliseconds DefaultSweepInterval() const override {
    return std::chrono::seconds{5};
  }
  [[nodiscard]] std::unique_ptr<PartitionLeases> OpenPartitionLeases() const override;
  [[nodiscard]] std::unique_ptr<Admin> OpenAdmin(
      std::chrono::milliseconds statement_timeout) const override;
  // The password, decoded and as written in the URL's user info.
  [[nodiscard]] std::vector<std::string> Secrets() const override;
  [[nodiscard]] const std::string& url() const { return url_; }
  [[nodiscard]] const std::string& schema() const { return schema_; }
  [[nodiscard]] std::chrono::milliseconds statement_deadline() const { return deadline_; }
  [[nodiscard]] std::chrono::milliseconds idle_poll() const { return idle_poll_; }

 private:
  std::string url_;
  std::string schema_;
  std::chrono::milliseconds deadline_;
  std::chrono::milliseconds idle_poll_;
};

// type = "mariadb".
StoreType Type();

}  // namespace outbox::mariadb
