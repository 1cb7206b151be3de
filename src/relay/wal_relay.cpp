#include "outbox/relay/wal_relay.h"

#include <algorithm>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "outbox/core/backoff.h"
#include "outbox/core/error.h"
#include "outbox/core/uuid.h"
#include "pipeline.h"
#include "wal_batch.h"
#include "wal_gather.h"
#include "wal_metrics.h"
#include "wal_numbers.h"
#include "wal_settler.h"
#include "wal_slot_watch.h"

namespace outbox {
namespace {

using relay::Batch;
using relay::Item;
using relay::WalStreamOf;

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// While another relay holds the slot, how often to look whether its lease has expired.
constexpr milliseconds kStandbyLook{1000};
// How often what later commits superseded is removed from the ledger (WalLedger::Purge).
constexpr milliseconds kPurgeEvery{5000};
// The longest a read of the slot waits, so that the lease is renewed and Stop is seen in time.
constexpr milliseconds kLongestRead{500};
// How long a commit's word that outbox.messages holds nothing that could hold a stream back is
// taken for it (renewed by every commit; a bound, in case a row comes by some other way).
constexpr milliseconds kTrustClearTable{1000};

std::string Describe(const std::exception& error) { return error.what(); }

using WalPipeline = relay::Pipeline<Batch, std::set<WalStream>>;

}  // namespace

class WalRelay::Engine : private WalPipeline::Stages {
 public:
  Engine(WalRelayOptions options, std::unique_ptr<WalSource> source,
         std::unique_ptr<WalLedger> ledger, std::shared_ptr<Dispatcher> dispatcher, LogFn log,
         WalRelayCounters& counters)
      : own_registry_(options.metrics == nullptr ? std::make_unique<observe::Registry>() : nullptr),
        metrics_(observe::Scope(options.metrics != nullptr ? *options.metrics : *own_registry_,
                                options.metric_labels, options.metric_series_limit)),
        options_(std::move(options)),
        source_(std::move(source)),
        ledger_(std::move(ledger)),
        dispatcher_(std::move(dispatcher)),
        log_(std::move(log)),
        counters_(counters),
        owner_(options_.instance + "/" + NewUuidV7().ToString().substr(24)),
        backoff_(options_.min_backoff, options_.max_backoff),
        settler_(options_.retry, *dispatcher_, log_) {}

  void Run() {
    Log(LogLevel::kInfo, "WAL relay started as " + owner_);
    while (!stopping()) {
      try {
        slot_.Check(last_error_);
        if (!HoldLease()) {
          Sleep(kStandbyLook);
          continue;
        }
        if (!streaming_) StartStreaming();
        Purge();
        pipeline_.Turn(/*take_ahead=*/true);
      } catch (const StoreError& error) {
        if (error.kind() == FailureKind::kPermanent && !streaming_) {
          if (!slot_.IsGone()) throw;
          SlotGone(Describe(error));
          continue;
        }
        Outage(Describe(error));
      }
    }
    // A batch published while the last one was committed: settled, so that a restart does not
    // publish it again.
    if (pipeline_.publishing() != nullptr && epoch_) {
      try {
        pipeline_.Turn(/*take_ahead=*/false);
      } catch (const StoreError& error) {
        Log(LogLevel::kWarn,
            "settling the last WAL batch at stop failed (it is read and "
            "published again by the next relay): " +
                Describe(error));
      }
    }
    pipeline_.Drop();
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

  std::optional<std::string> SlotProblem() const { return slot_.Problem(); }

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
    numbers_.Forget();
    SetActive(false);
  }

  void StartStreaming() {
    // A slot made again starts where it was made: what was committed before that and after the
    // ledger's position is read back from the WAL files first.
    if (slot_.gone() && slot_.Exists()) Recover();
    const Lsn position = ledger_->Position();
    numbers_.Forget();
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
    if (const auto gone = slot_.Back()) {
      Log(LogLevel::kWarn, "the WAL slot is back after " + std::to_string(gone->count()) +
                               " s; WAL mode carries on from where the new slot starts");
      recovery_idle_ = false;
    }
  }

