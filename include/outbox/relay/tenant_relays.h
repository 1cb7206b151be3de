#pragma once
// Many databases, one relay process: a RelayGroup per database (a tenant's database or schema),
// all publishing through one dispatcher, so the sinks, their lanes, pauses and rate limits are
// shared (a broker's outage pauses its target for every database), while each database has its
// own connections, claims, backoff and partition leases (one database down, slow or locked holds
// back nothing of another's). Fairness comes from the dispatcher: each database's relay asks for
// its target's lane in turn, in the order they asked, so a database with a million messages
// waiting publishes one batch between two of a quiet database's.
//
// The set of databases may change while it runs (Serve): new ones start, removed ones drain and
// stop, one whose settings changed restarts. A database that cannot be reached or is not migrated
// is reported (DatabaseState, the log) and tried again with backoff; it never stops the others.
//
// Threading: each database's relays run on a thread of their own; every member is thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/log.h"
#include "outbox/observe/metrics.h"
#include "outbox/relay/dispatcher.h"
#include "outbox/relay/relay.h"
#include "outbox/relay/relay_config.h"
#include "outbox/store/registry.h"

namespace outbox {

class TenantRelays {
 public:
  // Databases beyond this many get the metric label database="_other": their series add up there,
  // so /metrics stays bounded however many databases there are.
  static constexpr std::size_t kMaxLabelledDatabases = 100;
  static constexpr std::string_view kOtherDatabasesLabel = "_other";

  // `settings` apply to every database; `sinks` are shared through one dispatcher.
  // Throws ConfigError for invalid relay options or an empty sink map.
  TenantRelays(RelayGroup::Settings settings, SinkMap sinks, observe::Registry& metrics, LogFn log);
  ~TenantRelays();
  TenantRelays(const TenantRelays&) = delete;
  TenantRelays& operator=(const TenantRelays&) = delete;

  // Makes `databases` the set served: starts the new ones, stops (drains) and drops the ones not
  // named any more, restarts those whose fingerprint changed. Names must be unique (the caller
  // checks). Does not wait for a start to reach its database; waits for a removed one's drain.
  void Serve(const std::vector<NamedDatabase>& databases);

  // Blocks until Stop; then every database's relays drain (each at most its publish_timeout) and
  // Run returns.
  void Run();
  // Asks Run to drain and return. Thread-safe, idempotent.
  void Stop();

  // What one database is doing now.
  struct DatabaseState {
    std::string name;
    // Its relays run and its database answers (an outage is ridden out inside the relay, which
    // reports it here until a claim works again).
    bool relaying = false;
    std::string problem;  // when not relaying: why (cannot reach it, not migrated, WAL failed)
    std::uint64_t published = 0;
    std::uint64_t failed = 0;
  };
  [[nodiscard]] std::vector<DatabaseState> States() const;
  // The counters of every database's table relay, added up (RelayCounters' fields), those of
  // databases no longer served included.
  struct Totals {
    std::uint64_t published = 0;
    std::uint64_t failed = 0;
    std::uint64_t unconfirmed = 0;
    std::uint64_t takeovers = 0;
    int partitions_owned = 0;
  };
  [[nodiscard]] Totals CountersTotal() const;
  [[nodiscard]] std::vector<Relay::PausedTarget> paused_targets() const;
  [[nodiscard]] const Dispatcher& dispatcher() const { return *dispatcher_; }

 private:
  class Database;
  // Drains `databases` (all at once) and keeps their counts in retired_.
  void Retire(std::vector<std::unique_ptr<Database>>& databases);

  RelayGroup::Settings settings_;
  observe::Registry& metrics_;
  LogFn log_;
  std::shared_ptr<Dispatcher> dispatcher_;
  mutable std::mutex mutex_;
  std::condition_variable stopped_;
  bool stopping_ = false;                                     // guarded by mutex_
  std::map<std::string, std::unique_ptr<Database>> running_;  // guarded by mutex_
  std::map<std::string, std::string> labels_;                 // name -> label value; guarded
  Totals retired_;  // the counts of the databases no longer served; guarded by mutex_
};

}  // namespace outbox
