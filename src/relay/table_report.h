#pragma once
// What the table relay counts and says, shared by its parts (the loop, the settler, the partition
// membership): its series (registered once; updating them is atomics only), its counters and its
// log.

#include <array>
#include <cstddef>
#include <string>

#include "outbox/core/error.h"
#include "outbox/core/log.h"
#include "outbox/observe/metrics.h"
#include "outbox/relay/relay.h"
#include "outbox/store/store.h"

namespace outbox::relay {

struct RelayMetrics {
  // Each series carries the scope's labels first (the database's, when a process relays several).
  explicit RelayMetrics(const observe::Scope& into);

  observe::Registry& registry;
  observe::Counter& claimed;
  observe::Histogram& claim_batch_size;
  observe::Histogram& claim_seconds;
  observe::Counter& published;
  observe::Counter& retries;
  observe::Counter& held_back;
  observe::Counter& throttled;
  observe::Counter& lease_lost;
  observe::Counter& store_errors;
  observe::Histogram& publish_latency;
  observe::Gauge& leases_held;
  observe::Gauge& partitions_owned;
  observe::Gauge& live_instances;
  observe::Counter& rebalances;
  observe::Counter& takeovers;
  std::array<observe::Counter*, kFailureKindCount> failures{};
  std::array<observe::Counter*, kFailureKindCount> abandoned{};  // rejected and permanent only
};

class TableReport {
 public:
  TableReport(const observe::Scope& scope, RelayCounters& relay_counters, LogFn log)
      : metrics(scope), counters(relay_counters), log_(std::move(log)) {}

  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }
  // A database call failed: counted, and kept as the store's last error.
  void StoreFailed(const StoreError& error);
  // Outcomes the store refused because their leases were no longer this relay's.
  void LeaseLost(const SettleResult& result);
  // Leases taken (`claimed`) and given up (`settled`): the leases-held gauge.
  void LeasesHeld(std::size_t claimed, std::size_t settled);
  // What a completion settled as published.
  void Completed(const SettleResult& result);

  RelayMetrics metrics;
  RelayCounters& counters;

 private:
  LogFn log_;
};

}  // namespace outbox::relay
