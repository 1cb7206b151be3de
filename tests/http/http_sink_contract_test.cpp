// The sink contract suite (tests/sink/) against webhook_receiver.py: one receiver process for the
// whole binary (SharedReceiver, started at the first test), a destination of each test bed's own
// (its name is the topic: the sink's url is http://127.0.0.1:<proxy>/hooks/{topic}), and a
// loopback TcpProxy in front of the receiver that produces the faults: the proxy stopped (server
// down: connections cut, new ones refused) and started again on the same port, its
// server-to-client direction held (lost answers, a silent server), its open connections frozen
// both ways while new ones go through (a silent peer). Too large: over the
// max_message_bytes given to the sink. Requests are signed with the secret the receiver checks,
// and a request whose signature the receiver refused fails the test.
//
// Unknown destination: HTTP has no "unknown destination" other than a 404 from the endpoint (a
// destination never created here), which http.h classifies kPermanent (the request is wrong as it
// is); an operator who wants it retried lists it in retry_statuses, as this harness does, so that
// it is kRejected as the contract wants. http_sink_test.cpp checks 404 without it.
//
// What arrived is read back from the receiver's record, not through the sink: the requests it
// answered 2xx, the id from webhook-id, stream key and seq from outbox-stream-key /
// outbox-stream-seq, the payload as received.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../sink/sink_contract.h"
#include "http_test_support.h"
#include "outbox/inbox/headers.h"
#include "outbox/sink/http.h"
#include "support/tcp_proxy.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kMaxMessageBytes = std::size_t{64} * 1024;
// How long a read with nothing expected waits for stragglers.
constexpr milliseconds kIdle{300};

// The receiver's record in "the destination's order". An HTTP endpoint receives many requests at
// once, and the sink promises an order only within a stream (http.h: messages without a stream
// key have none): so, as a broker's partitions may be concatenated, each stream's requests keep
// the order in which the receiver accepted them (a stream out of order stays out of order), and
// the streams and the messages without one are merged by message id (UUIDv7: creation order, the
// suite's batch order).
std::vector<ArrivedMessage> DestinationOrder(const std::vector<ReceivedRequest>& accepted) {
  std::vector<std::vector<ArrivedMessage>> queues;
  std::map<std::string, std::size_t> queue_of_stream;
  for (const ReceivedRequest& request : accepted) {
    // As an inbox consumer reads it (ArrivedThroughInbox); the receiver keeps the names in
    // lower case, as HTTP's are case-insensitive.
    ArrivedMessage message = ArrivedThroughInbox(
        [&](const std::string& name) -> std::optional<std::string> {
          const auto found = request.headers.find(name);
          if (found == request.headers.end()) return std::nullopt;
          return found->second;
        },
        inbox::kWebhookIdHeader, request.payload);
    EXPECT_EQ(message.stream_key, request.stream_key) << message.id;
    EXPECT_EQ(message.stream_seq, request.stream_seq) << message.id;
    if (request.stream_key) {
      const auto [it, added] = queue_of_stream.emplace(*request.stream_key, queues.size());
      if (added) queues.emplace_back();
      queues[it->second].push_back(std::move(message));
    } else {
      queues.push_back({std::move(message)});
    }
  }
  std::vector<std::size_t> next(queues.size(), 0);
  std::vector<ArrivedMessage> merged;
  merged.reserve(accepted.size());
  for (;;) {
    std::size_t best = queues.size();
    for (std::size_t q = 0; q < queues.size(); ++q) {
      if (next[q] == queues[q].size()) continue;
      if (best == queues.size() || queues[q][next[q]].id < queues[best][next[best]].id) best = q;
    }
    if (best == queues.size()) return merged;
    merged.push_back(queues[best][next[best]++]);
  }
}

