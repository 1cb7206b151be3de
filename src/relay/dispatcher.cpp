#include "outbox/relay/dispatcher.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <sstream>
#include <utility>

#include "outbox/core/error.h"

namespace outbox {
namespace {

constexpr std::string_view kTargetPausedName = "outbox_relay_target_paused";
constexpr std::string_view kTargetThrottledName = "outbox_relay_target_throttled_seconds";

std::vector<PublishOutcome> NotSent(std::span<const Envelope> batch, FailureKind kind,
                                    const std::string& reason) {
  std::vector<PublishOutcome> outcomes;
  outcomes.reserve(batch.size());
  for (const Envelope& envelope : batch) outcomes.push_back({envelope.id, Failure{kind, reason}});
  return outcomes;
}

std::string NumberText(double number) {
  std::ostringstream text;
  text << number;
  return text.str();
}

}  // namespace

void ValidateRateLimit(const RateLimit& limit) {
  constexpr double kMost = 1e6;
  if (!(limit.max_rate > 0 && limit.max_rate <= kMost)) {
    throw ConfigError("max_rate",
                      "must be a positive number of messages a second (at most 1000000), got " +
                          NumberText(limit.max_rate));
  }
  if (limit.max_burst && !(*limit.max_burst >= 1 && *limit.max_burst <= kMost)) {
    throw ConfigError("max_burst", "must be a number of messages from 1 to 1000000, got " +
                                       NumberText(*limit.max_burst));
  }
}

// A rate-limited target's token bucket (RateLimit). Guarded by buckets_mutex_.
struct Dispatcher::Bucket {
  double rate = 0;    // tokens a second
  double burst = 0;   // the most it holds
  double tokens = 0;  // at `counted`
  SteadyClock::time_point counted;
  // Once a message had no token, the target is held until its bucket is nine tenths full: the next
  // claim that takes its messages then sends about a burst's worth (the tenth left leaves time for
  // that claim to come, without the full bucket's cap losing tokens). Claims being per batch, not
  // per target, each one may take up to a batch of them and give back what is over; the fewer such
  // claims, the less of that (docs/rate-limits.md). A target under its rate is never held, so that
  // it does not go in and out of the claims' paused set (which restarts the claim cursor's walk).
  // The time held is outbox_relay_target_throttled_seconds.
  SteadyClock::time_point throttled_until;
  observe::Gauge* throttled_seconds = nullptr;

  [[nodiscard]] double TokensAt(SteadyClock::time_point now) const {
    const double elapsed = std::chrono::duration<double>(now - counted).count();
    return std::min(burst, tokens + rate * std::max(elapsed, 0.0));
  }
  [[nodiscard]] bool Holds(SteadyClock::time_point now) const { return now < throttled_until; }
  // Takes a token for each of up to `wanted` messages; returns how many it had.
  std::size_t Take(std::size_t wanted, SteadyClock::time_point now) {
    tokens = TokensAt(now);
    counted = now;
    const auto granted = std::min(wanted, static_cast<std::size_t>(tokens));
    tokens -= static_cast<double>(granted);
    if (granted < wanted) {
      const double enough = std::max(1.0, burst * 0.9);
      const auto held_until = now + std::chrono::ceil<SteadyClock::duration>(
                                        std::chrono::duration<double>((enough - tokens) / rate));
      const auto from = std::max(now, throttled_until);
      if (held_until > from) {
        throttled_seconds->Add(std::chrono::duration<double>(held_until - from).count());
        throttled_until = held_until;
      }
    }
    return granted;
  }
};

// One target's lane: its sink, used by one caller at a time, turns given in the order they were
// asked for (a source with batch after batch cannot keep another waiting past its deadline).
struct Dispatcher::Lane {
  Sink* sink = nullptr;
  observe::Gauge* paused = nullptr;  // outbox_relay_target_paused{target}

  std::mutex mutex;
  std::condition_variable changed;
  bool busy = false;
  std::uint64_t next_ticket = 0;
  std::deque<std::uint64_t> queue;  // tickets in line, first come first

  // Waits for this caller's turn until `deadline`; false (and out of the line) if it did not
  // come. Give ends the turn.
  bool Take(Deadline deadline) {
    std::unique_lock lock(mutex);
    const std::uint64_t ticket = next_ticket++;
    queue.push_back(ticket);
    if (changed.wait_until(lock, deadline, [&] { return !busy && queue.front() == ticket; })) {
      queue.pop_front();
      busy = true;
      return true;
    }
    queue.erase(std::find(queue.begin(), queue.end(), ticket));
    changed.notify_all();  // the one behind may be first now
    return false;
  }

