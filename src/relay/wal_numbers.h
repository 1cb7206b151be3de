#pragma once
// stream_seq in commit order, for the WAL relay: from the ledger's counters as of the last commit
// (read once per stream and kept while the slot is read without a break). The ledger's counter of
// a stream is the greater of the WAL relay's and the table's (stream_seqs): after a change of
// delivery (`switches`: item indexes) each stream's number is read again, since table-mode
// enqueues may have numbered it meanwhile; what was given but not committed yet stays a floor.

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "outbox/store/wal.h"
#include "wal_batch.h"

namespace outbox::relay {

class WalStreamNumbers {
 public:
  // Numbers the sequenced messages of `items` and puts each stream's last number in `commit`.
  // Throws StoreError when the ledger cannot be read.
  void Assign(std::vector<Item>& items, WalCommit& commit, const std::vector<std::size_t>& switches,
              WalLedger& ledger);
  // After a break (an outage, a lost lease, a restart of the stream): everything is read again.
  void Forget();

 private:
  std::map<WalStream, std::int64_t> seqs_;  // the latest stream_seq given, per stream
  // After a delivery switch: numbers given before it, perhaps not committed yet, which a stream's
  // number read again from the ledger must not fall below.
  std::map<WalStream, std::int64_t> floors_;
};

}  // namespace outbox::relay
