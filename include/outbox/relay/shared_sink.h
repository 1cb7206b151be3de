#pragma once
// One sink used by several relays of one process, one Publish at a time (the Sink contract's
// threading rule). outboxd in WAL mode runs two relays (the WAL relay, and the table relay for
// what it parks and for topics in table mode): each gets a SharedSink of every target over the
// same sink, so a target has one connection and one memory of what its broker asked, e.g. an HTTP
// endpoint's Retry-After, which two instances would each keep to themselves (the other one sent
// too early).

#include <chrono>
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
  // What the users of one sink share: the sink and whose turn it is.
  struct Core {
    explicit Core(std::unique_ptr<Sink> shared) : sink(std::move(shared)) {}
    std::timed_mutex turn;
    std::unique_ptr<Sink> sink;
  };

  explicit SharedSink(std::shared_ptr<Core> core);

  [[nodiscard]] std::string_view Name() const override;
  // Waits for its turn until `deadline`; a batch whose turn did not come by then is reported
  // kUnavailable, message by message ("not sent: …"), which spends no attempt.
  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline deadline) override;
  void Close() override;

 private:
  std::shared_ptr<Core> core_;
};

// `copies` sink maps over the same sinks: every map has each of `sinks`' targets, as a SharedSink
// (with one copy, `sinks` themselves).
std::vector<SinkMap> ShareSinks(SinkMap sinks, std::size_t copies);

}  // namespace outbox
