#include "database_config.h"

#include <toml.hpp>  // the parsed file (config::TomlValue)

#include "outbox/config/toml_file.h"
#include "outbox/store/postgres_type.h"
#include "store_types.h"

namespace outboxctl {

Database LoadDatabase(const std::string& path, const outbox::config::GetenvFn& getenv) {
  const outbox::config::TomlValue root =
      outbox::config::ParseToml(outbox::config::ReadConfigFile(path), path);
  const outbox::config::Section table = outbox::config::Section{&root, ""}.Table("database");
  // As outboxd reads it (apps/outboxd/config.cpp): "postgres" unless `type` says otherwise.
  Database database{.type = "postgres", .settings = nullptr};
  table.Read("type", database.type);
  const outbox::StoreRegistry& types = outbox::apps::StoreTypes();
  const outbox::StoreType* type = types.Find(database.type);
  if (type == nullptr) {
    outbox::config::Fail("database.type",
                         "unknown store type " + outbox::config::Quoted(database.type) +
                             "; expected " + types.Names(),
                         table.Find("type"));
  }
  database.settings = type->parse(table, getenv);
  return database;
}

Database PostgresDatabase(const std::string& conninfo, const std::string& schema) {
  return {.type = "postgres",
          .settings = std::make_shared<const outbox::postgres::StoreSettings>(conninfo, schema)};
}

}  // namespace outboxctl
