#include "outbox/relay/wal_relay.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "adaptive_linger.h"
#include "outbox/core/error.h"
#include "outbox/core/random.h"
#include "outbox/core/uuid.h"

namespace outbox {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// While another relay holds the slot, how often to look whether its lease has expired.
constexpr milliseconds kStandbyLook{1000};
// How often the slot's state is read (for readiness and the outbox_wal_slot_* gauges).
constexpr milliseconds kSlotCheck{5000};
// How often a missing slot is logged again while the relay waits for it.
constexpr milliseconds kSlotGoneLogEvery{60000};
// How often what later commits superseded is removed from the ledger (WalLedger::Purge).
constexpr milliseconds kPurgeEvery{5000};
// The longest a read of the slot waits, so that the lease is renewed and Stop is seen in time.
constexpr milliseconds kLongestRead{500};
// How long a commit's word that outbox.messages holds nothing that could hold a stream back is
// taken for it (renewed by every commit; a bound, in case a row comes by some other way).
constexpr milliseconds kTrustClearTable{1000};
// While a batch publishes, how long one read ahead waits before it looks whether the publish is
// done.
constexpr milliseconds kReadAheadWait{1};

std::string Describe(const std::exception& error) { return error.what(); }

struct WalMetrics {
  explicit WalMetrics(observe::Registry& into)
      : registry(into),
        transactions(into.AddCounter("outbox_wal_transactions_total",
                                     "Committed transactions with outbox messages read from the "
                                     "slot and handled (published or parked).")),
        published(into.AddCounter(
            "outbox_wal_published_total",
            "WAL-mode messages confirmed by the broker, their position committed.")),
        parked(into.AddCounter("outbox_wal_parked_total",
                               "WAL-mode messages parked in outbox.messages: rejected by their "
                               "sink, or behind an earlier parked message of their stream.")),
        undecodable(into.AddCounter(
            "outbox_wal_undecodable_total",
            "Logical messages with the outbox prefix that could not be decoded (not relayed).")),
        errors(into.AddCounter("outbox_wal_errors_total",
                               "Database and broker outages the WAL relay met (it reads the slot "
                               "again from its committed position).")),
        lag_bytes(into.AddGauge("outbox_wal_lag_bytes",
                                "WAL the server has sent past this relay's committed position.")),
        lag_seconds(into.AddGauge(
            "outbox_wal_lag_seconds",
            "Age of the oldest transaction read but not yet committed; 0 when caught up.")),
        active(into.AddGauge("outbox_wal_active",
                             "1 while this relay holds the slot's lease and reads it.")),
        slot_active(into.AddGauge(
            "outbox_wal_slot_active",
            "1 while some relay streams the slot (pg_replication_slots.active), as last checked.")),
        slot_retained_bytes(into.AddGauge(
            "outbox_wal_slot_retained_bytes",
            "WAL the server keeps for the slot (its position - restart_lsn), as last checked.")),
        slot_unconfirmed_bytes(
            into.AddGauge("outbox_wal_slot_unconfirmed_bytes",
                          "WAL written since the slot's confirmed position, as last checked.")),
        recovered(into.AddCounter(
            "outbox_wal_recovered_total",
            "WAL-mode messages read back from the WAL files (pg_walinspect) after the slot went, "
            "and published.")),
        slot_missing(into.AddGauge(
            "outbox_wal_slot_missing",
            "1 while the slot this relay read is gone (dropped, or its WAL lost): WAL-mode "
            "enqueues fail until it is made again.")),
        slot_flush_lag_seconds(into.AddGauge(
            "outbox_wal_slot_flush_lag_seconds",
            "How long the reader's confirmations trail the server's WAL, as the server measures "
            "it (pg_stat_replication.flush_lag); 0 when it shows none. As last checked.")),
        batch_seconds(
            into.AddHistogram("outbox_wal_batch_seconds",
                              "Duration of each WAL batch from its read to the ledger's commit "
                              "(with a backlog, its wait for the batch before it included).",
                              observe::LatencyBuckets())) {}

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

std::optional<WalStream> StreamOf(const Envelope& envelope) {
  if (!envelope.stream_key) return std::nullopt;
  return WalStream{envelope.target, *envelope.stream_key};
}

}  // namespace

class WalRelay::Engine {
 public:
  Engine(WalRelayOptions options, std::unique_ptr<WalSource> source,
         std::unique_ptr<WalLedger> ledger, SinkMap sinks, LogFn log, WalRelayCounters& counters)
      : own_registry_(options.metrics == nullptr ? std::make_unique<observe::Registry>() : nullptr),
        metrics_(options.metrics != nullptr ? *options.metrics : *own_registry_),
        options_(std::move(options)),
        source_(std::move(source)),
        ledger_(std::move(ledger)),
        sinks_(std::move(sinks)),
        log_(std::move(log)),
        counters_(counters),
        owner_(options_.instance + "/" + NewUuidV7().ToString().substr(24)),
        backoff_(options_.min_backoff),
        random_(DefaultRandom()) {}

