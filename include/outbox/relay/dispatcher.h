#pragma once
// The dispatcher: one per process, between the sources of messages (the table relay's claims, the
// WAL relay's slot) and the sinks. It owns the sinks, one lane per target, and what concerns a
// destination rather than a source:
// - each target's messages go through its sink, the targets side by side, so that a slow or dead
//   broker costs the others nothing but its own deadline;
// - a sink is used by one caller at a time: callers take turns in the order they asked, and a turn
//   that does not come by the deadline sends nothing (kUnavailable, no attempt spent);
// - per (target, stream) order: the rest of a stream whose first message in a batch is a retry is
//   not sent, so that if the retry fails again its followers have not reached the broker first;
// - a target whose sink finds no broker (every outcome kUnavailable) is paused: its messages are
//   not sent until its probe is due (min_backoff, doubling up to max_backoff), whoever dispatches
//   them; the sources leave them where they are (the table relay does not claim them, the WAL
//   relay parks them in the table), so one sink's outage pauses its lane only, in every mode;
// - a target with a rate limit (RateLimit: `max_rate`, `max_burst`) is sent at most what its token
//   bucket holds; what is over is not sent (kUnavailable, IsThrottled, no attempt spent, no pause
//   verdict), and from then until its bucket is nine tenths full again the target is held
//   like a paused one (Held, NextProbe), so the sources do not take its messages only to give
//   them back. Nothing waits for tokens: the other targets' lanes, and the source's next batch,
//   never wait for it;
// - one outcome per message, in batch order, each reason passed through RedactReasons: a sink
//   that returns outcomes that do not match its batch is logged, and what it did not answer is
//   kOutcomeUnknown.
//
// Threading: Dispatch may be called from several threads at once (the lanes take turns); the
// pause queries are thread-safe.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/backoff.h"
#include "outbox/core/log.h"
#include "outbox/observe/metrics.h"
#include "outbox/sink/sink.h"

namespace outbox {

// Sinks by target name (the message's `target` column).
using SinkMap = std::map<std::string, std::unique_ptr<Sink>, std::less<>>;

// A target's rate limit: a token bucket of `max_burst` tokens refilled at `max_rate` a second,
// one token per message sent. It starts full; after an idle spell or an outage it holds no more
// than `max_burst`, so a partner that comes back is not sent more than that at once.
struct RateLimit {
  double max_rate = 0;              // messages a second; > 0
  std::optional<double> max_burst;  // tokens; unset: max_rate x 1 s (at least 1)

  [[nodiscard]] double burst() const { return max_burst.value_or(std::max(1.0, max_rate)); }
};
using RateLimits = std::map<std::string, RateLimit, std::less<>>;

// Throws ConfigError("max_rate" or "max_burst", why) unless 0 < max_rate <= 1,000,000 and
// max_burst is unset (the default) or within [1, 1,000,000].
void ValidateRateLimit(const RateLimit& limit);

// The reason of a message not sent because its target's bucket was empty (IsThrottled).
inline constexpr std::string_view kThrottledReason = "not sent: throttled, target '";
// A failure that only says the target's rate limit held the message back: the source gives its
// lease back untouched (no attempt, no error recorded, not a failure in the metrics).
inline bool IsThrottled(const Failure& failure) {
  return failure.kind == FailureKind::kUnavailable && failure.reason.starts_with(kThrottledReason);
}

struct DispatcherOptions {
  // A paused target is probed again after min_backoff, then after twice as long each time its
  // probe finds no broker, up to max_backoff.
  std::chrono::milliseconds min_backoff{100};
  std::chrono::milliseconds max_backoff{std::chrono::seconds{5}};
  // Where outbox_relay_publish_seconds, outbox_relay_broker_unavailable and
  // outbox_relay_target_paused{target} go. Not owned; must outlive the dispatcher. Null: a
  // registry of its own.
  observe::Registry* metrics = nullptr;
  // By target; a target not named here is not limited. Each must name a sink (ConfigError).
  RateLimits rate_limits;
};

class Dispatcher {
 public:
  using SteadyClock = std::chrono::steady_clock;

  struct PausedTarget {
    std::string name;
    std::string reason;  // why, from its last batch: the reason of its first outcome
  };

  // Throws ConfigError for an empty sink map or invalid backoff bounds.
  explicit Dispatcher(SinkMap sinks, DispatcherOptions options = {}, LogFn log = {});
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Publishes `batch` (see the top of this file) and waits for every lane, at most until
  // `deadline` (a sink's own deadline, or its turn's); one outcome per message, in batch order.
  // Messages for a paused target whose probe is not due are not sent (kUnavailable); for a
  // target without a sink, kRejected.
  std::vector<PublishOutcome> Dispatch(std::span<const Envelope> batch, Deadline deadline);

