#include "outbox/relay/relay.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "adaptive_linger.h"
#include "outbox/core/backoff.h"
#include "outbox/core/error.h"
#include "outbox/core/message.h"
#include "outbox/core/uuid.h"
#include "partition_membership.h"
#include "pipeline.h"
#include "table_housekeeping.h"
#include "table_report.h"
#include "table_settler.h"

namespace outbox {
namespace {

using SteadyClock = std::chrono::steady_clock;
using relay::PartitionMembership;
using relay::StreamId;
using relay::StreamOf;

std::string Describe(const std::exception& error) { return error.what(); }

// A claimed batch from its launch to its settling. Destroying it waits for its publish
// (std::async's future), so that a sink is never used by two threads at once.
struct TableBatch {
  std::vector<Envelope> messages;
  std::future<std::vector<PublishOutcome>> outcomes;
};
using TablePipeline = relay::Pipeline<TableBatch, std::set<StreamId>>;

}  // namespace

class Relay::Engine : private TablePipeline::Stages {
 public:
  Engine(RelayOptions options, std::unique_ptr<Store> store, std::unique_ptr<Wakeup> wakeup,
         std::shared_ptr<Dispatcher> dispatcher, LogFn log, RelayCounters& counters)
      : own_registry_(options.metrics == nullptr ? std::make_unique<observe::Registry>() : nullptr),
        report_(observe::Scope(options.metrics != nullptr ? *options.metrics : *own_registry_,
                               options.metric_labels, options.metric_series_limit),
                counters, std::move(log)),
        options_(std::move(options)),
        store_(std::move(store)),
        wakeup_(std::move(wakeup)),
        dispatcher_(std::move(dispatcher)),
        // Unique per run: a restarted relay with the same instance name must not mistake the
        // leases of its dead predecessor for its own (see Store::Claim).
        owner_(options_.instance + "/" + NewUuidV7().ToString().substr(24)),
        settler_(*store_, owner_, options_.max_attempts, report_),
        backoff_(options_.min_backoff, options_.max_backoff) {
    if (options_.hand_off != nullptr) {
      options_.hand_off->SetListener([wakeup = wakeup_.get()] { wakeup->Interrupt(); });
    }
    // Whoever pauses a target (this relay, or a WAL relay sharing the dispatcher), the counters
    // show it.
    pause_listener_ = dispatcher_->AddPauseListener(
        [&counters = report_.counters](bool any) { counters.broker_unavailable = any; });
    if (options_.partition_leases != nullptr) {
      membership_ = std::make_unique<PartitionMembership>(
          *options_.partition_leases, owner_,
          PartitionMembership::Timing{.lease = options_.lease,
                                      .idle_lease = std::max(options_.lease, options_.idle_lease),
                                      .sweep_interval = options_.sweep_interval,
                                      .max_backoff = options_.max_backoff},
          report_, [wakeup = wakeup_.get()] { wakeup->Interrupt(); });
    }
  }

  ~Engine() {
    if (options_.hand_off != nullptr) options_.hand_off->SetListener({});
    dispatcher_->RemovePauseListener(pause_listener_);
  }

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void Run() {
    Log(LogLevel::kInfo, "relay started; leases are held as " + owner_);
    // Heartbeats run on a thread (and connection) of their own (partition_membership.h); on a
    // way out by exception (a bug) it is stopped and joined too, not left to terminate.
    struct Joined {
      PartitionMembership* membership;
      ~Joined() {
        if (membership == nullptr) return;
        membership->Stop();
        membership->Join();
      }
    } heartbeats{membership_.get()};
    if (membership_) membership_->Start();
    while (!stopping()) {
      // Outcomes not yet recorded come before any claim: a message of a stream left leased here
      // must be back before the stream's later messages can be claimed behind it. While a batch
      // publishes they are recorded by the claim made beside it (TakeAhead); partitions are
      // handed back only once they are recorded (the next owner would find them fenced and
      // publish them again).
      if (membership_ && membership_->HandBackPending()) {
        if (const auto error = settler_.RecordUnrecorded()) {
          Backoff("recording outcomes failed: " + *error);
          continue;
        }
      }
      const TableBatch* publishing = pipeline_.publishing();
      Housekeeping(publishing != nullptr ? publishing->messages : std::vector<Envelope>{});
      pipeline_.Turn(/*take_ahead=*/true);
    }
    // The batch launched last is settled (Launch published nothing after the stop).
    if (pipeline_.publishing() != nullptr) pipeline_.Turn(/*take_ahead=*/false);
    if (membership_) membership_->Join();  // it ends on Stop
    settler_.RecordUnrecorded();  // a last try; what is left comes back when its lease expires
    if (membership_) membership_->Leave();
    Log(LogLevel::kInfo,
        "relay " + owner_ + " stopped: " + std::to_string(report_.counters.published) +
            " published, " + std::to_string(report_.counters.lease_lost) + " lease lost");
  }