  void Run() {
    Log(LogLevel::kInfo, "WAL relay started as " + owner_);
    while (!stopping()) {
      try {
        CheckSlot();
        if (!HoldLease()) {
          Sleep(kStandbyLook);
          continue;
        }
        if (!streaming_) StartStreaming();
        Purge();
        Step(true);
      } catch (const StoreError& error) {
        if (error.kind() == FailureKind::kPermanent && !streaming_) {
          if (!SlotIsGone()) throw;
          SlotGone(Describe(error));
          continue;
        }
        Outage(Describe(error));
      }
    }
    // A batch published while the last one was committed: settled, so that a restart does not
    // publish it again.
    if (in_flight_ && epoch_) {
      try {
        Step(false);
      } catch (const StoreError& error) {
        Log(LogLevel::kWarn,
            "settling the last WAL batch at stop failed (it is read and "
            "published again by the next relay): " +
                Describe(error));
      }
    }
    in_flight_.reset();
    source_->Close();  // before the lease goes, so that the next reader finds the slot free
    if (epoch_) {
      try {
        ledger_->Leave(owner_, *epoch_);
      } catch (const StoreError& error) {
        Log(LogLevel::kWarn,
            "leaving the WAL slot's lease failed (it expires by itself): " + Describe(error));
      }
    }
    SetActive(false);
    Log(LogLevel::kInfo, "WAL relay stopped");
  }

  std::optional<std::string> SlotProblem() const {
    std::lock_guard lock(slot_mutex_);
    return slot_problem_;
  }

  void Stop() {
    {
      std::lock_guard lock(stop_mutex_);
      stop_ = true;
    }
    stop_changed_.notify_all();
  }

 private:
  bool stopping() const {
    std::lock_guard lock(stop_mutex_);
    return stop_;
  }

  void Sleep(milliseconds duration) {
    std::unique_lock lock(stop_mutex_);
    stop_changed_.wait_for(lock, duration, [this] { return stop_; });
  }

  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  void SetActive(bool active) {
    counters_.active = active;
    metrics_.active.Set(active ? 1.0 : 0.0);
  }

  // Every few seconds, active or standing by: is some relay reading the slot, and how much WAL
  // does it keep? An inactive slot is a readiness failure (nobody relays the WAL messages).
  void CheckSlot() {
    const auto now = SteadyClock::now();
    if (now < next_slot_check_) return;
    next_slot_check_ = now + kSlotCheck;
    std::optional<std::string> problem;
    try {
      const WalSlotState state = ledger_->SlotState();
      metrics_.slot_active.Set(state.active ? 1.0 : 0.0);
      metrics_.slot_retained_bytes.Set(static_cast<double>(state.retained_bytes));
      metrics_.slot_unconfirmed_bytes.Set(static_cast<double>(state.unconfirmed_bytes));
      metrics_.slot_flush_lag_seconds.Set(state.flush_lag_seconds.value_or(0.0));
      if (!state.exists) {
        problem = "the replication slot does not exist (outboxctl migrate --wal-slot)";
      } else if (state.wal_status == "lost") {
        problem = "the replication slot is lost (its WAL was removed): see the README, WAL mode";
      } else if (!state.active) {
        problem = "no relay is reading the replication slot" +
                  (last_error_.empty() ? std::string{} : " (this one: " + last_error_ + ")");
      }
    } catch (const StoreError& error) {
      problem = "the slot's state could not be read: " + Describe(error);
    }
    std::lock_guard lock(slot_mutex_);
    slot_problem_ = std::move(problem);
  }

  // Every few seconds while this relay holds the slot: the ledger's superseded records go. A
  // failure is housekeeping's, not the relay's: it is reported and tried again next time (a lost
  // connection shows in the next batch's statements anyway).
  void Purge() {
    const auto now = SteadyClock::now();
    if (now < next_purge_) return;
    next_purge_ = now + kPurgeEvery;
    try {
      ledger_->Purge();
    } catch (const StoreError& error) {
      metrics_.registry.RecordError("wal", "purging the WAL ledger: " + Describe(error));
      Log(LogLevel::kWarn, "purging the WAL ledger failed (tried again in " +
                               std::to_string(kPurgeEvery.count() / 1000) +
                               " s): " + Describe(error));
    }
  }

  // Takes or renews the lease every third of it; false while another relay holds it.
  bool HoldLease() {
    const auto now = SteadyClock::now();
    if (epoch_ && now < renew_at_) return true;
    const auto epoch = ledger_->Acquire(owner_, options_.lease);
    if (!epoch) {
      if (epoch_) LostLease("another relay holds the WAL slot's lease now");
      return false;
    }
    if (epoch_ && *epoch != *epoch_) {
      // Taken over and back again in between: nothing read under the old epoch may commit.
      LostLease("the WAL slot's lease changed hands meanwhile");
    }
    if (!epoch_)
      Log(LogLevel::kInfo, "holding the WAL slot (lease epoch " + std::to_string(*epoch) + ")");
    epoch_ = epoch;
    renew_at_ = now + options_.lease / 3;
    return true;
  }

