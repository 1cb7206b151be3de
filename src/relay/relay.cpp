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
#include "outbox/core/error.h"
#include "outbox/core/message.h"
#include "outbox/core/uuid.h"

namespace outbox {
namespace {

// "message <id> (topic <topic>, attempt <n>[, correlation_id <c>])": what a failure line names,
// so that an operator can find the message (outboxctl show <id>) and the request behind it.
std::string DescribeAttempt(const Envelope& envelope) {
  std::string text = "message " + envelope.id.ToString() + " (topic " + envelope.topic +
                     ", attempt " + std::to_string(envelope.attempts + 1);
  if (const auto found = envelope.headers.find(kCorrelationIdHeader);
      found != envelope.headers.end() && !found->second.empty()) {
    text += ", correlation_id " + found->second;
  }
  return text + ")";
}

using SteadyClock = std::chrono::steady_clock;

// A relay below its fair share of partitions (others are handing theirs back), or whose heartbeat
// failed, heartbeats again this soon at the latest, however long its idle sweep.
constexpr std::chrono::milliseconds kRebalanceLook{1000};

// A stream, as the stores order it: stream_seq counts per (target, stream key), and head-of-line
// is per pair, so that one target's failure never holds back another target's copies.
using StreamId = std::pair<std::string, std::string>;
StreamId StreamOf(const Envelope& envelope) {
  return {envelope.target, envelope.stream_key.value_or(std::string{})};
}

std::string Describe(const std::exception& error) { return error.what(); }

constexpr std::array<FailureKind, kFailureKindCount> kFailureKinds{
    FailureKind::kUnavailable, FailureKind::kRejected, FailureKind::kPermanent,
    FailureKind::kLeaseLost, FailureKind::kOutcomeUnknown};

constexpr std::string_view kTargetPausedName = "outbox_relay_target_paused";

observe::Labels Reason(FailureKind kind) { return {{"reason", std::string{NameOf(kind)}}}; }

// The relay's series, registered once; updating them is atomics only.
struct RelayMetrics {
  explicit RelayMetrics(observe::Registry& into)
      : registry(into),
        claimed(into.AddCounter("outbox_relay_claimed_total",
                                "Messages claimed (leased) by this relay.")),
        claim_batch_size(into.AddHistogram("outbox_relay_claim_batch_size",
                                           "Messages per non-empty claim by this relay.",
                                           observe::SizeBuckets())),
        claim_seconds(into.AddHistogram(
            "outbox_relay_claim_seconds",
            "Duration of each claim statement of this relay (it also settles the batch before).",
            observe::LatencyBuckets())),
        publish_seconds(into.AddHistogram(
            "outbox_relay_publish_seconds",
            "Duration of each batch's publish, from the first send to the last confirmation.",
            observe::LatencyBuckets())),
        published(into.AddCounter(
            "outbox_published_total",
            "Messages confirmed by the broker and recorded as published by this relay.")),
        retries(into.AddCounter(
            "outbox_retries_total",
            "Messages that failed to publish (or were held back) and will be published again.")),
        held_back(into.AddCounter(
            "outbox_held_back_total",
            "Messages sent back unsettled because an earlier message of their stream failed.")),
        lease_lost(into.AddCounter(
            "outbox_relay_lease_lost_total",
            "Messages whose lease expired or was taken over before their outcome was recorded.")),
        store_errors(into.AddCounter("outbox_relay_store_errors_total",
                                     "Database calls of the relay that failed.")),
        publish_latency(into.AddHistogram(
            "outbox_publish_latency_seconds",
            "From the writer's transaction (created_at, the database's now()) to the broker's "
            "confirmation, per published message.",
            observe::LatencyBuckets())),
        leases_held(into.AddGauge("outbox_relay_leases_held",
                                  "Messages this relay holds leases on right now.")),
        broker_unavailable(into.AddGauge(
            "outbox_relay_broker_unavailable",
            "1 while the sink of some target is paused: its last batch found no broker.")),
        partitions_owned(into.AddGauge(
            "outbox_relay_partitions_owned",
            "Partitions this relay holds the lease of (with several relays per database).")),
        live_instances(into.AddGauge(
            "outbox_relay_live_instances",
            "Relays with a live heartbeat on this database, as of this relay's last heartbeat.")),
        rebalances(into.AddCounter("outbox_relay_rebalances_total",
                                   "Partitions this relay took while free or handed back to make "
                                   "room for another relay.")),
        takeovers(into.AddCounter(
            "outbox_relay_takeovers_total",
            "Partitions this relay took over from another relay whose lease had expired.")) {
    for (const FailureKind kind : kFailureKinds) {
      failures[static_cast<std::size_t>(kind)] = &into.AddCounter(
          "outbox_publish_failures_total", "Failed publishes, by failure kind.", Reason(kind));
    }
    for (const FailureKind kind : {FailureKind::kRejected, FailureKind::kPermanent}) {
      abandoned[static_cast<std::size_t>(kind)] = &into.AddCounter(
          "outbox_abandoned_total",
          "Messages abandoned by this relay: rejected with no attempts left, or permanent.",
          Reason(kind));
    }
  }

