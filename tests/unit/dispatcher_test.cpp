// The dispatcher (include/outbox/relay/dispatcher.h): lanes per target, turns for callers that
// share a sink, pauses, per-stream retry hold, one outcome per message whatever the sink returns.
#include "outbox/relay/dispatcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/core/uuid.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// A sink that notes how many calls run at once, takes `hold` per call and answers as told.
class ScriptedSink final : public Sink {
 public:
  using Answer = std::function<std::vector<PublishOutcome>(std::span<const Envelope>)>;
  explicit ScriptedSink(milliseconds hold = milliseconds{0}, Answer answer = {})
      : answer_(std::move(answer)), hold_(hold) {}
  std::string_view Name() const override { return "scripted"; }
  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline) override {
    {
      const std::lock_guard lock(mutex_);
      if (!batch.empty()) topics_.push_back(batch.front().topic);
      sent_ += batch.size();
    }
    const int now = ++running_;
    int seen = most_;
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(hold_);
    --running_;
    ++calls_;
    if (answer_) return answer_(batch);
    std::vector<PublishOutcome> outcomes;
    for (const Envelope& envelope : batch) outcomes.push_back({envelope.id, std::nullopt});
    return outcomes;
  }
  void Close() override {}

  std::vector<std::string> topics() const {
    const std::lock_guard lock(mutex_);
    return topics_;
  }
  std::size_t sent() const {
    const std::lock_guard lock(mutex_);
    return sent_;
  }

  std::atomic<int> running_{0};
  std::atomic<int> most_{0};
  std::atomic<int> calls_{0};
  Answer answer_;

 private:
  milliseconds hold_;
  mutable std::mutex mutex_;
  std::vector<std::string> topics_;  // each call's first topic, in call order
  std::size_t sent_ = 0;
};

std::vector<PublishOutcome> AllUnavailable(std::span<const Envelope> batch) {
  std::vector<PublishOutcome> outcomes;
  for (const Envelope& envelope : batch) {
    outcomes.push_back({envelope.id, Failure{FailureKind::kUnavailable, "connection refused"}});
  }
  return outcomes;
}

std::vector<Envelope> Batch(int size, const std::string& topic = "t",
                            const std::string& target = "default") {
  std::vector<Envelope> batch(static_cast<std::size_t>(size));
  for (Envelope& envelope : batch) {
    envelope.id = NewUuidV7();
    envelope.topic = topic;
    envelope.target = target;
  }
  return batch;
}

Deadline Far() { return SteadyClock::now() + milliseconds{10000}; }

struct OneTarget {
  explicit OneTarget(milliseconds hold, ScriptedSink::Answer answer = {},
                     DispatcherOptions options = {}) {
    auto owned = std::make_unique<ScriptedSink>(hold, std::move(answer));
    sink = owned.get();
    SinkMap sinks;
    sinks.emplace("default", std::move(owned));
    dispatcher = std::make_unique<Dispatcher>(std::move(sinks), options);
  }
  ScriptedSink* sink = nullptr;
  std::unique_ptr<Dispatcher> dispatcher;
};

TEST(DispatcherTest, CallersSharingASinkTakeTurns) {
  OneTarget one(milliseconds{2});
  std::vector<std::thread> sources;
  std::atomic<int> published{0};
  for (int source = 0; source < 2; ++source) {
    sources.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        for (const auto& outcome : one.dispatcher->Dispatch(Batch(3), Far())) {
          if (outcome.published()) ++published;
        }
      }
    });
  }
  for (std::thread& source : sources) source.join();
  EXPECT_EQ(one.sink->calls_.load(), 50);
  EXPECT_EQ(published.load(), 150);
  EXPECT_EQ(one.sink->most_.load(), 1) << "two Publish calls ran at once";
}

TEST(DispatcherTest, ATurnThatDoesNotComeByTheDeadlineSendsNothingAndSpendsNoAttempt) {
  OneTarget one(milliseconds{500});
  std::thread busy([&] { one.dispatcher->Dispatch(Batch(1), Far()); });
  while (one.sink->running_.load() == 0) std::this_thread::sleep_for(milliseconds{1});
  const auto batch = Batch(2);
  const auto outcomes = one.dispatcher->Dispatch(batch, SteadyClock::now() + milliseconds{50});
  busy.join();
  ASSERT_EQ(outcomes.size(), 2U);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    ASSERT_TRUE(outcomes[i].failure.has_value());
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kUnavailable);
    EXPECT_FALSE(outcomes[i].failure->treatment().spends_attempt);
  }
  EXPECT_EQ(one.sink->calls_.load(), 1) << "the late batch was not sent";
}