  void LostLease(const std::string& why) {
    Log(LogLevel::kWarn, why + "; standing by");
    DropPipeline();
    epoch_.reset();
    streaming_ = false;
    source_->Close();  // the server lets one reader stream a slot: the new owner
    seqs_.clear();
    floors_.clear();
    SetActive(false);
  }

  void StartStreaming() {
    // A slot made again starts where it was made: what was committed before that and after the
    // ledger's position is read back from the WAL files first.
    if (slot_gone_since_ && SlotExists()) Recover();
    const Lsn position = ledger_->Position();
    seqs_.clear();
    floors_.clear();
    // A reader still connected now is a relay whose lease expired (frozen, or cut off from the
    // database): it can no longer commit, and the server lets one reader stream a slot, so it is
    // ended instead of waited for (up to wal_sender_timeout).
    try {
      if (const auto ended = ledger_->EndOtherReader()) {
        Log(LogLevel::kWarn, "ended the slot's previous reader (server process " +
                                 std::to_string(*ended) + "), whose lease had expired");
      }
    } catch (const StoreError& error) {
      if (error.kind() != FailureKind::kPermanent) throw;
      Log(LogLevel::kWarn,
          "could not end the slot's previous reader (the slot is free once the "
          "server's wal_sender_timeout ends it): " +
              Describe(error));
    }
    source_->Start(position);
    streaming_ = true;
    counters_.position = position;
    SetActive(true);
    Log(LogLevel::kInfo, "reading the WAL slot from " + FormatLsn(position));
    if (slot_gone_since_) {
      const auto gone =
          std::chrono::duration_cast<std::chrono::seconds>(SteadyClock::now() - *slot_gone_since_);
      Log(LogLevel::kWarn, "the WAL slot is back after " + std::to_string(gone.count()) +
                               " s; WAL mode carries on from where the new slot starts");
      slot_gone_since_.reset();
      recovery_idle_ = false;
      metrics_.slot_missing.Set(0.0);
    }
  }

  bool SlotExists() {
    const WalSlotState state = ledger_->SlotState();
    return state.exists && state.wal_status != "lost";
  }

  // Whether the slot is missing (or lost) as the server says now: reading it failed for good.
  bool SlotIsGone() {
    try {
      return !SlotExists();
    } catch (const StoreError&) {
      return false;
    }
  }

  // The slot was dropped (or lost its WAL) under this relay. WAL-mode enqueues fail without it
  // (outbox.enqueue checks), so what is lost is what was committed but not yet read when it went:
  // said loudly (log, /readyz, outbox_wal_slot_missing), and the relay waits for the slot to be
  // made again (outboxctl migrate --wal-slot) to carry on from it, instead of exiting; the table
  // relay goes on meanwhile.
  void SlotGone(const std::string& what) {
    const auto now = SteadyClock::now();
    metrics_.slot_missing.Set(1.0);
    if (!slot_gone_since_) {
      slot_gone_since_ = now;
      slot_gone_at_ = counters_.position.load();
    }
    if (now >= next_slot_gone_log_) {
      next_slot_gone_log_ = now + kSlotGoneLogEvery;
      metrics_.registry.RecordError("wal", what);
      Log(LogLevel::kError,
          "WAL mode has no slot to read: " + what +
              ". Enqueues in WAL mode fail until it is made again (outboxctl migrate --wal-slot) "
              "or delivery is set to 'table'; messages committed in WAL mode after " +
              FormatLsn(slot_gone_at_) +
              " that this relay had not read when the slot went are not in any slot. Looking "
              "for the slot again every " +
              std::to_string(kSlotCheck.count() / 1000) + " s");
    }
    {
      std::lock_guard lock(slot_mutex_);
      slot_problem_ = "the replication slot is gone: " + what;
    }
    next_slot_check_ = {};
    if (epoch_ && !recovery_idle_) Recover();  // only the lease holder publishes
    Sleep(kSlotCheck);
  }

  // An outage: nothing of the batch in hand was committed; read again from the ledger's position
  // after a pause.
  void Outage(const std::string& what) {
    last_error_ = what;
    ++counters_.errors;
    metrics_.errors.Increment();
    metrics_.registry.RecordError("wal", what);
    Log(LogLevel::kWarn, what + "; reading the slot again from the committed position in " +
                             std::to_string(backoff_.count()) + " ms");
    DropPipeline();
    streaming_ = false;
    seqs_.clear();
    floors_.clear();
    // Not read during the pause, the stream would hold its walsender: a server shutting down
    // waits for every walsender to send all WAL (up to wal_sender_timeout, 60 s).
    source_->Close();
    Sleep(backoff_);
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
  }

  milliseconds UntilRenewal() const {
    const auto left = std::chrono::duration_cast<milliseconds>(renew_at_ - SteadyClock::now());
    return std::clamp(left, milliseconds{0}, kLongestRead);
  }

  struct Item {
    Envelope envelope;
    bool sequenced = false;
  };