  observe::Registry& registry;
  observe::Counter& claimed;
  observe::Histogram& claim_batch_size;
  observe::Histogram& claim_seconds;
  observe::Histogram& publish_seconds;
  observe::Counter& published;
  observe::Counter& retries;
  observe::Counter& held_back;
  observe::Counter& lease_lost;
  observe::Counter& store_errors;
  observe::Histogram& publish_latency;
  observe::Gauge& leases_held;
  observe::Gauge& broker_unavailable;
  observe::Gauge& partitions_owned;
  observe::Gauge& live_instances;
  observe::Counter& rebalances;
  observe::Counter& takeovers;
  std::array<observe::Counter*, kFailureKindCount> failures{};
  std::array<observe::Counter*, kFailureKindCount> abandoned{};  // rejected and permanent only
};

}  // namespace

class Relay::Engine {
 public:
  Engine(RelayOptions options, std::unique_ptr<Store> store, std::unique_ptr<Wakeup> wakeup,
         SinkMap sinks, LogFn log, RelayCounters& counters)
      : own_registry_(options.metrics == nullptr ? std::make_unique<observe::Registry>() : nullptr),
        metrics_(options.metrics != nullptr ? *options.metrics : *own_registry_),
        options_(std::move(options)),
        store_(std::move(store)),
        wakeup_(std::move(wakeup)),
        sinks_(std::move(sinks)),
        log_(std::move(log)),
        counters_(counters),
        // Unique per run: a restarted relay with the same instance name must not mistake the
        // leases of its dead predecessor for its own (see Store::Claim).
        owner_(options_.instance + "/" + NewUuidV7().ToString().substr(24)),
        backoff_(options_.min_backoff) {
    if (options_.hand_off != nullptr) {
      options_.hand_off->SetListener([wakeup = wakeup_.get()] { wakeup->Interrupt(); });
    }
    // One series per target: as many as the configuration has (observe::SeriesPerTarget).
    metrics_.registry.AllowSeries(kTargetPausedName, observe::SeriesPerTarget(1, sinks_.size()));
    for (const auto& [target, sink] : sinks_) {
      paused_gauges_[target] = &metrics_.registry.AddGauge(
          kTargetPausedName,
          "1 while the target's sink is paused: its last batch found no broker; its messages "
          "wait without leases or attempts spent while other targets flow.",
          {{"target", target}});
    }
  }

  ~Engine() {
    if (options_.hand_off != nullptr) options_.hand_off->SetListener({});
  }

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void Run() {
    Log(LogLevel::kInfo, "relay started; leases are held as " + owner_);
    // Heartbeats run on a thread (and connection) of their own, so that a slow batch never lets
    // a live relay's partition leases expire.
    // On a way out by exception (a bug) it is stopped and joined too, not left to terminate.
    struct Joined {
      Engine& engine;
      std::thread thread;
      ~Joined() {
        if (!thread.joinable()) return;
        engine.Stop();
        thread.join();
      }
    } heartbeats{*this, {}};
    if (options_.partition_leases != nullptr) {
      heartbeats.thread = std::thread([this] { HeartbeatLoop(); });
    }
    std::vector<Envelope> current;
    while (!stopping()) {
      // Outcomes not yet recorded come before any claim: a message of a stream left leased here
      // must be back before the stream's later messages can be claimed behind it. With a batch
      // ready to publish they are recorded while it is published (below); partitions are handed
      // back only once they are recorded (the next owner would find them fenced and publish them
      // again).
      if (HandBackPending()) {
        if (const auto error = RecordUnrecorded()) {
          Backoff("recording outcomes failed: " + *error);
          continue;
        }
      }
      Housekeeping(current);
      KeepPartitions(current);
      if (current.empty()) {
        // Published ones are settled by the claim itself (ClaimRequest::complete).
        if (const auto error = RecordReturned()) {
          Backoff("recording outcomes failed: " + *error);
          continue;
        }
        Linger();
        current = Claim();
        if (current.empty()) {
          // A claim that failed is tried again after its backoff rather than going idle: the
          // wake-up connection may be as silent as the store's was, and its deadline would hold
          // back what is waiting (issue #40).
          if (!claim_failed_) current = IdleUntilWork();
          continue;
        }
      }
      // Publish this batch on another thread while the database records the previous batch's
      // outcomes and claims the next one: the broker never waits for the database. Only a full
      // batch suggests there is more to claim.
      auto publishing =
          std::async(std::launch::async, [this, &current] { return Publish(current); });
      // Once the batch is on its way: the wake-up connection may be the one that stopped
      // answering (issue #40), and its deadline must not hold back what was claimed.
      WithdrawIdle();
      const auto unrecorded = RecordReturned();
      std::vector<Envelope> next;
      if (!unrecorded && static_cast<int>(current.size()) >= options_.batch_size && !stopping()) {
        next = Claim(current);
      }
      const auto published = publishing.get();
      auto broken_streams = Settle(current, published.outcomes);
      PauseTargets(published.unavailable);
      // Claimed while this batch was in flight, for a target paused since: back, with no lease
      // kept; the later messages of their streams wait for them.
      std::vector<Envelope> parked;
      std::erase_if(next, [&](Envelope& envelope) {
        if (!paused_.contains(envelope.target)) return false;
        if (envelope.stream_key) broken_streams.insert(StreamOf(envelope));
        parked.push_back(std::move(envelope));
        return true;
      });
      Release(parked);
      HoldBack(next, broken_streams);
      backoff_ = options_.min_backoff;
      current = std::move(next);
    }
    if (heartbeats.thread.joinable()) heartbeats.thread.join();  // it ends on Stop
    Release(current);
    RecordUnrecorded();  // a last try; what is left comes back when its lease expires
    LeavePartitions();
    Log(LogLevel::kInfo, "relay " + owner_ + " stopped: " + std::to_string(counters_.published) +
                             " published, " + std::to_string(counters_.lease_lost) + " lease lost");
  }