// A source with batch after batch (the WAL relay draining a backlog) must not keep the other one
// waiting: turns go in the order they were asked for.
TEST(DispatcherTest, TurnsGoInTheOrderTheyWereAskedFor) {
  OneTarget one(milliseconds{200});
  std::thread draining([&] {
    one.dispatcher->Dispatch(Batch(1, "busy"), Far());
    std::this_thread::sleep_for(milliseconds{20});  // the other one asks meanwhile
    one.dispatcher->Dispatch(Batch(1, "busy"), Far());
  });
  while (one.sink->running_.load() == 0) std::this_thread::sleep_for(milliseconds{1});
  std::thread waiting([&] { one.dispatcher->Dispatch(Batch(1, "other"), Far()); });
  draining.join();
  waiting.join();
  EXPECT_EQ(one.sink->topics(), (std::vector<std::string>{"busy", "other", "busy"}));
}

TEST(DispatcherTest, TargetsPublishSideBySideEachInItsOwnLane) {
  SinkMap sinks;
  auto slow = std::make_unique<ScriptedSink>(milliseconds{300});
  auto fast = std::make_unique<ScriptedSink>(milliseconds{0});
  ScriptedSink* fast_sink = fast.get();
  sinks.emplace("a", std::move(slow));
  sinks.emplace("b", std::move(fast));
  Dispatcher dispatcher(std::move(sinks));
  auto batch = Batch(2, "t", "a");
  for (auto& envelope : Batch(3, "t", "b")) batch.push_back(envelope);
  batch.push_back(Batch(1, "t", "nowhere").front());
  const auto started = SteadyClock::now();
  const auto outcomes = dispatcher.Dispatch(batch, Far());
  EXPECT_LT(SteadyClock::now() - started, milliseconds{550}) << "the lanes ran one after another";
  ASSERT_EQ(outcomes.size(), 6U);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    EXPECT_TRUE(outcomes[i].published()) << i;
  }
  EXPECT_EQ(fast_sink->sent(), 3U);
  ASSERT_TRUE(outcomes[5].failure);
  EXPECT_EQ(outcomes[5].failure->kind, FailureKind::kRejected);
  EXPECT_NE(outcomes[5].failure->reason.find("no sink is configured for target 'nowhere'"),
            std::string::npos);
}

TEST(DispatcherTest, OutcomesThatDoNotMatchTheBatchAreOutcomeUnknownForWhatWasNotAnswered) {
  OneTarget one(milliseconds{0}, [](std::span<const Envelope> batch) {
    return std::vector<PublishOutcome>{{batch[0].id, std::nullopt}};  // one answer for three
  });
  const auto batch = Batch(3);
  const auto outcomes = one.dispatcher->Dispatch(batch, Far());
  ASSERT_EQ(outcomes.size(), 3U);
  EXPECT_TRUE(outcomes[0].published());
  for (std::size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    ASSERT_TRUE(outcomes[i].failure);
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kOutcomeUnknown);
  }
}

TEST(DispatcherTest, TheRestOfAStreamWhoseFirstMessageIsARetryIsNotSent) {
  OneTarget one(milliseconds{0});
  auto batch = Batch(3);
  for (auto& envelope : batch) envelope.stream_key = "order-1";
  batch[0].attempts = 1;
  const auto outcomes = one.dispatcher->Dispatch(batch, Far());
  EXPECT_TRUE(outcomes[0].published());
  for (std::size_t i = 1; i < 3; ++i) {
    ASSERT_TRUE(outcomes[i].failure);
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kOutcomeUnknown);
  }
  EXPECT_EQ(one.sink->sent(), 1U);
}

