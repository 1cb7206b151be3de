#pragma once
// The SQLite store type for outboxd's [database] table (store/registry.h):
//
//   [database]
//   type = "sqlite"
//   path = "/var/lib/app/app.db"   # required; created and migrated at start when missing
//
// One relay per database file: no partition leases.

#include <string>
#include <utility>

#include "outbox/store/registry.h"

namespace outbox::sqlite {

class StoreSettings final : public outbox::StoreSettings {
 public:
  explicit StoreSettings(std::string path) : path_(std::move(path)) {}
  void Describe(config::TomlWriter& out) const override;
  [[nodiscard]] std::string Description() const override { return "SQLite database " + path_; }
  void Prepare() const override;
  [[nodiscard]] std::unique_ptr<Store> OpenStore(const RetryPolicy& retry,
                                                 const RetentionPolicy& retention) const override;
  [[nodiscard]] std::unique_ptr<Wakeup> OpenWakeup() const override;
  [[nodiscard]] std::unique_ptr<Admin> OpenAdmin(
      std::chrono::milliseconds statement_timeout) const override;
  // The database file (a relative path is relative to the working directory).
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// type = "sqlite".
StoreType Type();

}  // namespace outbox::sqlite
