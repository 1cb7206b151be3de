#pragma once
// The relay engine: claim -> publish -> complete, pipelined, with per-stream order, retries by
// failure class, idle wake-ups and a bounded graceful drain. Depends only on the Store, Wakeup
// and Sink contracts.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "outbox/core/hand_off.h"
#include "outbox/core/log.h"
#include "outbox/observe/metrics.h"
#include "outbox/relay/dispatcher.h"
#include "outbox/sink/sink.h"
#include "outbox/store/partitions.h"
#include "outbox/store/store.h"
#include "outbox/store/wakeup.h"

namespace outbox {

struct RelayOptions {
  std::string instance;  // lease owner name; unique per running relay
  int batch_size = 500;
  std::chrono::milliseconds lease{std::chrono::seconds{30}};
  // With partition leases: the partition lease (renewed every third of it) once the relay has had
  // nothing to do for a whole `lease`; back to `lease` at its next claim that finds work. A
  // relay that dies while idle holds its partitions for up to this long. 0: `lease`; else at
  // least `lease`.
  // Longer than `lease`, it also stops the idle relay's sweeps (below) while the heartbeat finds
  // no message waiting, leased or failed (Membership::unfinished; a heartbeat that finds one
  // wakes the relay), so an idle database costs a heartbeat per idle_lease / 3 and a sweep per
  // purge_interval.
  std::chrono::milliseconds idle_lease{0};
  // Idle: how often to look for new messages without a notification (a store whose writers
  // cannot notify, like SQLite's from another process, is seen only this way) and for expired
  // leases. Retries are looked for when they are due (ClaimResult::next_due), not only then.
  std::chrono::milliseconds sweep_interval{std::chrono::seconds{1}};
  // The cap of the adaptive linger (adaptive_linger.h): under steady load the next claim waits up
  // to this long after the last one, so that a round claims many messages in one statement
  // instead of a few. 22 ms: at 1,000 messages a second a round carries about 22 (~0.046
  // statements a message) and a message waits at most a round (p99 under 30 ms on a 2-core box;
  // 25 ms gave 31-34 ms, 20 ms 0.051 statements). 0: claim at once, always.
  std::chrono::milliseconds linger{22};
  // How long a batch may wait for broker confirms; must be well under `lease`.
  std::chrono::milliseconds publish_timeout{std::chrono::seconds{10}};
  // Pause after a database outage is noticed, doubling up to max_backoff; the same for a target
  // whose sink is unavailable: its messages are not claimed until its pause ends (the next batch
  // for it is the probe), while other targets flow.
  std::chrono::milliseconds min_backoff{100};
  std::chrono::milliseconds max_backoff{std::chrono::seconds{5}};
  // Published/abandoned rows past their retention are purged this often.
  std::chrono::milliseconds purge_interval{std::chrono::minutes{1}};
  RetentionPolicy retention;
  // Writers in this process may hand committed ids over here (the in-process fast path): an
  // idle relay then wakes without waiting for the NOTIFY. The ids are only a hint; what is
  // claimed is still read from the store. Not owned; must outlive the relay.
  HandOffQueue* hand_off = nullptr;
  // Where the relay writes its metrics (outbox_relay_* and outbox_publish_*; see the README's
  // "Operating outbox"). Not owned; must outlive the relay. Null: a registry of the relay's own.
  observe::Registry* metrics = nullptr;
  // Per-target rate limits (sinks' max_rate, max_burst), for the dispatcher a relay makes of its
  // sinks (see dispatcher.h).
  RateLimits rate_limits;
  // Relays sharing one database divide its partitions through these leases (store/partitions.h):
  // this relay then claims only from partitions it holds, heartbeats every
  // Membership::next_heartbeat between batches, hands surplus back and leaves on Stop. Not owned;
  // must outlive the relay. Null: this relay is the only one and claims from every partition.
  PartitionLeases* partition_leases = nullptr;
  // The store's RetryPolicy::max_attempts, used only to count abandoned messages in the metrics
  // (the store decides what is abandoned). 0: count only what is abandoned at once (kPermanent).
  int max_attempts = 0;
  // When this relay is one of several in a process, each on a database of its own (TenantRelays):
  // the database's name, given to every message it claims (Envelope::database, the
  // outbox-database header), and the labels its series carry ({database="<name>"}), each family
  // holding up to metric_series_limit series (observe::Scope). Empty: the process relays one
  // database.
  std::string database;
  observe::Labels metric_labels;
  std::size_t metric_series_limit = 0;
};

// Monotonic counters since start; read from any thread.
struct RelayCounters {
  std::atomic<std::uint64_t> claimed{0};
  std::atomic<std::uint64_t> published{0};    // confirmed and completed
  std::atomic<std::uint64_t> failed{0};       // rejected or permanent: an attempt spent
  std::atomic<std::uint64_t> unconfirmed{0};  // unavailable or outcome unknown: republished
  std::atomic<std::uint64_t> held_back{0};    // confirmed after an earlier failure of its stream
  // Claimed, then given back untouched: over their target's max_rate (dispatcher.h). The churn a
  // rate limit costs, as the store's claim takes no per-target limit.
  std::atomic<std::uint64_t> throttled{0};
  std::atomic<std::uint64_t> lease_lost{0};
  std::atomic<std::uint64_t> store_errors{0};
  std::atomic<std::uint64_t> takeovers{0};  // partitions taken from an expired lease of another
  std::atomic<int> partitions_owned{0};     // with partition leases: held now
  // True while the sink of some target is paused: its last batch found no broker (every outcome
  // kUnavailable). Other targets flow meanwhile (see Relay::paused_targets).
  std::atomic<bool> broker_unavailable{false};
  // True from a failed database call until the next claim works: the database does not answer
  // (the relay backs off and tries again). Beside store_errors, what is wrong now.
  std::atomic<bool> database_failing{false};
};

class Relay {
 public:
  // Throws ConfigError for invalid options, naming the field: what the constructor checks
  // besides the sinks and the store, for a caller that validates without starting (outboxd
  // --check-config).
  static void CheckOptions(const RelayOptions& options);

