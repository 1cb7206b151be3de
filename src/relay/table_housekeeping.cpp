#include "table_housekeeping.h"

#include <algorithm>
#include <string>

#include "outbox/core/error.h"

namespace outbox::relay {

TableHousekeeping::TableHousekeeping(Store& store, Timing timing, TableReport& report)
    : store_(store), timing_(timing), report_(report) {}

void TableHousekeeping::Sweep(const ReclaimRequest& reclaim,
                              const std::function<bool()>& stopping) {
  const auto now = Clock::now();
  // Expired leases matter on the scale of the lease, not of the sweep.
  next_sweep_ =
      now + std::max(timing_.sweep_interval,
                     std::chrono::duration_cast<std::chrono::milliseconds>(timing_.lease / 4));
  try {
    const auto started = Clock::now();
    const std::int64_t reclaimed = store_.ReclaimExpired(reclaim);
    // Finding expired leases walks every index entry of a leased row, which an old snapshot
    // keeps even after the row is gone (0.6 s and growing in the held-snapshot benchmark): the
    // relay then looks less often, at most 5 % of its time, and still once per lease.
    const auto took = Clock::now() - started;
    next_sweep_ =
        std::max(next_sweep_, started + std::min<Clock::duration>(20 * took, timing_.lease));
    if (reclaimed > 0) {
      report_.Log(LogLevel::kWarn,
                  std::to_string(reclaimed) +
                      " messages had expired leases (a relay stopped or stalled, or a claim's "
                      "reply was lost); they will be published again");
    }
    if (now >= next_purge_) {
      next_purge_ = now + timing_.purge_interval;
      std::int64_t purged = 0;
      for (std::int64_t chunk = 1; chunk > 0 && !stopping();) {
        chunk = store_.Purge(timing_.retention, 1000);
        purged += chunk;
      }
      if (purged > 0)
        report_.Log(LogLevel::kInfo, "purged " + std::to_string(purged) + " messages");
    }
  } catch (const StoreError& error) {
    report_.StoreFailed(error);
    report_.Log(LogLevel::kWarn, "housekeeping failed: " + std::string{error.what()});
  }
}

}  // namespace outbox::relay
