#pragma once
// Which database outboxctl works on: the [database] table of an outboxd configuration file
// (--config), read by the store type it names through the registry outboxd uses
// (apps/common/store_types.h), or a PostgreSQL connection string (--db, --schema).

#include <memory>
#include <string>

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
Database LoadDatabase(const std::string& path, const outbox::config::GetenvFn& getenv);

// A PostgreSQL database given by connection string and schema (--db, --schema).
Database PostgresDatabase(const std::string& conninfo, const std::string& schema);

}  // namespace outboxctl
