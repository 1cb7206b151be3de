#pragma once
// The Sink contract (include/outbox/sink/sink.h, core/failure.h) as tests, run by every sink
// against its real server, as tests/store/ is run by every store. A sink's test binary provides
// a SinkHarness, links the suite (CMake target outbox_sink_contract) and instantiates it:
//
//   KafkaHarness harness;
//   INSTANTIATE_TEST_SUITE_P(Kafka, SinkContractTest, ::testing::Values(&harness),
//                            SinkHarnessName);
//
// Each test asks the harness for a SinkTestBed of its own: a destination nobody else uses on a
// working server, a way to open sinks that publish there, an independent reader of what arrived,
// and the faults the sink's server can be put through. Every fault must be real (a server that
// does not answer, a connection that is cut, a destination that does not exist), never a mock
// of the sink's client library. A fault the harness cannot produce is declared by
// SinkHarness::Lacks, and the tests that need it are skipped with that reason.
//
// What the suite checks, for every sink: a published message is at the destination, payload
// bytes equal (including non-UTF-8 bytes); the message id reaches the consumer; order within a
// stream with many messages in flight, in one batch and over several; exactly one outcome per
// message, in batch order; Close() and Publish again. With the faults: server down -> every
// message kUnavailable and none arrives; the server comes back -> the next Publish reconnects;
// unknown destination -> kRejected for that message only (and, for a sink that holds a stream
// after a failure, the rest of its stream not sent); too large -> kPermanent for that message
// only; lost confirmation -> kOutcomeUnknown, then published again; a silent server ->
// Publish returns by its deadline; Close() with publishes unconfirmed; the connections frozen
// (open, silent both ways, while new ones work) -> Publish returns by its deadline, nothing
// is reported published that did not arrive, the sink gives the frozen connection up and
// publishes over a new one within its documented bound, and Close() and destruction return.
//
// Writing a harness (see tests/rabbitmq/rabbitmq_sink_contract_test.cpp,
// tests/kafka/kafka_sink_contract_test.cpp and tests/file/file_sink_contract_test.cpp):
//   - Which faults: a sink with a server must produce kServerDown, kLostConfirmation and kFreeze
//     (every server can go away, every reply can be lost, every route can drop a connection
//     without a word), and kTooLarge (every broker has a size
//     limit; give the sink a small one); kUnknownDestination wherever the server refuses a
//     destination it does not know (a server that creates destinations on first use may lack
//     it, and says so). Lacks is only for what the sink cannot have, never for what is hard to
//     set up; the file sink, which has no server, lacks all four.
//   - The reader must not share the sink's code path: a plain client of the server (its own
//     consumer connection and decoding), so that a sink that reports "published" for what never
//     arrived, or that mangles ids, keys or bytes, fails. It finds the id, stream key and stream
//     seq where the sink documents them for consumers (RabbitMQ: the message_id property and the
//     outbox-stream-key / outbox-stream-seq headers, core/wire_names.h).
//   - A test bed is made per test: keep it cheap (a queue or topic of its own, a proxy), keep
//     every wait bounded, and make its destructor work in any fault state (server down, replies
//     held). Sinks the test opened are destroyed before it.
//
// Payloads the suite sends, and what ReadBack must give back: compact JSON with one key (e.g.
// {"n":7}) under content type application/json, and arbitrary bytes (UTF-8 text, invalid UTF-8,
// NUL bytes, empty) under other content types. A sink whose format embeds JSON payloads as JSON
// (the file sink) may return them re-serialized compactly: they compare equal.

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "outbox/sink/sink.h"

namespace outbox::testing {

// The faults a harness may be able to produce (each optional; see SinkHarness::Lacks).
enum class SinkFault : std::uint8_t {
  // ServerDown() / ServerUp(): the server becomes unreachable (connections cut, new ones
  // refused or never answered), then reachable again at the same address. Also used for "the
  // server comes back" (reconnect) and to cut a connection with publishes unconfirmed.
  kServerDown,
  // UnknownTopic(): a topic that the sink maps to a destination that does not exist, refused by
  // the server message by message (RabbitMQ: unroutable with mandatory; Kafka: an unknown topic
  // with auto-creation off).
  kUnknownDestination,
  // TooLargePayloadBytes(): a payload size the sink opened by OpenSink must refuse as too large
  // (over its max_message_bytes or the server's limit).
  kTooLarge,
  // HoldReplies() / ReleaseReplies(): the server keeps receiving and storing what the sink
  // sends, but nothing it sends back reaches the sink (confirmations, and the handshake of a new
  // connection) until released; what was held is then delivered (RabbitMQ: a TCP proxy that
  // stops forwarding the broker's bytes). Used for lost confirmations, deadlines and Close().
  kLostConfirmation,
  // Freeze() / Thaw(): the connections the sink holds when it is called stop answering in both
  // directions and stay open (nothing read, nothing closed: a broker failed over behind a
  // virtual IP, a dropped route, a frozen VM), while new connections go through normally.
  // SilentConnectionBound() is the sink's documented bound, for the options OpenSink gives it.
  kFreeze,
};

// A message as the independent reader found it at the destination.
struct ArrivedMessage {
  std::string id;  // the outbox message id as the consumer sees it (MessageId::ToString() form)
  std::optional<std::string> stream_key;
  std::optional<std::int64_t> stream_seq;
  std::string payload;  // the bytes (see above for JSON payloads)
};

// The message as an inbox consumer reads it from text headers (inbox::FromHeaders: Kafka, NATS,
// Redis, webhooks), so that every message a contract test reads back also checks the inbox's
// adapter against what the sink really sent; one the inbox cannot read is a test failure.
// `header` returns a header's (or field's) value, nullopt when there is none.
ArrivedMessage ArrivedThroughInbox(
    const std::function<std::optional<std::string>(const std::string& name)>& header,
    std::string_view id_name, std::string payload);

// One test's destination, sinks and faults. Destroying it removes what it made on the server.
// The fault methods are called only when the harness does not lack the fault; their default
// implementations throw std::logic_error.
class SinkTestBed {
 public:
  SinkTestBed() = default;
  virtual ~SinkTestBed() = default;
  SinkTestBed(const SinkTestBed&) = delete;
  SinkTestBed& operator=(const SinkTestBed&) = delete;