  void Give() {
    {
      const std::lock_guard lock(mutex);
      busy = false;
    }
    changed.notify_all();
  }

  // The sink's outcomes for `batch` in its turn, one per message in batch order whatever the
  // sink returned.
  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline deadline,
                                      const std::string& target, const LogFn& log) {
    if (!Take(deadline)) {
      return NotSent(batch, FailureKind::kUnavailable,
                     "not sent: the sink was busy with another batch until the deadline");
    }
    struct Turn {
      Lane& lane;
      ~Turn() { lane.Give(); }
    } turn{*this};
    auto outcomes = RedactReasons(sink->Publish(batch, deadline));
    bool matches = outcomes.size() == batch.size();
    for (std::size_t i = 0; matches && i < batch.size(); ++i) {
      matches = outcomes[i].id == batch[i].id;
    }
    if (matches) return outcomes;
    if (log) {
      log(LogLevel::kError, "sink '" + target + "' returned " + std::to_string(outcomes.size()) +
                                " outcomes that do not match its batch of " +
                                std::to_string(batch.size()));
    }
    std::vector<PublishOutcome> fixed;
    fixed.reserve(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (i < outcomes.size() && outcomes[i].id == batch[i].id) {
        fixed.push_back(std::move(outcomes[i]));
      } else {
        fixed.push_back({batch[i].id, Failure{FailureKind::kOutcomeUnknown,
                                              "no outcome: the sink did not answer for it"}});
      }
    }
    return fixed;
  }
};

Dispatcher::Dispatcher(SinkMap sinks, DispatcherOptions options, LogFn log)
    : options_(options),
      own_registry_(options.metrics == nullptr ? std::make_unique<observe::Registry>() : nullptr),
      registry_(options.metrics != nullptr ? *options.metrics : *own_registry_),
      publish_seconds_(registry_.AddHistogram(
          "outbox_relay_publish_seconds",
          "Duration of each batch's publish, from the first send to the last confirmation.",
          observe::LatencyBuckets())),
      broker_unavailable_(registry_.AddGauge(
          "outbox_relay_broker_unavailable",
          "1 while the sink of some target is paused: its last batch found no broker.")),
      sinks_(std::move(sinks)),
      log_(std::move(log)) {
  if (sinks_.empty()) throw ConfigError("sinks", "at least one sink is needed");
  if (options_.min_backoff.count() < 1 || options_.max_backoff < options_.min_backoff) {
    throw ConfigError("relay.max_backoff", "backoff bounds must be positive and ordered");
  }
  // One series per target: as many as the configuration has (observe::SeriesPerTarget).
  registry_.AllowSeries(kTargetPausedName, observe::SeriesPerTarget(1, sinks_.size()));
  for (const auto& [target, sink] : sinks_) {
    if (!sink) throw ConfigError("sinks", "target '" + target + "' has no sink");
    auto lane = std::make_unique<Lane>();
    lane->sink = sink.get();
    lane->paused = &registry_.AddGauge(
        kTargetPausedName,
        "1 while the target's sink is paused: its last batch found no broker; its messages "
        "wait without leases or attempts spent while other targets flow.",
        {{"target", target}});
    lanes_.emplace(target, std::move(lane));
  }
  registry_.AllowSeries(kTargetThrottledName, observe::SeriesPerTarget(1, sinks_.size()));
  const auto now = SteadyClock::now();
  for (const auto& [target, limit] : options_.rate_limits) {
    const std::string key = "sinks." + target;
    if (!sinks_.contains(target)) {
      throw ConfigError(key + ".max_rate", "no sink is configured for target '" + target + "'");
    }
    try {
      ValidateRateLimit(limit);
    } catch (const ConfigError& error) {
      throw ConfigError(key + "." + error.key(), error.message());
    }
    auto bucket = std::make_unique<Bucket>();
    bucket->rate = limit.max_rate;
    bucket->burst = limit.burst();
    bucket->tokens = bucket->burst;
    bucket->counted = now;
    bucket->throttled_until = now;
    bucket->throttled_seconds = &registry_.AddGauge(
        kTargetThrottledName,
        "Seconds the target's messages waited for its max_rate's tokens (only grows: use rate()); "
        "only targets with a max_rate have it.",
        {{"target", target}});
    buckets_.emplace(target, std::move(bucket));
  }
}

Dispatcher::~Dispatcher() = default;

void Dispatcher::Log(LogLevel level, const std::string& message) const {
  if (log_) log_(level, message);
}

