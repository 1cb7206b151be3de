#pragma once
// The PostgreSQL store type for outboxd's [database] table (store/registry.h):
//
//   [database]
//   type = "postgres"   # the default
//   url = "postgresql://user:password@host:5432/db"   # required, or OUTBOX_DATABASE_URL (wins)
//   schema = "outbox"   # a plain lower-case identifier; migrated by `outboxctl migrate`
//   mode = "table"      # "wal": also relay the messages outbox.enqueue writes to the WAL
//                       # (outbox/store/wal.h; the slot: `outboxctl migrate --wal-slot`)
//   statement_deadline = "15s"  # the longest wait for any answer of the database before the
//                       # connection is given up and opened again (1s..1h; "0s": none)
//
// Several relays may share one database: outboxd always takes partition leases here.

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "outbox/store/registry.h"

namespace outbox::postgres {

// The environment variable that wins over [database] url.
inline constexpr const char* kDatabaseUrlEnv = "OUTBOX_DATABASE_URL";

class StoreSettings final : public outbox::StoreSettings {
 public:
  StoreSettings(std::string url, std::string schema, bool wal = false,
                std::chrono::milliseconds statement_deadline = std::chrono::seconds{15})
      : url_(std::move(url)),
        schema_(std::move(schema)),
        wal_(wal),
        deadline_(statement_deadline) {}
  void Describe(config::TomlWriter& out) const override;
  [[nodiscard]] std::string Description() const override { return "schema " + schema_; }
  // `outboxctl migrate`: postgres::Migrate, MigrationScript and EnsureWalSlot on this schema.
  [[nodiscard]] std::optional<SchemaVersions> MigrateSchema() const override;
  [[nodiscard]] std::optional<std::string> MigrationScript(int from) const override;
  [[nodiscard]] bool HasWalMode() const override { return true; }
  [[nodiscard]] WalSlotReady EnsureWalSlot() const override;
  [[nodiscard]] std::unique_ptr<Store> OpenStore(const RetryPolicy& retry,
                                                 const RetentionPolicy& retention) const override;
  [[nodiscard]] std::unique_ptr<Wakeup> OpenWakeup() const override;
  // Every enqueue wakes an idle relay (NOTIFY), and retries are woken for when due.
  [[nodiscard]] std::chrono::milliseconds DefaultSweepInterval() const override {
    return std::chrono::seconds{10};
  }
  [[nodiscard]] std::unique_ptr<PartitionLeases> OpenPartitionLeases() const override;
  [[nodiscard]] std::unique_ptr<Admin> OpenAdmin(
      std::chrono::milliseconds statement_timeout) const override;
  [[nodiscard]] bool WalMode() const override { return wal_; }
  [[nodiscard]] std::unique_ptr<WalSource> OpenWalSource() const override;
  [[nodiscard]] std::unique_ptr<WalLedger> OpenWalLedger() const override;
  // The password (and sslpassword) as libpq reads them, and as written in a URI's user info.
  [[nodiscard]] std::vector<std::string> Secrets() const override;
  [[nodiscard]] const std::string& url() const { return url_; }
  [[nodiscard]] const std::string& schema() const { return schema_; }
  [[nodiscard]] std::chrono::milliseconds statement_deadline() const { return deadline_; }

 private:
  std::string url_;  // a libpq URI or key=value string
  std::string schema_;
  bool wal_ = false;
  // [database] statement_deadline: every Open* makes it the process's StatementDeadline().
  std::chrono::milliseconds deadline_;
};

// type = "postgres".
StoreType Type();

}  // namespace outbox::postgres