  // What a source should not take now: the paused targets whose probe is not due at `now`, and the
  // throttled ones: a message of theirs found no token, and their bucket is not 9/10 full again
  // yet.
  [[nodiscard]] std::vector<std::string> Held(SteadyClock::time_point now) const;
  // Held, and the rate-limited targets that `in_flight` (messages being published now) leaves with
  // no token: what a source claiming beside a batch in flight should not take, or it would take
  // only to give back.
  [[nodiscard]] std::vector<std::string> Held(SteadyClock::time_point now,
                                              std::span<const Envelope> in_flight) const;
  // Held, without the throttled targets: those whose sink is down (a source that finds every
  // target unavailable but for throttled ones is not facing an outage).
  [[nodiscard]] std::vector<std::string> HeldPaused(SteadyClock::time_point now) const;
  // The earliest time after `now` when a held target is not held any more: a paused one's probe,
  // a throttled one's bucket 9/10 full again.
  [[nodiscard]] std::optional<SteadyClock::time_point> NextProbe(SteadyClock::time_point now) const;
  // Ends the pause of each of `targets` whose last verdict came before `looked_at`: a source
  // that looked then for its messages (a claim that could take them all) found none waiting, so
  // there is nothing to probe with and nothing held back; the next failure starts a new pause.
  void EndPauses(const std::vector<std::string>& targets, SteadyClock::time_point looked_at);

  [[nodiscard]] bool Has(std::string_view target) const { return sinks_.contains(target); }
  [[nodiscard]] std::size_t size() const { return sinks_.size(); }
  // The paused targets, by name, and why. Thread-safe.
  [[nodiscard]] std::vector<PausedTarget> Paused() const;
  [[nodiscard]] bool AnyPaused() const;
  // `listener` is called with AnyPaused() now and whenever it changes, from the thread that
  // changed it, under the dispatcher's lock (it must not call the dispatcher). Returns the id for
  // RemovePauseListener, which a listener that goes before the dispatcher must call.
  int AddPauseListener(std::function<void(bool any_paused)> listener);
  void RemovePauseListener(int id);

 private:
  struct Lane;
  struct Bucket;
  struct Pause {
    SteadyClock::time_point since;
    SteadyClock::time_point verdict_at;  // of the batch that paused it or extended the pause
    SteadyClock::time_point probe_at;
    outbox::Backoff backoff;  // its probes
    std::string reason;
  };

  // Tokens for up to `wanted` messages of `target` (all of them when it has no rate limit).
  std::size_t Admit(std::string_view target, std::size_t wanted, SteadyClock::time_point now);
  // After a lane's publish: paused (or its pause doubled) when it found no broker, resumed when
  // it answered. `reason` is set when every outcome was kUnavailable.
  void Verdict(const std::string& target, const std::optional<std::string>& reason);
  // Gauges and the paused list, after a change (pauses_mutex_ held).
  void PausesChanged();
  void Log(LogLevel level, const std::string& message) const;

  DispatcherOptions options_;
  std::unique_ptr<observe::Registry> own_registry_;
  observe::Registry& registry_;
  observe::Histogram& publish_seconds_;
  observe::Gauge& broker_unavailable_;
  SinkMap sinks_;
  std::map<std::string, std::unique_ptr<Lane>, std::less<>> lanes_;
  LogFn log_;
  mutable std::mutex pauses_mutex_;
  std::map<std::string, Pause, std::less<>> pauses_;  // guarded by pauses_mutex_, as below
  std::map<int, std::function<void(bool)>> pause_listeners_;
  mutable std::mutex buckets_mutex_;
  std::map<std::string, std::unique_ptr<Bucket>, std::less<>> buckets_;  // by target; guarded
  int next_listener_ = 0;
};

// A dispatcher over `sinks` with the backoff bounds and the registry of a relay's options
// (RelayOptions, WalRelayOptions).
template <class RelayOptionsT>
std::shared_ptr<Dispatcher> DispatcherFor(SinkMap sinks, const RelayOptionsT& options,
                                          const LogFn& log) {
  return std::make_shared<Dispatcher>(std::move(sinks),
                                      DispatcherOptions{.min_backoff = options.min_backoff,
                                                        .max_backoff = options.max_backoff,
                                                        .metrics = options.metrics,
                                                        .rate_limits = options.rate_limits},
                                      log);
}

}  // namespace outbox
