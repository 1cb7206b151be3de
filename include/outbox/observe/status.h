#pragma once
// The status service: what an outbox looks like from outside, whatever its store and sinks, for
// an operations surface (outboxd's /metrics, /api/outbox, /readyz and dashboard). It reads
//   - the store's counts (Store::Stats) every stats_interval, on a connection of its own, and
//     caches them: a scrape or probe never reaches the database;
//   - the backlog by topic (Admin::CountByTopic), bounded in time and skipped for big backlogs;
//   - each sink's broker (its SinkEndpoint): a TCP connection attempt per interval;
//   - the relay's counters (RelayTotals, through a callback): one sample a second into a ring of
//     15 minutes, for rates;
// writes what it reads into the observe::Registry (outbox_messages, outbox_ready, ...) and answers
// readiness from the cache, with one line per check.
//
// It depends on the store and sink contracts only (outbox/store/registry.h, outbox/sink/registry.h)
// and on no relay: the program hands it the relay's counters and paused targets as callbacks.
//
// Threading: Start runs a stats thread (the counts, the grouped counts, the probes, in that order)
// and, when `serving`, a rates thread. Every other member is thread-safe and reads caches.
// Errors: Stats and probes never throw; a failure is logged once per change, recorded in the
// registry (RecordError) and fails readiness until a read works again.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "outbox/core/log.h"
#include "outbox/core/retry_policy.h"
#include "outbox/observe/metrics.h"
#include "outbox/sink/registry.h"
#include "outbox/store/registry.h"

namespace outbox::observe {

// Whether a TCP connection to host:port is accepted within `timeout`.
bool TcpReachable(const std::string& host, int port, std::chrono::milliseconds timeout);

// A sink whose broker readiness probes: its name and SinkSettings::Endpoint.
struct ProbedSink {
  std::string name;
  SinkEndpoint endpoint;  // an empty host: nothing to probe (then never ready)
};

// The relay's counters since start, as the status service reads them (from any thread).
struct RelayTotals {
  std::uint64_t published = 0;    // confirmed and completed
  std::uint64_t failed = 0;       // an attempt spent
  std::uint64_t unconfirmed = 0;  // published again: unavailable or outcome unknown
  std::uint64_t takeovers = 0;    // partitions taken from an expired lease
  int partitions_owned = 0;
  // A target's sink is paused: its last batch found no broker (PausedTarget names it).
  bool broker_unavailable = false;
};

// A target whose sink is paused as unavailable, with the reason of its last batch.
struct PausedTarget {
  std::string name;
  std::string reason;
};

struct StatusOptions {
  std::string instance;  // outbox_info's instance label
  // How often the counts are read and the brokers probed.
  std::chrono::milliseconds stats_interval{5000};
  // Readiness fails when the last good read of the counts (or probe of a broker) is older.
  std::chrono::milliseconds ready_max_age{15000};
  // Whether something serves what the service reads (a listener). Without, the counts are not
  // read (they walk each status index and cost seconds under a held snapshot), brokers are still
  // probed for the log, and no rates are sampled.
  bool serving = true;
  // For opening the store whose Stats are read (StoreSettings::OpenStore).
  RetryPolicy retry;
  RetentionPolicy retention;
};

class StatusService {
 public:
  using RelayTotalsFn = std::function<RelayTotals()>;
  using PausedTargetsFn = std::function<std::vector<PausedTarget>()>;
  // WAL mode: what is wrong with the replication slot right now, nullopt while a relay reads it.
  using WalCheckFn = std::function<std::optional<std::string>()>;

  // Registers its series in `registry` (which must outlive it); starts nothing. `relay` and
  // `paused` may be empty (no relay: zero totals, none paused). A null `store`: no counts are read
  // (a relay of many databases; its extra check says how they are).
  StatusService(StatusOptions options, std::shared_ptr<const StoreSettings> store,
                std::vector<ProbedSink> sinks, Registry& registry, LogFn log,
                RelayTotalsFn relay = {}, PausedTargetsFn paused = {});
  ~StatusService();
  StatusService(const StatusService&) = delete;
  StatusService& operator=(const StatusService&) = delete;

  // Before Start: a failing WAL check fails readiness ("WAL slot: <problem>").
  void SetWalCheck(WalCheckFn check);

  // A check of the program's own, asked at each readiness check: its lines, each with whether it
  // passes (a failing line fails readiness). For a relay of many databases: which are relayed.
  struct CheckLine {
    bool ok = true;
    std::string text;
  };
  using ExtraCheckFn = std::function<std::vector<CheckLine>()>;
  void SetExtraCheck(ExtraCheckFn check);

  // Starts the stats thread and, when serving, the rates thread.
  void Start();
  // Readiness fails from now on ("draining").
  void BeginDrain();
  // Stops and joins the threads; idempotent.
  void Stop();

  struct Readiness {
    bool ready = false;
    std::string report;  // one line per check: "database: ok (counts read 1.2 s ago)"
  };
  // From the cache; also refreshes outbox_ready and outbox_stats_age_seconds.
  [[nodiscard]] Readiness CheckReadiness();

  // The relay's counters now (zeros without a relay).
  [[nodiscard]] RelayTotals Totals() const;

  // How much the relay's counters grew each second, oldest first, the last 15 minutes at most.
  struct Rates {
    std::chrono::seconds step{1};
    std::int64_t end_unix_ms = 0;  // when the last sample was taken (0: none yet)
    std::vector<std::uint64_t> published;
    std::vector<std::uint64_t> failed;
    std::vector<std::uint64_t> unconfirmed;
  };
  [[nodiscard]] Rates RecentRates() const;
  // RecentRates as JSON: {"step_seconds", "end_unix_ms", "published", "failed", "unconfirmed"}.
  [[nodiscard]] std::string RatesJson() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::observe
