// The sink contract suite (tests/sink/) against librdkafka's mock cluster. Each test bed has a
// cluster of its own (3 brokers) with one topic of one partition (so that the topic's order is
// the order of publishing), and a KafkaProxy in front of every broker, through which the sink
// sees the cluster; it produces the faults on the sink's connections only: the proxy stopped
// (every broker cut off and refusing connections: the cluster is down) and started again on the
// same ports, its broker-to-client direction held (lost confirmations, a silent cluster), its
// open connections frozen both ways while new ones go through (a silent peer). An
// unknown destination is a topic the cluster answers UNKNOWN_TOPIC_OR_PART for, and too large is
// over the sink's max_message_bytes. What arrived is read back by an independent librdkafka
// consumer connected to the brokers directly (kafka_test_support.h), not through the sink.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "../sink/sink_contract.h"
#include "kafka_proxy.h"
#include "kafka_test_support.h"
#include "outbox/core/wire_names.h"
#include "outbox/inbox/headers.h"
#include "outbox/sink/kafka.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kMaxMessageBytes = 64 * 1024;
constexpr int kBrokers = 3;
// librdkafka's socket.timeout.ms: a request in flight that long without an answer makes it drop
// the connection (a frozen one is given up). request.timeout.ms does not: with it at 2 s and
// socket.timeout.ms at librdkafka's 60 s, a frozen connection was still used after 21 s.
constexpr milliseconds kSocketTimeout{2000};

class KafkaTestBed final : public SinkTestBed {
 public:
  KafkaTestBed()
      : cluster_(kBrokers), proxy_(cluster_.bootstraps()), reader_(cluster_.bootstraps()) {
    cluster_.CreateTopic(kTopic, 1);
  }
  ~KafkaTestBed() override {
    if (const std::string problem = proxy_.problem(); !problem.empty()) ADD_FAILURE() << problem;
  }

  [[nodiscard]] std::string Topic() const override { return kTopic; }

  std::unique_ptr<Sink> OpenSink() override {
    kafka::SinkOptions options;
    options.brokers = proxy_.bootstraps();
    options.max_message_bytes = kMaxMessageBytes;
    options.properties = {
        {"log_level", "2"},  // the tests cut the sink off on purpose
        // An unknown topic is reported within a second (the sink's default is 5 s).
        {"topic.metadata.propagation.max.ms", "1000"},
        {"socket.timeout.ms", std::to_string(kSocketTimeout.count())},
    };
    return kafka::OpenSink(std::move(options));
  }

  std::vector<ArrivedMessage> ReadBack(std::size_t expected, milliseconds limit) override {
    // What the topic holds now, and at least `expected`: the consumer stops waiting for more
    // once it has them (then reads on until quiet, so that duplicates are seen too).
    const std::size_t stored = reader_.Stored(kTopic);
    std::vector<ArrivedMessage> arrived;
    for (const Record& record : reader_.ReadAll(kTopic, std::max(expected, stored), limit)) {
      arrived.push_back(Arrived(record));
    }
    return arrived;
  }

  void ServerDown() override { proxy_.Stop(); }
  void ServerUp() override { proxy_.Start(); }
  [[nodiscard]] std::string UnknownTopic() override {
    cluster_.MakeTopicUnknown(kUnknownTopic);
    return kUnknownTopic;
  }
  [[nodiscard]] std::size_t TooLargePayloadBytes() override { return kMaxMessageBytes + 1; }
  void HoldReplies() override { proxy_.Hold(true); }
  void ReleaseReplies() override { proxy_.Hold(false); }
  void Freeze() override { proxy_.Freeze(true); }
  void Thaw() override { proxy_.Freeze(false); }
  // sink/kafka.h: librdkafka drops a connection whose request timed out (it looks once a
  // second), then reconnects.
  [[nodiscard]] milliseconds SilentConnectionBound() override {
    return kSocketTimeout + milliseconds{1500};
  }

 private:
  static constexpr const char* kTopic = "contract";
  static constexpr const char* kUnknownTopic = "contract-no-such-topic";

  // Where the Kafka sink documents them (sink/kafka.h): the id in the message_id header, the
  // stream key as the record key (and in outbox-stream-key), the seq in outbox-stream-seq.
  // Read as an inbox consumer reads it (ArrivedThroughInbox).
  static ArrivedMessage Arrived(const Record& record) {
    ArrivedMessage message =
        ArrivedThroughInbox([&](const std::string& name) { return record.Header(name); },
                            inbox::kKafkaIdHeader, record.value);
    EXPECT_EQ(message.stream_key, record.key)
        << message.id << ": the record key and outbox-stream-key differ";
    return message;
  }

  MockCluster cluster_;
  KafkaProxy proxy_;
  Consumer reader_;
};

class KafkaHarness final : public SinkHarness {
 public:
  std::unique_ptr<SinkTestBed> NewTestBed() override { return std::make_unique<KafkaTestBed>(); }
  // Every fault: the proxy cuts and holds, the cluster refuses a topic, the sink has a limit.
  [[nodiscard]] std::optional<std::string> Lacks(SinkFault /*fault*/) const override {
    return std::nullopt;
  }
  [[nodiscard]] std::string Name() const override { return "kafka"; }
};

KafkaHarness harness;
INSTANTIATE_TEST_SUITE_P(Kafka, SinkContractTest, ::testing::Values(&harness), SinkHarnessName);

}  // namespace
}  // namespace outbox::testing