  void Stop() {
    {
      std::lock_guard lock(stop_mutex_);
      stop_ = true;
    }
    stop_changed_.notify_all();
    if (membership_) membership_->Stop();
    wakeup_->Interrupt();
  }

  [[nodiscard]] const Dispatcher& dispatcher() const { return *dispatcher_; }

 private:
  bool stopping() const {
    std::lock_guard lock(stop_mutex_);
    return stop_;
  }

  void Log(LogLevel level, const std::string& message) const { report_.Log(level, message); }

  // The pipeline's stages (pipeline.h).

  // Nothing publishing: what the last claim left to record first, then the next claim, after
  // the linger; none found, the relay idles until there is work.
  std::unique_ptr<TableBatch> Take() override {
    std::vector<Envelope> none;
    KeepPartitions(none);  // hands surplus partitions over while idle too
    // Published ones are settled by the claim itself (ClaimRequest::complete).
    if (const auto error = settler_.RecordReturned()) {
      Backoff("recording outcomes failed: " + *error);
      return nullptr;
    }
    Linger();
    auto messages = Claim();
    // A claim that failed is tried again after its backoff rather than going idle: the wake-up
    // connection may be as silent as the store's was, and its deadline would hold back what is
    // waiting (issue #40).
    if (messages.empty() && !claim_failed_) messages = IdleUntilWork();
    if (messages.empty()) return nullptr;
    auto batch = std::make_unique<TableBatch>();
    batch->messages = std::move(messages);
    return batch;
  }

  // While `publishing` publishes, the database records the outcomes before it and claims the
  // next batch: only a full batch suggests there is more to claim.
  std::unique_ptr<TableBatch> TakeAhead(TableBatch& publishing) override {
    // Once a batch is on its way: the wake-up connection may be the one that stopped answering
    // (issue #40), and its deadline must not hold back what was claimed.
    WithdrawIdle();
    if (settler_.RecordReturned()) return nullptr;
    if (static_cast<int>(publishing.messages.size()) < options_.batch_size || stopping()) {
      return nullptr;
    }
    auto messages = Claim(publishing.messages);
    if (messages.empty()) return nullptr;
    auto batch = std::make_unique<TableBatch>();
    batch->messages = std::move(messages);
    return batch;
  }

  // Claimed while the batch before was in flight: messages of a target paused since go back with
  // no lease kept, and messages behind a failure of their stream wait for it (both unpublished,
  // no attempt spent); partitions found lost or surplus are let go. After a stop nothing starts.
  void Launch(TableBatch& batch, const std::set<StreamId>& broken_before) override {
    if (stopping()) {
      settler_.Release(batch.messages);
      batch.messages.clear();
    }
    std::set<StreamId> broken = broken_before;
    const auto now = SteadyClock::now();
    const auto held = dispatcher_->Held(now);
    const auto paused = dispatcher_->HeldPaused(now);
    std::vector<Envelope> parked;
    std::size_t throttled = 0;  // of a target held for its max_rate, not for an outage
    std::erase_if(batch.messages, [&](Envelope& envelope) {
      if (std::find(held.begin(), held.end(), envelope.target) == held.end()) return false;
      if (std::find(paused.begin(), paused.end(), envelope.target) == paused.end()) ++throttled;
      if (envelope.stream_key) broken.insert(StreamOf(envelope));
      parked.push_back(std::move(envelope));
      return true;
    });
    report_.counters.throttled += throttled;
    report_.metrics.throttled.Increment(throttled);
    settler_.Release(parked);
    settler_.HoldBack(batch.messages, broken);
    KeepPartitions(batch.messages);
    if (batch.messages.empty()) {
      std::promise<std::vector<PublishOutcome>> none;
      none.set_value({});
      batch.outcomes = none.get_future();
      return;
    }
    batch.outcomes =
        std::async(std::launch::async, [this, &batch] { return Publish(batch.messages); });
  }