  // A batch from its reading to its commit. While it publishes (on a thread of its own) the next
  // batch is read and prepared, and while that one publishes, this one is committed: the broker
  // is kept busy through the database's round trips.
  struct Batch {
    std::vector<Item> items;
    std::size_t transactions = 0;
    WalCommit commit;  // the position and seqs at once; what is parked once the outcomes are in
    // Streams whose messages here are parked, not published: waiting in the table when the batch
    // was read, or left broken by the batch before it (whose commit was not yet made).
    std::set<WalStream> broken;
    std::vector<std::size_t> to_publish;  // indexes into items
    std::future<std::vector<PublishOutcome>> outcomes;
    SteadyClock::time_point started;
    std::uint64_t published = 0;
    // Destroying a batch waits for its publish (std::async's future), so a sink is never used by
    // two threads at once and nothing it reads goes away under it.
  };

  // The slot's next transaction, counted for the linger's arrival rate.
  std::optional<WalTransaction> Read(milliseconds timeout) {
    auto transaction = source_->Next(timeout);
    if (transaction) linger_.Observe(SteadyClock::now(), transaction->messages.size());
    return transaction;
  }

  // One transaction: what was read ahead first, then the slot.
  std::optional<WalTransaction> NextTransaction(milliseconds timeout) {
    if (read_ahead_.empty()) return Read(timeout);
    WalTransaction transaction = std::move(read_ahead_.front());
    read_ahead_.pop_front();
    return transaction;
  }

  // Whole transactions, until batch_size messages or the linger after the first. As the table
  // relay's linger: only as long as the arrival rate makes worth it (adaptive_linger.h); a lone
  // transaction at a low rate goes at once with whatever is already read.
  std::vector<WalTransaction> Gather() {
    std::vector<WalTransaction> batch;
    auto first = NextTransaction(UntilRenewal());
    if (!first) return batch;
    std::size_t messages = first->messages.size();
    batch.push_back(std::move(*first));
    const auto now = SteadyClock::now();
    const auto until = now + linger_.Wait(now);
    while (messages < static_cast<std::size_t>(options_.batch_size)) {
      const auto left = std::chrono::duration_cast<milliseconds>(until - SteadyClock::now());
      auto next = NextTransaction(std::max(left, milliseconds{0}));
      if (!next) break;
      messages += next->messages.size();
      batch.push_back(std::move(*next));
    }
    return batch;
  }

  // While `publishing` publishes: the next batch, if a whole one arrives meanwhile (a backlog).
  // Otherwise what was read stays for Gather, which lingers as usual: the pipeline is for a
  // backlog, and a steady trickle keeps its few statements per message.
  std::vector<WalTransaction> ReadAhead(const Batch& publishing) {
    std::size_t messages = 0;
    for (const WalTransaction& transaction : read_ahead_) messages += transaction.messages.size();
    const auto wanted = static_cast<std::size_t>(options_.batch_size);
    while (messages < wanted) {
      const bool published =
          publishing.outcomes.wait_for(milliseconds{0}) == std::future_status::ready;
      auto next = Read(published ? milliseconds{0} : kReadAheadWait);
      if (!next) {
        if (published) break;
        continue;
      }
      messages += next->messages.size();
      read_ahead_.push_back(std::move(*next));
    }
    if (messages < wanted) return {};
    std::vector<WalTransaction> batch(std::make_move_iterator(read_ahead_.begin()),
                                      std::make_move_iterator(read_ahead_.end()));
    read_ahead_.clear();
    return batch;
  }

  // Nothing to read: with nothing of ours uncommitted, what the server has sent since holds no
  // outbox message, so the slot may let it go (an idle slot then keeps no WAL).
  void Idle() {
    const Lsn received = source_->Received();
    if (received > counters_.position) source_->Confirm(received);
    metrics_.lag_bytes.Set(0);
    metrics_.lag_seconds.Set(0);
  }

  // One step: read a batch unless one is publishing; read the next while it publishes (when
  // `read_ahead`); settle it, start the next one's publish, commit it.
  void Step(bool read_ahead) {
    if (!in_flight_) {
      auto transactions = Gather();
      if (transactions.empty()) {
        Idle();
        return;
      }
      in_flight_ = Prepare(std::move(transactions));
      Launch(*in_flight_, {});
    }
    std::unique_ptr<Batch> next;
    if (read_ahead) {
      if (auto transactions = ReadAhead(*in_flight_); !transactions.empty()) {
        next = Prepare(std::move(transactions));
      }
    }
    std::unique_ptr<Batch> batch = std::move(in_flight_);
    if (!Decide(*batch, batch->outcomes.get())) return;
    // The next batch goes now, without what this one leaves broken: a stream this batch parks or
    // abandons a message of waits for the table, and the next batch's read of the table predates
    // this commit.
    if (next) {
      Launch(*next, batch->broken);
      in_flight_ = std::move(next);
    }
    Record(*batch);
  }