std::vector<PublishOutcome> Dispatcher::Dispatch(std::span<const Envelope> batch,
                                                 Deadline deadline) {
  const auto started = SteadyClock::now();
  std::vector<PublishOutcome> outcomes(batch.size());
  const std::vector<std::string> held = HeldPaused(started);
  std::map<std::string_view, std::vector<std::size_t>> by_target;
  // Per stream: whether its first message here is a retry (the rest then waits for the next
  // batch).
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
  struct Running {
    std::string target;
    std::vector<std::size_t> indexes;  // of the messages sent
    std::future<std::vector<PublishOutcome>> outcomes;
  };
  // One lane per target; the first runs on this thread (deferred: when its outcomes are asked).
  std::vector<Running> running;
  for (const auto& [name, indexes] : by_target) {
    std::string target{name};
    const auto lane = lanes_.find(name);
    if (lane == lanes_.end() || std::find(held.begin(), held.end(), target) != held.end()) {
      std::string reason;
      FailureKind kind = FailureKind::kRejected;
      if (lane == lanes_.end()) {
        reason = "no sink is configured for target '" + target + "'";
      } else {
        kind = FailureKind::kUnavailable;
        std::lock_guard lock(pauses_mutex_);
        const auto pause = pauses_.find(name);
        reason = "not sent: target '" + target + "' is paused" +
                 (pause != pauses_.end() ? ": " + pause->second.reason : std::string{});
      }
      for (const auto i : indexes) outcomes[i] = {batch[i].id, Failure{kind, reason}};
      continue;
    }
    // A rate-limited target sends what its tokens allow, the first in batch order: what follows
    // in a stream is never sent before what precedes it.
    std::vector<std::size_t> sent = indexes;
    if (const std::size_t granted = Admit(name, indexes.size(), started);
        granted < indexes.size()) {
      const std::string reason = std::string{kThrottledReason} + target +
                                 "' is over its max_rate; sent when it has tokens again";
      for (std::size_t k = granted; k < indexes.size(); ++k) {
        outcomes[indexes[k]] = {batch[indexes[k]].id, Failure{FailureKind::kUnavailable, reason}};
      }
      sent.resize(granted);
      if (sent.empty()) continue;  // nothing sent: no verdict either
    }
    auto publish = [this, &batch, deadline, lane = lane->second.get(), sent, target] {
      if (sent.size() == batch.size()) return lane->Publish(batch, deadline, target, log_);
      std::vector<Envelope> group;
      group.reserve(sent.size());
      for (const auto i : sent) group.push_back(batch[i]);
      return lane->Publish(group, deadline, target, log_);
    };
    const auto policy = running.empty() ? std::launch::deferred : std::launch::async;
    running.push_back({std::move(target), std::move(sent), std::async(policy, std::move(publish))});
  }
  for (Running& lane : running) {
    auto lane_outcomes = lane.outcomes.get();
    bool all_unavailable = true;
    for (std::size_t k = 0; k < lane.indexes.size(); ++k) {
      const auto& failure = lane_outcomes[k].failure;
      all_unavailable = all_unavailable && failure && failure->kind == FailureKind::kUnavailable;
      outcomes[lane.indexes[k]] = std::move(lane_outcomes[k]);
    }
    std::optional<std::string> reason;
    if (all_unavailable) reason = outcomes[lane.indexes.front()].failure->reason;
    Verdict(lane.target, reason);
  }
  publish_seconds_.Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  return outcomes;
}

void Dispatcher::Verdict(const std::string& target, const std::optional<std::string>& reason) {
  const auto now = SteadyClock::now();
  std::lock_guard lock(pauses_mutex_);
  auto found = pauses_.find(target);
  if (!reason) {
    if (found == pauses_.end()) return;
    const auto paused_for =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - found->second.since);
    Log(LogLevel::kInfo, "sink '" + target + "' is available again after " +
                             std::to_string(paused_for.count()) + " ms; its messages flow");
    pauses_.erase(found);
    PausesChanged();
    return;
  }
  if (found == pauses_.end()) {
    found =
        pauses_
            .emplace(
                target,
                Pause{
                    now, now, now, outbox::Backoff{options_.min_backoff, options_.max_backoff}, {}})
            .first;
  }
  const auto backoff = found->second.backoff.Failed();
  found->second.verdict_at = now;
  found->second.probe_at = now + backoff;
  found->second.reason = *reason;
  PausesChanged();
  registry_.RecordError(NameOf(FailureKind::kUnavailable), *reason);
  Log(LogLevel::kWarn, "sink '" + target + "' is unavailable: " + *reason +
                           "; its messages wait (no attempt spent, no lease kept) while other "
                           "targets flow; probing it again in " +
                           std::to_string(backoff.count()) + " ms");
}

