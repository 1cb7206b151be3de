#pragma once
// How a store type plugs into outboxd: it registers its name (`[database] type`), a parser for the
// [database] table and, through what the parser returns, everything outboxd opens on that
// database (the relay's store and wake-up, the partition leases when several relays may share it,
// the operator's admin) and its part of --check-config. outboxd loops over the registry; a new
// store type adds its own files (include/outbox/store/<type>*.h, src/store/<type>/) and one
// registration line (apps/outboxd/stores.cpp).

#include <algorithm>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox/config/registry.h"
#include "outbox/config/toml_table.h"
#include "outbox/core/error.h"
#include "outbox/core/retry_policy.h"
#include "outbox/store/admin.h"
#include "outbox/store/partitions.h"
#include "outbox/store/store.h"
#include "outbox/store/wakeup.h"
#include "outbox/store/wal.h"

namespace outbox {

// One [database] table, read and checked by its store type. Immutable once parsed. Each Open*
// returns an object with a connection of its own; they throw StoreError when the database cannot
// be reached and ConfigError for what only opening can tell.
class StoreSettings {
 public:
  virtual ~StoreSettings() = default;
  // The table's keys with their effective values (defaults included), secrets masked, for
  // --check-config; the caller has written the section header and the type.
  virtual void Describe(config::TomlWriter& out) const = 0;
  // What the relay works on, for the start-up log line ("schema outbox", "SQLite database x.db");
  // no secret.
  [[nodiscard]] virtual std::string Description() const = 0;
  // Readies the database before anything opens it (SQLite creates or upgrades its tables, so the
  // embedded store needs no migrate step); nothing where migration is an operator's step.
  virtual void Prepare() const {}
  // The operator's migrate step (`outboxctl migrate`): creates or upgrades the store's tables on
  // a connection of its own. Returns the schema version before and after it; nullopt where the
  // store numbers no versions (the default: Prepare, which readies the database as a start does).
  struct SchemaVersions {
    int before = 0;  // 0: nothing was there
    int after = 0;
  };
  [[nodiscard]] virtual std::optional<SchemaVersions> MigrateSchema() const {
    Prepare();
    return std::nullopt;
  }
  // The SQL MigrateSchema runs from version `from` (0: nothing there yet), for a team whose schema
  // changes go through a migration tool; nullopt where the store has none to print (it readies
  // itself). Throws std::invalid_argument for a version outside 0..the latest.
  [[nodiscard]] virtual std::optional<std::string> MigrationScript(int /*from*/) const {
    return std::nullopt;
  }
  // Whether the store type has a WAL mode at all (outbox/store/wal.h; PostgreSQL), whatever this
  // table's mode.
  [[nodiscard]] virtual bool HasWalMode() const { return false; }
  // Creates what WAL mode reads (a logical replication slot and its publication) unless it is
  // there. Throws std::logic_error where !HasWalMode(), StoreError when the database refuses (no
  // wal_level = logical, no REPLICATION attribute).
  struct WalSlotReady {
    std::string slot;  // its name
    std::string
        setting;  // what turns WAL mode on, once the slot is there: "<schema>.settings.delivery"
  };
  [[nodiscard]] virtual WalSlotReady EnsureWalSlot() const {
    throw std::logic_error(Description() + " has no WAL mode");
  }
  [[nodiscard]] virtual std::unique_ptr<Store> OpenStore(
      const RetryPolicy& retry, const RetentionPolicy& retention) const = 0;
  [[nodiscard]] virtual std::unique_ptr<Wakeup> OpenWakeup() const = 0;
  // relay.sweep_interval when the configuration names none: how often an idle relay looks for
  // work nothing woke it for. Short where writers in other processes cannot wake the relay; long
  // where every writer does (the sweep is then a safety net, and each look is a statement).
  [[nodiscard]] virtual std::chrono::milliseconds DefaultSweepInterval() const {
    return std::chrono::seconds{1};
  }
  // The partition leases of a database that several relays may share; null when one relay per
  // database is the rule (it then claims every partition).
  [[nodiscard]] virtual std::unique_ptr<PartitionLeases> OpenPartitionLeases() const {
    return nullptr;
  }
  // WAL mode (outbox/store/wal.h): true when the relay also reads the database's logical
  // replication slot; its reader and ledger, each on a connection of its own. Null where the store
  // has no WAL mode (only PostgreSQL has one).
  [[nodiscard]] virtual bool WalMode() const { return false; }
  [[nodiscard]] virtual std::unique_ptr<WalSource> OpenWalSource() const { return nullptr; }
  [[nodiscard]] virtual std::unique_ptr<WalLedger> OpenWalLedger() const { return nullptr; }
  // An Admin on a connection of its own. A positive `statement_timeout` bounds each of its
  // statements, waits for locks included (PostgreSQL: statement_timeout; SQLite: the busy
  // timeout); zero leaves the database's default.
  [[nodiscard]] virtual std::unique_ptr<Admin> OpenAdmin(
      std::chrono::milliseconds statement_timeout) const = 0;
  // Every secret the table holds (the database password), in each form the database may quote it
  // back, for the process's redactor (core/secrets.h), as SinkSettings::Secrets.
  [[nodiscard]] virtual std::vector<std::string> Secrets() const { return {}; }
};

struct StoreType {
  std::string name;  // `type = "<name>"` in [database], e.g. "postgres"
  // Reads the [database] table (its `type` already read), rejecting unknown keys by name
  // (Section::AllowOnly, with "type" among them) and bad values through config::Fail. Secrets
  // may come from the environment through `getenv`.
  std::function<std::unique_ptr<const StoreSettings>(const config::Section& table,
                                                     const config::GetenvFn& getenv)>
      parse;
};

// The store types a program knows (outboxd: apps/outboxd/stores.cpp).
class StoreRegistry : public config::Registry<StoreType> {
 public:
  // NOLINTNEXTLINE(google-explicit-constructor): a registry is its list of types
  StoreRegistry(std::initializer_list<StoreType> types = {}) : Registry("store", types) {}
};

// One database of several a process relays (outboxd's [[databases]], [discovery];
// relay/tenant_relays.h): its name (logs, the outbox-database header, the metric label) and its
// store's settings. `fingerprint` tells settings apart: a database whose fingerprint changes is
// restarted with the new settings (StoreSettings has no equality).
struct NamedDatabase {
  std::string name;
  std::string type;  // the store type's name: "postgres", "sqlite", ...
  std::shared_ptr<const StoreSettings> settings;
  std::string fingerprint;
};

// Throws ConfigError("name", why) unless `name` is 1 to 63 bytes of A-Z a-z 0-9 _ . - (it goes
// into a header, a metric label and log lines as is).
inline void ValidateDatabaseName(const std::string& name) {
  constexpr std::size_t kMaxBytes = 63;
  const bool plain = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
  if (name.empty() || name.size() > kMaxBytes || !plain) {
    throw ConfigError("name", "must be 1 to " + std::to_string(kMaxBytes) +
                                  " bytes of A-Z, a-z, 0-9, '_', '.' and '-'");
  }
}

}  // namespace outbox
