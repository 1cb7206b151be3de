#pragma once

#include <string>
#include <string_view>
#include <vector>

struct pg_conn;

namespace outbox::postgres {

struct Migration {
  int version;
  std::string_view name;
  // With placeholders: __SCHEMA__, __CHANNEL__, __WAKEUP_LOCK__, __WAL_PREFIX__.
  std::string_view sql;
};

// In version order; generated from sql/*.sql.
const std::vector<Migration>& Migrations();

// Throws StoreError(kPermanent) naming the fix (run outboxctl migrate) when `schema` on `conn`
// is missing or older than this build; `where` describes the server for the message.
void RequireSchemaVersion(pg_conn* conn, const std::string& schema, const std::string& where);

}  // namespace outbox::postgres
