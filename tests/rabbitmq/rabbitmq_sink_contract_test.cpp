// The sink contract suite (tests/sink/) against the real RabbitMQ. Each test bed has a queue of
// its own, reached through the default exchange (routing key = topic = queue name), and a
// loopback TcpProxy in front of the broker that produces the faults: the proxy stopped (server
// down: connections cut, new ones refused) and started again on the same port, its broker-to-
// client direction held (lost confirmations, a silent server), its open connections frozen both
// ways while new ones go through (a silent peer; the sink's heartbeat is 1 s to find it soon). What
// arrived is read back by a plain rabbitmq-c consumer on a direct connection (Admin), not through
// the sink.
#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../sink/sink_contract.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/rabbitmq.h"
#include "rabbit_test_support.h"
#include "support/proxied_server.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kMaxMessageBytes = 64 * 1024;
// How long a read waits for one more message before it takes the queue as drained.
constexpr milliseconds kIdle{200};
// The sink's heartbeat (a frozen connection is given up after two without a frame).
constexpr std::chrono::seconds kHeartbeat{1};

class RabbitTestBed final : public SinkTestBed {
 public:
  RabbitTestBed() : endpoint_(rabbitmq::ParseUrl(AmqpUrl())), queue_(UniqueName("contract")) {
    admin_.DeclareQueue(queue_);
  }

  [[nodiscard]] std::string Topic() const override { return queue_; }

  std::unique_ptr<Sink> OpenSink() override {
    rabbitmq::SinkOptions options;
    options.url = "amqp://" + endpoint_.user + ":" + endpoint_.password +
                  "@127.0.0.1:" + std::to_string(server_.port()) + "/";
    if (endpoint_.vhost != "/") options.url += endpoint_.vhost;
    options.max_message_bytes = kMaxMessageBytes;
    options.connect_timeout = milliseconds{2000};
    options.heartbeat = kHeartbeat;
    return rabbitmq::OpenSink(std::move(options));
  }

  std::vector<ArrivedMessage> ReadBack(std::size_t expected, milliseconds limit) override {
    const auto until = std::chrono::steady_clock::now() + limit;
    do {
      for (Received& message :
           admin_.Consume(queue_, std::numeric_limits<std::size_t>::max(), kIdle)) {
        arrived_.push_back(Arrived(message));
      }
    } while (arrived_.size() < expected && std::chrono::steady_clock::now() < until);
    return arrived_;
  }

  void ServerDown() override { server_.Down(); }
  void ServerUp() override { server_.Up(); }
  [[nodiscard]] std::string UnknownTopic() override { return UniqueName("no-such-queue"); }
  [[nodiscard]] std::size_t TooLargePayloadBytes() override { return kMaxMessageBytes + 1; }
  void HoldReplies() override { server_.Hold(true); }
  void ReleaseReplies() override { server_.Hold(false); }
  void Freeze() override { server_.Freeze(); }
  void Thaw() override { server_.Thaw(); }
  // sink/rabbitmq.h: two heartbeats without a frame from the broker.
  [[nodiscard]] milliseconds SilentConnectionBound() override { return 2 * kHeartbeat; }

 private:
  static ArrivedMessage Arrived(const Received& received) {
    ArrivedMessage message{.id = received.message_id, .payload = received.body};
    if (const auto it = received.headers.find(std::string{wire::kStreamKeyHeader});
        it != received.headers.end()) {
      message.stream_key = it->second;
    }
    if (const auto it = received.headers.find(std::string{wire::kStreamSeqHeader});
        it != received.headers.end()) {
      message.stream_seq = std::stoll(it->second);
    }
    return message;
  }

  rabbitmq::Endpoint endpoint_;
  Admin admin_;
  std::string queue_;
  ProxiedServer server_{endpoint_.host, endpoint_.port};
  std::vector<ArrivedMessage> arrived_;
};

class RabbitHarness final : public SinkHarness {
 public:
  [[nodiscard]] std::string Name() const override { return "rabbitmq"; }
  [[nodiscard]] std::optional<std::string> Lacks(SinkFault /*fault*/) const override {
    return std::nullopt;
  }
  std::unique_ptr<SinkTestBed> NewTestBed() override { return std::make_unique<RabbitTestBed>(); }
};

RabbitHarness harness;
INSTANTIATE_TEST_SUITE_P(RabbitMQ, SinkContractTest, ::testing::Values(&harness), SinkHarnessName);

}  // namespace
}  // namespace outbox::testing
