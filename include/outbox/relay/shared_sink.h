#pragma once
// One sink used by several relays of one process, one Publish at a time (the Sink contract's
// threading rule). outboxd in WAL mode runs two relays (the WAL relay, and the table relay for
// what it parks and for topics in table mode): each gets a SharedSink of every target over the
// same sink, so a target has one connection and one memory of what its broker asked, e.g. an HTTP
// endpoint's Retry-After, which two instances would each keep to themselves (the other one sent
// too early).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "outbox/relay/relay.h"
#include "outbox/sink/sink.h"

namespace outbox {

class SharedSink final : public Sink {
 public:
  // What the users of one sink share: the sink, and whose turn it is. Turns are given in the
  // order they were asked for, so a relay with batch after batch to publish cannot keep the other
  // one waiting past its deadline.
  class Core {
   public:
    explicit Core(std::unique_ptr<Sink> shared) : sink(std::move(shared)) {}
    // Waits for this caller's turn until `deadline`; false (and out of the line) if it did not
    // come. Give ends the turn.
    bool Take(Deadline deadline);
    void Give();
    // Callers in line for a turn (for tests).
    [[nodiscard]] std::size_t waiting() const;

    const std::unique_ptr<Sink> sink;

   private:
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    bool busy_ = false;
    std::uint64_t next_ticket_ = 0;
    std::deque<std::uint64_t> queue_;  // tickets in line, first come first
  };

  explicit SharedSink(std::shared_ptr<Core> core);

  [[nodiscard]] std::string_view Name() const override;
  // Waits for its turn until `deadline`; a batch whose turn did not come by then is reported
  // kUnavailable, message by message ("not sent: …"), which spends no attempt.
  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline deadline) override;
  void Close() override;

 private:
  // Gives the turn back however Publish ends.
  struct Turn {
    explicit Turn(Core& taken) : core(taken) {}
    ~Turn() { core.Give(); }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    Core& core;
  };

  std::shared_ptr<Core> core_;
};

// `copies` sink maps over the same sinks: every map has each of `sinks`' targets, as a SharedSink
// (with one copy, `sinks` themselves).
std::vector<SinkMap> ShareSinks(SinkMap sinks, std::size_t copies);

}  // namespace outbox