std::size_t Dispatcher::Admit(std::string_view target, std::size_t wanted,
                              SteadyClock::time_point now) {
  std::lock_guard lock(buckets_mutex_);
  const auto bucket = buckets_.find(target);
  return bucket == buckets_.end() ? wanted : bucket->second->Take(wanted, now);
}

std::vector<std::string> Dispatcher::HeldPaused(SteadyClock::time_point now) const {
  std::lock_guard lock(pauses_mutex_);
  std::vector<std::string> names;
  for (const auto& [target, pause] : pauses_) {
    if (now < pause.probe_at) names.push_back(target);
  }
  return names;
}

std::vector<std::string> Dispatcher::Held(SteadyClock::time_point now) const {
  std::vector<std::string> names = HeldPaused(now);
  std::lock_guard lock(buckets_mutex_);
  for (const auto& [target, bucket] : buckets_) {
    if (bucket->Holds(now) && std::find(names.begin(), names.end(), target) == names.end()) {
      names.push_back(target);
    }
  }
  return names;
}

std::vector<std::string> Dispatcher::Held(SteadyClock::time_point now,
                                          std::span<const Envelope> in_flight) const {
  std::vector<std::string> names = Held(now);
  if (in_flight.empty()) return names;
  std::lock_guard lock(buckets_mutex_);
  for (const auto& entry : buckets_) {  // not [target, bucket]: clang 14 cannot capture those
    const std::string& target = entry.first;
    if (std::find(names.begin(), names.end(), target) != names.end()) continue;
    const auto of_target = std::count_if(in_flight.begin(), in_flight.end(),
                                         [&](const Envelope& e) { return e.target == target; });
    if (of_target > 0 && static_cast<double>(of_target) >= entry.second->TokensAt(now)) {
      names.push_back(target);
    }
  }
  return names;
}

std::optional<Dispatcher::SteadyClock::time_point> Dispatcher::NextProbe(
    SteadyClock::time_point now) const {
  std::optional<SteadyClock::time_point> next;
  {
    std::lock_guard lock(pauses_mutex_);
    for (const auto& [target, pause] : pauses_) {
      if (pause.probe_at > now) next = std::min(next.value_or(pause.probe_at), pause.probe_at);
    }
  }
  std::lock_guard lock(buckets_mutex_);
  for (const auto& [target, bucket] : buckets_) {
    if (!bucket->Holds(now)) continue;
    next = std::min(next.value_or(bucket->throttled_until), bucket->throttled_until);
  }
  return next;
}

void Dispatcher::EndPauses(const std::vector<std::string>& targets,
                           SteadyClock::time_point looked_at) {
  std::lock_guard lock(pauses_mutex_);
  std::size_t ended = 0;
  for (const auto& target : targets) {
    const auto found = pauses_.find(target);
    if (found == pauses_.end() || found->second.verdict_at >= looked_at) continue;
    pauses_.erase(found);
    ++ended;
  }
  if (ended > 0) PausesChanged();
}

std::vector<Dispatcher::PausedTarget> Dispatcher::Paused() const {
  std::lock_guard lock(pauses_mutex_);
  std::vector<PausedTarget> paused;
  paused.reserve(pauses_.size());
  for (const auto& [target, pause] : pauses_) paused.push_back({target, pause.reason});
  return paused;
}

bool Dispatcher::AnyPaused() const {
  std::lock_guard lock(pauses_mutex_);
  return !pauses_.empty();
}

int Dispatcher::AddPauseListener(std::function<void(bool any_paused)> listener) {
  std::lock_guard lock(pauses_mutex_);
  listener(!pauses_.empty());
  pause_listeners_.emplace(next_listener_, std::move(listener));
  return next_listener_++;
}

void Dispatcher::RemovePauseListener(int id) {
  std::lock_guard lock(pauses_mutex_);
  pause_listeners_.erase(id);
}

void Dispatcher::PausesChanged() {
  for (const auto& [target, lane] : lanes_) {
    lane->paused->Set(pauses_.contains(target) ? 1.0 : 0.0);
  }
  broker_unavailable_.Set(pauses_.empty() ? 0.0 : 1.0);
  for (const auto& [id, listener] : pause_listeners_) listener(!pauses_.empty());
}

}  // namespace outbox