TEST(DispatcherTest, ATargetWithoutABrokerIsPausedAndProbedAfterItsBackoff) {
  OneTarget one(milliseconds{0}, AllUnavailable,
                {.min_backoff = milliseconds{200}, .max_backoff = milliseconds{400}});
  const auto first = one.dispatcher->Dispatch(Batch(2), Far());
  ASSERT_TRUE(first[0].failure);
  EXPECT_EQ(one.sink->calls_.load(), 1);
  ASSERT_EQ(one.dispatcher->Paused().size(), 1U);
  EXPECT_EQ(one.dispatcher->Paused()[0].name, "default");
  EXPECT_EQ(one.dispatcher->Paused()[0].reason, "connection refused");
  EXPECT_TRUE(one.dispatcher->AnyPaused());
  EXPECT_EQ(one.dispatcher->Held(SteadyClock::now()), std::vector<std::string>{"default"});
  // While held, nothing is sent: not an attempt, and no second verdict.
  const auto held = one.dispatcher->Dispatch(Batch(1), Far());
  ASSERT_TRUE(held[0].failure);
  EXPECT_EQ(held[0].failure->kind, FailureKind::kUnavailable);
  EXPECT_NE(held[0].failure->reason.find("is paused: connection refused"), std::string::npos);
  EXPECT_EQ(one.sink->calls_.load(), 1);
  const auto probe = one.dispatcher->NextProbe(SteadyClock::now());
  ASSERT_TRUE(probe.has_value());
  std::this_thread::sleep_until(*probe);
  EXPECT_TRUE(one.dispatcher->Held(SteadyClock::now()).empty());
  // The probe is sent; the broker answers now, and the pause ends.
  one.sink->answer_ = {};
  EXPECT_TRUE(one.dispatcher->Dispatch(Batch(1), Far())[0].published());
  EXPECT_EQ(one.sink->calls_.load(), 2);
  EXPECT_FALSE(one.dispatcher->AnyPaused());
}

TEST(DispatcherTest, APauseEndsOnlyForALookMadeAfterItsLastVerdict) {
  OneTarget one(milliseconds{0}, AllUnavailable);
  const auto before = SteadyClock::now();
  one.dispatcher->Dispatch(Batch(1), Far());
  ASSERT_TRUE(one.dispatcher->AnyPaused());
  one.dispatcher->EndPauses({"default"}, before);  // a claim sent before the verdict
  EXPECT_TRUE(one.dispatcher->AnyPaused());
  one.dispatcher->EndPauses({"default"}, SteadyClock::now() + milliseconds{1});
  EXPECT_FALSE(one.dispatcher->AnyPaused());
}

TEST(DispatcherTest, PauseListenersHearEveryChangeUntilRemoved) {
  OneTarget one(milliseconds{0}, AllUnavailable, {.min_backoff = milliseconds{1}});
  std::vector<bool> heard;
  const int id = one.dispatcher->AddPauseListener([&](bool any) { heard.push_back(any); });
  one.dispatcher->Dispatch(Batch(1), Far());
  std::this_thread::sleep_for(milliseconds{5});  // the probe is due
  one.sink->answer_ = {};
  one.dispatcher->Dispatch(Batch(1), Far());
  one.dispatcher->RemovePauseListener(id);
  one.sink->answer_ = AllUnavailable;
  one.dispatcher->Dispatch(Batch(1), Far());
  EXPECT_EQ(heard, (std::vector<bool>{false, true, false}));
}

TEST(DispatcherTest, BadSetUpIsAConfigError) {
  EXPECT_THROW(Dispatcher(SinkMap{}), ConfigError);
  SinkMap sinks;
  sinks.emplace("default", std::make_unique<ScriptedSink>());
  EXPECT_THROW(Dispatcher(std::move(sinks),
                          {.min_backoff = milliseconds{10}, .max_backoff = milliseconds{5}}),
               ConfigError);
  SinkMap empty_sink;
  empty_sink.emplace("default", nullptr);
  EXPECT_THROW(Dispatcher(std::move(empty_sink)), ConfigError);
}

