#pragma once
// The MariaDB schema's migrations: SQL files (sql/NNN_*.sql) compiled into the library, each a
// script for the `mariadb` client (statements end with ';', stored routines are wrapped in
// DELIMITER // ... //), split into statements here.

#include <string>
#include <string_view>
#include <vector>

namespace outbox::mariadb {

class Connection;

struct Migration {
  int version;
  std::string_view name;
  std::string_view sql;
};

// Every migration, by version (1, 2, ...).
const std::vector<Migration>& Migrations();

// The statements of a script in the `mariadb` client's syntax, each without its delimiter and
// with `__SCHEMA__` replaced by `quoted_schema`; comment lines (starting with --) are dropped. A
// statement ends on a line that ends with the current delimiter.
std::vector<std::string> SplitStatements(std::string_view script, const std::string& quoted_schema);

// Throws StoreError(kPermanent) telling the operator to run `outboxctl migrate` unless `schema`
// is at LatestSchemaVersion() (what every Open* checks before it serves).
void RequireSchemaVersion(Connection& connection, const std::string& schema);

}  // namespace outbox::mariadb
