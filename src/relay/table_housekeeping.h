#pragma once
// The table relay's housekeeping: leases that expired go back to be claimed again (a relay
// stopped or stalled, or a claim's reply was lost), on the scale of the lease; rows past their
// retention are purged every purge_interval. A failure is reported and tried at the next sweep.

#include <chrono>
#include <functional>

#include "outbox/store/store.h"
#include "table_report.h"

namespace outbox::relay {

class TableHousekeeping {
 public:
  using Clock = std::chrono::steady_clock;
  struct Timing {
    std::chrono::milliseconds sweep_interval;
    std::chrono::milliseconds lease;
    std::chrono::milliseconds purge_interval;
    RetentionPolicy retention;
  };

  TableHousekeeping(Store& store, Timing timing, TableReport& report);

  [[nodiscard]] bool Due(Clock::time_point now) const { return now >= next_sweep_; }
  // When the next sweep is due (an idle relay wakes for it).
  [[nodiscard]] Clock::time_point next_sweep() const { return next_sweep_; }
  // When the next purge is due (at the first sweep from then on).
  [[nodiscard]] Clock::time_point next_purge() const { return next_purge_; }
  // Gives back what `reclaim` names as expired, then purges when that is due; `stopping` ends a
  // long purge between its chunks.
  void Sweep(const ReclaimRequest& reclaim, const std::function<bool()>& stopping);

 private:
  Store& store_;
  const Timing timing_;
  TableReport& report_;
  Clock::time_point next_sweep_{};
  Clock::time_point next_purge_{};
};

}  // namespace outbox::relay
