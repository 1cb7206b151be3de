#pragma once
// Which database outboxctl works on: the [database] table of an outboxd configuration file
// (--config), read by the store type it names through the registry outboxd uses
// (apps/common/store_types.h), or a PostgreSQL connection string (--db, --schema).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "outbox/config/toml_table.h"
#include "outbox/store/registry.h"

namespace outboxctl {

struct Database {
  std::string type;  // the store type's name: "postgres", "sqlite"
  std::shared_ptr<const outbox::StoreSettings> settings;
};

// The [database] table of the outboxd configuration file at `path`, checked as outboxd checks it
// (unknown keys, bad values, the environment's overrides through `getenv`); the file's other
// sections are outboxd's and are not read. Throws outbox::ConfigError naming the key (or "file"
// when the file cannot be read, is not a regular file, is larger than 1 MiB or is not TOML).
// A file that names many databases ([[databases]], [discovery]) needs `name` (--database): its
// [[databases]] table of that name, else the catalog's row (the catalog is read); a ConfigError
// with key "--database" when it names none, or for a name on a file with one [database].
Database LoadDatabase(const std::string& path, const outbox::config::GetenvFn& getenv,
                      const std::string& name = {});

// Every database of the file (`migrate --all`): [database] alone (its name empty), or the
// [[databases]] tables and the catalog's rows (read now), each with its name. A catalog row its
// store type refuses is in `refused` with why.
struct AllDatabases {
  std::vector<outbox::NamedDatabase> databases;
  std::vector<std::pair<std::string, std::string>> refused;
};
AllDatabases LoadAllDatabases(const std::string& path, const outbox::config::GetenvFn& getenv);

// A PostgreSQL database given by connection string and schema (--db, --schema).
Database PostgresDatabase(const std::string& conninfo, const std::string& schema);

}  // namespace outboxctl