  // Throws ConfigError for invalid options (CheckOptions) or an empty sink map. The sinks get a
  // dispatcher of their own (min_backoff, max_backoff and metrics from `options`).
  Relay(RelayOptions options, std::unique_ptr<Store> store, std::unique_ptr<Wakeup> wakeup,
        SinkMap sinks, LogFn log = {});
  // Publishes through `dispatcher`, which other sources of this process (a WalRelay) may share:
  // a target paused by one is paused for all.
  Relay(RelayOptions options, std::unique_ptr<Store> store, std::unique_ptr<Wakeup> wakeup,
        std::shared_ptr<Dispatcher> dispatcher, LogFn log = {});
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Publishes until Stop() is called, then drains: the batch being published is waited for (at
  // most publish_timeout) and settled, claimed but unpublished messages are released, and Run
  // returns. Database and broker outages are ridden out inside Run; it throws only for bugs.
  void Run();

  // Asks Run to drain and return. Thread-safe, idempotent, async-signal-unsafe (call it from a
  // signal-handling thread, not a handler).
  void Stop();

  [[nodiscard]] const RelayCounters& counters() const { return counters_; }
  // The targets whose sink is paused as unavailable right now, by name. Thread-safe.
  [[nodiscard]] std::vector<std::string> paused_targets() const;
  // The same, each with why: the reason of its last batch's first outcome, e.g. "the endpoint
  // refuses the relay: HTTP 401 ...". Thread-safe.
  using PausedTarget = Dispatcher::PausedTarget;
  [[nodiscard]] std::vector<PausedTarget> paused_target_reasons() const;

 private:
  class Engine;
  std::unique_ptr<Engine> engine_;
  RelayCounters counters_;
};

}  // namespace outbox