  // The outcomes are settled; the streams that had a failure are returned.
  std::optional<std::set<StreamId>> Decide(TableBatch& batch) override {
    return settler_.Settle(batch.messages, batch.outcomes.get());
  }

  // The published ones ride on the next claim (ClaimRequest::complete); what failed is recorded
  // before it (RecordReturned).
  void Record(TableBatch& /*batch*/) override { backoff_.Succeeded(); }

  // Sleeps (interruptibly) after an outage, doubling the pause each time up to max_backoff.
  void Backoff(const std::string& reason) {
    const auto pause = backoff_.Failed();
    Log(LogLevel::kWarn, reason + "; retrying in " + std::to_string(pause.count()) + " ms");
    std::unique_lock lock(stop_mutex_);
    stop_changed_.wait_for(lock, pause, [this] { return stop_; });
  }

  // Claims the next batch; `in_flight` are the messages claimed earlier and not yet settled.
  std::vector<Envelope> Claim(const std::vector<Envelope>& in_flight = {}) {
    claim_failed_ = false;
    if (const auto error = ReconcileLeases(in_flight)) {
      claim_failed_ = true;
      Backoff("giving back the leases of a failed claim failed: " + *error);
      return {};
    }
    try {
      ClaimRequest request;
      request.owner = owner_;
      request.max_messages = options_.batch_size;
      request.lease_duration = options_.lease;
      // Beside a batch in flight: also a limited target that batch leaves without tokens.
      request.paused_targets = dispatcher_->Held(SteadyClock::now(), in_flight);
      if (membership_) {
        request.partitions = membership_->Claimable();
        if (request.partitions->empty()) return {};  // no partition held (yet)
      }
      request.complete = settler_.done();
      last_claim_at_ = SteadyClock::now();
      auto round = store_->ClaimRound(request);
      report_.metrics.claim_seconds.Observe(
          std::chrono::duration<double>(SteadyClock::now() - last_claim_at_).count());
      settler_.DoneRecorded();
      report_.counters.database_failing = false;
      report_.Completed(round.completed);
      next_due_.reset();
      if (round.next_due) next_due_ = last_claim_at_ + *round.next_due;
      auto& batch = round.messages;
      if (!options_.database.empty()) {
        for (auto& envelope : batch) envelope.database = options_.database;
      }
      last_claim_size_ = static_cast<int>(batch.size());
      linger_.Observe(SteadyClock::now(), batch.size());
      if (static_cast<int>(batch.size()) < request.max_messages) {
        EndIdlePauses(batch, in_flight, request.paused_targets);
      }
      report_.counters.claimed += batch.size();
      if (!batch.empty()) {
        if (membership_) membership_->SetIdle(false);
        report_.metrics.claimed.Increment(batch.size());
        report_.metrics.claim_batch_size.Observe(static_cast<double>(batch.size()));
        report_.LeasesHeld(batch.size(), 0);
      }
      return std::move(batch);
    } catch (const StoreError& error) {
      // Its reply may have been lost after the database committed it: messages leased here that
      // this relay does not know. They go back before anything more is claimed (ReconcileLeases).
      reconcile_leases_ = true;
      claim_failed_ = true;
      report_.StoreFailed(error);
      Backoff("claim failed: " + Describe(error));
      return {};
    }
  }

  // What to give back: this relay's leases but `in_flight`, and sharing partitions only in those
  // it holds (another relay's slow batch is its own; a takeover voids a dead relay's leases).
  ReclaimRequest Reclaim(const std::vector<Envelope>& in_flight, bool own_unexpired) {
    ReclaimRequest request;
    request.owner = owner_;
    request.own_unexpired = own_unexpired;
    for (const auto& envelope : in_flight) request.in_flight.push_back(envelope.id);
    if (membership_) request.partitions = membership_->Claimable();
    return request;
  }

