#pragma once
// The WAL relay's series (outbox_wal_*), registered once; updating them is atomics only.

#include "outbox/observe/metrics.h"

namespace outbox::relay {

struct WalMetrics {
  // Each series carries the scope's labels (the database's, when a process relays several).
  explicit WalMetrics(const observe::Scope& into);

  observe::Registry& registry;
  observe::Counter& transactions;
  observe::Counter& published;
  observe::Counter& parked;
  observe::Counter& undecodable;
  observe::Counter& errors;
  observe::Gauge& lag_bytes;
  observe::Gauge& lag_seconds;
  observe::Gauge& active;
  observe::Gauge& slot_active;
  observe::Gauge& slot_retained_bytes;
  observe::Gauge& slot_unconfirmed_bytes;
  observe::Counter& recovered;
  observe::Gauge& slot_missing;
  observe::Gauge& slot_flush_lag_seconds;
  observe::Histogram& batch_seconds;
};

}  // namespace outbox::relay