  // Makes a decided batch durable (position, numbers, parks); false when the lease was lost.
  bool Record(Batch& batch_ref) {
    Batch* batch = &batch_ref;
    const WalCommitted written = ledger_->Commit(owner_, *epoch_, batch->commit);
    if (!written) {
      ++counters_.lease_lost;
      LostLease("committing the WAL position was refused: the slot's lease was lost");
      return false;
    }
    table_clear_until_ = written.table_clear && batch->commit.parked.empty()
                             ? SteadyClock::now() + kTrustClearTable
                             : SteadyClock::time_point{};
    const Lsn position = batch->commit.position;
    source_->Confirm(position);
    counters_.position = position;
    counters_.transactions += batch->transactions;
    counters_.published += batch->published;
    counters_.parked += batch->commit.parked.size();
    metrics_.transactions.Increment(batch->transactions);
    metrics_.published.Increment(batch->published);
    metrics_.parked.Increment(batch->commit.parked.size());
    metrics_.batch_seconds.Observe(
        std::chrono::duration<double>(SteadyClock::now() - batch->started).count());
    backoff_ = options_.min_backoff;
    last_error_.clear();
    return true;
  }

  // While the slot is gone: what the server's WAL files still hold of the messages committed
  // after the ledger's position (read back with pg_walinspect) is published as if read from the
  // slot, in batches. Passes repeat while something was found or a transaction was still open;
  // a slot made again ends them with a last pass up to where it starts.
  void Recover() {
    const Lsn after = ledger_->Position();
    WalRecovery recovery;
    try {
      recovery = source_->ReadWalFiles(after);
    } catch (const StoreError& error) {
      if (error.kind() != FailureKind::kPermanent) throw;
      recovery_idle_ = true;
      metrics_.registry.RecordError("wal", Describe(error));
      Log(LogLevel::kError,
          "WAL mode cannot read back what was committed after " + FormatLsn(after) +
              " from the WAL files: " + Describe(error) +
              ". Messages committed in WAL mode that the relay had not read when the slot went "
              "are lost unless re-enqueued (README, WAL mode)");
      return;
    }
    std::size_t messages = 0;
    const std::size_t transactions = recovery.transactions.size();
    std::vector<WalTransaction> chunk;
    std::size_t in_chunk = 0;
    const auto settle = [&] {
      auto batch = Prepare(std::move(chunk));
      chunk.clear();
      in_chunk = 0;
      Launch(*batch, {});
      return Decide(*batch, batch->outcomes.get()) && Record(*batch);
    };
    for (WalTransaction& transaction : recovery.transactions) {
      in_chunk += transaction.messages.size();
      messages += transaction.messages.size();
      chunk.push_back(std::move(transaction));
      if (in_chunk >= static_cast<std::size_t>(options_.batch_size) && !settle()) return;
    }
    if (!chunk.empty() && !settle()) return;
    metrics_.recovered.Increment(messages);
    recovery_idle_ = transactions == 0 && recovery.open_messages == 0;
    if (transactions > 0 || recovery.open_messages > 0) {
      Log(LogLevel::kWarn,
          "read back from the WAL files (pg_walinspect) " + std::to_string(messages) +
              " message(s) of " + std::to_string(transactions) +
              " transaction(s) committed in WAL mode after " + FormatLsn(after) +
              " that no slot will give, up to " + FormatLsn(recovery.until) +
              ", and published them" +
              (recovery.open_messages > 0
                   ? "; " + std::to_string(recovery.open_messages) +
                         " record(s) of transactions still open are read again later"
                   : std::string{}));
    }
  }

  // After an outage or a lost lease: what is publishing is waited for and dropped with what was
  // read ahead; the slot is read again from the ledger's position.
  void DropPipeline() {
    in_flight_.reset();
    read_ahead_.clear();
    table_clear_until_ = {};
  }

  // Decoded messages with their stream_seq and what the table says about their streams.
  std::unique_ptr<Batch> Prepare(std::vector<WalTransaction> transactions) {
    auto batch = std::make_unique<Batch>();
    batch->started = SteadyClock::now();
    std::vector<std::size_t> switches;  // item indexes where a delivery switch comes
    // A switch's own transaction carries no message: not counted as one with outbox messages.
    batch->transactions = static_cast<std::size_t>(std::count_if(
        transactions.begin(), transactions.end(),
        [](const WalTransaction& t) { return !t.messages.empty() || !t.undecodable.empty(); }));
    for (WalTransaction& transaction : transactions) {
      for (const std::string& problem : transaction.undecodable) {
        ++counters_.undecodable;
        metrics_.undecodable.Increment();
        metrics_.registry.RecordError("wal", "undecodable WAL record: " + problem);
        Log(LogLevel::kError,
            "a WAL record with the outbox prefix could not be decoded and is "
            "not relayed: " +
                problem);
      }
      // A change of delivery: what is known of numbers and of the table is out of date from here.
      if (transaction.delivery_switched) {
        switches.push_back(batch->items.size());
        table_clear_until_ = {};
      }
      for (WalMessage& message : transaction.messages) {
        batch->items.push_back({std::move(message.envelope), message.sequenced});
      }
    }
    batch->commit.position = transactions.back().end_lsn;
    const std::chrono::duration<double> age =
        std::chrono::system_clock::now() - transactions.front().commit_time;
    metrics_.lag_seconds.Set(std::max(age.count(), 0.0));
    const Lsn received = source_->Received();
    metrics_.lag_bytes.Set(
        received > counters_.position ? static_cast<double>(received - counters_.position) : 0.0);
    AssignSeqs(batch->items, batch->commit, switches);
    // With the table clear as of a recent commit, nothing there can hold a stream of this batch
    // back (what later batches parked is carried in memory: Launch): one round trip fewer.
    if (SteadyClock::now() >= table_clear_until_) batch->broken = ReadStreamStates(batch->items);
    return batch;
  }

