#include "database_list.h"

#include <set>
#include <string_view>
#include <toml.hpp>  // the parsed tables (config::TomlValue)

#include "outbox/config/toml_file.h"
#include "outbox/core/error.h"
#include "outbox/store/postgres_catalog.h"
#include "store_types.h"

namespace outbox::apps {
namespace {

using config::Fail;
using config::GetenvFn;
using config::Quoted;
using config::Section;
using config::TomlValue;
using config::TypeName;

constexpr std::chrono::milliseconds kHour{std::chrono::hours{1}};

// What tells one database's settings from another's (NamedDatabase::fingerprint).
std::string Fingerprint(const std::string& type, const StoreSettings& settings) {
  config::TomlWriter out;
  out.String("type", type);
  settings.Describe(out);
  return out.Take();
}

}  // namespace

std::shared_ptr<const StoreSettings> ReadStore(const Section& table, const GetenvFn& getenv,
                                               std::string& type_name) {
  const StoreRegistry& types = StoreTypes();
  table.Read("type", type_name);
  const StoreType* type = types.Find(type_name);
  if (type == nullptr) {
    Fail(table.Key("type"),
         "unknown store type " + Quoted(type_name) + "; expected " + types.Names(),
         table.Find("type"));
  }
  return type->parse(table, getenv);
}

std::vector<NamedDatabase> ReadDatabaseList(const Section& root, const GetenvFn& getenv) {
  std::vector<NamedDatabase> databases;
  const TomlValue* list = root.Find("databases");
  if (list == nullptr) return databases;
  if (!list->is_array()) {
    Fail("databases", "expected an array of tables ([[databases]]), got " + TypeName(list->type()),
         list);
  }
  const GetenvFn without_url = [&getenv](const char* name) -> const char* {
    return std::string_view{name} == "OUTBOX_DATABASE_URL" ? nullptr : getenv(name);
  };
  std::set<std::string> names;
  std::size_t index = 0;
  for (const TomlValue& entry : list->as_array()) {
    const std::string path = "databases[" + std::to_string(index++) + "]";
    if (!entry.is_table()) Fail(path, "expected a table, got " + TypeName(entry.type()), &entry);
    const Section table{&entry, path};
    NamedDatabase database;
    if (!table.Read("name", database.name)) Fail(table.Key("name"), "is required", &entry);
    try {
      ValidateDatabaseName(database.name);
    } catch (const ConfigError& error) {
      Fail(table.Key("name"), error.message(), table.Find("name"));
    }
    if (!names.insert(database.name).second) {
      Fail(table.Key("name"), Quoted(database.name) + " names two databases", table.Find("name"));
    }
    std::string type = "postgres";
    database.settings = ReadStore(table.WithCommonKeys({"name"}), without_url, type);
    database.type = type;
    database.fingerprint = Fingerprint(type, *database.settings);
    databases.push_back(std::move(database));
  }
  if (databases.empty() && root.Find("discovery") == nullptr) {
    Fail("databases", "names no database", list);
  }
  return databases;
}

std::optional<DiscoveryConfig> ReadDiscovery(const Section& root, const GetenvFn& getenv) {
  const TomlValue* table = root.Find("discovery");
  if (table == nullptr) return std::nullopt;
  if (!table->is_table())
    Fail("discovery", "expected a table, got " + TypeName(table->type()), table);
  const Section discovery{table, "discovery"};
  discovery.AllowOnly({"url", "query", "interval", "type", "statement_deadline"});
  DiscoveryConfig out;
  discovery.ReadSecret("url", "OUTBOX_DISCOVERY_URL", getenv, out.url, /*required=*/true);
  if (!discovery.Read("query", out.query) ||
      out.query.find_first_not_of(" \t\r\n") == std::string::npos) {
    Fail(discovery.Key("query"),
         "is required: a query returning the columns name and url (and optionally schema)",
         discovery.Find("query"));
  }
  discovery.ReadDuration("interval", std::chrono::seconds{1}, kHour, out.interval);
  discovery.ReadDuration("statement_deadline", std::chrono::seconds{1}, kHour,
                         out.statement_deadline);
  discovery.Read("type", out.type);
  if (outbox::apps::StoreTypes().Find(out.type) == nullptr) {
    Fail(discovery.Key("type"),
         "unknown store type " + Quoted(out.type) + "; expected " +
             outbox::apps::StoreTypes().Names(),
         discovery.Find("type"));
  }
  return out;
}

NamedDatabase DiscoveredDatabase(const DiscoveryConfig& discovery, const CatalogEntry& entry) {
  ValidateDatabaseName(entry.name);
  config::TomlWriter table;
  table.String("type", discovery.type);
  table.String(discovery.type == "sqlite" ? "path" : "url", entry.url);
  if (entry.schema) table.String("schema", *entry.schema);
  const std::string text = table.Take();
  const TomlValue root = config::ParseToml(text, "the catalog's row " + Quoted(entry.name));
  NamedDatabase database{.name = entry.name};
  std::string type = discovery.type;
  const GetenvFn no_environment = [](const char*) -> const char* { return nullptr; };
  try {
    database.settings = ReadStore(Section{&root, ""}, no_environment, type);
    database.type = type;
  } catch (const ConfigError& error) {
    // The store type names its key ("url", "schema"): the catalog's column of that name.
    throw ConfigError(error.key() == "path" ? "url" : error.key(), error.message());
  }
  database.fingerprint = text;
  return database;
}

CatalogDatabases ReadCatalog(Catalog& catalog, const DiscoveryConfig& discovery,
                             const std::vector<NamedDatabase>& static_list) {
  const std::vector<CatalogEntry> rows = catalog.Read();
  CatalogDatabases out{.databases = static_list, .refused = {}};
  std::set<std::string> names;
  for (const NamedDatabase& database : static_list) names.insert(database.name);
  for (const CatalogEntry& row : rows) {
    try {
      NamedDatabase database = DiscoveredDatabase(discovery, row);
      if (names.insert(database.name).second) {
        out.databases.push_back(std::move(database));
        continue;
      }
      out.refused.emplace_back(
          row.name,
          "the name is taken by another database (a [[databases]] entry or an earlier row)");
    } catch (const ConfigError& error) {
      out.refused.emplace_back(row.name, error.what());
    }
  }
  return out;
}

std::unique_ptr<Catalog> OpenCatalog(const DiscoveryConfig& discovery) {
  return OpenPostgresCatalog(discovery.url, discovery.query, discovery.statement_deadline);
}

}  // namespace outbox::apps