  // The slot was dropped (or lost its WAL) under this relay: reported (WalSlotWatch::Gone), and
  // the relay waits for the slot to be made again (outboxctl migrate --wal-slot) to carry on from
  // it, instead of exiting; the table relay goes on meanwhile. What the WAL files still hold is
  // published meanwhile (Recover).
  void SlotGone(const std::string& what) {
    slot_.Gone(what, counters_.position.load());
    if (epoch_ && !recovery_idle_) Recover();  // only the lease holder publishes
    Sleep(relay::WalSlotWatch::kCheckEvery);
  }

  // An outage: nothing of the batch in hand was committed; read again from the ledger's position
  // after a pause.
  void Outage(const std::string& what) {
    last_error_ = what;
    ++counters_.errors;
    metrics_.errors.Increment();
    metrics_.registry.RecordError("wal", what);
    const milliseconds pause = backoff_.Failed();
    Log(LogLevel::kWarn, what + "; reading the slot again from the committed position in " +
                             std::to_string(pause.count()) + " ms");
    DropPipeline();
    streaming_ = false;
    numbers_.Forget();
    // Not read during the pause, the stream would hold its walsender: a server shutting down
    // waits for every walsender to send all WAL (up to wal_sender_timeout, 60 s).
    source_->Close();
    Sleep(pause);
  }

  milliseconds UntilRenewal() const {
    const auto left = std::chrono::duration_cast<milliseconds>(renew_at_ - SteadyClock::now());
    return std::clamp(left, milliseconds{0}, kLongestRead);
  }

  // Nothing to read: with nothing of ours uncommitted, what the server has sent since holds no
  // outbox message, so the slot may let it go (an idle slot then keeps no WAL).
  void Idle() {
    const Lsn received = source_->Received();
    if (received > counters_.position) source_->Confirm(received);
    metrics_.lag_bytes.Set(0);
    metrics_.lag_seconds.Set(0);
  }

  // The pipeline's stages (pipeline.h).

  // Nothing publishing: the next transactions, waited for until the lease is due for renewal.
  std::unique_ptr<Batch> Take() override {
    auto transactions = gatherer_.Gather(UntilRenewal());
    if (transactions.empty()) {
      Idle();
      return nullptr;
    }
    return Prepare(std::move(transactions));
  }

  // While `publishing` publishes: the next batch if a whole one is there (a backlog).
  std::unique_ptr<Batch> TakeAhead(Batch& publishing) override {
    auto transactions = gatherer_.ReadAhead(publishing.outcomes);
    if (transactions.empty()) return nullptr;
    return Prepare(std::move(transactions));
  }

  // The next batch goes without what the batch before left broken: a stream that batch parks
  // or abandons a message of waits for the table, and this batch's read of the table predates
  // that batch's commit.
  void Launch(Batch& batch, const std::set<WalStream>& broken_before) override {
    batch.broken.insert(broken_before.begin(), broken_before.end());
    for (std::size_t i = 0; i < batch.items.size(); ++i) {
      const auto stream = WalStreamOf(batch.items[i].envelope);
      if (stream && batch.broken.contains(*stream)) continue;
      batch.to_publish.push_back(i);
    }
    batch.outcomes = std::async(std::launch::async,
                                [this, &batch] { return Publish(batch.items, batch.to_publish); });
  }

  // An outage (a sink's answer that leaves nothing decidable) drops the pipeline; nothing of the
  // batch is committed and the slot is read again.
  std::optional<std::set<WalStream>> Decide(Batch& batch) override {
    if (const auto outage = settler_.Decide(batch, batch.outcomes.get())) {
      Outage(*outage);
      return std::nullopt;
    }
    return batch.broken;
  }

  void Record(Batch& batch) override { Commit(batch); }