class HttpTestBed final : public SinkTestBed {
 public:
  HttpTestBed() : receiver_(SharedReceiver()), destination_(UniqueDestination("contract")) {
    receiver_.CreateDestination(destination_);
    StartProxy(0);
  }
  ~HttpTestBed() override { receiver_.RemoveDestination(destination_); }
  HttpTestBed(const HttpTestBed&) = delete;
  HttpTestBed& operator=(const HttpTestBed&) = delete;

  [[nodiscard]] std::string Topic() const override { return destination_; }

  std::unique_ptr<Sink> OpenSink() override {
    webhook::SinkOptions options;
    options.url = "http://127.0.0.1:" + std::to_string(port_) + "/hooks/{topic}";
    options.secrets = {SharedSecret()};
    options.max_message_bytes = kMaxMessageBytes;
    options.connect_timeout = milliseconds{2000};
    options.request_timeout = milliseconds{20000};
    // See the top of this file: the unknown destination's 404 is retried, kRejected.
    options.retry_statuses = {404};
    options.http_version = webhook::HttpVersion::kHttp1;
    return webhook::OpenSink(std::move(options));
  }

  std::vector<ArrivedMessage> ReadBack(std::size_t expected, milliseconds limit) override {
    if (expected == 0) std::this_thread::sleep_for(kIdle);
    const auto requests = receiver_.WaitForRequests(destination_, expected, limit, true);
    std::vector<ReceivedRequest> accepted;
    for (const ReceivedRequest& request : requests) {
      EXPECT_NE(request.signature_ok, std::optional<bool>{false})
          << "the receiver refused the signature of request " << request.seq << " ("
          << request.id.value_or("no id") << ")";
      if (request.ok()) accepted.push_back(request);
    }
    return DestinationOrder(accepted);
  }

  void ServerDown() override { proxy_.reset(); }
  void ServerUp() override { StartProxy(port_); }
  [[nodiscard]] std::string UnknownTopic() override { return destination_ + "-never-created"; }
  [[nodiscard]] std::size_t TooLargePayloadBytes() override { return kMaxMessageBytes + 1; }
  void HoldReplies() override { SetHeld(true); }
  void ReleaseReplies() override { SetHeld(false); }
  void Freeze() override { proxy_->SetMode(TcpProxy::Mode::kFreeze); }
  void Thaw() override { SetHeld(held_); }
  // sink/http.h: a request without an answer by its deadline (or request_timeout) ends with its
  // connection, so none is used after that; the requests that timed out together pause the host
  // once, for the shortest pause (100 ms).
  [[nodiscard]] milliseconds SilentConnectionBound() override { return milliseconds{100}; }

 private:
  void StartProxy(int port) {
    proxy_ = std::make_unique<TcpProxy>("127.0.0.1", receiver_.port(), port);
    port_ = proxy_->port();
    if (held_) proxy_->SetMode(TcpProxy::Mode::kHoldReplies);
  }

  void SetHeld(bool held) {
    held_ = held;
    if (proxy_) proxy_->SetMode(held ? TcpProxy::Mode::kHoldReplies : TcpProxy::Mode::kForward);
  }

  WebhookReceiver& receiver_;
  std::string destination_;
  std::unique_ptr<TcpProxy> proxy_;  // null while the server is down
  int port_ = 0;
  bool held_ = false;
};

class HttpHarness final : public SinkHarness {
 public:
  [[nodiscard]] std::string Name() const override { return "http"; }
  [[nodiscard]] std::optional<std::string> Lacks(SinkFault /*fault*/) const override {
    return std::nullopt;
  }
  std::unique_ptr<SinkTestBed> NewTestBed() override { return std::make_unique<HttpTestBed>(); }
  // sink/http.h: a stream's next request goes once the one before it was answered 2xx.
  [[nodiscard]] bool HoldsStreamAfterFailure() const override { return true; }
};

HttpHarness harness;
INSTANTIATE_TEST_SUITE_P(Http, SinkContractTest, ::testing::Values(&harness), SinkHarnessName);

}  // namespace
}  // namespace outbox::testing