  void Stop() {
    {
      std::lock_guard lock(stop_mutex_);
      stop_ = true;
    }
    stop_changed_.notify_all();
    {
      std::lock_guard lock(membership_mutex_);  // the heartbeat thread checks stop_ under it
    }
    membership_changed_.notify_all();
    wakeup_->Interrupt();
  }

  std::vector<std::string> paused_names() const {
    std::lock_guard lock(paused_names_mutex_);
    std::vector<std::string> names;
    names.reserve(paused_names_.size());
    for (const auto& paused : paused_names_) names.push_back(paused.name);
    return names;
  }

  std::vector<Relay::PausedTarget> paused_reasons() const {
    std::lock_guard lock(paused_names_mutex_);
    return paused_names_;
  }

 private:
  bool stopping() const {
    std::lock_guard lock(stop_mutex_);
    return stop_;
  }

  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  void StoreFailed(const StoreError& error) {
    ++counters_.store_errors;
    metrics_.store_errors.Increment();
    metrics_.registry.RecordError("store", Describe(error));
  }

  void LeaseLost(const SettleResult& result) {
    counters_.lease_lost += result.lease_lost.size();
    metrics_.lease_lost.Increment(result.lease_lost.size());
  }

  void LeasesHeld(std::size_t claimed, std::size_t settled) {
    metrics_.leases_held.Add(static_cast<double>(claimed) - static_cast<double>(settled));
  }

  // Sleeps (interruptibly) after an outage, doubling the pause each time up to max_backoff.
  void Backoff(const std::string& reason) {
    Log(LogLevel::kWarn, reason + "; retrying in " + std::to_string(backoff_.count()) + " ms");
    std::unique_lock lock(stop_mutex_);
    stop_changed_.wait_for(lock, backoff_, [this] { return stop_; });
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
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
      request.paused_targets = PausedTargets(SteadyClock::now());
      if (options_.partition_leases != nullptr) {
        {
          std::lock_guard lock(membership_mutex_);
          request.partitions = claimable_;
        }
        if (request.partitions->empty()) return {};  // no partition held (yet)
      }
      request.complete = unrecorded_.done;
      last_claim_at_ = SteadyClock::now();
      auto round = store_->ClaimRound(request);
      metrics_.claim_seconds.Observe(
          std::chrono::duration<double>(SteadyClock::now() - last_claim_at_).count());
      unrecorded_.done.clear();
      Completed(round.completed);
      next_due_.reset();
      if (round.next_due) next_due_ = last_claim_at_ + *round.next_due;
      auto& batch = round.messages;
      last_claim_size_ = static_cast<int>(batch.size());
      linger_.Observe(SteadyClock::now(), batch.size());
      if (static_cast<int>(batch.size()) < request.max_messages) {
        EndIdlePauses(batch, in_flight, request.paused_targets);
      }
      counters_.claimed += batch.size();
      if (!batch.empty()) {
        metrics_.claimed.Increment(batch.size());
        metrics_.claim_batch_size.Observe(static_cast<double>(batch.size()));
        LeasesHeld(batch.size(), 0);
      }
      return std::move(batch);
    } catch (const StoreError& error) {
      // Its reply may have been lost after the database committed it: messages leased here that
      // this relay does not know. They go back before anything more is claimed (ReconcileLeases).
      reconcile_leases_ = true;
      claim_failed_ = true;
      StoreFailed(error);
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
    if (options_.partition_leases != nullptr) {
      std::lock_guard lock(membership_mutex_);
      request.partitions = claimable_;
    }
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
      StoreFailed(error);
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
    if (const auto error = RecordUnrecorded()) {
      Backoff("recording outcomes failed: " + *error);
      return {};
    }
    const auto now = SteadyClock::now();
    std::optional<SteadyClock::time_point> next_probe;
    for (const auto& [target, pause] : paused_) {
      if (pause.probe_at > now)
        next_probe = std::min(next_probe.value_or(pause.probe_at), pause.probe_at);
    }
    if (next_probe && PausedTargets(now).size() == sinks_.size()) {
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
        StoreFailed(error);
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
    const auto until = std::min({SteadyClock::now() + options_.sweep_interval,
                                 next_probe.value_or(SteadyClock::time_point::max()),
                                 next_due_.value_or(SteadyClock::time_point::max()), next_sweep_});
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
      StoreFailed(error);  // writers notify more than needed until the next announcement
    }
  }

