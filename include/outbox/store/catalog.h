#pragma once
// A catalog of the databases one relay process serves (outboxd's [discovery]): a query on a
// database of the operator's that returns a row per tenant database, read again every interval,
// so that tenants come and go without a restart.

#include <optional>
#include <string>
#include <vector>

namespace outbox {

// One row of the catalog: the database's name (logs, the outbox-database header, the metric
// label), how to reach it, and optionally its outbox schema.
struct CatalogEntry {
  std::string name;
  std::string url;
  std::optional<std::string> schema;
};

class Catalog {
 public:
  virtual ~Catalog() = default;
  // Runs the query. Throws StoreError when the catalog cannot be read (unreachable, the query
  // fails), and ConfigError("query", why) when its answer does not have the columns name and url
  // (and optionally schema), as text, or a name or url is null. Rows are returned as read.
  virtual std::vector<CatalogEntry> Read() = 0;
};

}  // namespace outbox
