#pragma once
// The WAL relay's reading of the slot: whole transactions gathered into batches, lingering only as
// long as the arrival rate makes worth it (adaptive_linger.h), and read ahead while a batch
// publishes (a backlog keeps the broker busy through the database's round trips).

#include <chrono>
#include <deque>
#include <future>
#include <optional>
#include <vector>

#include "adaptive_linger.h"
#include "outbox/sink/sink.h"
#include "outbox/store/wal.h"

namespace outbox::relay {

class WalGatherer {
 public:
  WalGatherer(WalSource& source, int batch_size, std::chrono::milliseconds linger);

  // Whole transactions, until batch_size messages or the linger after the first; the first is
  // waited for at most `first_wait`. Empty when none came. Throws StoreError.
  std::vector<WalTransaction> Gather(std::chrono::milliseconds first_wait);
  // While `publishing` publishes: the next batch, if a whole one arrives meanwhile (a backlog).
  // Otherwise what was read stays for Gather. Throws StoreError.
  std::vector<WalTransaction> ReadAhead(const std::future<std::vector<PublishOutcome>>& publishing);
  // After an outage or a lost lease: what was read ahead goes (the slot is read again).
  void Clear() { read_ahead_.clear(); }

 private:
  // The slot's next transaction, counted for the linger's arrival rate.
  std::optional<WalTransaction> Read(std::chrono::milliseconds timeout);
  // One transaction: what was read ahead first, then the slot. `read_at`: when it was read.
  std::optional<WalTransaction> NextTransaction(std::chrono::milliseconds timeout,
                                                std::chrono::steady_clock::time_point& read_at);

  struct ReadTransaction {
    std::chrono::steady_clock::time_point read_at;
    WalTransaction transaction;
  };

  WalSource& source_;
  const int batch_size_;
  AdaptiveLinger linger_;                   // fed by every transaction read
  std::deque<ReadTransaction> read_ahead_;  // read while a batch published; not yet in a batch
};

}  // namespace outbox::relay
