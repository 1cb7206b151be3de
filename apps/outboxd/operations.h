#pragma once
// outboxd's operations side: wiring. It builds the status service (outbox/observe/status.h:
// the cached store counts, broker probes, readiness and rates) from the configuration, and the
// HTTP listener that serves it (/metrics, /api/outbox, /api/outbox/rates, /api/outbox/relay,
// /healthz, /readyz), the admin API (/api/messages: list, show, replay, abandon, over the store's
// Admin; never without a configured token) and the dashboard: its page and files under /ui
// (compiled in: ui_assets.h; they need no token, the data they fetch does). Everything the
// metrics show is rendered by the one observe::Registry the relay also writes into.
//
// The store is [database]'s, PostgreSQL or SQLite: the counts are Store::Stats, the counts by
// topic and the admin API the store's Admin (outbox/store/admin.h); no SQL here.
//
// Threading: the status service's threads (outbox/observe/status.h) and the HTTP server's bounded
// pool of worker threads. Admin requests run one at a time on a connection of their own (the
// store's Admin, opened on first use). The relay's hot path is not involved.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config.h"
#include "outbox/core/log.h"
#include "outbox/observe/http_server.h"
#include "outbox/observe/metrics.h"
#include "outbox/observe/status.h"
#include "outbox/relay/relay.h"
#include "outbox/relay/tenant_relays.h"

namespace outbox::outboxd {

// Constant-time comparison of the Authorization header with "Bearer <token>".
bool BearerTokenMatches(std::string_view authorization, std::string_view token);

// The warning Operations::Start logs when the listener is reachable beyond loopback without a
// token (allowed by [http] allow_unauthenticated), or nothing. A function of its own so that tests
// check it without listening beyond loopback.
std::optional<std::string> ExposureWarning(const HttpConfig& http);

class Operations {
 public:
  // The targets whose sink is paused right now (Relay::paused_targets), for /readyz.
  using PausedTargetsFn = std::function<std::vector<Relay::PausedTarget>()>;

  // The relays' counters now, added up over every database.
  using RelayTotalsFn = observe::StatusService::RelayTotalsFn;
  // Registers its gauges in `registry`; starts nothing.
  Operations(const Config& config, observe::Registry& registry, RelayTotalsFn relay, LogFn log,
             PausedTargetsFn paused_targets = {});

  // The totals of one relay's counters (a process that relays one database).
  static RelayTotalsFn TotalsOf(const RelayCounters& relay);

  // Many databases (Config::many_databases): each one's state for /readyz and
  // /api/outbox/relay, the settings of one by name for the admin API (its `database` parameter),
  // and what is wrong with the discovery, if anything. Set before Start().
  struct ManyDatabases {
    std::function<std::vector<TenantRelays::DatabaseState>()> states;
    std::function<std::shared_ptr<const StoreSettings>(const std::string& name)> find;
    std::function<std::optional<std::string>()> discovery_problem;
  };
  void SetManyDatabases(ManyDatabases many);
  ~Operations();
  Operations(const Operations&) = delete;
  Operations& operator=(const Operations&) = delete;

  // WAL mode: what is wrong with the replication slot right now (WalRelay::SlotProblem), nullopt
  // when a relay reads it; a problem fails /readyz. Set before Start().
  using WalCheckFn = std::function<std::optional<std::string>()>;
  void SetWalCheck(WalCheckFn check);

  // Starts the stats thread and, when [http] listen is set, the HTTP listener. Throws
  // std::runtime_error when the address cannot be bound.
  void Start();
  // Readiness fails from now on ("draining"); the listener keeps answering until Stop().
  void BeginDrain();
  // Stops the listener and the stats thread; idempotent.
  void Stop();

  using Readiness = observe::StatusService::Readiness;
  [[nodiscard]] Readiness CheckReadiness();

  // Answers one request given as the raw bytes a client would send, on the calling thread,
  // through the listener's own parser, limits, token check and routes (admin requests included,
  // on the store's Admin); nullopt when the bytes hold no complete request. For tests and the
  // HTTP fuzz target (fuzz/http_fuzz.cpp); needs no Start().
  [[nodiscard]] std::optional<observe::http::Response> AnswerRaw(std::string_view bytes);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::outboxd
