// The sink base (sink/sink_base.h): what it gives every sink, with a sink whose steps the test
// scripts. No server.

#include "outbox/sink/sink_base.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/uuid.h"

namespace outbox {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

std::vector<Envelope> MakeBatch(std::size_t size) {
  std::vector<Envelope> batch(size);
  for (Envelope& envelope : batch) {
    envelope.id = NewUuidV7();
    envelope.topic = "t";
  }
  return batch;
}

Deadline In(milliseconds duration) { return SteadyClock::now() + duration; }

// Each step does what the test put in it; the calls are counted.
class ScriptedSink final : public SinkBase {
 public:
  ScriptedSink() = default;
  explicit ScriptedSink(Backoff backoff) : SinkBase(backoff) {}

  [[nodiscard]] std::string_view Name() const override { return "scripted"; }
  void Close() override { connected = false; }

  bool connected = true;
  std::optional<std::string> connect_error;
  int connects = 0;
  int sends = 0;
  int finishes = 0;
  std::function<void(Batch&)> send;
  std::function<void(Batch&)> finish;

 private:
  bool Connected(Deadline /*deadline*/) override { return connected; }
  std::optional<std::string> Connect(Deadline /*deadline*/) override {
    ++connects;
    if (connect_error) return connect_error;
    connected = true;
    return std::nullopt;
  }
  void Send(Batch& batch, Deadline /*deadline*/) override {
    ++sends;
    if (send) send(batch);
  }
  void Finish(Batch& batch, Deadline /*deadline*/) override {
    ++finishes;
    if (finish) finish(batch);
  }
};

TEST(SinkBaseTest, EmptyBatchCallsNoStep) {
  ScriptedSink sink;
  EXPECT_TRUE(sink.Publish({}, In(milliseconds{100})).empty());
  EXPECT_EQ(sink.sends, 0);
  EXPECT_EQ(sink.finishes, 0);
}

TEST(SinkBaseTest, OneOutcomePerMessageInBatchOrderWhateverTheSinkSettles) {
  ScriptedSink sink;
  sink.send = [](SinkBase::Batch& batch) {
    batch.Settle(3, std::nullopt);
    batch.Fail(0, FailureKind::kRejected, "no");
    batch.Fail(0, FailureKind::kPermanent, "the first verdict counts");
    batch.MarkSent(1);
    batch.Settle(SinkBase::kNoIndex, std::nullopt);  // ignored
    // 2 and 4: nothing
  };
  const std::vector<Envelope> batch = MakeBatch(5);
  const std::vector<PublishOutcome> outcomes = sink.Publish(batch, In(milliseconds{100}));
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) EXPECT_EQ(outcomes[i].id, batch[i].id) << i;
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kRejected);
  ASSERT_FALSE(outcomes[1].published());
  EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kOutcomeUnknown);
  EXPECT_NE(outcomes[1].failure->reason.find("sent"), std::string::npos);
  // Left without a verdict, never marked sent, the batch not stopped: the base cannot know.
  for (const std::size_t i : {std::size_t{2}, std::size_t{4}}) {
    ASSERT_FALSE(outcomes[i].published()) << i;
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kOutcomeUnknown) << i;
    EXPECT_FALSE(outcomes[i].failure->reason.empty()) << i;
  }
  EXPECT_TRUE(outcomes[3].published());
  EXPECT_EQ(sink.finishes, 1);
}

TEST(SinkBaseTest, WhatAStoppedBatchDidNotSendIsUnavailableWithTheReason) {
  ScriptedSink sink;
  sink.send = [](SinkBase::Batch& batch) {
    batch.Settle(0, std::nullopt);
    batch.MarkSent(1);
    batch.Stop("the broker went away");
    batch.Stop("a later reason");
  };
  const std::vector<PublishOutcome> outcomes = sink.Publish(MakeBatch(3), In(milliseconds{100}));
  EXPECT_TRUE(outcomes[0].published());
  EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kOutcomeUnknown);
  EXPECT_EQ(outcomes[2].failure->kind, FailureKind::kUnavailable);
  EXPECT_EQ(outcomes[2].failure->reason, "not sent: the broker went away");
}

TEST(SinkBaseTest, APassedDeadlineSendsNothingButFinishes) {
  ScriptedSink sink;
  const std::vector<PublishOutcome> outcomes =
      sink.Publish(MakeBatch(2), SteadyClock::now() - milliseconds{1});
  EXPECT_EQ(sink.sends, 0);
  EXPECT_EQ(sink.finishes, 1);
  for (const PublishOutcome& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
    EXPECT_NE(outcome.failure->reason.find("deadline"), std::string::npos);
  }
}

TEST(SinkBaseTest, AFailedConnectWaitsItsBackoffBeforeTheNextAttempt) {
  ScriptedSink sink(Backoff{milliseconds{50}, milliseconds{80}});
  sink.connected = false;
  sink.connect_error = "connection refused";
  const std::vector<Envelope> batch = MakeBatch(2);
  std::vector<PublishOutcome> outcomes = sink.Publish(batch, In(milliseconds{100}));
  EXPECT_EQ(sink.connects, 1);
  EXPECT_EQ(sink.sends, 0);
  EXPECT_EQ(sink.finishes, 1);
  EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kUnavailable);
  EXPECT_EQ(outcomes[1].failure->reason, "not sent: connection refused");

  outcomes = sink.Publish(batch, In(milliseconds{100}));  // within the pause: no attempt
  EXPECT_EQ(sink.connects, 1);
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kUnavailable);
  EXPECT_NE(outcomes[0].failure->reason.find("connection refused (next attempt in "),
            std::string::npos)
      << outcomes[0].failure->reason;

  std::this_thread::sleep_for(milliseconds{60});
  sink.connect_error.reset();
  outcomes = sink.Publish(batch, In(milliseconds{100}));
  EXPECT_EQ(sink.connects, 2);
  EXPECT_EQ(sink.sends, 1);
}

TEST(SinkBaseTest, BackoffDoublesUpToItsCapAndStartsOverAfterASuccess) {
  Backoff backoff{milliseconds{100}, milliseconds{500}};
  EXPECT_EQ(backoff.Failed(), milliseconds{100});
  EXPECT_EQ(backoff.Failed(), milliseconds{200});
  EXPECT_EQ(backoff.Failed(), milliseconds{400});
  EXPECT_EQ(backoff.Failed(), milliseconds{500});
  EXPECT_EQ(backoff.Failed(), milliseconds{500});
  backoff.Succeeded();
  EXPECT_EQ(backoff.current(), milliseconds{0});
  EXPECT_EQ(backoff.Failed(), milliseconds{100});
}

TEST(SinkBaseTest, ShortenNeverCutsAUtf8Sequence) {
  EXPECT_EQ(Shorten("abc", 3), "abc");
  EXPECT_EQ(Shorten("abcd", 3), "abc...");
  EXPECT_EQ(Shorten("a\xc3\xa9z", 2), "a...");  // é is two bytes
}

}  // namespace
}  // namespace outbox