  // Starts publishing what of `batch` is not parked at once (its streams wait in the table, or
  // in `broken_before`).
  void Launch(Batch& batch, const std::set<WalStream>& broken_before) {
    batch.broken.insert(broken_before.begin(), broken_before.end());
    for (std::size_t i = 0; i < batch.items.size(); ++i) {
      const auto stream = StreamOf(batch.items[i].envelope);
      if (stream && batch.broken.contains(*stream)) continue;
      batch.to_publish.push_back(i);
    }
    batch.outcomes = std::async(std::launch::async,
                                [this, &batch] { return Publish(batch.items, batch.to_publish); });
  }

  // What becomes of each message once the sinks have answered: fills batch.commit.parked and
  // batch.broken. False (after Outage) when the batch must be read and published again.
  bool Decide(Batch& batch, const std::vector<PublishOutcome>& outcomes) {
    const std::vector<Item>& items = batch.items;
    const std::vector<std::size_t>& to_publish = batch.to_publish;
    std::set<WalStream>& broken = batch.broken;
    WalCommit& commit = batch.commit;
    std::vector<const PublishOutcome*> outcome_of(items.size(), nullptr);  // by item
    for (std::size_t k = 0; k < to_publish.size(); ++k) outcome_of[to_publish[k]] = &outcomes[k];
    // An outage (something unconfirmed by a target that rejected nothing in this batch): nothing
    // is committed or parked; the batch is read and published again. When a target did reject
    // something, what it left unconfirmed beside it (a channel closed by the rejection: "not
    // sent", "outcome unknown") is parked to wait as well: publishing the batch again would meet
    // the same rejection forever. Another target's outage is never parked.
    std::set<std::string, std::less<>> rejecting;
    for (std::size_t k = 0; k < outcomes.size(); ++k) {
      const auto& failure = outcomes[k].failure;
      if (failure && failure->treatment().spends_attempt) {
        rejecting.insert(items[to_publish[k]].envelope.target);
      }
    }
    for (std::size_t k = 0; k < outcomes.size(); ++k) {
      const auto& failure = outcomes[k].failure;
      if (failure && !failure->treatment().spends_attempt &&
          !rejecting.contains(items[to_publish[k]].envelope.target)) {
        // An unreachable broker is worded as the table relay words it, so that an operator
        // greps one line for both; a verdict that did not come is not called an outage of it.
        const std::string& target = items[to_publish[k]].envelope.target;
        Outage(failure->kind == FailureKind::kOutcomeUnknown
                   ? "sink '" + target + "' gave no verdict on a message: " + failure->Describe()
                   : "sink '" + target + "' is unavailable: " + failure->Describe());
        return false;
      }
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Envelope& envelope = items[i].envelope;
      const auto stream = StreamOf(envelope);
      if (stream && broken.contains(*stream)) {
        commit.parked.push_back({.envelope = envelope,
                                 .as = ParkAs::kWaiting,
                                 .attempts = 0,
                                 .available_in = milliseconds{0},
                                 .error = "waiting: an earlier message of its stream is parked"});
        continue;
      }
      const PublishOutcome* outcome = outcome_of[i];  // published: its stream is not broken
      if (outcome->published()) {
        ++batch.published;
        continue;
      }
      const Failure& failure = *outcome->failure;
      if (!failure.treatment().spends_attempt) {  // beside a rejection (see above)
        commit.parked.push_back({.envelope = envelope,
                                 .as = ParkAs::kWaiting,
                                 .attempts = 0,
                                 .available_in = milliseconds{0},
                                 .error = failure.Describe()});
        if (stream) broken.insert(*stream);
        continue;
      }
      const bool abandon = failure.treatment().abandon_now || options_.retry.Exhausted(1);
      Log(LogLevel::kWarn, "WAL message " + envelope.id.ToString() + " to " + envelope.target +
                               " failed and is parked" + (abandon ? " as abandoned" : "") + ": " +
                               failure.Describe());
      const milliseconds delay = std::max(options_.retry.Delay(1, random_), failure.retry_after);
      commit.parked.push_back({.envelope = envelope,
                               .as = abandon ? ParkAs::kAbandoned : ParkAs::kFailed,
                               .attempts = 1,
                               .available_in = abandon ? milliseconds{0} : delay,
                               .error = failure.Describe()});
      // Its followers in this batch reached the broker before the verdict, without
      // stream_prev_seq: they are parked too, and published again by the table relay, whose
      // claim sets it after an abandoned one (as table mode holds them back); so are those of the
      // batch read ahead (Launch). In batches read after this commit an abandoned message holds
      // nothing back: the stream's next message carries stream_prev_seq.
      if (stream) broken.insert(*stream);
    }
    return true;
  }

