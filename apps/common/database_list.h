#pragma once
// Many databases in an outboxd configuration file, read the same way by outboxd and outboxctl:
// [[databases]] (each a [database] table with a `name`) and [discovery] (a catalog query whose
// rows name more, store/catalog.h).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/config/toml_table.h"
#include "outbox/store/catalog.h"
#include "outbox/store/registry.h"

namespace outbox::apps {

// [discovery]: the databases to serve, read from a catalog every `interval`.
struct DiscoveryConfig {
  std::string url;    // the catalog, PostgreSQL; OUTBOX_DISCOVERY_URL wins over the file
  std::string query;  // returns the columns name, url and optionally schema
  std::chrono::milliseconds interval{30000};
  std::string type = "postgres";  // the store type of the databases it names
  // How long a read of the catalog may take.
  std::chrono::milliseconds statement_deadline{15000};
};

// The settings a store type (StoreTypes) reads from `table`, after `type` is read there into
// `type_name` (which holds the default). Throws ConfigError naming the key.
std::shared_ptr<const StoreSettings> ReadStore(const config::Section& table,
                                               const config::GetenvFn& getenv,
                                               std::string& type_name);

// The [[databases]] tables of `root` (none when absent), each checked by its store type, the
// names valid and unique. OUTBOX_DATABASE_URL is [database]'s alone and not read here.
std::vector<NamedDatabase> ReadDatabaseList(const config::Section& root,
                                            const config::GetenvFn& getenv);

// [discovery] of `root`, when present.
std::optional<DiscoveryConfig> ReadDiscovery(const config::Section& root,
                                             const config::GetenvFn& getenv);

// A database the catalog names, read by its store type as a [[databases]] table of `type`,
// `name`, `url` (`path` for "sqlite") and `schema` would be. Throws ConfigError naming the
// catalog row's column ("name", "url", "schema") for a value its store type refuses.
NamedDatabase DiscoveredDatabase(const DiscoveryConfig& discovery, const CatalogEntry& entry);

// What the catalog names now, after the static list: the databases to serve, and the rows left
// out with why (a bad value, a name taken). Throws what Catalog::Read throws.
struct CatalogDatabases {
  std::vector<NamedDatabase> databases;                      // the static list first
  std::vector<std::pair<std::string, std::string>> refused;  // row name, why
};
CatalogDatabases ReadCatalog(Catalog& catalog, const DiscoveryConfig& discovery,
                             const std::vector<NamedDatabase>& static_list);

// The catalog [discovery] names (PostgreSQL).
std::unique_ptr<Catalog> OpenCatalog(const DiscoveryConfig& discovery);

}  // namespace outbox::apps
