#pragma once
// The WAL-mode relay (outbox/store/wal.h): reads committed transactions from the slot, gives each
// sequenced message its stream_seq in commit order, publishes through the same sinks as the table
// relay, and then makes the batch's fate durable in one WalLedger::Commit (the position reached,
// the counters, the messages parked in the table) before it lets the slot go past it. A restart
// reads again from the ledger's position with the ledger's counters, so a message published but
// not yet committed is published again with the same id and stream_seq (a duplicate the inbox
// removes), never lost and never renumbered.
//
// Outcomes: a message its sink rejects is parked in outbox.messages (failed, due after the retry
// policy's first delay; abandoned when kPermanent), and every later message of its stream is
// parked behind it, in this batch and in later ones, until the table relay has published them:
// table-mode retries, `outboxctl replay` and `abandon` then apply unchanged. A target whose broker
// is unavailable (or gives no verdict) has its messages parked as waiting, unattempted, while the
// other targets flow (the dispatcher pauses its lane: the table relay publishes them once its sink
// answers). When no target can take anything, nothing is parked: the batch is not committed, the
// relay backs off and reads the slot again from the ledger's position.
//
// One relay reads a slot at a time: the others stand by until its lease (WalLedger::Acquire)
// expires. A relay that lost the lease cannot commit (the ledger is fenced by the epoch), and the
// server refuses a second reader of the slot while the first is connected.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "outbox/core/log.h"
#include "outbox/core/retry_policy.h"
#include "outbox/observe/metrics.h"
#include "outbox/relay/relay.h"
#include "outbox/store/wal.h"

namespace outbox {

struct WalRelayOptions {
  std::string instance;  // the lease owner's name; unique per running relay
  // Messages per publish: whole transactions are gathered until this many (a larger transaction
  // goes alone).
  int batch_size = 500;
  // After the first transaction of a batch, how long to wait for more before publishing, while
  // transactions arrive faster than batches go (the last batch held more than one); a lone
  // transaction after a quiet spell does not wait.
  std::chrono::milliseconds linger{5};
  std::chrono::milliseconds lease{std::chrono::seconds{30}};
  std::chrono::milliseconds publish_timeout{std::chrono::seconds{10}};
  // After a database or broker outage, doubling up to max_backoff.
  std::chrono::milliseconds min_backoff{100};
  std::chrono::milliseconds max_backoff{std::chrono::seconds{5}};
  // A rejected message is parked due after Delay(1); abandoned at once when max_attempts is 1.
  RetryPolicy retry;
  // Where the outbox_wal_* series go. Not owned; must outlive the relay. Null: a registry of the
  // relay's own.
  observe::Registry* metrics = nullptr;
  // As RelayOptions::rate_limits.
  RateLimits rate_limits;
  // As RelayOptions::database, metric_labels and metric_series_limit.
  std::string database;
  observe::Labels metric_labels;
  std::size_t metric_series_limit = 0;
};

struct WalRelayCounters {
  std::atomic<std::uint64_t> transactions{0};  // committed transactions handled
  std::atomic<std::uint64_t> published{0};     // confirmed by the broker and committed
  std::atomic<std::uint64_t> parked{0};        // written to outbox.messages
  std::atomic<std::uint64_t> undecodable{0};   // records that could not be read
  std::atomic<std::uint64_t> lease_lost{0};    // commits refused: another relay took the slot
  std::atomic<std::uint64_t> errors{0};        // database and broker outages met
  std::atomic<Lsn> position{0};                // the ledger's position, as last committed
  std::atomic<bool> active{false};             // holds the lease and reads the slot
};

class WalRelay {
 public:
  // Throws ConfigError for invalid options, naming the field: what the constructor checks
  // besides the sinks, the source and the ledger (for outboxd --check-config).
  static void CheckOptions(const WalRelayOptions& options);

  // Throws ConfigError for invalid options (CheckOptions) or an empty sink map. The sinks get a
  // dispatcher of their own.
  WalRelay(WalRelayOptions options, std::unique_ptr<WalSource> source,
           std::unique_ptr<WalLedger> ledger, SinkMap sinks, LogFn log = {});
  // Publishes through `dispatcher`, shared with the table relay of this process: a target paused
  // by either is paused for both, and its messages are parked in the table meanwhile.
  WalRelay(WalRelayOptions options, std::unique_ptr<WalSource> source,
           std::unique_ptr<WalLedger> ledger, std::shared_ptr<Dispatcher> dispatcher,
           LogFn log = {});
  ~WalRelay();
  WalRelay(const WalRelay&) = delete;
  WalRelay& operator=(const WalRelay&) = delete;

  // Relays until Stop(). Outages are ridden out inside; throws StoreError (kPermanent) when the
  // slot cannot be read at all (it is gone: the message says how to recover).
  void Run();
  // Asks Run to finish the batch in hand and return. Thread-safe, idempotent.
  void Stop();

  [[nodiscard]] const WalRelayCounters& counters() const { return counters_; }
  // What is wrong with the slot as last checked (every few seconds): it does not exist, is lost,
  // or no relay reads it; nullopt when a relay reads it. For /readyz. Thread-safe.
  [[nodiscard]] std::optional<std::string> SlotProblem() const;

 private:
  class Engine;
  WalRelayCounters counters_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace outbox