  // The topic that envelopes must carry to reach this test bed's destination (unique per test).
  [[nodiscard]] virtual std::string Topic() const = 0;
  // A new sink publishing to the destination, through the path on which the faults act. It may
  // be called several times (and while the server is down, when the sink connects lazily).
  virtual std::unique_ptr<Sink> OpenSink() = 0;
  // Everything that arrived at the destination since the test bed was made, read by a consumer
  // that is not the sink's code (RabbitMQ: a plain rabbitmq-c consumer; the file sink: the file
  // parsed with nlohmann-json), in the destination's order: one stream's messages in the order
  // they are stored (with several partitions, partitions may be concatenated). Waits until at
  // least `expected` messages are there or `limit` has passed, then returns what is there
  // (`expected` 0: what is there now, after a short wait for stragglers). Throws when the
  // destination cannot be read; unreadable messages (a line that does not parse) are a failure.
  virtual std::vector<ArrivedMessage> ReadBack(std::size_t expected,
                                               std::chrono::milliseconds limit) = 0;

  // SinkFault::kServerDown. ServerDown returns once existing connections are cut and new ones
  // fail; ServerUp once the server accepts connections again.
  virtual void ServerDown();
  virtual void ServerUp();
  // SinkFault::kUnknownDestination.
  [[nodiscard]] virtual std::string UnknownTopic();
  // SinkFault::kTooLarge. The suite's other payloads are at most 1 KiB.
  [[nodiscard]] virtual std::size_t TooLargePayloadBytes();
  // SinkFault::kLostConfirmation.
  virtual void HoldReplies();
  virtual void ReleaseReplies();
  // SinkFault::kFreeze. Freeze returns once the connections open now are frozen; Thaw lets
  // them (those still open) forward again.
  virtual void Freeze();
  virtual void Thaw();
  // How long after its connection froze the sink opened by OpenSink may go on using it: a
  // Publish that starts later sends over a new connection (the bound the sink documents for a
  // silent peer, e.g. two heartbeats, computed for the options OpenSink sets).
  [[nodiscard]] virtual std::chrono::milliseconds SilentConnectionBound();
};

class SinkHarness {
 public:
  virtual ~SinkHarness() = default;
  // The sink's name, ending every test's name (e.g. "rabbitmq").
  [[nodiscard]] virtual std::string Name() const = 0;
  // Why this sink cannot produce `fault` (the skip message, e.g. "the file sink has no
  // server"), or nullopt when it can.
  [[nodiscard]] virtual std::optional<std::string> Lacks(SinkFault fault) const = 0;
  // A test bed for one test, on a working server.
  virtual std::unique_ptr<SinkTestBed> NewTestBed() = 0;
  // True when the sink sends a stream's next message only once the one before it was accepted
  // (the HTTP sink: an endpoint may refuse any request, and a later one of the stream must not be
  // accepted first). A message that failed in a way that is tried again (anything but
  // kPermanent) then holds the rest of its stream in the batch: each of them is reported
  // kOutcomeUnknown (not sent, no attempt spent) unless it failed on its own before sending, and
  // none of them arrives. False: every message is sent whatever happened to the ones before it.
  [[nodiscard]] virtual bool HoldsStreamAfterFailure() const { return false; }
};

// Test names end with the harness's name, and CTest's with "GetParam() = <name>" (not an address
// that changes from build to build).
inline std::string SinkHarnessName(const ::testing::TestParamInfo<SinkHarness*>& info) {
  return info.param->Name();
}
inline void PrintTo(SinkHarness* harness, std::ostream* out) { *out << harness->Name(); }

class SinkContractTest : public ::testing::TestWithParam<SinkHarness*> {
 protected:
  void SetUp() override { bed_ = GetParam()->NewTestBed(); }
  void TearDown() override { bed_.reset(); }

  std::unique_ptr<SinkTestBed> bed_;
};

}  // namespace outbox::testing