  // stream_seq in commit order, from the counters as of the last commit (read once per stream
  // and kept while the slot is read without a break). The ledger's counter of a stream is the
  // greater of the WAL relay's and the table's (stream_seqs): after a change of delivery
  // (`switches`: item indexes) each stream's number is read again, since table-mode enqueues may
  // have numbered it meanwhile; what this relay gave but has not committed yet stays a floor.
  void AssignSeqs(std::vector<Item>& items, WalCommit& commit,
                  const std::vector<std::size_t>& switches) {
    const std::size_t first_switch = switches.empty() ? items.size() : switches.front();
    std::vector<WalStream> unread;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& item = items[i];
      if (!item.sequenced || !item.envelope.stream_key) continue;
      WalStream stream{item.envelope.target, *item.envelope.stream_key};
      if ((i >= first_switch || !seqs_.contains(stream)) &&
          std::find(unread.begin(), unread.end(), stream) == unread.end()) {
        unread.push_back(std::move(stream));
      }
    }
    std::map<WalStream, std::int64_t> read;
    if (!unread.empty()) {
      const auto latest = ledger_->Seqs(unread);
      for (std::size_t i = 0; i < unread.size(); ++i) read[unread[i]] = latest[i];
    }
    const auto forget = [this] {
      for (const auto& [stream, seq] : seqs_) {
        auto& floor = floors_[stream];
        floor = std::max(floor, seq);
      }
      seqs_.clear();
    };
    auto next_switch = switches.begin();
    std::map<WalStream, std::int64_t> changed;
    for (std::size_t i = 0; i < items.size(); ++i) {
      for (; next_switch != switches.end() && *next_switch <= i; ++next_switch) forget();
      Item& item = items[i];
      if (!item.sequenced || !item.envelope.stream_key) continue;
      WalStream stream{item.envelope.target, *item.envelope.stream_key};
      auto cached = seqs_.find(stream);
      if (cached == seqs_.end()) {
        std::int64_t latest = read.at(stream);
        if (const auto floor = floors_.find(stream); floor != floors_.end()) {
          latest = std::max(latest, floor->second);
          floors_.erase(floor);
        }
        cached = seqs_.emplace(stream, latest).first;
      }
      const std::int64_t seq = ++cached->second;
      item.envelope.stream_seq = seq;
      changed[stream] = seq;
    }
    if (next_switch != switches.end()) forget();  // a switch after the batch's last message
    commit.seqs.assign(changed.begin(), changed.end());
  }