  // With partition leases, at the top of the loop (`current` is the one batch claimed and not
  // yet published; everything claimed before it is settled): drops the messages of partitions
  // found taken over (their leases are void; the new owner publishes them) and, when the
  // heartbeat found surplus partitions, gives their messages in `current` back and asks the
  // heartbeat thread to hand them over. Claims made after the surplus was known exclude it.
  // Partitions wait to be handed back (see KeepPartitions).
  bool HandBackPending() {
    if (options_.partition_leases == nullptr) return false;
    std::lock_guard lock(membership_mutex_);
    return release_.empty() && !surplus_.empty();
  }

  [[nodiscard]] bool HasUnrecorded() const {
    return !unrecorded_.done.empty() || !unrecorded_.failed.empty() ||
           !unrecorded_.released.empty();
  }

  // Drops the messages of partitions taken over from `current`, and hands back the partitions
  // beyond the fair share (their messages in `current` released) once every outcome is recorded.
  void KeepPartitions(std::vector<Envelope>& current) {
    if (options_.partition_leases == nullptr) return;
    std::set<int> lost;
    std::set<int> surplus;
    {
      std::lock_guard lock(membership_mutex_);
      lost.swap(lost_);
      if (release_.empty() && !HasUnrecorded()) surplus = surplus_;
    }
    if (!lost.empty()) {
      const auto dropped = std::erase_if(
          current, [&](const Envelope& envelope) { return lost.contains(envelope.partition); });
      counters_.lease_lost += dropped;
      metrics_.lease_lost.Increment(dropped);
      LeasesHeld(0, dropped);
    }
    if (surplus.empty()) return;
    std::vector<Envelope> handed_back;
    std::erase_if(current, [&](Envelope& envelope) {
      if (!surplus.contains(envelope.partition)) return false;
      handed_back.push_back(std::move(envelope));
      return true;
    });
    Release(handed_back);
    {
      std::lock_guard lock(membership_mutex_);
      release_.assign(surplus.begin(), surplus.end());
    }
    membership_changed_.notify_all();
  }

  void HeartbeatLoop() {
    std::unique_lock lock(membership_mutex_);
    auto next = SteadyClock::now();
    while (!stopping()) {
      membership_changed_.wait_until(lock, next, [&] {
        return stopping() || !release_.empty() || SteadyClock::now() >= next;
      });
      if (stopping()) return;
      const std::vector<int> release = release_;
      lock.unlock();
      next = Heartbeat(release);
      lock.lock();
      release_.clear();
    }
  }

  // One heartbeat (on the heartbeat thread); returns when the next is due.
  SteadyClock::time_point Heartbeat(const std::vector<int>& release) {
    const auto now = SteadyClock::now();
    Membership membership;
    try {
      membership = options_.partition_leases->Heartbeat(owner_, options_.lease, release);
    } catch (const StoreError& error) {
      StoreFailed(error);
      Log(LogLevel::kWarn, "partition heartbeat failed: " + Describe(error));
      // The claims check the leases themselves: expired ones claim nothing.
      return now + std::min({options_.sweep_interval, options_.max_backoff, kRebalanceLook});
    }
    std::set<int> now_owned;
    for (const auto& held : membership.owned) now_owned.insert(held.partition);
    std::set<int> lost;
    bool gained = false;
    {
      std::lock_guard lock(membership_mutex_);
      for (const int partition : owned_) {
        const bool released = std::find(release.begin(), release.end(), partition) != release.end();
        if (!released && !now_owned.contains(partition)) lost.insert(partition);
      }
      for (const int partition : now_owned) gained = gained || !owned_.contains(partition);
      lost_.insert(lost.begin(), lost.end());
      owned_ = std::move(now_owned);
      surplus_ = {membership.surplus.begin(), membership.surplus.end()};
      claimable_.clear();
      for (const auto& held : membership.owned) {
        if (!surplus_.contains(held.partition)) claimable_.push_back(held);
      }
    }
    if (!lost.empty()) {
      Log(LogLevel::kWarn, std::to_string(lost.size()) +
                               " partitions were taken over by another relay (this relay's "
                               "lease expired: it stalled or lost the database); first " +
                               std::to_string(*lost.begin()));
    }
    const int rebalanced = membership.acquired - membership.taken_over + membership.released;
    if (rebalanced > 0) metrics_.rebalances.Increment(static_cast<std::uint64_t>(rebalanced));
    if (membership.taken_over > 0) {
      counters_.takeovers += static_cast<std::uint64_t>(membership.taken_over);
      metrics_.takeovers.Increment(static_cast<std::uint64_t>(membership.taken_over));
    }
    const auto held = membership.owned.size();
    if (membership.acquired > 0 || membership.released > 0 || !lost.empty()) {
      Log(LogLevel::kInfo, "partitions: " + std::to_string(held) + " of " +
                               std::to_string(membership.partition_count) + " held (fair share " +
                               std::to_string(membership.fair_share) + ", " +
                               std::to_string(membership.live_instances) + " live relays; took " +
                               std::to_string(membership.acquired) + ", of them " +
                               std::to_string(membership.taken_over) +
                               " from expired leases; handed back " +
                               std::to_string(membership.released) + ")");
    }
    counters_.partitions_owned = static_cast<int>(held);
    metrics_.partitions_owned.Set(static_cast<double>(held));
    metrics_.live_instances.Set(static_cast<double>(membership.live_instances));
    if (gained || !lost.empty()) wakeup_->Interrupt();  // an idle relay claims at once
    // Below its share, a relay looks again soon: others are handing partitions back.
    auto wait = membership.next_heartbeat;
    if (static_cast<int>(held) < membership.fair_share) {
      wait = std::min({wait, options_.sweep_interval, kRebalanceLook});
    }
    return now + wait;
  }

