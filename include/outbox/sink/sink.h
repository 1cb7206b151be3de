#pragma once
// The Sink contract: a broker client that publishes batches and reports, per message, what the
// broker confirmed. Implementations live in src/sink/<broker>/ and are created by factories that
// return std::unique_ptr<Sink>; no broker header appears here.
//
// Threading: one thread calls Publish at a time. A sink that needs its own I/O thread owns it.
//
// Errors: broker failures are outcomes, never exceptions. A sink that cannot reach its broker
// returns kUnavailable for the whole batch (and reconnects on a later call, with a backoff).
// Exceptions are thrown only for misuse and for configuration errors at construction.
//
// The sinks of this project are built on SinkBase (sink_base.h), which owns the deadline, the one
// outcome per message and the reconnect backoff; this interface is what the relay calls.

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/failure.h"
#include "outbox/core/message.h"
#include "outbox/core/secrets.h"

namespace outbox {

// The broker's verdict on one message. No failure means the broker confirmed it durably
// (publisher confirm, acks=all, JetStream ack, XADD reply).
struct PublishOutcome {
  MessageId id;
  std::optional<Failure> failure;

  [[nodiscard]] bool published() const { return !failure.has_value(); }
};

// `outcomes` with each failure's reason passed through RedactKnownSecrets (core/secrets.h): what a
// broker or an endpoint answered may quote a configured secret. The relays pass every sink's
// outcomes through it before anything stores (last_error), counts or logs them.
inline std::vector<PublishOutcome> RedactReasons(std::vector<PublishOutcome> outcomes) {
  for (PublishOutcome& outcome : outcomes) {
    if (outcome.failure) outcome.failure->reason = RedactKnownSecrets(outcome.failure->reason);
  }
  return outcomes;
}

class Sink {
 public:
  virtual ~Sink() = default;

  // A short name for logs and metrics, e.g. "rabbitmq".
  [[nodiscard]] virtual std::string_view Name() const = 0;

  // Publishes `batch` in order, keeping many messages in flight (confirms are windowed, never one
  // round trip per message), and waits for the broker's verdict on each at most until `deadline`.
  // Returns exactly one outcome per message, in batch order. A message without a verdict by the
  // deadline is kOutcomeUnknown. Messages of one stream must reach the broker in batch order.
  virtual std::vector<PublishOutcome> Publish(std::span<const Envelope> batch,
                                              Deadline deadline) = 0;

  // Flushes and closes the connection; reports nothing and never throws. Publish may reconnect.
  virtual void Close() = 0;
};

}  // namespace outbox