  // The streams of the batch that wait in the table (their messages here are parked behind);
  // and, where the message before a stream's first one here was abandoned, that first message's
  // stream_prev_seq.
  std::set<WalStream> ReadStreamStates(std::vector<Item>& items) {
    std::vector<std::pair<WalStream, std::int64_t>> streams;
    std::vector<std::size_t> first_item;
    std::map<WalStream, std::size_t> seen;
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto stream = StreamOf(items[i].envelope);
      if (!stream || !seen.try_emplace(*stream, streams.size()).second) continue;
      streams.emplace_back(std::move(*stream), items[i].envelope.stream_seq.value_or(0));
      first_item.push_back(i);
    }
    const auto states = ledger_->StreamStates(streams);
    if (states.size() != streams.size()) {
      throw StoreError(FailureKind::kUnavailable,
                       "the ledger returned " + std::to_string(states.size()) +
                           " stream states for " + std::to_string(streams.size()) + " streams");
    }
    std::set<WalStream> blocked;
    for (std::size_t k = 0; k < streams.size(); ++k) {
      if (states[k].blocked) blocked.insert(streams[k].first);
      if (states[k].prev_seq) items[first_item[k]].envelope.stream_prev_seq = states[k].prev_seq;
    }
    return blocked;
  }

  // Each target's messages through its sink, in batch order, the targets side by side (as the
  // table relay's lanes: a slow broker adds nothing to the others' time; the first target's lane
  // runs on this thread); one outcome per index.
  std::vector<PublishOutcome> Publish(const std::vector<Item>& items,
                                      const std::vector<std::size_t>& indexes) {
    std::vector<PublishOutcome> outcomes(indexes.size());
    std::map<std::string, std::vector<std::size_t>, std::less<>> by_target;
    for (std::size_t k = 0; k < indexes.size(); ++k) {
      by_target[items[indexes[k]].envelope.target].push_back(k);
    }
    const Deadline deadline = SteadyClock::now() + options_.publish_timeout;
    struct Lane {
      const std::string* target;
      const std::vector<std::size_t>* positions;
      std::future<std::vector<PublishOutcome>> outcomes;
    };
    std::vector<Lane> lanes;
    for (const auto& [target, positions] : by_target) {
      const auto sink = sinks_.find(target);
      if (sink == sinks_.end()) {
        for (const auto k : positions) {
          outcomes[k] = {
              items[indexes[k]].envelope.id,
              Failure{FailureKind::kRejected, "no sink is configured for target '" + target + "'"}};
        }
        continue;
      }
      auto lane = [&items, &indexes, &deadline, &positions = positions, sink = sink->second.get()] {
        std::vector<Envelope> envelopes;
        envelopes.reserve(positions.size());
        for (const auto k : positions) envelopes.push_back(items[indexes[k]].envelope);
        return RedactReasons(sink->Publish(envelopes, deadline));
      };
      const auto policy = lanes.empty() ? std::launch::deferred : std::launch::async;
      lanes.push_back({&target, &positions, std::async(policy, std::move(lane))});
    }
    for (Lane& lane : lanes) {
      auto results = lane.outcomes.get();
      if (results.size() != lane.positions->size()) {
        throw StoreError(FailureKind::kUnavailable,
                         "sink " + *lane.target + " returned " + std::to_string(results.size()) +
                             " outcomes for " + std::to_string(lane.positions->size()) +
                             " messages");
      }
      for (std::size_t j = 0; j < results.size(); ++j) {
        outcomes[(*lane.positions)[j]] = std::move(results[j]);
      }
    }
    return outcomes;
  }

  std::unique_ptr<observe::Registry> own_registry_;
  WalMetrics metrics_;
  WalRelayOptions options_;
  std::unique_ptr<WalSource> source_;
  std::unique_ptr<WalLedger> ledger_;
  SinkMap sinks_;
  LogFn log_;
  WalRelayCounters& counters_;
  const std::string owner_;
  milliseconds backoff_;
  UniformRandom random_;

  std::optional<std::int64_t> epoch_;  // set while the lease is held
  SteadyClock::time_point renew_at_{};
  bool streaming_ = false;
  AdaptiveLinger linger_{options_.linger, options_.batch_size};  // fed by every transaction read
  std::deque<WalTransaction> read_ahead_;  // read while a batch published; not yet in a batch
  std::unique_ptr<Batch> in_flight_;       // publishing; its outcomes not yet taken
  // Until when the table is taken as clear (WalCommitted::table_clear): StreamStates is skipped.
  SteadyClock::time_point table_clear_until_{};
  std::optional<SteadyClock::time_point> slot_gone_since_;  // while the slot is missing
  Lsn slot_gone_at_ = 0;                                    // the committed position when it went
  bool recovery_idle_ = false;  // the last read of the WAL files found nothing left
  SteadyClock::time_point next_slot_gone_log_{};
  std::map<WalStream, std::int64_t> seqs_;  // the latest stream_seq given, per stream
  // After a delivery switch: numbers given before it, perhaps not committed yet, which a stream's
  // number read again from the ledger must not fall below.
  std::map<WalStream, std::int64_t> floors_;

  SteadyClock::time_point next_slot_check_{};
  SteadyClock::time_point next_purge_{};
  std::string last_error_;  // of the last outage, until a batch succeeds
  mutable std::mutex slot_mutex_;
  std::optional<std::string> slot_problem_;  // guarded by slot_mutex_

  mutable std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;  // guarded by stop_mutex_
};

void WalRelay::CheckOptions(const WalRelayOptions& options) {
  if (options.instance.empty()) throw ConfigError("instance", "must not be empty");
  if (options.batch_size < 1) throw ConfigError("batch_size", "must be at least 1");
  if (options.linger < milliseconds{0}) throw ConfigError("linger", "must not be negative");
  if (options.lease < milliseconds{1000}) throw ConfigError("lease", "must be at least 1s");
  if (options.publish_timeout >= options.lease) {
    throw ConfigError("publish_timeout", "must be shorter than the lease");
  }
  if (auto problem = options.retry.Validate()) throw ConfigError("retry", *problem);
}

WalRelay::WalRelay(WalRelayOptions options, std::unique_ptr<WalSource> source,
                   std::unique_ptr<WalLedger> ledger, SinkMap sinks, LogFn log) {
  CheckOptions(options);
  if (sinks.empty()) throw ConfigError("sinks", "at least one sink is needed");
  if (!source || !ledger) throw std::invalid_argument("WalRelay: a source and a ledger are needed");
  engine_ = std::make_unique<Engine>(std::move(options), std::move(source), std::move(ledger),
                                     std::move(sinks), std::move(log), counters_);
}

WalRelay::~WalRelay() = default;

void WalRelay::Run() { engine_->Run(); }

void WalRelay::Stop() { engine_->Stop(); }

std::optional<std::string> WalRelay::SlotProblem() const { return engine_->SlotProblem(); }

}  // namespace outbox