  // Makes a decided batch durable (position, numbers, parks); false when the lease was lost.
  bool Commit(Batch& batch_ref) {
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
    backoff_.Succeeded();
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
      return Decide(*batch) && Commit(*batch);
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
    pipeline_.Drop();
    gatherer_.Clear();
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
    numbers_.Assign(batch->items, batch->commit, switches, *ledger_);
    // With the table clear as of a recent commit, nothing there can hold a stream of this batch
    // back (what later batches parked is carried in memory: Launch): one round trip fewer.
    if (SteadyClock::now() >= table_clear_until_) batch->broken = ReadStreamStates(batch->items);
    return batch;
  }

  // The streams of the batch that wait in the table (their messages here are parked behind);
  // and, where the message before a stream's first one here was abandoned, that first message's
  // stream_prev_seq.
  std::set<WalStream> ReadStreamStates(std::vector<Item>& items) {
    std::vector<std::pair<WalStream, std::int64_t>> streams;
    std::vector<std::size_t> first_item;
    std::map<WalStream, std::size_t> seen;
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto stream = WalStreamOf(items[i].envelope);
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

  // The messages at `indexes` through the dispatcher (dispatcher.h); one outcome per index.
  std::vector<PublishOutcome> Publish(const std::vector<Item>& items,
                                      const std::vector<std::size_t>& indexes) {
    std::vector<Envelope> envelopes;
    envelopes.reserve(indexes.size());
    for (const auto i : indexes) {
      envelopes.push_back(items[i].envelope);
      envelopes.back().database = options_.database;
    }
    return dispatcher_->Dispatch(envelopes, SteadyClock::now() + options_.publish_timeout);
  }

  std::unique_ptr<observe::Registry> own_registry_;
  relay::WalMetrics metrics_;
  WalRelayOptions options_;
  std::unique_ptr<WalSource> source_;
  std::unique_ptr<WalLedger> ledger_;
  std::shared_ptr<Dispatcher> dispatcher_;
  LogFn log_;
  WalRelayCounters& counters_;
  const std::string owner_;
  outbox::Backoff backoff_;  // after an outage
  relay::WalSettler settler_;

  std::optional<std::int64_t> epoch_;  // set while the lease is held
  SteadyClock::time_point renew_at_{};
  bool streaming_ = false;
  relay::WalGatherer gatherer_{*source_, options_.batch_size, options_.linger};
  relay::WalSlotWatch slot_{*ledger_, metrics_, log_};  // declared after ledger_ and metrics_
  WalPipeline pipeline_{*this};  // what publishes; destroyed (waited for) before what it uses
  // Until when the table is taken as clear (WalCommitted::table_clear): StreamStates is skipped.
  SteadyClock::time_point table_clear_until_{};
  bool recovery_idle_ = false;  // the last read of the WAL files found nothing left
  relay::WalStreamNumbers numbers_;

  SteadyClock::time_point next_purge_{};
  std::string last_error_;  // of the last outage, until a batch succeeds

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
                   std::unique_ptr<WalLedger> ledger, SinkMap sinks, LogFn log)
    : WalRelay(options, std::move(source), std::move(ledger),
               DispatcherFor(std::move(sinks), options, log), log) {}

WalRelay::WalRelay(WalRelayOptions options, std::unique_ptr<WalSource> source,
                   std::unique_ptr<WalLedger> ledger, std::shared_ptr<Dispatcher> dispatcher,
                   LogFn log) {
  CheckOptions(options);
  if (!dispatcher) throw ConfigError("sinks", "at least one sink is needed");
  if (!source || !ledger) throw std::invalid_argument("WalRelay: a source and a ledger are needed");
  engine_ = std::make_unique<Engine>(std::move(options), std::move(source), std::move(ledger),
                                     std::move(dispatcher), std::move(log), counters_);
}

WalRelay::~WalRelay() = default;

void WalRelay::Run() { engine_->Run(); }

void WalRelay::Stop() { engine_->Stop(); }

std::optional<std::string> WalRelay::SlotProblem() const { return engine_->SlotProblem(); }

}  // namespace outbox
