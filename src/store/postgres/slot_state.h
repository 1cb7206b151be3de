#pragma once
// A replication slot's state as the server sees it (WalSlotState), read the same way by the
// relay's ledger (every few seconds) and by `outboxctl status`.

#include <libpq-fe.h>

#include <string>

#include "outbox/store/wal.h"

namespace outbox::postgres {

// The select-list of WalSlotState's columns, in ReadSlotState's order, over pg_replication_slots
// as `slot` (NULLs of a LEFT JOIN read as a slot that is absent and not read): active,
// wal_status, retained bytes, unconfirmed bytes, and the reader's flush lag (microseconds, NULL
// when the server shows none).
std::string SlotStateColumns(const std::string& slot);

// The columns above from `row`, starting at `column`, into `state` (its `exists` is the
// caller's).
void ReadSlotState(const PGresult* result, int row, int column, WalSlotState& state);

}  // namespace outbox::postgres
