#pragma once
// The PostgreSQL store (libpq): schema migrations, the writer that enqueues in the caller's
// transaction, and the relay-side Store.
//
// Connection settings follow libpq's own conventions: a URI or key=value string, with PG*
// environment variables filling what it leaves out. Passwords never appear in errors or logs.

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "outbox/core/message.h"
#include "outbox/core/random.h"
#include "outbox/core/retry_policy.h"
#include "outbox/store/partitions.h"
#include "outbox/store/store.h"
#include "outbox/store/wakeup.h"

// libpq's connection type, declared so that this header does not pull in libpq-fe.h.
struct pg_conn;

namespace outbox::postgres {

inline constexpr std::string_view kDefaultSchema = "outbox";

// The schema version this library's migrations bring a database to.
int LatestSchemaVersion();

// Brings `schema` up to LatestSchemaVersion(), creating it if needed; idempotent and safe to run
// from several processes at once (they serialize on an advisory lock). Returns the version the
// schema had before. Throws StoreError when the database cannot be reached or a migration fails,
// and std::invalid_argument for a schema name that is not a plain identifier.
int Migrate(const std::string& conninfo, const std::string& schema = std::string{kDefaultSchema});
int Migrate(pg_conn* conn, const std::string& schema = std::string{kDefaultSchema});

// The SQL that Migrate runs to bring `schema` from version `from` (0: nothing there yet) to
// LatestSchemaVersion(), as one script for teams whose schema changes go through a migration tool
// or a DBA. It has no BEGIN/COMMIT (apply it in one transaction) and refuses to run, with SQLSTATE
// 55000, unless the schema is at version `from`. Throws std::invalid_argument for a `from` outside
// 0..LatestSchemaVersion() or a schema name that is not a plain identifier.
std::string MigrationScript(const std::string& schema, int from = 0);

// The NOTIFY channel that wakes an idle relay of `schema`: "<schema>_wakeup".
std::string WakeupChannel(const std::string& schema);
// The advisory lock (pg_advisory_xact_lock_shared(hashtext(name))) every enqueue holds until it
// commits: "<schema>.wakeup".
std::string WakeupLockName(const std::string& schema);

// ---- WAL mode (outbox/store/wal.h) ----
// With outbox.settings.delivery = 'wal' (or a topic_settings row's delivery), enqueue emits one
// transactional logical message per copy instead of inserting a row; a relay reads them from the
// schema's logical replication slot with the built-in pgoutput plugin.

// The name of `schema`'s slot: "outbox_<schema>", at most 63 bytes (a longer one ends in a hash
// of the schema's name, so that two long names sharing a start get two slots).
std::string WalSlotName(const std::string& schema);

// Makes `schema` (migrated) ready for WAL mode; idempotent. Creates the publication the relay
// names to pgoutput (kWalPublication, outbox/store/postgres_wal.h: no table, shared by every
// schema of the database) and the slot WalSlotName(schema) (pgoutput) when missing, records it in
// settings.wal_slot and its row in wal_progress; returns the slot's name. Setting delivery to
// 'wal' is left to the operator. `conn` must not be inside a transaction (a slot is created
// outside one). Throws StoreError(kPermanent) naming the fix when the schema is not migrated,
// wal_level is not logical, the role may not replicate, or a slot of that name exists with
// another plugin, in another database, or lost (its WAL removed: it is never recreated silently);
// std::invalid_argument for a schema name that is not a plain identifier, std::logic_error when
// `conn` is inside a transaction. Creating a slot waits until every transaction running in the
// server that has written something ends.
std::string EnsureWalSlot(pg_conn* conn, const std::string& schema = std::string{kDefaultSchema});
std::string EnsureWalSlot(const std::string& conninfo,
                          const std::string& schema = std::string{kDefaultSchema});
// Undoes EnsureWalSlot: sets settings.delivery back to 'table', topic_settings' 'wal' overrides
// to NULL and settings.wal_slot to NULL, then drops the slot if it exists (also when the schema
// is gone). Messages still in the slot, not yet relayed, are lost with it. Throws StoreError when
// the slot is in use (a relay streams it). `conn` must not be inside a transaction.
void DropWalSlot(pg_conn* conn, const std::string& schema = std::string{kDefaultSchema});

// Writes messages in the caller's transaction. It never begins, commits or rolls back; the
// messages become visible to relays when the caller commits and vanish if it rolls back.
class Writer {
 public:
  // `limits` are checked before anything is sent (all but max_payload_bytes, which is left to
  // the database); the database checks its own settings too, whose defaults are the same. If you
  // raise a header limit in outbox.settings, raise it here as well.
  explicit Writer(std::string schema = std::string{kDefaultSchema}, MessageLimits limits = {});

  // Enqueues `messages` on `conn`, which must be inside an open transaction block (after BEGIN);
  // otherwise throws std::logic_error and writes nothing. One round trip for the whole batch
  // (libpq pipeline mode). Returns, per message, its event id: the id of its first copy (its only
  // one when it goes to one target; see NewMessage::targets).
  // Throws InvalidMessage for a message that breaks the limits — before anything is sent when the
  // writer's `limits` refuse it, or after PostgreSQL refused it (payload over settings'
  // max_payload_bytes, or a setting lower than the writer's limit), in which case the caller's
  // transaction is aborted and must be rolled back. Throws StoreError when the connection fails.
  std::vector<MessageId> Enqueue(pg_conn* conn, std::span<const NewMessage> messages) const;
  MessageId Enqueue(pg_conn* conn, const NewMessage& message) const;
  // The same, returning the ids of all copies of each message, in the order of its targets.
  std::vector<std::vector<MessageId>> EnqueueCopies(pg_conn* conn,
                                                    std::span<const NewMessage> messages) const;

 private:
  std::string sql_;
  MessageLimits limits_;
};

struct StoreOptions {
  std::string conninfo;  // libpq URI or key=value string
  std::string schema{kDefaultSchema};
  RetryPolicy retry;
  RetentionPolicy retention;
  // Rows counted exactly per status in Stats(); above this the count is the planner's estimate.
  std::int64_t exact_count_limit = 100000;
  // Random source for retry jitter; DefaultRandom() when empty.
  UniformRandom random;
};

// Opens a Store on its own connection. Throws StoreError(kUnavailable) when the database cannot
// be reached, ConfigError for invalid options. The schema must have been migrated.
std::unique_ptr<Store> OpenStore(StoreOptions options);

// Opens the relay's wake-up channel on a connection of its own: LISTENs on WakeupChannel(schema).
// Throws StoreError(kUnavailable) when the database cannot be reached.
std::unique_ptr<Wakeup> OpenWakeup(const std::string& conninfo,
                                   const std::string& schema = std::string{kDefaultSchema});

// Opens the partition leases of `schema` (store/partitions.h) on a connection of their own, for a
// relay that shares the database with other relays. Throws StoreError(kUnavailable) when the
// database cannot be reached; the schema must have been migrated.
std::unique_ptr<PartitionLeases> OpenPartitionLeases(const std::string& conninfo,
                                                     const std::string& schema = std::string{
                                                         kDefaultSchema});

}  // namespace outbox::postgres