// Issue #43: a target with a max_rate gets what its bucket holds, in batch order; the rest is
// throttled (not sent, no attempt, not a pause), and the target is held until its bucket is back
// 9/10 full. The other target's lane does not wait for it.
struct TwoTargets {
  explicit TwoTargets(RateLimit slow_limit) {
    auto slow_owned = std::make_unique<ScriptedSink>();
    auto fast_owned = std::make_unique<ScriptedSink>();
    slow = slow_owned.get();
    fast = fast_owned.get();
    SinkMap sinks;
    sinks.emplace("slow", std::move(slow_owned));
    sinks.emplace("fast", std::move(fast_owned));
    dispatcher = std::make_unique<Dispatcher>(
        std::move(sinks),
        DispatcherOptions{.metrics = &registry, .rate_limits = {{"slow", slow_limit}}});
  }
  // `slow_count` messages to "slow", then `fast_count` to "fast".
  static std::vector<Envelope> Mixed(int slow_count, int fast_count) {
    auto batch = Batch(slow_count, "t", "slow");
    for (auto& envelope : Batch(fast_count, "t", "fast")) batch.push_back(envelope);
    return batch;
  }
  observe::Registry registry;
  ScriptedSink* slow = nullptr;
  ScriptedSink* fast = nullptr;
  std::unique_ptr<Dispatcher> dispatcher;
};

TEST(DispatcherTest, ARateLimitedTargetSendsWhatItsBucketHoldsAndIsHeldUntilItRefills) {
  TwoTargets two({.max_rate = 100, .max_burst = 10});
  EXPECT_TRUE(two.dispatcher->Held(SteadyClock::now()).empty()) << "a bucket starts full";
  const auto batch = TwoTargets::Mixed(30, 30);
  const auto outcomes = two.dispatcher->Dispatch(batch, Far());
  for (std::size_t i = 0; i < 10; ++i) EXPECT_TRUE(outcomes[i].published()) << i;
  for (std::size_t i = 10; i < 30; ++i) {
    ASSERT_TRUE(outcomes[i].failure) << i;
    EXPECT_TRUE(IsThrottled(*outcomes[i].failure)) << outcomes[i].failure->reason;
    EXPECT_FALSE(outcomes[i].failure->treatment().spends_attempt);
  }
  for (std::size_t i = 30; i < 60; ++i) EXPECT_TRUE(outcomes[i].published()) << i;
  EXPECT_EQ(two.slow->sent(), 10U);
  EXPECT_EQ(two.fast->sent(), 30U);
  EXPECT_FALSE(two.dispatcher->AnyPaused()) << "throttled is not paused";
  EXPECT_TRUE(two.dispatcher->HeldPaused(SteadyClock::now()).empty());
  EXPECT_EQ(two.dispatcher->Held(SteadyClock::now()), std::vector<std::string>{"slow"});
  // 9/10 full again (9 tokens at 100/s): 90 ms after it ran dry.
  const auto now = SteadyClock::now();
  const auto refilled = two.dispatcher->NextProbe(now);
  ASSERT_TRUE(refilled.has_value());
  EXPECT_LE(*refilled - now, milliseconds{101});
  EXPECT_GE(*refilled - now, milliseconds{80});
  std::this_thread::sleep_until(*refilled);
  EXPECT_TRUE(two.dispatcher->Held(SteadyClock::now()).empty());
  EXPECT_FALSE(two.dispatcher->NextProbe(SteadyClock::now()).has_value());
  // Throttled time is counted, once per spell.
  const std::string text = two.registry.RenderPrometheus();
  const std::string series = "outbox_relay_target_throttled_seconds{target=\"slow\"} ";
  const auto at = text.find(series);
  ASSERT_NE(at, std::string::npos) << text;
  const double throttled = std::stod(text.substr(at + series.size()));
  EXPECT_GT(throttled, 0.08);
  EXPECT_LT(throttled, 0.11);
  EXPECT_EQ(text.find("outbox_relay_target_throttled_seconds{target=\"fast\"}"), std::string::npos);
}

// A target under its rate is never held: it stays out of the claims' paused set, whose changes
// restart the claim cursor's walk.
TEST(DispatcherTest, ATargetUnderItsRateIsNeverHeld) {
  TwoTargets two({.max_rate = 1000, .max_burst = 10});
  for (int i = 0; i < 20; ++i) {
    for (const auto& outcome : two.dispatcher->Dispatch(TwoTargets::Mixed(5, 5), Far())) {
      EXPECT_TRUE(outcome.published());
    }
    EXPECT_TRUE(two.dispatcher->Held(SteadyClock::now()).empty()) << "after batch " << i;
    EXPECT_FALSE(two.dispatcher->NextProbe(SteadyClock::now()).has_value());
    std::this_thread::sleep_for(milliseconds{6});  // 6 tokens back, 5 taken a batch
  }
  EXPECT_EQ(two.slow->sent(), 100U);
}

