#pragma once
// WAL mode on PostgreSQL (outbox/store/wal.h): the slot's reader and its ledger for the outbox in
// `schema`. The slot is the one `outboxctl migrate --wal-slot` created and recorded in the
// schema's settings (settings.wal_slot); the messages are the ones outbox.enqueue emitted with the
// schema's prefix ("outbox" for schema outbox, else "outbox:<schema>").

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "outbox/store/wal.h"

struct pg_conn;

namespace outbox::postgres {

// The publication every outbox slot is read with: pgoutput wants one by name, and an empty one
// (no tables) is enough to receive logical messages.
inline constexpr const char* kWalPublication = "outbox_wal";

// The prefix of the schema's logical messages.
std::string WalPrefix(const std::string& schema);

// settings.wal_slot of the schema. Throws StoreError(kPermanent) naming the fix when there is
// none (outboxctl migrate --wal-slot), kUnavailable when the database cannot be read.
std::string ReadWalSlot(pg_conn* conn, const std::string& schema);

// What `outboxctl status` shows of WAL mode (Admin::Wal), for the outbox in `schema`.
using WalStatus = outbox::WalStatus;
WalStatus ReadWalStatus(pg_conn* conn, const std::string& schema);

// Each opens a connection of its own; both throw StoreError as above, and when the schema is not
// migrated to this build's version.
std::unique_ptr<WalSource> OpenWalSource(const std::string& conninfo, const std::string& schema);
std::unique_ptr<WalLedger> OpenWalLedger(const std::string& conninfo, const std::string& schema);

}  // namespace outbox::postgres
