// outbox-amqp10-bench: the AMQP 1.0 sink alone next to a raw Proton sender with the same window,
// on the same broker, one after the other (issue #46). Both send the same messages (256-byte
// payloads over 1,000 streams, the sink's properties and annotations) to the same address and
// count a message when the broker's disposition says accepted.
//
//   outbox-amqp10-bench [--url amqp://guest:guest@127.0.0.1:5672] [--messages 100000]
//                       [--window 1000] [--batch 500] [--address /exchange/amq.direct/none]
//
// The default address routes to no queue (RabbitMQ 3.10 accepts an unroutable message): what is
// measured is the client, the protocol and the broker's routing, not a queue's storage. The sink
// is measured as the relay uses it: Publish calls of `batch` messages, each waiting for its
// dispositions (the relay pipelines claims around that, not publishes).

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <proton/annotation_key.hpp>
#include <proton/connection.hpp>
#include <proton/connection_options.hpp>
#include <proton/container.hpp>
#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/sender.hpp>
#include <proton/sender_options.hpp>
#include <proton/timestamp.hpp>
#include <proton/tracker.hpp>
#include <proton/transport.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox/core/uuid.h"
#include "outbox/sink/amqp10.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

std::vector<outbox::Envelope> MakeEnvelopes(int count) {
  std::vector<outbox::Envelope> envelopes;
  envelopes.reserve(static_cast<std::size_t>(count));
  const std::string payload(256, 'x');
  for (int i = 0; i < count; ++i) {
    outbox::Envelope envelope;
    envelope.id = outbox::NewUuidV7();
    envelope.topic = "bench";
    envelope.stream_key = "stream-" + std::to_string(i % 1000);
    envelope.stream_seq = i / 1000 + 1;
    envelope.partition = i % 16;
    envelope.type = "BenchEvent";
    envelope.payload = payload;
    envelope.created_at = std::chrono::system_clock::now();
    envelopes.push_back(std::move(envelope));
  }
  return envelopes;
}

// The message the sink sends for `envelope` (sink/amqp10.h), built here by hand.
proton::message RawMessage(const outbox::Envelope& envelope) {
  proton::message message;
  message.id(proton::message_id(envelope.id.ToString()));
  message.durable(true);
  message.inferred(true);
  message.body(proton::binary(envelope.payload));
  message.content_type(envelope.content_type);
  message.subject(*envelope.type);
  message.creation_time(proton::timestamp(
      std::chrono::duration_cast<std::chrono::milliseconds>(envelope.created_at.time_since_epoch())
          .count()));
  message.group_id(*envelope.stream_key);
  message.group_sequence(static_cast<std::int32_t>(*envelope.stream_seq));
  message.message_annotations().put(proton::annotation_key(proton::symbol("x-opt-partition-key")),
                                    *envelope.stream_key);
  auto& properties = message.properties();
  properties.put("event_id", envelope.id.ToString());
  properties.put("outbox-topic", envelope.topic);
  properties.put("outbox-stream-key", *envelope.stream_key);
  properties.put("outbox-stream-seq", std::int64_t{*envelope.stream_seq});
  properties.put("outbox-partition", std::int32_t{envelope.partition});
  properties.put("outbox-attempts", std::int32_t{0});
  return message;
}

// A plain Proton sender: up to `window` deliveries unsettled, on one link.
class RawSender final : public proton::messaging_handler {
 public:
  RawSender(const outbox::amqp10::Endpoint& endpoint, std::string address,
            const std::vector<outbox::Envelope>& envelopes, std::size_t window)
      : endpoint_(endpoint), address_(std::move(address)), envelopes_(envelopes), window_(window) {}

