// The sink contract suite (tests/sink/) against RabbitMQ's AMQP 1.0 plugin (rabbitmq_amqp1_0,
// enabled by scripts/services). Each test bed has a fanout exchange and a queue bound to it, both
// its own (declared over AMQP 0-9-1: the plugin of RabbitMQ 3.10 declares no exchange); the sink
// publishes to "/exchange/{topic}/k", so that an unknown topic is an exchange that does not exist
// (the broker refuses the link: amqp:not-found). A loopback TcpProxy in front of the broker
// produces the faults: stopped (server down) and started again on the same port, its
// broker-to-client direction held (lost dispositions, a silent server), its open connections
// frozen both ways while new ones go through (a silent peer; the sink's idle_timeout is 2 s to
// find it soon). What arrived is read back by a plain Proton receiver of its own on a direct
// connection (amqp10_test_support.h), not through the sink.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "../sink/sink_contract.h"
#include "amqp10_test_support.h"
#include "outbox/sink/amqp10.h"
#include "rabbit_test_support.h"
#include "support/proxied_server.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kMaxMessageBytes = 64 * 1024;
// How long a read waits for one more message before it takes the queue as drained.
constexpr milliseconds kIdle{200};
// The sink's idle timeout (a frozen connection is given up after it, plus Proton's timer tick).
constexpr milliseconds kIdleTimeout{2000};

class Amqp10TestBed final : public SinkTestBed {
 public:
  Amqp10TestBed()
      : endpoint_(amqp10::ParseUrl(Amqp10Url())),
        exchange_(UniqueName("amqp10-x")),
        queue_(UniqueName("amqp10-q")) {
    admin_.DeclareQueue(queue_);
    admin_.DeclareExchange(exchange_, "fanout");
    admin_.Bind(queue_, exchange_, "");
  }

  [[nodiscard]] std::string Topic() const override { return exchange_; }

  std::unique_ptr<Sink> OpenSink() override {
    amqp10::SinkOptions options;
    options.url = "amqp://" + endpoint_.user + ":" + endpoint_.password +
                  "@127.0.0.1:" + std::to_string(server_.port());
    options.address = "/exchange/{topic}/k";
    options.max_message_bytes = kMaxMessageBytes;
    options.connect_timeout = milliseconds{2000};
    options.idle_timeout = kIdleTimeout;
    return amqp10::OpenSink(std::move(options));
  }

  std::vector<ArrivedMessage> ReadBack(std::size_t expected, milliseconds limit) override {
    const std::size_t more = expected > arrived_.size() ? expected - arrived_.size() : 0;
    for (Amqp10Message& message :
         ReceiveAmqp10(Amqp10Url(), "/amq/queue/" + queue_, more, limit, kIdle)) {
      ArrivedMessage arrived{.id = message.id, .payload = std::move(message.body)};
      if (const auto it = message.properties.find("outbox-stream-key");
          it != message.properties.end()) {
        arrived.stream_key = it->second;
      }
      if (const auto it = message.properties.find("outbox-stream-seq");
          it != message.properties.end()) {
        arrived.stream_seq = std::stoll(it->second);
      }
      arrived_.push_back(std::move(arrived));
    }
    return arrived_;
  }

  void ServerDown() override { server_.Down(); }
  void ServerUp() override { server_.Up(); }
  [[nodiscard]] std::string UnknownTopic() override { return UniqueName("no-such-exchange"); }
  [[nodiscard]] std::size_t TooLargePayloadBytes() override { return kMaxMessageBytes + 1; }
  void HoldReplies() override { server_.Hold(true); }
  void ReleaseReplies() override { server_.Hold(false); }
  void Freeze() override { server_.Freeze(); }
  void Thaw() override { server_.Thaw(); }
  // sink/amqp10.h: idle_timeout without a frame from the broker; Proton checks it on its timer,
  // which may fire up to another idle_timeout later.
  [[nodiscard]] milliseconds SilentConnectionBound() override { return 2 * kIdleTimeout; }

 private:
  amqp10::Endpoint endpoint_;
  Admin admin_;
  std::string exchange_;
  std::string queue_;
  ProxiedServer server_{endpoint_.host, endpoint_.port};
  std::vector<ArrivedMessage> arrived_;
};

class Amqp10Harness final : public SinkHarness {
 public:
  [[nodiscard]] std::string Name() const override { return "amqp10"; }
  [[nodiscard]] std::optional<std::string> Lacks(SinkFault /*fault*/) const override {
    return std::nullopt;
  }
  std::unique_ptr<SinkTestBed> NewTestBed() override { return std::make_unique<Amqp10TestBed>(); }
};

Amqp10Harness harness;
INSTANTIATE_TEST_SUITE_P(Amqp10, SinkContractTest, ::testing::Values(&harness), SinkHarnessName);

}  // namespace
}  // namespace outbox::testing