  // After a failed claim, before the next: gives back every lease this relay holds apart from
  // `in_flight`, so that a message leased by a claim whose reply was lost is claimable again
  // before its stream's later messages are claimed (they would otherwise be published first,
  // since claims may go behind the caller's own leases). Returns the error when the store could
  // not be reached; reconcile_leases_ stays set until it succeeds, and no claim is made till then.
  std::optional<std::string> ReconcileLeases(const std::vector<Envelope>& in_flight) {
    if (!reconcile_leases_) return std::nullopt;
    try {
      const std::int64_t given_back =
          store_->ReclaimExpired(Reclaim(in_flight, /*own_unexpired=*/true));
      reconcile_leases_ = false;
      if (given_back > 0) {
        Log(LogLevel::kWarn, std::to_string(given_back) +
                                 " messages leased by a claim whose reply was lost were given "
                                 "back; they will be published in stream order");
      }
      return std::nullopt;
    } catch (const StoreError& error) {
      report_.StoreFailed(error);
      return Describe(error);
    }
  }

  // Under steady load the next claim waits, since the last one, for as long as the arrival rate
  // makes worth it (adaptive_linger.h; RelayOptions::linger is the cap); a full batch (a
  // backlog) claims at once.
  void Linger() {
    if (last_claim_size_ >= options_.batch_size) return;
    const auto wait = linger_.Wait(SteadyClock::now());
    if (wait.count() == 0) return;
    std::unique_lock lock(stop_mutex_);
    stop_changed_.wait_until(lock, last_claim_at_ + wait, [this] { return stop_; });
  }

  // Nothing to do: tell writers, look once more, then sleep until notified or the sweep is due.
  std::vector<Envelope> IdleUntilWork() {
    // Outcomes a claim did not take (it was not made: no partition held) are recorded before a
    // sleep, not after it.
    if (const auto error = settler_.RecordUnrecorded()) {
      Backoff("recording outcomes failed: " + *error);
      return {};
    }
    const auto now = SteadyClock::now();
    const auto next_probe = dispatcher_->NextProbe(now);
    if (next_probe && dispatcher_->Held(now).size() == dispatcher_->size()) {
      // Every sink paused: nothing can be claimed before the first probe. No idle mark meanwhile,
      // so that writers do not wake the relay for each commit only to claim nothing.
      WithdrawIdle();
      std::unique_lock lock(stop_mutex_);
      stop_changed_.wait_until(lock, *next_probe, [this] { return stop_; });
      return {};
    }
    // Announce once per idle spell: after a sleep that ended without a notification the mark
    // still stands, so an idle relay costs the database one claim per sweep.
    if (!idle_announced_) {
      try {
        wakeup_->AnnounceIdle();
      } catch (const StoreError& error) {
        report_.StoreFailed(error);
        Backoff("announcing idleness failed: " + Describe(error));
        return {};
      }
      idle_announced_ = true;
      auto batch = Claim();
      // A failed claim (reconcile_leases_) may have left leases behind: not a time to sleep.
      if (!batch.empty() || stopping() || reconcile_leases_) return batch;
    }
    // A paused target's probe is due at its pause's end, a retry at its backoff's end, the
    // housekeeping at its interval: wake for the first (what is already due was in the claim
    // just made).
    // While the partition heartbeat finds nothing unfinished, no sweep: a message whose
    // notification was lost is found by the next heartbeat (which wakes this relay), an expired
    // lease has nothing left to give back; only the purge is due.
    if (membership_) membership_->SetIdle(true);
    const bool quiet = membership_ && membership_->NothingUnfinished();
    const auto sweep =
        quiet ? housekeeping_.next_purge()
              : std::min(SteadyClock::now() + options_.sweep_interval, housekeeping_.next_sweep());
    const auto until = std::min({sweep, next_probe.value_or(SteadyClock::time_point::max()),
                                 next_due_.value_or(SteadyClock::time_point::max())});
    const auto reason = wakeup_->Wait(until);
    if (reason == WakeReason::kNotified || reason == WakeReason::kReconnected) {
      idle_announced_ = false;  // the mark was used up, or may have been missed
    }
    if (options_.hand_off != nullptr) {
      // The ids only woke us; the claim reads the table. Keep the queue from filling up.
      options_.hand_off->Take(SIZE_MAX, std::chrono::milliseconds{0});
    }
    return {};
  }

