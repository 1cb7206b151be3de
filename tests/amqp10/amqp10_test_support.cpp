#include "amqp10_test_support.h"

#include <cstdlib>
#include <proton/annotation_key.hpp>
#include <proton/connection.hpp>
#include <proton/connection_options.hpp>
#include <proton/container.hpp>
#include <proton/delivery.hpp>
#include <proton/error_condition.hpp>
#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/receiver.hpp>
#include <proton/receiver_options.hpp>
#include <proton/scalar.hpp>
#include <proton/timestamp.hpp>
#include <proton/transport.hpp>
#include <proton/types.hpp>
#include <proton/work_queue.hpp>
#include <stdexcept>

#include "outbox/inbox/amqp10.h"
#include "outbox/sink/amqp10.h"

namespace outbox::testing {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string Text(const proton::scalar& value, std::string& type) {
  type = proton::type_name(value.type());
  switch (value.type()) {
    case proton::STRING:
      return proton::get<std::string>(value);
    case proton::SYMBOL:
      return proton::get<proton::symbol>(value);
    case proton::LONG:
      return std::to_string(proton::get<std::int64_t>(value));
    case proton::INT:
      return std::to_string(proton::get<std::int32_t>(value));
    default:
      return proton::to_string(value);
  }
}

class Receiver final : public proton::messaging_handler {
 public:
  Receiver(std::string url, std::string address, std::size_t expected,
           std::chrono::milliseconds limit, std::chrono::milliseconds idle)
      : url_(std::move(url)),
        address_(std::move(address)),
        expected_(expected),
        until_(SteadyClock::now() + limit),
        idle_(idle),
        last_(SteadyClock::now()) {}

  std::vector<Amqp10Message> Take() { return std::move(messages_); }
  [[nodiscard]] const std::string& error() const { return error_; }

  void on_container_start(proton::container& container) override {
    const amqp10::Endpoint endpoint = amqp10::ParseUrl(url_);
    proton::connection_options options;
    options.sasl_allow_insecure_mechs(true);
    if (!endpoint.user.empty()) {
      options.user(endpoint.user).password(endpoint.password).sasl_allowed_mechs("PLAIN");
    }
    container.connect(endpoint.Describe(), options);
  }
  void on_connection_open(proton::connection& connection) override {
    connection_ = connection;
    connection.open_receiver(address_, proton::receiver_options().credit_window(500));
    Tick();
  }
  void on_message(proton::delivery& /*delivery*/, proton::message& message) override {
    Amqp10Message out;
    const proton::message_id id = message.id();
    out.id = id.type() == proton::STRING ? proton::get<std::string>(id) : proton::to_string(id);
    if (!message.group_id().empty()) out.group_id = message.group_id();
    if (message.group_sequence() != 0) out.group_sequence = message.group_sequence();
    out.subject = message.subject();
    out.content_type = message.content_type();
    const proton::message_id correlation = message.correlation_id();
    if (correlation.type() == proton::STRING) {
      out.correlation_id = proton::get<std::string>(correlation);
    }
    out.creation_time_ms = message.creation_time().milliseconds();
    out.durable = message.durable();
    out.data_section = message.inferred();
    const proton::value& body = message.body();
    if (body.type() == proton::BINARY) {
      const auto bytes = proton::get<proton::binary>(body);
      out.body.assign(bytes.begin(), bytes.end());
    } else if (body.type() == proton::STRING) {
      out.body = proton::get<std::string>(body);
    }
    std::map<std::string, proton::scalar> properties;
    if (!message.properties().empty()) proton::get(message.properties().value(), properties);
    for (const auto& [name, value] : properties) {
      std::string type;
      out.properties[name] = Text(value, type);
      out.property_types[name] = type;
    }
    const proton::annotation_key key(proton::symbol("x-opt-partition-key"));
    if (message.message_annotations().exists(key)) {
      out.partition_key = proton::get<std::string>(message.message_annotations().get(key));
    }
    out.delivery = inbox::FromAmqp10(message, &out.delivery_error);
    messages_.push_back(std::move(out));
    last_ = SteadyClock::now();
  }
  void on_receiver_error(proton::receiver& receiver) override {
    Fail(receiver.error().what(), receiver.connection());
  }
  void on_transport_error(proton::transport& transport) override {
    error_ = transport.error().what();
    done_ = true;
  }
  void on_error(const proton::error_condition& error) override { error_ = error.what(); }

 private:
  void Fail(const std::string& error, proton::connection connection) {
    error_ = error;
    Stop(connection);
  }
  void Stop(proton::connection connection) {
    done_ = true;
    if (connection) connection.close();
  }
  // Every 20 ms: done once enough came and the queue stayed idle, or at the limit.
  void Tick() {
    if (done_) return;
    const auto now = SteadyClock::now();
    if ((messages_.size() >= expected_ && now - last_ >= idle_) || now >= until_) {
      Stop(connection_);
      return;
    }
    connection_.work_queue().schedule(proton::duration(20), [this] { Tick(); });
  }

  std::string url_;
  std::string address_;
  std::size_t expected_;
  SteadyClock::time_point until_;
  std::chrono::milliseconds idle_;
  SteadyClock::time_point last_;
  proton::connection connection_;
  std::vector<Amqp10Message> messages_;
  std::string error_;
  bool done_ = false;
};

}  // namespace

std::string Amqp10Url() {
  const char* url = std::getenv("OUTBOX_TEST_AMQP10_URL");
  return url != nullptr && url[0] != '\0' ? url : "amqp://guest:guest@127.0.0.1:5672";
}

std::vector<Amqp10Message> ReceiveAmqp10(const std::string& url, const std::string& address,
                                         std::size_t expected, std::chrono::milliseconds limit,
                                         std::chrono::milliseconds idle) {
  Receiver receiver(url, address, expected, limit, idle);
  proton::container container(receiver);
  container.run();
  if (!receiver.error().empty()) {
    throw std::runtime_error("receiving from " + address + ": " + receiver.error());
  }
  return receiver.Take();
}

}  // namespace outbox::testing