  void on_container_start(proton::container& container) override {
    proton::connection_options options;
    options.sasl_allow_insecure_mechs(true);
    if (!endpoint_.user.empty()) {
      options.user(endpoint_.user).password(endpoint_.password).sasl_allowed_mechs("PLAIN");
    }
    container.connect(endpoint_.Describe(), options);
  }
  void on_connection_open(proton::connection& connection) override {
    started_ = SteadyClock::now();
    connection.open_sender(address_);
  }
  void on_sendable(proton::sender& sender) override {
    while (sender.credit() > 0 && sent_ < envelopes_.size() && sent_ - settled_ < window_) {
      sender.send(RawMessage(envelopes_[sent_++]));
    }
  }
  void on_tracker_accept(proton::tracker& tracker) override { Settled(tracker, true); }
  void on_tracker_reject(proton::tracker& tracker) override { Settled(tracker, false); }
  void on_tracker_release(proton::tracker& tracker) override { Settled(tracker, false); }
  void on_transport_error(proton::transport& transport) override {
    error_ = transport.error().what();
  }
  void on_error(const proton::error_condition& error) override { error_ = error.what(); }

  [[nodiscard]] double seconds() const { return seconds_; }
  [[nodiscard]] std::size_t accepted() const { return accepted_; }
  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  void Settled(proton::tracker& tracker, bool accepted) {
    ++settled_;
    if (accepted) ++accepted_;
    if (settled_ == envelopes_.size()) {
      seconds_ = std::chrono::duration<double>(SteadyClock::now() - started_).count();
      tracker.connection().close();
      return;
    }
    proton::sender sender = tracker.sender();
    on_sendable(sender);
  }

  outbox::amqp10::Endpoint endpoint_;
  std::string address_;
  const std::vector<outbox::Envelope>& envelopes_;
  std::size_t window_;
  std::size_t sent_ = 0;
  std::size_t settled_ = 0;
  std::size_t accepted_ = 0;
  SteadyClock::time_point started_;
  double seconds_ = 0;
  std::string error_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The AMQP 1.0 sink next to a raw Proton sender with the same window"};
  std::string url = "amqp://guest:guest@127.0.0.1:5672";
  std::string address = "/exchange/amq.direct/none";
  int messages = 100000;
  std::size_t window = 1000;
  std::size_t batch = 500;
  app.add_option("--url", url, "the broker");
  app.add_option("--address", address, "the target address (both)");
  app.add_option("--messages", messages, "messages per run")->check(CLI::PositiveNumber);
  app.add_option("--window", window, "deliveries awaiting a disposition (both)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "messages per Publish call (the sink)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const outbox::amqp10::Endpoint endpoint = outbox::amqp10::ParseUrl(url);
  const auto envelopes = MakeEnvelopes(messages);

  RawSender raw(endpoint, address, envelopes, window);
  proton::container(raw).run();
  if (!raw.error().empty()) {
    std::fprintf(stderr, "raw sender: %s\n", raw.error().c_str());
    return 1;
  }

  outbox::amqp10::SinkOptions options;
  options.url = url;
  options.address = address;
  options.max_in_flight = window;
  auto sink = outbox::amqp10::OpenSink(options);
  std::size_t published = 0;
  const std::span<const outbox::Envelope> all{envelopes};
  const auto started = SteadyClock::now();
  for (std::size_t first = 0; first < all.size(); first += batch) {
    const auto part = all.subspan(first, std::min(batch, all.size() - first));
    for (const auto& outcome : sink->Publish(part, SteadyClock::now() + std::chrono::seconds{30})) {
      if (outcome.published()) ++published;
    }
  }
  const double sink_seconds = std::chrono::duration<double>(SteadyClock::now() - started).count();
  sink->Close();

  const double raw_rate = static_cast<double>(raw.accepted()) / raw.seconds();
  const double sink_rate = static_cast<double>(published) / sink_seconds;
  std::printf("raw Proton sender (window %zu):          %zu accepted in %.2f s: %.0f msgs/s\n",
              window, raw.accepted(), raw.seconds(), raw_rate);
  std::printf(
      "amqp10 sink (max_in_flight %zu, batch %zu): %zu published in %.2f s: %.0f msgs/s "
      "(%.0f %% of raw)\n",
      window, batch, published, sink_seconds, sink_rate, 100.0 * sink_rate / raw_rate);
  return published == envelopes.size() && raw.accepted() == envelopes.size() ? 0 : 1;
}
