// The sink contract suite (tests/sink/) against the real Redis (the shared test server). Each
// test bed has a stream key of its own (the topic; the sink's stream template is "{topic}") and a
// dedup prefix of its own, and a loopback TcpProxy in front of the server that produces the
// faults: the proxy stopped (server down: connections cut, new ones refused) and started again on
// the same port, its server-to-client direction held (lost replies, a silent server), its open
// connections frozen both ways while new ones go through (a silent peer). What
// arrived is read back by a plain hiredis client on a direct connection (XRANGE), not through
// the sink, with the id, stream key and stream seq taken from the entry's fields as sink/redis.h
// documents them.
//
// Unknown destination: Redis creates a stream on its first XADD, so no stream key is unknown.
// The fault that is real, and that the server refuses message by message as the suite needs, is
// a destination that exists as something else: UnknownTopic() is a key holding a string, and
// XADD to it gets WRONGTYPE (kRejected). Too large: max_message_bytes 64 KiB.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../sink/sink_contract.h"
#include "outbox/core/wire_names.h"
#include "outbox/inbox/headers.h"
#include "outbox/sink/redis.h"
#include "redis_test_support.h"
#include "support/tcp_proxy.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kMaxMessageBytes = std::size_t{64} * 1024;
// How long ReadBack(0, ...) waits for stragglers.
constexpr milliseconds kSettle{200};

class RedisTestBed final : public SinkTestBed {
 public:
  RedisTestBed()
      : address_(RedisAddress()),
        stream_(UniqueKey("contract")),
        dedup_prefix_(stream_ + ":dedup:") {
    StartProxy(0);
  }
  ~RedisTestBed() override {
    try {
      admin_.Delete(stream_);
      admin_.DeletePrefix(dedup_prefix_);
      for (const std::string& key : wrong_type_keys_) admin_.Delete(key);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "cleaning up " << stream_ << ": " << error.what();
    }
  }
  RedisTestBed(const RedisTestBed&) = delete;
  RedisTestBed& operator=(const RedisTestBed&) = delete;

  [[nodiscard]] std::string Topic() const override { return stream_; }

  std::unique_ptr<Sink> OpenSink() override {
    redis::SinkOptions options;
    options.url = "redis://127.0.0.1:" + std::to_string(port_);
    options.dedup_prefix = dedup_prefix_;
    options.dedup_window = std::chrono::minutes{10};
    options.max_message_bytes = kMaxMessageBytes;
    options.connect_timeout = milliseconds{2000};
    return redis::OpenSink(std::move(options));
  }

  std::vector<ArrivedMessage> ReadBack(std::size_t expected, milliseconds limit) override {
    const auto until = std::chrono::steady_clock::now() + limit;
    if (expected == 0) std::this_thread::sleep_for(kSettle);
    std::vector<ArrivedMessage> arrived;
    for (;;) {
      arrived.clear();
      for (const StreamEntry& entry : admin_.ReadStream(stream_)) arrived.push_back(Arrived(entry));
      if (arrived.size() >= expected || std::chrono::steady_clock::now() >= until) return arrived;
      std::this_thread::sleep_for(milliseconds{20});
    }
  }

  void ServerDown() override { proxy_.reset(); }
  void ServerUp() override { StartProxy(port_); }
  [[nodiscard]] std::string UnknownTopic() override {
    std::string key = UniqueKey("not-a-stream");
    admin_.Ok({"SET", key, "a string, not a stream"});
    wrong_type_keys_.push_back(key);
    return key;
  }
  [[nodiscard]] std::size_t TooLargePayloadBytes() override { return kMaxMessageBytes + 1; }
  void HoldReplies() override { SetHeld(true); }
  void ReleaseReplies() override { SetHeld(false); }
  void Freeze() override { proxy_->SetMode(TcpProxy::Mode::kFreeze); }
  void Thaw() override { SetHeld(held_); }
  // sink/redis.h: a Publish that ends with replies outstanding drops the connection, so the
  // next one opens a new connection; none is used after its first unanswered deadline.
  [[nodiscard]] milliseconds SilentConnectionBound() override { return milliseconds{0}; }

 private:
  // An entry as a consumer reads it; a missing id is a failure of the sink.
  static ArrivedMessage Arrived(const StreamEntry& entry) {
    const auto id = entry.Field(std::string{redis::kIdField});
    const auto payload = entry.Field(std::string{redis::kPayloadField});
    if (!id || !payload) {
      throw std::runtime_error("stream entry " + entry.entry_id + " without id or payload");
    }
    return ArrivedThroughInbox([&](const std::string& name) { return entry.Field(name); },
                               inbox::kRedisIdField, *payload);
  }

  void StartProxy(int port) {
    proxy_ = std::make_unique<TcpProxy>(address_.first, address_.second, port);
    port_ = proxy_->port();
    if (held_) proxy_->SetMode(TcpProxy::Mode::kHoldReplies);
  }

  void SetHeld(bool held) {
    held_ = held;
    if (proxy_) proxy_->SetMode(held ? TcpProxy::Mode::kHoldReplies : TcpProxy::Mode::kForward);
  }

  std::pair<std::string, int> address_;
  RedisClient admin_;  // direct, not through the proxy
  std::string stream_;
  std::string dedup_prefix_;
  std::vector<std::string> wrong_type_keys_;
  std::unique_ptr<TcpProxy> proxy_;  // null while the server is down
  int port_ = 0;
  bool held_ = false;
};

class RedisHarness final : public SinkHarness {
 public:
  [[nodiscard]] std::string Name() const override { return "redis"; }
  [[nodiscard]] std::optional<std::string> Lacks(SinkFault /*fault*/) const override {
    return std::nullopt;
  }
  std::unique_ptr<SinkTestBed> NewTestBed() override { return std::make_unique<RedisTestBed>(); }
};

RedisHarness harness;
INSTANTIATE_TEST_SUITE_P(Redis, SinkContractTest, ::testing::Values(&harness), SinkHarnessName);

}  // namespace
}  // namespace outbox::testing
