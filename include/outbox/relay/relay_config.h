#pragma once
// The relay's section of outboxd's configuration, [relay], read once with one set of rules for
// the table relay and WAL mode's relay alike; and the relays of one process built from it
// (RelayGroup): the table relay, WAL mode's relay when the store delivers by WAL, and the one
// dispatcher they publish through. The apps only wire: they hand over the parsed sections, the
// store's settings and the sinks.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "outbox/config/toml_table.h"
#include "outbox/core/log.h"
#include "outbox/core/retry_policy.h"
#include "outbox/observe/metrics.h"
#include "outbox/relay/dispatcher.h"
#include "outbox/relay/relay.h"
#include "outbox/relay/wal_relay.h"
#include "outbox/store/registry.h"
#include "outbox/store/store.h"

namespace outbox {

// relay.linger's defaults, the cap of the adaptive linger (adaptive_linger.h), per delivery
// mode: each the longest that keeps issue #49's bounds at 1,000 messages/s on the project's
// machine (p99 <= 30 ms, <= 0.05 statements/message; bench/RESULTS.md). WAL mode's is longer
// because its linger counts from when a batch's first transaction was read, which may be before
// the last batch finished publishing.
inline constexpr std::chrono::milliseconds kTableLinger{22};
inline constexpr std::chrono::milliseconds kWalLinger{26};
// relay.sweep_interval's default when one process relays many databases (TenantRelays): each
// idle database's sweep is a statement, and with hundreds of them the sweeps are most of what an
// idle relay costs; every enqueue wakes the relay anyway (NOTIFY), and due retries are woken for.
inline constexpr std::chrono::milliseconds kManyDatabasesSweep{30000};
// relay.purge_interval's default with many databases: a purge is a statement per database, and
// with published rows deleted at once (retention.published = "0s") it finds abandoned rows past
// their retention, counted in days.
inline constexpr std::chrono::milliseconds kManyDatabasesPurge{std::chrono::minutes{10}};
// relay.idle_lease's default with many databases, in leases: 2 minutes with the default lease,
// so an idle database's partition heartbeat (a statement every third of the lease) comes every
// 40 s, and its sweeps are skipped while that heartbeat finds nothing unfinished: about 0.03
// statements/s per idle database (issue #42). A relay that dies while a database is idle leaves
// it for up to this long, and a relay added takes its share of an idle database within a third
// of it; both scale with the lease a user chooses.
inline constexpr int kManyDatabasesIdleLeaseFactor = 4;

// [relay], as read (every key is documented in apps/outboxd/outbox.example.toml).
struct RelaySection {
  std::string instance;  // lease owner name; default "<hostname>-<pid>"
  int batch_size = 500;  // 1..10000
  std::chrono::milliseconds lease{30000};
  // Default: the store type's (StoreSettings::DefaultSweepInterval).
  std::chrono::milliseconds sweep_interval{10000};
  // Under lease/2; default: the mode's (kTableLinger, kWalLinger); see RelayOptions::linger.
  std::chrono::milliseconds linger{kTableLinger};
  std::chrono::milliseconds publish_timeout{10000};  // at most lease/2
  std::chrono::milliseconds shutdown_timeout{10000};
  std::chrono::milliseconds min_backoff{100};  // pause after an outage, doubling up to max_backoff
  std::chrono::milliseconds max_backoff{5000};
  std::chrono::milliseconds purge_interval{60000};
  // The partition lease while the relay has had nothing to do for a whole `lease`; 0: `lease`
  // (ReadRelaySection always sets it). See RelayOptions::idle_lease.
  std::chrono::milliseconds idle_lease{0};
};

// What [relay] defaults to where the file says nothing: the store type's sweep interval
// (StoreSettings::DefaultSweepInterval), the mode's linger, and with many databases a longer purge
// interval and a longer idle lease.
struct RelayDefaults {
  std::chrono::milliseconds sweep_interval{10000};
  std::chrono::milliseconds linger{kTableLinger};
  std::chrono::milliseconds purge_interval{std::chrono::minutes{1}};
  // idle_lease's default, in leases: 1, an idle relay renews as often as a busy one.
  int idle_lease_factor = 1;
};

// Reads the [relay] table. Throws ConfigError naming "relay.<key>" (with the value's place in
// the file) for an unknown key, a wrong type, a value out of range, or a broken rule between
// keys (publish_timeout at most half of lease: partition leases are renewed between batches;
// linger under half of lease; max_backoff at least min_backoff; idle_lease at least lease).
RelaySection ReadRelaySection(const config::Section& relay, const RelayDefaults& defaults);
// The section as TOML (it reads back to the same values), for outboxd --check-config.
void DescribeRelaySection(config::TomlWriter& out, const RelaySection& relay);

// The table relay's options from the sections. `retry.max_attempts` only counts abandoned
// messages (the store decides).
RelayOptions TableRelayOptionsOf(const RelaySection& relay, const RetryPolicy& retry,
                                 const RetentionPolicy& retention, observe::Registry& metrics);
// WAL mode's relay options from the sections.
WalRelayOptions WalRelayOptionsOf(const RelaySection& relay, const RetryPolicy& retry,
                                  observe::Registry& metrics);

// The relays of one process over one store. Construction reaches the database (the store's
// Prepare: reachable, migrated) and throws StoreError or ConfigError; Run relays until Stop.
class RelayGroup {
 public:
  struct Settings {
    RelaySection relay;
    RetryPolicy retry;
    RetentionPolicy retention;
    // The sinks' max_rate and max_burst, by target (dispatcher.h).
    RateLimits rate_limits;
  };