// A claim made beside a batch in flight leaves out a limited target that batch will leave with
// no token (it would only be given back), and no other.
TEST(DispatcherTest, ALimitedTargetThatABatchInFlightEmptiesIsHeldForTheClaimBesideIt) {
  TwoTargets two({.max_rate = 100, .max_burst = 10});
  const auto now = SteadyClock::now();
  EXPECT_TRUE(two.dispatcher->Held(now, TwoTargets::Mixed(5, 50)).empty());
  EXPECT_EQ(two.dispatcher->Held(now, TwoTargets::Mixed(10, 0)), std::vector<std::string>{"slow"});
  EXPECT_TRUE(two.dispatcher->Held(now, TwoTargets::Mixed(0, 500)).empty());
  EXPECT_TRUE(two.dispatcher->Held(now).empty()) << "without a batch in flight";
}

TEST(DispatcherTest, AThrottledTargetHoldsUpNoOtherLaneAndSendsItsRateOverTime) {
  TwoTargets two({.max_rate = 200, .max_burst = 5});
  const auto started = SteadyClock::now();
  auto slowest_dispatch = SteadyClock::duration::zero();
  // A source that takes what is not held, every 2 ms or when a held target is due (as the
  // relays do), for half a second.
  while (SteadyClock::now() - started < milliseconds{500}) {
    const auto held = two.dispatcher->Held(SteadyClock::now());
    const int slow_count = held.empty() ? 50 : 0;
    const auto before = SteadyClock::now();
    two.dispatcher->Dispatch(TwoTargets::Mixed(slow_count, 50), Far());
    slowest_dispatch = std::max(slowest_dispatch, SteadyClock::now() - before);
    const auto next = SteadyClock::now() + milliseconds{2};
    std::this_thread::sleep_until(std::min(next, two.dispatcher->NextProbe(before).value_or(next)));
  }
  const double elapsed = std::chrono::duration<double>(SteadyClock::now() - started).count();
  const std::size_t slow_published = two.slow->sent();
  const std::size_t fast_published = two.fast->sent();
  // The burst, then 200/s (5 every 25 ms).
  const double expected = 5 + 200 * elapsed;
  EXPECT_GT(static_cast<double>(slow_published), expected * 0.9);
  EXPECT_LT(static_cast<double>(slow_published), expected * 1.1);
  EXPECT_GT(fast_published, 50U * 100) << "the fast lane kept going, 50 a batch";
  EXPECT_LT(slowest_dispatch, milliseconds{100}) << "a Dispatch waited for tokens";
  EXPECT_FALSE(two.dispatcher->AnyPaused());
}

TEST(DispatcherTest, BadRateLimitsAreConfigErrors) {
  const auto with = [](RateLimits limits) {
    SinkMap sinks;
    sinks.emplace("default", std::make_unique<ScriptedSink>());
    Dispatcher dispatcher(std::move(sinks), {.rate_limits = std::move(limits)});
  };
  const auto expect_error = [&](RateLimits limits, const std::string& key) {
    try {
      with(std::move(limits));
      ADD_FAILURE() << "no error for " << key;
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key(), key) << error.what();
    }
  };
  expect_error({{"default", {.max_rate = 0}}}, "sinks.default.max_rate");
  expect_error({{"default", {.max_rate = -5}}}, "sinks.default.max_rate");
  expect_error({{"default", {.max_rate = 10, .max_burst = 0.5}}}, "sinks.default.max_burst");
  expect_error({{"other", {.max_rate = 10}}}, "sinks.other.max_rate");
  EXPECT_NO_THROW(with({{"default", {.max_rate = 0.5}}}));
  EXPECT_EQ((RateLimit{.max_rate = 0.5}).burst(), 1.0);
  EXPECT_EQ((RateLimit{.max_rate = 250}).burst(), 250.0);
}

}  // namespace
}  // namespace outbox::testing