  // Work found while the idle mark stands (the sweep, a hand-off, writers that had missed the
  // mark): take the mark back, or every writer would notify while this relay is busy.
  void WithdrawIdle() {
    if (!idle_announced_) return;
    idle_announced_ = false;
    try {
      wakeup_->Withdraw();
    } catch (const StoreError& error) {
      report_.StoreFailed(error);  // writers notify more than needed until the next announcement
    }
  }

  // With partition leases, before a batch is launched (`current`; everything claimed before it is
  // settled) or taken: drops the messages of partitions
  // found taken over (their leases are void; the new owner publishes them) and, when the
  // heartbeat found surplus partitions, gives their messages in `current` back and asks the
  // heartbeat thread to hand them over once every outcome is recorded. Claims made after the
  // surplus was known exclude it.
  void KeepPartitions(std::vector<Envelope>& current) {
    if (!membership_) return;
    const std::set<int> lost = membership_->TakeLost();
    if (!lost.empty()) {
      const auto dropped = std::erase_if(
          current, [&](const Envelope& envelope) { return lost.contains(envelope.partition); });
      report_.counters.lease_lost += dropped;
      report_.metrics.lease_lost.Increment(dropped);
      report_.LeasesHeld(0, dropped);
    }
    if (settler_.HasUnrecorded()) return;
    const std::set<int> surplus = membership_->Surplus();
    if (surplus.empty()) return;
    std::vector<Envelope> handed_back;
    std::erase_if(current, [&](Envelope& envelope) {
      if (!surplus.contains(envelope.partition)) return false;
      handed_back.push_back(std::move(envelope));
      return true;
    });
    settler_.Release(handed_back);
    membership_->HandBack(surplus);
  }

  void Housekeeping(const std::vector<Envelope>& in_flight) {
    if (!housekeeping_.Due(SteadyClock::now())) return;
    housekeeping_.Sweep(Reclaim(in_flight, /*own_unexpired=*/false), [this] { return stopping(); });
  }

  // The batch through the dispatcher's lanes (dispatcher.h): one outcome per message.
  std::vector<PublishOutcome> Publish(const std::vector<Envelope>& batch) {
    return dispatcher_->Dispatch(batch, SteadyClock::now() + options_.publish_timeout);
  }

  // A claim that could take every claimable message (it came back short of its limit) had none
  // for a target whose probe is due, and none of its messages is in flight: nothing of it waits
  // to be published, so there is nothing to probe with and nothing held back; its pause ends (the
  // next failure starts a new one). A target with messages in flight is being probed by them (a
  // claim made beside that batch finds the rest of its streams behind their leased heads): the
  // batch's verdict ends or extends the pause. `excluded` are the targets the claim left out
  // (their probe was not due when it was made, though it may be by now): the claim says nothing
  // of them.
  void EndIdlePauses(const std::vector<Envelope>& batch, const std::vector<Envelope>& in_flight,
                     const std::vector<std::string>& excluded) {
    std::vector<std::string> idle;
    for (auto& paused : dispatcher_->Paused()) {
      const auto of_target = [&name = paused.name](const Envelope& envelope) {
        return envelope.target == name;
      };
      if (std::find(excluded.begin(), excluded.end(), paused.name) == excluded.end() &&
          std::none_of(batch.begin(), batch.end(), of_target) &&
          std::none_of(in_flight.begin(), in_flight.end(), of_target)) {
        idle.push_back(std::move(paused.name));
      }
    }
    if (idle.empty()) return;
    // Only a pause whose last verdict came before this claim was sent: one set meanwhile (by a
    // batch of another source) is not answered by it.
    dispatcher_->EndPauses(idle, last_claim_at_);
  }

