#pragma once
// The operator's side of the PostgreSQL store (the Admin contract of outbox/store/admin.h):
// list and inspect messages, replay abandoned ones, abandon stuck ones, purge old ones, the
// backlog by topic. This is what `outboxctl` drives; a service may use it too.
//
// Every age and retention is compared on the database's clock (now()). A row that a relay
// claims while a replay or abandon statement waits for its lock is skipped when the statement
// re-checks its status, not overwritten.

#include <chrono>
#include <memory>
#include <string>

#include "outbox/store/admin.h"
#include "outbox/store/postgres.h"

namespace outbox::postgres {

// Connects on a connection of its own and checks that `schema` is migrated. Throws
// StoreError(kUnavailable) when the database cannot be reached, StoreError(kPermanent) naming
// `outboxctl migrate` when the schema is missing or older than this build, and
// std::invalid_argument for a schema name that is not a plain identifier. A positive
// `statement_timeout` is the connection's statement_timeout (each statement, lock waits
// included, is cancelled after it: StoreError(kUnavailable)); zero keeps the server's.
std::unique_ptr<Admin> OpenAdmin(const std::string& conninfo,
                                 const std::string& schema = std::string{kDefaultSchema},
                                 std::chrono::milliseconds statement_timeout = {});

}  // namespace outbox::postgres