  // What a start checks before it reaches the database, for outboxd --check-config: the
  // options of each relay the store's mode runs. Throws ConfigError.
  static void Check(const Settings& settings, const StoreSettings& store);

  RelayGroup(const Settings& settings, const StoreSettings& store, SinkMap sinks,
             observe::Registry& metrics, LogFn log);

  // The dispatcher the relays of `settings` publish through (backoff bounds, rate limits).
  static std::shared_ptr<Dispatcher> MakeDispatcher(const Settings& settings, SinkMap sinks,
                                                    observe::Registry& metrics, const LogFn& log);
  // One database of several in a process (TenantRelays): the relays publish through `dispatcher`,
  // which the other databases' relays share; `source` names the database and labels its series
  // (RelayOptions::database, metric_labels, metric_series_limit).
  struct Source {
    std::string database;
    observe::Labels metric_labels;
    std::size_t metric_series_limit = 0;
  };
  RelayGroup(const Settings& settings, const StoreSettings& store,
             std::shared_ptr<Dispatcher> dispatcher, const Source& source,
             observe::Registry& metrics, LogFn log);
  ~RelayGroup();
  RelayGroup(const RelayGroup&) = delete;
  RelayGroup& operator=(const RelayGroup&) = delete;

  // Relays until Stop, WAL mode's relay on a thread of its own, then drains both. Returns false
  // when WAL mode failed for good (not an outage, not a missing slot, which it reports and
  // waits out): the table relay is stopped then too, as nothing may be skipped silently.
  bool Run();
  // Asks both relays to drain and Run to return. Thread-safe, idempotent.
  void Stop();

  [[nodiscard]] const RelayCounters& counters() const { return table_->counters(); }
  // WAL mode's counters; null in table mode.
  [[nodiscard]] const WalRelayCounters* wal_counters() const;
  [[nodiscard]] std::vector<Relay::PausedTarget> paused_targets() const {
    return table_->paused_target_reasons();
  }
  // WAL mode's slot problem for /readyz (WalRelay::SlotProblem); nullopt in table mode.
  [[nodiscard]] std::optional<std::string> SlotProblem() const;
  [[nodiscard]] bool wal_mode() const { return wal_ != nullptr; }

 private:
  LogFn log_;
  std::unique_ptr<PartitionLeases> partition_leases_;
  std::unique_ptr<Relay> table_;
  std::unique_ptr<WalRelay> wal_;
};

}  // namespace outbox