  std::unique_ptr<observe::Registry> own_registry_;  // when the options name no registry
  relay::TableReport report_;
  RelayOptions options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Wakeup> wakeup_;
  std::shared_ptr<Dispatcher> dispatcher_;
  std::string owner_;  // lease owner: instance name plus a per-run suffix
  relay::TableSettler settler_;
  std::unique_ptr<PartitionMembership> membership_;  // when options_.partition_leases is set
  int pause_listener_ = 0;                           // on dispatcher_
  outbox::Backoff backoff_;                          // after a database outage
  bool claim_failed_ = false;    // the last Claim failed (and backed off): claim again, not idle
  bool idle_announced_ = false;  // this relay's idle mark stands (see Wakeup)
  SteadyClock::time_point last_claim_at_{};  // when the last claim was sent (see Linger)
  AdaptiveLinger linger_{options_.linger, options_.batch_size};
  int last_claim_size_ = 0;  // and how many messages it found
  // When the last claim found nothing: when the first retry it saw waiting is due.
  std::optional<SteadyClock::time_point> next_due_;
  bool reconcile_leases_ = false;  // a claim failed: leases may exist that this relay lost
  relay::TableHousekeeping housekeeping_{*store_,
                                         {.sweep_interval = options_.sweep_interval,
                                          .lease = options_.lease,
                                          .purge_interval = options_.purge_interval,
                                          .retention = options_.retention},
                                         report_};
  mutable std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;              // guarded by stop_mutex_
  TablePipeline pipeline_{*this};  // last: what publishes is waited for before the rest goes
};

void Relay::CheckOptions(const RelayOptions& options) {
  if (options.instance.empty()) throw ConfigError("relay.instance", "must not be empty");
  if (options.batch_size < 1) throw ConfigError("relay.batch_size", "must be at least 1");
  if (options.publish_timeout >= options.lease) {
    throw ConfigError("relay.publish_timeout", "must be shorter than relay.lease");
  }
  if (options.partition_leases != nullptr && options.publish_timeout * 2 > options.lease) {
    // Heartbeats happen between batches: a third of the lease plus a batch must fit in it.
    throw ConfigError("relay.publish_timeout",
                      "must be at most half of relay.lease when relays share partitions");
  }
  if (options.idle_lease.count() != 0 && options.idle_lease < options.lease) {
    throw ConfigError("relay.idle_lease", "must be 0 (the lease) or at least relay.lease");
  }
  if (options.sweep_interval.count() < 1) {
    throw ConfigError("relay.sweep_interval", "must be positive");
  }
  // linger * 2 < lease, as outboxd's configuration states it (lease / 2 would round down).
  if (options.linger.count() < 0 || options.linger * 2 >= options.lease) {
    throw ConfigError("relay.linger", "must be at least 0 and less than half of relay.lease");
  }
  if (options.min_backoff.count() < 1 || options.max_backoff < options.min_backoff) {
    throw ConfigError("relay.max_backoff", "backoff bounds must be positive and ordered");
  }
}

Relay::Relay(RelayOptions options, std::unique_ptr<Store> store, std::unique_ptr<Wakeup> wakeup,
             SinkMap sinks, LogFn log)
    : Relay(options, std::move(store), std::move(wakeup),
            DispatcherFor(std::move(sinks), options, log), log) {}

Relay::Relay(RelayOptions options, std::unique_ptr<Store> store, std::unique_ptr<Wakeup> wakeup,
             std::shared_ptr<Dispatcher> dispatcher, LogFn log) {
  CheckOptions(options);
  if (!dispatcher) throw ConfigError("sinks", "at least one sink is needed");
  if (!store || !wakeup) throw std::invalid_argument("relay: store and wakeup are required");
  engine_ = std::make_unique<Engine>(std::move(options), std::move(store), std::move(wakeup),
                                     std::move(dispatcher), std::move(log), counters_);
}

Relay::~Relay() = default;

std::vector<std::string> Relay::paused_targets() const {
  std::vector<std::string> names;
  for (auto& paused : engine_->dispatcher().Paused()) names.push_back(std::move(paused.name));
  return names;
}

std::vector<Relay::PausedTarget> Relay::paused_target_reasons() const {
  return engine_->dispatcher().Paused();
}

void Relay::Run() { engine_->Run(); }

void Relay::Stop() { engine_->Stop(); }

}  // namespace outbox