  void LeavePartitions() {
    if (options_.partition_leases == nullptr) return;
    try {
      options_.partition_leases->Leave(owner_);
    } catch (const StoreError& error) {
      StoreFailed(error);
      Log(LogLevel::kWarn,
          "handing back partitions failed (they are free when the lease "
          "expires): " +
              Describe(error));
    }
  }

  void Housekeeping(const std::vector<Envelope>& in_flight) {
    const auto now = SteadyClock::now();
    if (now < next_sweep_) return;
    // Expired leases matter on the scale of the lease, not of the sweep.
    next_sweep_ =
        now + std::max(options_.sweep_interval,
                       std::chrono::duration_cast<std::chrono::milliseconds>(options_.lease / 4));
    try {
      const auto started = SteadyClock::now();
      const std::int64_t reclaimed =
          store_->ReclaimExpired(Reclaim(in_flight, /*own_unexpired=*/false));
      // Finding expired leases walks every index entry of a leased row, which an old snapshot
      // keeps even after the row is gone (0.6 s and growing in the held-snapshot benchmark): the
      // relay then looks less often, at most 5 % of its time, and still once per lease.
      const auto took = SteadyClock::now() - started;
      next_sweep_ = std::max(next_sweep_,
                             started + std::min<SteadyClock::duration>(20 * took, options_.lease));
      if (reclaimed > 0) {
        Log(LogLevel::kWarn, std::to_string(reclaimed) +
                                 " messages had expired leases (a relay stopped or stalled, or "
                                 "a claim's reply was lost); they will be published again");
      }
      if (now >= next_purge_) {
        next_purge_ = now + options_.purge_interval;
        std::int64_t purged = 0;
        for (std::int64_t chunk = 1; chunk > 0 && !stopping();) {
          chunk = store_->Purge(options_.retention, 1000);
          purged += chunk;
        }
        if (purged > 0) Log(LogLevel::kInfo, "purged " + std::to_string(purged) + " messages");
      }
    } catch (const StoreError& error) {
      StoreFailed(error);
      Log(LogLevel::kWarn, "housekeeping failed: " + Describe(error));
    }
  }

  // What a batch's publish found: one outcome per message, in batch order, and for each target
  // whose sink was called, the reason when it found no broker at all (every outcome kUnavailable).
  struct Published {
    std::vector<PublishOutcome> outcomes;
    std::map<std::string, std::optional<std::string>, std::less<>> unavailable;
  };

