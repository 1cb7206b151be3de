#include "database_config.h"

#include <toml.hpp>  // the parsed file (config::TomlValue)

#include "database_list.h"
#include "outbox/config/toml_file.h"
#include "outbox/store/postgres_type.h"
#include "store_types.h"

namespace outboxctl {

namespace {

// [database] of the parsed file, as outboxd reads it: "postgres" unless `type` says otherwise.
Database SingleDatabase(const outbox::config::TomlValue& root,
                        const outbox::config::GetenvFn& getenv) {
  const outbox::config::Section table = outbox::config::Section{&root, ""}.Table("database");
  Database database{.type = "postgres", .settings = nullptr};
  database.settings = outbox::apps::ReadStore(table, getenv, database.type);
  return database;
}

bool NamesMany(const outbox::config::TomlValue& root) {
  const outbox::config::Section top{&root, ""};
  return top.Find("databases") != nullptr || top.Find("discovery") != nullptr;
}

// `listed` (the [[databases]] tables) and, with [discovery], the catalog's rows after them.
outbox::apps::CatalogDatabases ManyDatabases(const outbox::config::TomlValue& root,
                                             const outbox::config::GetenvFn& getenv,
                                             std::vector<outbox::NamedDatabase> listed) {
  const auto discovery = outbox::apps::ReadDiscovery(outbox::config::Section{&root, ""}, getenv);
  if (!discovery) return {.databases = std::move(listed), .refused = {}};
  const auto catalog = outbox::apps::OpenCatalog(*discovery);
  return outbox::apps::ReadCatalog(*catalog, *discovery, listed);
}

std::vector<outbox::NamedDatabase> Listed(const outbox::config::TomlValue& root,
                                          const outbox::config::GetenvFn& getenv) {
  return outbox::apps::ReadDatabaseList(outbox::config::Section{&root, ""}, getenv);
}

}  // namespace

Database LoadDatabase(const std::string& path, const outbox::config::GetenvFn& getenv,
                      const std::string& name) {
  const outbox::config::TomlValue root =
      outbox::config::ParseToml(outbox::config::ReadConfigFile(path), path);
  if (!NamesMany(root)) {
    if (!name.empty()) {
      throw outbox::ConfigError("--database",
                                "the file names one database ([database]), not many: leave "
                                "--database out");
    }
    return SingleDatabase(root, getenv);
  }
  if (name.empty()) {
    throw outbox::ConfigError("--database",
                              "the file names many databases ([[databases]], [discovery]): "
                              "choose one with --database NAME (migrate takes --all)");
  }
  // The file's own list first: the catalog is read only for a name it does not have.
  std::vector<outbox::NamedDatabase> listed = Listed(root, getenv);
  for (const outbox::NamedDatabase& database : listed) {
    if (database.name == name) return {.type = database.type, .settings = database.settings};
  }
  for (const outbox::NamedDatabase& database :
       ManyDatabases(root, getenv, std::move(listed)).databases) {
    if (database.name == name) return {.type = database.type, .settings = database.settings};
  }
  throw outbox::ConfigError("--database", "no database named " + outbox::config::Quoted(name) +
                                              " in [[databases]] or the catalog");
}

AllDatabases LoadAllDatabases(const std::string& path, const outbox::config::GetenvFn& getenv) {
  const outbox::config::TomlValue root =
      outbox::config::ParseToml(outbox::config::ReadConfigFile(path), path);
  if (!NamesMany(root)) {
    Database single = SingleDatabase(root, getenv);
    return {.databases =
                {{.name = "", .type = single.type, .settings = single.settings, .fingerprint = {}}},
            .refused = {}};
  }
  auto many = ManyDatabases(root, getenv, Listed(root, getenv));
  return {.databases = std::move(many.databases), .refused = std::move(many.refused)};
}

Database PostgresDatabase(const std::string& conninfo, const std::string& schema) {
  return {.type = "postgres",
          .settings = std::make_shared<const outbox::postgres::StoreSettings>(conninfo, schema)};
}

}  // namespace outboxctl
