// The sink contract suite (tests/sink/) against the real nats-server with JetStream. Each test
// bed has a stream of its own (memory storage) listening on one subject of its own, and a
// loopback TcpProxy in front of the server that produces the faults: the proxy stopped (server
// down: connections cut, new ones refused) and started again on the same port, its
// server-to-client direction held (lost acks, a silent server), its open connections frozen both
// ways while new ones go through (a silent peer). Unknown destination: a subject no
// stream listens on ("no responders"). Too large: over the max_message_bytes given to the sink.
// What arrived is read back by an ordered consumer on a direct connection (JetStreamClient), not
// through the sink: the id from the message_id header, stream key and seq from
// outbox-stream-key / outbox-stream-seq, as sink/nats.h documents them for consumers.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../sink/sink_contract.h"
#include "nats_test_support.h"
#include "outbox/core/wire_names.h"
#include "outbox/inbox/headers.h"
#include "outbox/sink/nats.h"
#include "support/tcp_proxy.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kMaxMessageBytes = std::size_t{64} * 1024;
// How long a read with nothing expected waits for stragglers.
constexpr milliseconds kIdle{300};
// The sink's ping interval (a frozen connection is given up after three without a PONG).
constexpr milliseconds kPingInterval{500};

class NatsTestBed final : public SinkTestBed {
 public:
  NatsTestBed()
      : servers_(nats::ParseUrl(NatsUrl())),
        stream_(UniqueName("contract")),
        subject_("outbox.contract." + stream_) {
    admin_.AddStream({.name = stream_, .subjects = {subject_}});
    StartProxy(0);
  }
  ~NatsTestBed() override { admin_.DeleteStream(stream_); }
  NatsTestBed(const NatsTestBed&) = delete;
  NatsTestBed& operator=(const NatsTestBed&) = delete;

  [[nodiscard]] std::string Topic() const override { return subject_; }

  std::unique_ptr<Sink> OpenSink() override {
    nats::SinkOptions options;
    options.url = "nats://127.0.0.1:" + std::to_string(port_);
    if (!servers_.user.empty()) {
      options.url = "nats://" + servers_.user + ":" + servers_.password +
                    "@127.0.0.1:" + std::to_string(port_);
    }
    options.token = servers_.token;
    options.max_message_bytes = kMaxMessageBytes;
    options.connect_timeout = milliseconds{2000};
    options.ping_interval = kPingInterval;
    return nats::OpenSink(std::move(options));
  }

  std::vector<ArrivedMessage> ReadBack(std::size_t expected, milliseconds limit) override {
    if (expected == 0) std::this_thread::sleep_for(kIdle);
    admin_.WaitForCount(stream_, expected, limit);
    std::vector<ArrivedMessage> arrived;
    for (const StoredMessage& stored : admin_.ReadAll(stream_, limit)) {
      arrived.push_back(
          ArrivedThroughInbox([&](const std::string& name) { return stored.Header(name); },
                              inbox::kNatsIdHeader, stored.payload));
    }
    return arrived;
  }

  void ServerDown() override { proxy_.reset(); }
  void ServerUp() override { StartProxy(port_); }
  [[nodiscard]] std::string UnknownTopic() override { return "outbox.nostream." + stream_; }
  [[nodiscard]] std::size_t TooLargePayloadBytes() override { return kMaxMessageBytes + 1; }
  void HoldReplies() override { SetHeld(true); }
  void ReleaseReplies() override { SetHeld(false); }
  void Freeze() override { proxy_->SetMode(TcpProxy::Mode::kFreeze); }
  void Thaw() override { SetHeld(held_); }
  // sink/nats.h: three ping intervals without a PONG (libnats' timer may fire a little late).
  [[nodiscard]] milliseconds SilentConnectionBound() override {
    return 3 * kPingInterval + milliseconds{500};
  }

 private:
  void StartProxy(int port) {
    const HostPort& upstream = servers_.addresses.front();
    proxy_ = std::make_unique<TcpProxy>(upstream.host, upstream.port, port);
    port_ = proxy_->port();
    if (held_) proxy_->SetMode(TcpProxy::Mode::kHoldReplies);
  }

  void SetHeld(bool held) {
    held_ = held;
    if (proxy_) proxy_->SetMode(held ? TcpProxy::Mode::kHoldReplies : TcpProxy::Mode::kForward);
  }

  nats::Servers servers_;
  JetStreamClient admin_;
  std::string stream_;
  std::string subject_;
  std::unique_ptr<TcpProxy> proxy_;  // null while the server is down
  int port_ = 0;
  bool held_ = false;
};

class NatsHarness final : public SinkHarness {
 public:
  [[nodiscard]] std::string Name() const override { return "nats"; }
  [[nodiscard]] std::optional<std::string> Lacks(SinkFault /*fault*/) const override {
    return std::nullopt;
  }
  std::unique_ptr<SinkTestBed> NewTestBed() override { return std::make_unique<NatsTestBed>(); }
};

NatsHarness harness;
INSTANTIATE_TEST_SUITE_P(Nats, SinkContractTest, ::testing::Values(&harness), SinkHarnessName);

}  // namespace
}  // namespace outbox::testing