  // Messages go to the sink named by their target, each target in a lane of its own: the sinks
  // publish side by side, so that a slow or dead broker costs the others nothing but its own
  // publish_timeout. A stream is a (target, stream key) pair, so each lane keeps its own streams
  // in order. Not sent (kOutcomeUnknown, no attempt spent): the rest of a stream whose first
  // message here is a retry, so that if it fails again its followers have not reached the broker
  // ahead of it.
  Published Publish(const std::vector<Envelope>& batch) {
    const auto started = SteadyClock::now();
    const Deadline deadline = started + options_.publish_timeout;
    Published published;
    auto& outcomes = published.outcomes;
    outcomes.resize(batch.size());
    std::map<std::string_view, std::vector<std::size_t>> by_target;
    // Per stream: its first message here is a retry, and the rest waits for the next batch.
    std::map<std::pair<std::string_view, std::string_view>, bool> retrying;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Envelope& envelope = batch[i];
      if (envelope.stream_key) {
        const auto [head, first] = retrying.try_emplace(
            std::pair<std::string_view, std::string_view>{envelope.target, *envelope.stream_key},
            envelope.attempts > 0);
        if (!first && head->second) {
          outcomes[i] = {envelope.id,
                         Failure{FailureKind::kOutcomeUnknown,
                                 "not sent: waiting for the retry of an earlier message of its "
                                 "stream"}};
          continue;
        }
      }
      by_target[envelope.target].push_back(i);
    }
    // One lane per target; the first runs on this thread (deferred: when its outcomes are asked).
    std::vector<std::pair<std::string_view, std::future<std::vector<PublishOutcome>>>> lanes;
    for (const auto& [target, indexes] : by_target) {
      const auto sink = sinks_.find(target);
      if (sink == sinks_.end()) {
        for (const auto i : indexes) {
          outcomes[i] = {batch[i].id,
                         Failure{FailureKind::kRejected,
                                 "no sink is configured for target '" + std::string{target} + "'"}};
        }
        continue;
      }
      auto lane = [&batch, &deadline, sink = sink->second.get(), &indexes = indexes] {
        if (indexes.size() == batch.size()) return RedactReasons(sink->Publish(batch, deadline));
        std::vector<Envelope> group;
        group.reserve(indexes.size());
        for (const auto i : indexes) group.push_back(batch[i]);
        return RedactReasons(sink->Publish(group, deadline));
      };
      const auto policy = lanes.empty() ? std::launch::deferred : std::launch::async;
      lanes.emplace_back(target, std::async(policy, std::move(lane)));
    }
    for (auto& [target, lane] : lanes) {
      auto lane_outcomes = lane.get();
      const auto& indexes = by_target[target];
      bool all_unavailable = !lane_outcomes.empty();
      for (std::size_t k = 0; k < indexes.size(); ++k) {
        const auto i = indexes[k];
        if (k < lane_outcomes.size() && lane_outcomes[k].id == batch[i].id) {
          outcomes[i] = std::move(lane_outcomes[k]);
        } else {
          Log(LogLevel::kError,
              "sink '" + std::string{target} + "' returned outcomes that do not match its batch");
          outcomes[i] = {batch[i].id, Failure{FailureKind::kOutcomeUnknown, "no outcome"}};
        }
        all_unavailable = all_unavailable && outcomes[i].failure &&
                          outcomes[i].failure->kind == FailureKind::kUnavailable;
      }
      auto& verdict = published.unavailable[std::string{target}];
      if (all_unavailable) verdict = outcomes[indexes.front()].failure->reason;
    }
    metrics_.publish_seconds.Observe(
        std::chrono::duration<double>(SteadyClock::now() - started).count());
    return published;
  }

  // The targets not to claim now: paused, and their probe not yet due.
  std::vector<std::string> PausedTargets(SteadyClock::time_point now) const {
    std::vector<std::string> names;
    for (const auto& [target, pause] : paused_) {
      if (now < pause.probe_at) names.push_back(target);
    }
    return names;
  }

