// SharedSink (include/outbox/relay/shared_sink.h): relays of one process sharing a sink take
// turns, and a turn that does not come before the deadline is an outage, not a verdict.
#include "outbox/relay/shared_sink.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/uuid.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// A sink that notes how many calls run at once and takes `hold` per call.
class SlowSink final : public Sink {
 public:
  explicit SlowSink(milliseconds hold) : hold_(hold) {}
  std::string_view Name() const override { return "slow"; }
  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline) override {
    {
      const std::lock_guard lock(mutex_);
      if (!batch.empty()) topics_.push_back(batch.front().topic);
    }
    const int now = ++running_;
    int seen = most_;
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(hold_);
    --running_;
    ++calls_;
    std::vector<PublishOutcome> outcomes;
    for (const Envelope& envelope : batch) outcomes.push_back({envelope.id, std::nullopt});
    return outcomes;
  }
  void Close() override { ++closes_; }

  std::atomic<int> running_{0};
  std::atomic<int> most_{0};
  std::atomic<int> calls_{0};
  std::atomic<int> closes_{0};
  std::vector<std::string> topics() const {
    const std::lock_guard lock(mutex_);
    return topics_;
  }

 private:
  milliseconds hold_;
  mutable std::mutex mutex_;
  std::vector<std::string> topics_;  // each call's first topic, in call order
};

// `copies` maps over one sink as target "default".
std::vector<SinkMap> Share(std::unique_ptr<Sink> sink, std::size_t copies) {
  SinkMap sinks;
  sinks.emplace("default", std::move(sink));
  return ShareSinks(std::move(sinks), copies);
}

std::vector<Envelope> Batch(int size, const std::string& topic = "t") {
  std::vector<Envelope> batch(static_cast<std::size_t>(size));
  for (Envelope& envelope : batch) {
    envelope.id = NewUuidV7();
    envelope.topic = topic;
    envelope.target = "default";
  }
  return batch;
}

TEST(SharedSinkTest, RelaysSharingASinkTakeTurns) {
  auto owned = std::make_unique<SlowSink>(milliseconds{2});
  SlowSink* slow = owned.get();
  auto maps = Share(std::move(owned), 2);
  ASSERT_EQ(maps.size(), 2U);
  ASSERT_TRUE(maps[0].contains("default"));
  ASSERT_TRUE(maps[1].contains("default"));
  EXPECT_EQ(maps[0].at("default")->Name(), "slow");
  std::vector<std::thread> relays;
  std::atomic<int> published{0};
  for (SinkMap& map : maps) {
    relays.emplace_back([&published, &map] {
      for (int i = 0; i < 25; ++i) {
        const auto batch = Batch(3);
        for (const auto& outcome :
             map.at("default")->Publish(batch, SteadyClock::now() + milliseconds{10000})) {
          if (outcome.published()) ++published;
        }
      }
    });
  }
  for (std::thread& relay : relays) relay.join();
  EXPECT_EQ(slow->calls_.load(), 50);
  EXPECT_EQ(published.load(), 150);
  EXPECT_EQ(slow->most_.load(), 1) << "two Publish calls ran at once";
  maps[0].at("default")->Close();
  maps[1].at("default")->Close();
  EXPECT_EQ(slow->closes_.load(), 2);
}

TEST(SharedSinkTest, ATurnThatDoesNotComeByTheDeadlineSendsNothingAndSpendsNoAttempt) {
  auto owned = std::make_unique<SlowSink>(milliseconds{500});
  SlowSink* slow = owned.get();
  auto maps = Share(std::move(owned), 2);
  std::thread busy(
      [&] { maps[0].at("default")->Publish(Batch(1), SteadyClock::now() + milliseconds{5000}); });
  while (slow->running_.load() == 0) std::this_thread::sleep_for(milliseconds{1});
  const auto batch = Batch(2);
  const auto outcomes =
      maps[1].at("default")->Publish(batch, SteadyClock::now() + milliseconds{50});
  busy.join();
  ASSERT_EQ(outcomes.size(), 2U);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    ASSERT_TRUE(outcomes[i].failure.has_value());
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kUnavailable);
    EXPECT_FALSE(outcomes[i].failure->treatment().spends_attempt);
  }
  EXPECT_EQ(slow->calls_.load(), 1) << "the late batch was not sent";
}

// A relay with batch after batch (the WAL relay draining a backlog) must not keep the other one
// waiting: turns go in the order they were asked for.
TEST(SharedSinkTest, TurnsGoInTheOrderTheyWereAskedFor) {
  auto owned = std::make_unique<SlowSink>(milliseconds{200});
  SlowSink* slow = owned.get();
  const auto core = std::make_shared<SharedSink::Core>(std::move(owned));
  SharedSink busy(core);
  SharedSink other(core);
  const auto far = [] { return SteadyClock::now() + milliseconds{10000}; };
  std::thread draining([&] {
    busy.Publish(Batch(1, "busy"), far());
    busy.Publish(Batch(1, "busy"), far());  // asks again at once
  });
  while (slow->running_.load() == 0) std::this_thread::sleep_for(milliseconds{1});
  std::thread waiting([&] { other.Publish(Batch(1, "other"), far()); });
  while (core->waiting() == 0) std::this_thread::sleep_for(milliseconds{1});
  draining.join();
  waiting.join();
  EXPECT_EQ(slow->topics(), (std::vector<std::string>{"busy", "other", "busy"}));
  EXPECT_EQ(core->waiting(), 0U);
}

TEST(SharedSinkTest, OneCopyIsTheSinksThemselves) {
  auto owned = std::make_unique<SlowSink>(milliseconds{0});
  const Sink* raw = owned.get();
  auto maps = Share(std::move(owned), 1);
  ASSERT_EQ(maps.size(), 1U);
  EXPECT_EQ(maps[0].at("default").get(), raw);
  EXPECT_THROW(SharedSink(nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace outbox::testing
