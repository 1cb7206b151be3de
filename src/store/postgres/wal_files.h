#pragma once
// A schema's WAL records read back from the server's WAL files (pg_walinspect's
// pg_get_wal_records_info), for when its slot is gone: what WalSource::ReadWalFiles returns. The
// rows are the server's own descriptions of each record (PostgreSQL 15's rmgr desc functions):
//   LogicalMessage MESSAGE  "transactional, prefix \"outbox\"; payload (4 bytes): 01 02 03 04"
//   Transaction    COMMIT   "2026-11-27 21:20:33.21+00; subxacts: 298438 298439; inval msgs: ..."
//   Transaction    ABORT    "2026-11-27 21:20:33.20+00" (a subtransaction's own, or with subxacts)
// A transaction's records are those of its xid and its subtransactions', in WAL order; it counts
// once its COMMIT (or COMMIT_PREPARED) is read, and not at all after an ABORT.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/store/wal.h"

namespace outbox::postgres {

// One row of pg_get_wal_records_info, the columns the recovery reads.
struct WalFileRecord {
  Lsn start = 0;
  Lsn end = 0;
  std::uint64_t xid = 0;
  std::string resource_manager;
  std::string record_type;
  std::string description;
};

// A committed transaction's records of one prefix, as a slot would give them.
struct WalFileCommit {
  Lsn end_lsn = 0;  // the end of its commit record
  std::vector<std::string> contents;
};

struct WalFileCommits {
  std::vector<WalFileCommit> commits;  // committed after `after`, in commit order
  std::size_t open_records = 0;        // records of transactions with no end read
};

// The payload of a transactional logical message of `prefix`, from its description; nullopt for
// another prefix or a non-transactional message. Throws std::invalid_argument when the text is
// not the server's form (bad hex, a length that does not match).
std::optional<std::string> MessagePayload(std::string_view description, std::string_view prefix);

// The subtransaction ids a COMMIT or ABORT description lists ("subxacts: 1 2"); none when it has
// no such part. Throws std::invalid_argument for a number that is not one.
std::vector<std::uint64_t> Subxacts(std::string_view description);

// The transactions of `prefix` whose commit ends after `after`, from `records` in WAL order.
WalFileCommits CommitsAfter(const std::vector<WalFileRecord>& records, std::string_view prefix,
                            Lsn after);

}  // namespace outbox::postgres
