#pragma once
// The WAL relay's watch over its slot, active or standing by: is some relay reading it, how much
// WAL does it keep (the outbox_wal_slot_* gauges), and what is wrong with it for /readyz. A slot
// that went (dropped, or its WAL lost) is said loudly: log (at most once a minute), /readyz,
// outbox_wal_slot_missing. WAL-mode enqueues fail without it (outbox.enqueue checks), so what is
// lost is what was committed but not yet read when it went.

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include "outbox/core/log.h"
#include "outbox/store/wal.h"
#include "wal_metrics.h"

namespace outbox::relay {

class WalSlotWatch {
 public:
  // How often the slot's state is read, and looked for while it is gone.
  static constexpr std::chrono::milliseconds kCheckEvery{5000};

  WalSlotWatch(WalLedger& ledger, WalMetrics& metrics, LogFn log);

  // At most every kCheckEvery (sooner after Gone): reads the slot's state into the gauges and
  // the problem. `last_error`: this relay's last outage, named when no relay reads the slot.
  void Check(const std::string& last_error);
  // Whether the slot exists and has its WAL. Throws StoreError.
  bool Exists();
  // Whether the slot is missing (or lost) as the server says now; false when it cannot tell.
  bool IsGone();
  // Reports the slot gone; `position`: the ledger's position, the last one committed.
  void Gone(const std::string& what, Lsn position);
  // After Gone, once the slot is read again: how long it was gone (and the gauge cleared).
  std::optional<std::chrono::seconds> Back();
  [[nodiscard]] bool gone() const { return gone_since_.has_value(); }
  // What is wrong with the slot as last checked; nullopt when a relay reads it. Thread-safe.
  [[nodiscard]] std::optional<std::string> Problem() const;

 private:
  using SteadyClock = std::chrono::steady_clock;
  void SetProblem(std::optional<std::string> problem);

  WalLedger& ledger_;
  WalMetrics& metrics_;
  LogFn log_;
  SteadyClock::time_point next_check_{};
  std::optional<SteadyClock::time_point> gone_since_;  // while the slot is missing
  Lsn gone_at_ = 0;                                    // the committed position when it went
  SteadyClock::time_point next_gone_log_{};
  mutable std::mutex mutex_;
  std::optional<std::string> problem_;  // guarded by mutex_
};

}  // namespace outbox::relay