  // After a batch: a target whose sink found no broker is paused (or, after a failed probe, its
  // pause doubles, up to max_backoff); one whose sink answered resumes.
  void PauseTargets(
      const std::map<std::string, std::optional<std::string>, std::less<>>& unavailable) {
    const auto now = SteadyClock::now();
    bool changed = false;
    for (const auto& [target, reason] : unavailable) {
      auto found = paused_.find(target);
      if (!reason) {
        if (found == paused_.end()) continue;
        const auto paused_for =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - found->second.since);
        Log(LogLevel::kInfo, "sink '" + target + "' is available again after " +
                                 std::to_string(paused_for.count()) + " ms; its messages flow");
        paused_.erase(found);
        changed = true;
        continue;
      }
      if (found == paused_.end()) {
        found = paused_.emplace(target, TargetPause{now, now, options_.min_backoff, {}}).first;
        changed = true;
      } else {
        found->second.backoff = std::min(found->second.backoff * 2, options_.max_backoff);
      }
      found->second.probe_at = now + found->second.backoff;
      if (found->second.reason != *reason) {
        found->second.reason = *reason;
        changed = true;
      }
      metrics_.registry.RecordError(NameOf(FailureKind::kUnavailable), *reason);
      Log(LogLevel::kWarn, "sink '" + target + "' is unavailable: " + *reason +
                               "; its messages wait (no attempt spent, no lease kept) while other "
                               "targets flow; probing it again in " +
                               std::to_string(found->second.backoff.count()) + " ms");
    }
    if (changed) PausesChanged();
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
    const auto ended = std::erase_if(paused_, [&](const auto& entry) {
      const auto& [target, pause] = entry;
      if (std::find(excluded.begin(), excluded.end(), target) != excluded.end()) return false;
      const auto of_target = [&name = target](const Envelope& envelope) {
        return envelope.target == name;
      };
      return std::none_of(batch.begin(), batch.end(), of_target) &&
             std::none_of(in_flight.begin(), in_flight.end(), of_target);
    });
    if (ended > 0) PausesChanged();
  }

  // Publishes the paused set: gauges, counters, Relay::paused_targets().
  void PausesChanged() {
    std::vector<Relay::PausedTarget> names;
    for (const auto& [target, gauge] : paused_gauges_) {
      const auto paused = paused_.find(target);
      gauge->Set(paused != paused_.end() ? 1.0 : 0.0);
      if (paused != paused_.end()) names.push_back({target, paused->second.reason});
    }
    counters_.broker_unavailable = !paused_.empty();
    metrics_.broker_unavailable.Set(paused_.empty() ? 0.0 : 1.0);
    std::lock_guard lock(paused_names_mutex_);
    paused_names_ = std::move(names);
  }

  // Counts one failed publish by kind, and whether it is abandoned or retried. The store decides
  // abandonment (with its RetryPolicy); the count mirrors that rule with options_.max_attempts.
  void CountFailure(const Envelope& envelope, const Failure& failure) {
    metrics_.failures[static_cast<std::size_t>(failure.kind)]->Increment();
    const FailureTreatment treatment = failure.treatment();
    const bool out_of_attempts = treatment.spends_attempt && options_.max_attempts > 0 &&
                                 envelope.attempts + 1 >= options_.max_attempts;
    if (treatment.abandon_now || (treatment.retry && out_of_attempts)) {
      if (auto* abandoned = metrics_.abandoned[static_cast<std::size_t>(failure.kind)]) {
        abandoned->Increment();
      }
    } else if (treatment.retry) {
      metrics_.retries.Increment();
    }
    if (treatment.spends_attempt) {
      metrics_.registry.RecordError(NameOf(failure.kind),
                                    DescribeAttempt(envelope) + ": " + failure.reason);
    }
  }

  // Records the outcomes. Within a stream only the confirmed prefix counts as done: after a
  // failure, later messages of that stream in this batch go back unpublished (they will be
  // published again after the failed one, so nothing is reordered).
  // Returns the streams that had a failure: their later messages must wait for it.
  std::set<StreamId> Settle(const std::vector<Envelope>& batch,
                            const std::vector<PublishOutcome>& outcomes) {
    std::vector<LeasedId> done;
    std::vector<FailedMessage> failed;
    std::set<StreamId> broken_streams;
    // The broker's confirmations are in: the end of the commit -> confirm latency.
    const TimePoint confirmed_at = std::chrono::system_clock::now();
    LeasesHeld(0, batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Envelope& envelope = batch[i];
      const PublishOutcome& outcome = outcomes[i];
      // (The key is built only once a stream has failed: the usual batch builds none.)
      const bool broken = envelope.stream_key && !broken_streams.empty() &&
                          broken_streams.contains(StreamOf(envelope));
      if (outcome.published() && !broken) {
        done.push_back(LeasedId::Of(envelope));
        const std::chrono::duration<double> latency = confirmed_at - envelope.created_at;
        metrics_.publish_latency.Observe(std::max(latency.count(), 0.0));
        continue;
      }
      if (outcome.published()) {
        ++counters_.held_back;
        metrics_.held_back.Increment();
        metrics_.retries.Increment();
        failed.push_back(FailedMessage::Of(
            envelope, Failure{FailureKind::kOutcomeUnknown,
                              "held back: an earlier message of its stream failed"}));
        continue;
      }
      const Failure& failure = *outcome.failure;
      CountFailure(envelope, failure);
      if (failure.treatment().spends_attempt) {
        ++counters_.failed;
        Log(LogLevel::kWarn, DescribeAttempt(envelope) + " failed: " + failure.Describe());
      } else {
        ++counters_.unconfirmed;
      }
      failed.push_back(FailedMessage::Of(envelope, failure));
      if (envelope.stream_key) broken_streams.insert(StreamOf(envelope));
    }
    // The outcomes are known; they are recorded while the next batch is published, or before
    // anything more is claimed (see Run), also when the database is away now.
    Unrecorded(std::move(done), std::move(failed), {});
    return broken_streams;
  }

  // The next batch was claimed while this one was in flight; messages in it that follow a
  // failure of their stream go back unpublished, to wait for the failed one.
  void HoldBack(std::vector<Envelope>& next, const std::set<StreamId>& broken_streams) {
    if (broken_streams.empty() || next.empty()) return;
    std::vector<FailedMessage> held;
    std::erase_if(next, [&](const Envelope& envelope) {
      if (!envelope.stream_key || !broken_streams.contains(StreamOf(envelope))) return false;
      held.push_back(FailedMessage::Of(
          envelope, Failure{FailureKind::kOutcomeUnknown,
                            "not sent: an earlier message of its stream failed"}));
      return true;
    });
    if (held.empty()) return;
    counters_.held_back += held.size();
    metrics_.held_back.Increment(held.size());
    metrics_.retries.Increment(held.size());
    LeasesHeld(0, held.size());
    try {
      store_->Fail(owner_, held);
    } catch (const StoreError& error) {
      StoreFailed(error);
      Log(LogLevel::kWarn,
          "holding back " + std::to_string(held.size()) +
              " messages failed (tried again before the next claim): " + Describe(error));
      Unrecorded({}, std::move(held), {});
    }
  }

  void Release(const std::vector<Envelope>& batch) {
    if (batch.empty()) return;
    LeasesHeld(0, batch.size());
    std::vector<LeasedId> leases;
    for (const auto& envelope : batch) leases.push_back(LeasedId::Of(envelope));
    try {
      store_->Release(owner_, leases);
    } catch (const StoreError& error) {
      StoreFailed(error);
      Log(LogLevel::kWarn,
          "releasing " + std::to_string(batch.size()) +
              " messages failed (tried again before the next claim): " + Describe(error));
      Unrecorded({}, {}, std::move(leases));
    }
  }

  // Outcomes the store could not take: kept, and recorded before anything more is claimed. Each
  // is fenced by its lease, so one that no longer holds (taken over) is simply refused.
  void Unrecorded(std::vector<LeasedId> done, std::vector<FailedMessage> failed,
                  std::vector<LeasedId> released) {
    std::move(done.begin(), done.end(), std::back_inserter(unrecorded_.done));
    std::move(failed.begin(), failed.end(), std::back_inserter(unrecorded_.failed));
    std::move(released.begin(), released.end(), std::back_inserter(unrecorded_.released));
  }

  // Counts what a completion settled as published.
  void Completed(const SettleResult& result) {
    counters_.published += static_cast<std::uint64_t>(result.settled);
    metrics_.published.Increment(static_cast<std::uint64_t>(result.settled));
    LeaseLost(result);
  }

  // Records what Unrecorded kept; the error when some of it is still left.
  std::optional<std::string> RecordUnrecorded() {
    auto& done = unrecorded_.done;
    try {
      if (!done.empty()) {
        Completed(store_->Complete(owner_, done));
        done.clear();
      }
    } catch (const StoreError& error) {
      StoreFailed(error);
      return Describe(error);
    }
    return RecordReturned();
  }

  // Records the failed and released messages Unrecorded kept (they must be back before the next
  // claim); the published ones are left for the next claim to settle (ClaimRequest::complete).
  std::optional<std::string> RecordReturned() {
    auto& failed = unrecorded_.failed;
    auto& released = unrecorded_.released;
    try {
      if (!failed.empty()) {
        LeaseLost(store_->Fail(owner_, failed));
        failed.clear();
      }
      if (!released.empty()) {
        LeaseLost(store_->Release(owner_, released));
        released.clear();
      }
      return std::nullopt;
    } catch (const StoreError& error) {
      StoreFailed(error);
      return Describe(error);
    }
  }

  std::unique_ptr<observe::Registry> own_registry_;  // when the options name no registry
  RelayMetrics metrics_;
  RelayOptions options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Wakeup> wakeup_;
  SinkMap sinks_;
  LogFn log_;
  RelayCounters& counters_;
  std::string owner_;  // lease owner: instance name plus a per-run suffix
  std::chrono::milliseconds backoff_;
  bool claim_failed_ = false;  // the last Claim failed (and backed off): claim again, not idle
  // Partition leases (when options_.partition_leases is set), shared with the heartbeat thread.
  std::mutex membership_mutex_;
  std::condition_variable membership_changed_;
  std::set<int> owned_;                    // held as of the last heartbeat
  std::set<int> surplus_;                  // held beyond the fair share: to hand back
  std::vector<PartitionLease> claimable_;  // owned minus surplus, with epochs
  std::set<int> lost_;                     // taken over; not yet dropped from the batch
  std::vector<int> release_;               // to hand back at the next heartbeat (now)
  struct {
    std::vector<LeasedId> done;
    std::vector<FailedMessage> failed;
    std::vector<LeasedId> released;
  } unrecorded_;                 // outcomes the store could not take yet (see Unrecorded)
  bool idle_announced_ = false;  // this relay's idle mark stands (see Wakeup)
  SteadyClock::time_point last_claim_at_{};  // when the last claim was sent (see Linger)
  AdaptiveLinger linger_{options_.linger, options_.batch_size};
  int last_claim_size_ = 0;  // and how many messages it found
  // When the last claim found nothing: when the first retry it saw waiting is due.
  std::optional<SteadyClock::time_point> next_due_;
  bool reconcile_leases_ = false;  // a claim failed: leases may exist that this relay lost
  // Targets whose sink found no broker (main thread only): not claimed until probe_at, when the
  // next claim takes their messages again and publishing them is the probe.
  struct TargetPause {
    SteadyClock::time_point since;
    SteadyClock::time_point probe_at;
    std::chrono::milliseconds backoff;
    std::string reason;  // why, from its last batch
  };
  std::map<std::string, TargetPause, std::less<>> paused_;
  std::map<std::string, observe::Gauge*, std::less<>> paused_gauges_;  // one per sink
  mutable std::mutex paused_names_mutex_;
  std::vector<Relay::PausedTarget> paused_names_;  // for Relay::paused_targets()
  SteadyClock::time_point next_sweep_{};
  SteadyClock::time_point next_purge_{};
  mutable std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;  // guarded by stop_mutex_
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
             SinkMap sinks, LogFn log) {
  CheckOptions(options);
  if (sinks.empty()) throw ConfigError("sinks", "at least one sink is needed");
  if (!store || !wakeup) throw std::invalid_argument("relay: store and wakeup are required");
  engine_ = std::make_unique<Engine>(std::move(options), std::move(store), std::move(wakeup),
                                     std::move(sinks), std::move(log), counters_);
}

Relay::~Relay() = default;

std::vector<std::string> Relay::paused_targets() const { return engine_->paused_names(); }
std::vector<Relay::PausedTarget> Relay::paused_target_reasons() const {
  return engine_->paused_reasons();
}

void Relay::Run() { engine_->Run(); }

void Relay::Stop() { engine_->Stop(); }

}  // namespace outbox
