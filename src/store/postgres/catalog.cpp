#include <libpq-fe.h>

#include <utility>

#include "connection.h"
#include "outbox/core/error.h"
#include "outbox/store/postgres_catalog.h"
#include "outbox/store/postgres_libpq.h"

namespace outbox {
namespace {

using postgres::ConnPtr;

class PostgresCatalog final : public Catalog {
 public:
  PostgresCatalog(std::string conninfo, std::string query, std::chrono::milliseconds deadline)
      : conninfo_(std::move(conninfo)), query_(std::move(query)), deadline_(deadline) {}

  std::vector<CatalogEntry> Read() override {
    if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) {
      conn_ = postgres::Connect(conninfo_, deadline_);
      if (PQstatus(conn_.get()) != CONNECTION_OK) {
        const std::string why = PQerrorMessage(conn_.get());
        conn_.reset();
        throw StoreError(FailureKind::kUnavailable, "cannot reach the catalog (" +
                                                        postgres::DescribeConninfo(conninfo_) +
                                                        "): " + postgres::Trim(why));
      }
    }
    const postgres::ResultPtr result = postgres::Exec(conn_.get(), "the discovery query", query_);
    const int name = PQfnumber(result.get(), "name");
    const int url = PQfnumber(result.get(), "url");
    const int schema = PQfnumber(result.get(), "schema");
    if (name < 0 || url < 0) {
      throw ConfigError("query", "must return the columns name and url (and optionally schema)");
    }
    std::vector<CatalogEntry> entries;
    const int rows = PQntuples(result.get());
    entries.reserve(static_cast<std::size_t>(rows));
    for (int row = 0; row < rows; ++row) {
      if (PQgetisnull(result.get(), row, name) != 0 || PQgetisnull(result.get(), row, url) != 0) {
        throw ConfigError("query", "row " + std::to_string(row + 1) + " has a null name or url");
      }
      CatalogEntry entry{.name = std::string{postgres::Column(result.get(), row, name)},
                         .url = std::string{postgres::Column(result.get(), row, url)}};
      if (schema >= 0 && PQgetisnull(result.get(), row, schema) == 0) {
        entry.schema = std::string{postgres::Column(result.get(), row, schema)};
      }
      entries.push_back(std::move(entry));
    }
    return entries;
  }

 private:
  const std::string conninfo_;
  const std::string query_;
  const std::chrono::milliseconds deadline_;
  ConnPtr conn_;
};

}  // namespace

std::unique_ptr<Catalog> OpenPostgresCatalog(std::string conninfo, std::string query,
                                             std::chrono::milliseconds deadline) {
  return std::make_unique<PostgresCatalog>(std::move(conninfo), std::move(query), deadline);
}

}  // namespace outbox
