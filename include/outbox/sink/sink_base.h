#pragma once
// The base every sink is built on, in the manner of spdlog's base_sink: the base's final Publish
// owns the flow that every broker needs the same way, and a sink overrides the small steps that
// differ.
//
// The base owns:
//   - the deadline: a batch whose deadline has already passed is not sent at all;
//   - one outcome per message, in batch order: the sink settles messages on a Batch as verdicts
//     come (the first verdict on a message counts); a message left without one is, at the end,
//       sent (MarkSent) -> kOutcomeUnknown "sent, but no verdict by the deadline",
//       not sent, the batch stopped (Stop) -> kUnavailable "not sent: <why it stopped>",
//       anything else -> kOutcomeUnknown (a sink that lost track of a message never yields a
//       vector of the wrong size or order, nor a message reported published by mistake);
//   - connect with backoff: after a failed connect no new attempt is made before the pause
//     (Backoff: doubling from 100 ms to 5 s by default) is over; meanwhile a batch is stopped with
//     the last reason and "(next attempt in N ms)".
//
// A sink implements, in the order Publish calls them (on the thread that calls Publish):
//   Connected()   whether a usable connection is there; a sink checks its liveness here and drops
//                 a dead one, so that nothing is sent on it (its messages stay kUnavailable); why
//                 it was dropped is then no reason to stop, the next connect's failure is;
//   Connect()     makes one, within the deadline; returns why it could not;
//   Ready()       anything between connected and sending (RabbitMQ: its channel, a blocked
//                 connection); false stops the batch. Once ready, a reason to stop given before
//                 (a dead connection dropped and made anew) no longer holds;
//   Send()        sends in batch order (reading verdicts on the way where a window needs it);
//   Await()       waits for the verdicts until none is outstanding or the deadline passes;
//   Finish()      always last, even when nothing was sent: settles or forgets what is still in
//                 flight (a late confirm must not be taken for the next batch's); what time is
//                 left before the deadline may serve the sink's own chores (NATS: a check of the
//                 streams' duplicate windows).
// Classifying a broker's answer stays in each sink (classify.h next to it): the inputs differ.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/backoff.h"
#include "outbox/sink/sink.h"

namespace outbox {

// Helpers for the reasons the sinks give.
inline Failure MakeFailure(FailureKind kind, std::string reason) {
  return Failure{.kind = kind, .reason = std::move(reason)};
}
// `text` cut to its first `max` bytes (never inside a UTF-8 sequence) and "...", for a name or a
// broker's answer quoted in a reason.
std::string Shorten(std::string_view text, std::size_t max = 64);
// "250 ms" (whole milliseconds, rounded down).
std::string Millis(std::chrono::steady_clock::duration duration);

inline constexpr std::chrono::milliseconds kMinReconnectBackoff{100};
inline constexpr std::chrono::milliseconds kMaxReconnectBackoff{5000};

class SinkBase : public Sink {
 public:
  // A batch index that stands for no message (a command of the sink's own, a late answer).
  static constexpr std::size_t kNoIndex = std::numeric_limits<std::size_t>::max();

  // The outcomes of one Publish call, as they come.
  class Batch {
   public:
    explicit Batch(std::span<const Envelope> envelopes)
        : envelopes_(envelopes), verdicts_(envelopes.size()), states_(envelopes.size()) {}

    [[nodiscard]] std::span<const Envelope> envelopes() const { return envelopes_; }
    [[nodiscard]] std::size_t size() const { return envelopes_.size(); }
    [[nodiscard]] const Envelope& operator[](std::size_t index) const { return envelopes_[index]; }

    // The verdict on message `index` (no failure: published). The first one counts; kNoIndex is
    // ignored.
    void Settle(std::size_t index, std::optional<Failure> failure) {
      if (index >= size() || states_[index] == State::kSettled) return;
      states_[index] = State::kSettled;
      verdicts_[index] = std::move(failure);
    }
    void Fail(std::size_t index, FailureKind kind, std::string reason) {
      Settle(index, Failure{.kind = kind, .reason = std::move(reason)});
    }
    // Forgets the verdict on message `index`: it is sent again (Redis, after NOSCRIPT).
    void Unsettle(std::size_t index) {
      if (index >= size()) return;
      states_[index] = State::kNotSent;
      verdicts_[index].reset();
    }
    [[nodiscard]] bool settled(std::size_t index) const {
      return states_[index] == State::kSettled;
    }
    // The verdict on a settled message (no failure: published).
    [[nodiscard]] const std::optional<Failure>& verdict(std::size_t index) const {
      return verdicts_[index];
    }
    [[nodiscard]] bool published(std::size_t index) const {
      return settled(index) && !verdicts_[index];
    }
    // Message `index` was handed to the broker: without a verdict it ends kOutcomeUnknown.
    void MarkSent(std::size_t index) {
      if (index < size() && states_[index] == State::kNotSent) states_[index] = State::kSent;
    }
    [[nodiscard]] bool sent(std::size_t index) const { return states_[index] == State::kSent; }

    // Why the rest of the batch is not sent; the first reason counts.
    void Stop(std::string reason) {
      if (stop_reason_.empty()) stop_reason_ = std::move(reason);
    }
    // Sending goes on (a connection lost before the batch and made anew is no reason to stop).
    void Resume() { stop_reason_.clear(); }
    [[nodiscard]] bool stopped() const { return !stop_reason_.empty(); }
    [[nodiscard]] const std::string& stop_reason() const { return stop_reason_; }

   private:
    friend class SinkBase;
    enum class State : unsigned char { kNotSent, kSent, kSettled };

    std::vector<PublishOutcome> TakeOutcomes();

    std::span<const Envelope> envelopes_;
    std::vector<std::optional<Failure>> verdicts_;
    std::vector<State> states_;
    std::string stop_reason_;
  };

  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline deadline) final;

 protected:
  explicit SinkBase(Backoff reconnect = Backoff{kMinReconnectBackoff, kMaxReconnectBackoff})
      : reconnect_(reconnect) {}

  virtual bool Connected(Deadline deadline) = 0;
  virtual std::optional<std::string> Connect(Deadline deadline) = 0;
  virtual bool Ready(Batch& /*batch*/, Deadline /*deadline*/) { return true; }
  virtual void Send(Batch& batch, Deadline deadline) = 0;
  virtual void Await(Batch& /*batch*/, Deadline /*deadline*/) {}
  virtual void Finish(Batch& /*batch*/, Deadline /*deadline*/) {}

  // The batch of the Publish call in progress; null between calls (a callback of the broker's
  // library that runs then has nothing to settle).
  [[nodiscard]] Batch* batch() const { return batch_; }

 private:
  bool ConnectWithBackoff(Batch& batch, Deadline deadline);

  Backoff reconnect_;
  Deadline next_connect_at_{};
  std::string last_connect_error_;
  Batch* batch_ = nullptr;
};

}  // namespace outbox
