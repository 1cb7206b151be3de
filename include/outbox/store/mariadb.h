#pragma once
// The MariaDB (and MySQL 8) store, on MariaDB Connector/C: schema migrations, the writer that
// enqueues in the caller's transaction, the relay-side Store, its wake-up, partition leases and
// the operator's Admin.
//
// The outbox's tables live in a database of their own (`schema`, default "outbox") on the same
// server as the application's: a MariaDB transaction spans the databases of one server, so the
// application writes its rows and calls `outbox.enqueue(...)` in one transaction.
//
// Connection URLs: mariadb://user:password@host:port/database?option=value (mysql:// is the same;
// options: connect_timeout, ssl_mode=disabled|preferred|required|verify_ca|verify_identity,
// ssl_ca, unix_socket). The password never appears in errors or logs.
//
// Times are UTC on the database's clock (UTC_TIMESTAMP(6)), whatever the session's time_zone.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/message.h"
#include "outbox/core/random.h"
#include "outbox/core/retry_policy.h"
#include "outbox/store/admin.h"
#include "outbox/store/partitions.h"
#include "outbox/store/store.h"
#include "outbox/store/wakeup.h"

// Connector/C's connection type, declared so that this header does not pull in mysql.h.
struct st_mysql;

namespace outbox::mariadb {

inline constexpr std::string_view kDefaultSchema = "outbox";

// The bound on every statement when the caller names none: a server that stops answering is given
// up after this long (read/write timeouts and max_statement_time), as PostgreSQL's
// statement_deadline.
inline constexpr std::chrono::milliseconds kDefaultStatementDeadline{std::chrono::seconds{15}};

// The schema version this library's migrations bring a database to.
int LatestSchemaVersion();

// Brings `schema` (a database on the server) up to LatestSchemaVersion(), creating it if needed;
// idempotent and safe to run from several processes at once (they take turns on GET_LOCK).
// MariaDB commits DDL at once, so a migration that fails half-way leaves what it had done; running
// Migrate again finishes it (each step is written to be repeatable). Returns the version before.
// Throws StoreError when the server cannot be reached or a migration fails, std::invalid_argument
// for a schema name that is not a plain identifier.
int Migrate(const std::string& url, const std::string& schema = std::string{kDefaultSchema});
int Migrate(st_mysql* conn, const std::string& schema = std::string{kDefaultSchema});

// The SQL Migrate runs to bring `schema` from version `from` (0: nothing there yet) to
// LatestSchemaVersion(), as a script for the `mariadb` client (it uses DELIMITER for the stored
// routines). Throws std::invalid_argument for a `from` outside 0..LatestSchemaVersion() or a
// schema name that is not a plain identifier.
std::string MigrationScript(const std::string& schema, int from = 0);

// Writes messages in the caller's transaction on `conn` (an open transaction: after START
// TRANSACTION or with autocommit off; std::logic_error otherwise). Never commits or rolls back.
// Throws InvalidMessage for a message the limits or the database refuse, StoreError when the
// connection fails (error 1213, a deadlock, is kUnavailable: roll back and run the transaction
// again).
class Writer {
 public:
  explicit Writer(std::string schema = std::string{kDefaultSchema}, MessageLimits limits = {});

  // Returns, per message, its event id: the id of its first copy (its only one when it goes to one
  // target; see NewMessage::targets).
  std::vector<MessageId> Enqueue(st_mysql* conn, std::span<const NewMessage> messages) const;
  MessageId Enqueue(st_mysql* conn, const NewMessage& message) const;
  // The same, returning the ids of all copies of each message, in the order of its targets.
  std::vector<std::vector<MessageId>> EnqueueCopies(st_mysql* conn,
                                                    std::span<const NewMessage> messages) const;

 private:
  std::string schema_;
  MessageLimits limits_;
};

struct StoreOptions {
  std::string url;  // mariadb:// or mysql:// URL
  std::string schema{kDefaultSchema};
  RetryPolicy retry;
  RetentionPolicy retention;
  std::chrono::milliseconds statement_deadline = kDefaultStatementDeadline;
  UniformRandom random;  // retry jitter; DefaultRandom() when empty
};

// Opens the relay-side Store on a connection of its own. The schema must have been migrated.
// Throws StoreError(kUnavailable) when the server cannot be reached, ConfigError for bad options.
std::unique_ptr<Store> OpenStore(StoreOptions options);

// The relay's wake-up (outbox/store/wakeup.h). MariaDB has no NOTIFY: Wait polls for claimable
// work on a connection of its own, often just after work and less often the longer the relay
// idles (between `min_poll` and `max_poll`); Interrupt (the in-process hand-off) ends it at once.
struct WakeupOptions {
  std::string url;
  std::string schema{kDefaultSchema};
  std::chrono::milliseconds min_poll{5};
  std::chrono::milliseconds max_poll{200};
  std::chrono::milliseconds statement_deadline = kDefaultStatementDeadline;
};
std::unique_ptr<Wakeup> OpenWakeup(WakeupOptions options);

// The partition leases of `schema` (store/partitions.h) on a connection of their own.
std::unique_ptr<PartitionLeases> OpenPartitionLeases(
    const std::string& url, const std::string& schema = std::string{kDefaultSchema},
    std::chrono::milliseconds statement_deadline = kDefaultStatementDeadline);

// The operator's side (outbox/store/admin.h) on a connection of its own. A positive
// `statement_timeout` bounds each statement (max_statement_time and the lock wait); zero leaves
// the bound at `statement_deadline` (the store's, as every other connection's; zero: none).
// Throws std::invalid_argument for a bad schema name or a negative duration, StoreError
// (kPermanent) when the schema is not migrated, (kUnavailable) when the server cannot be reached.
std::unique_ptr<Admin> OpenAdmin(
    const std::string& url, const std::string& schema = std::string{kDefaultSchema},
    std::chrono::milliseconds statement_timeout = std::chrono::seconds{30},
    std::chrono::milliseconds statement_deadline = kDefaultStatementDeadline);

}  // namespace outbox::mariadb
