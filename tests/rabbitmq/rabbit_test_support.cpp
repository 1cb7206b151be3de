#include "rabbit_test_support.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <variant>

#include "outbox/core/uuid.h"

namespace outbox::testing {

using rabbitmq::Bytes;
using rabbitmq::View;

std::string AmqpUrl() {
  const char* url = std::getenv("OUTBOX_TEST_AMQP_URL");
  return url != nullptr && url[0] != '\0' ? url : "amqp://guest:guest@127.0.0.1:5672/";
}

std::string UniqueName(const std::string& stem) {
  static std::atomic<int> counter{0};
  return "outbox-test-" + std::to_string(getpid()) + "-" + std::to_string(++counter) + "-" + stem;
}

Envelope MakeEnvelope(const std::string& topic, std::string payload) {
  Envelope envelope;
  envelope.id = NewUuidV7();
  envelope.topic = topic;
  envelope.payload = std::move(payload);
  envelope.created_at = std::chrono::system_clock::now();
  return envelope;
}

std::vector<Envelope> MakeEnvelopes(const std::string& topic, std::size_t count) {
  std::vector<Envelope> envelopes;
  envelopes.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    envelopes.push_back(MakeEnvelope(topic, R"({"n":)" + std::to_string(i) + "}"));
  }
  return envelopes;
}

Deadline In(std::chrono::milliseconds duration) {
  return std::chrono::steady_clock::now() + duration;
}

Admin::Admin() {
  try {
    connection_.emplace(rabbitmq::ParseUrl(AmqpUrl()), std::chrono::milliseconds{5000},
                        std::chrono::seconds{0});
    connection_->OpenChannel(1, /*confirms=*/false);
  } catch (const std::exception& error) {
    throw std::runtime_error(
        std::string{"cannot reach the test RabbitMQ (start it with scripts/services): "} +
        error.what());
  }
}

Admin::~Admin() {
  if (!connection_ || !connection_->is_open()) return;
  for (const std::string& queue : queues_) {
    amqp_queue_delete(connection_->get(), 1, Bytes(queue), 0, 0);
  }
  for (const std::string& exchange : exchanges_) {
    amqp_exchange_delete(connection_->get(), 1, Bytes(exchange), 0);
  }
}

void Admin::DeclareQueue(
    const std::string& name,
    const std::map<std::string, std::variant<std::string, std::int64_t>>& arguments, bool durable) {
  std::vector<amqp_table_entry_t> entries;
  for (const auto& [key, value] : arguments) {
    amqp_table_entry_t entry{};
    entry.key = Bytes(key);
    if (const auto* text = std::get_if<std::string>(&value)) {
      entry.value.kind = AMQP_FIELD_KIND_UTF8;
      entry.value.value.bytes = Bytes(*text);
    } else {
      entry.value.kind = AMQP_FIELD_KIND_I64;
      entry.value.value.i64 = std::get<std::int64_t>(value);
    }
    entries.push_back(entry);
  }
  const amqp_table_t table{.num_entries = static_cast<int>(entries.size()),
                           .entries = entries.data()};
  amqp_queue_declare(connection_->get(), 1, Bytes(name), 0, durable ? 1 : 0, 0, 0, table);
  connection_->CheckLastRpc(1, "queue.declare " + name);
  queues_.push_back(name);
}

void Admin::DeclareExchange(const std::string& name, const std::string& type) {
  amqp_exchange_declare(connection_->get(), 1, Bytes(name), Bytes(type), 0, 0, 0, 0,
                        amqp_empty_table);
  connection_->CheckLastRpc(1, "exchange.declare " + name);
  exchanges_.push_back(name);
}

void Admin::Bind(const std::string& queue, const std::string& exchange, const std::string& key) {
  amqp_queue_bind(connection_->get(), 1, Bytes(queue), Bytes(exchange), Bytes(key),
                  amqp_empty_table);
  connection_->CheckLastRpc(1, "queue.bind");
}

bool Admin::ExchangeExists(const std::string& name) {
  const amqp_channel_t channel = next_channel_++;
  connection_->OpenChannel(channel, false);
  amqp_exchange_declare(connection_->get(), channel, Bytes(name), Bytes("direct"), 1, 0, 0, 0,
                        amqp_empty_table);
  try {
    connection_->CheckLastRpc(channel, "passive exchange.declare");
  } catch (const rabbitmq::AmqpError& error) {
    if (error.kind() == FailureKind::kRejected) return false;  // 404: channel closed, close-ok sent
    throw;
  }
  amqp_channel_close(connection_->get(), channel, AMQP_REPLY_SUCCESS);
  return true;
}

std::uint32_t Admin::Count(const std::string& queue) {
  const auto* ok =
      amqp_queue_declare(connection_->get(), 1, Bytes(queue), 1, 0, 0, 0, amqp_empty_table);
  connection_->CheckLastRpc(1, "passive queue.declare " + queue);
  return ok->message_count;
}

std::vector<Received> Admin::Consume(const std::string& queue, std::size_t max,
                                     std::chrono::milliseconds timeout) {
  const amqp_channel_t channel = next_channel_++;
  connection_->OpenChannel(channel, false);
  amqp_basic_qos(connection_->get(), channel, 0, 500, 0);
  connection_->CheckLastRpc(channel, "basic.qos");
  amqp_basic_consume(connection_->get(), channel, Bytes(queue), amqp_empty_bytes, 0,
                     /*no_ack=*/0, 0, amqp_empty_table);
  connection_->CheckLastRpc(channel, "basic.consume " + queue);

  std::vector<Received> received;
  const timeval tv = rabbitmq::ToTimeval(timeout);
  while (received.size() < max) {
    rabbitmq::EnvelopePtr envelope{new amqp_envelope_t{}};
    amqp_maybe_release_buffers(connection_->get());
    const auto reply = amqp_consume_message(connection_->get(), envelope.get(), &tv, 0);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
      if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
          reply.library_error == AMQP_STATUS_TIMEOUT) {
        break;
      }
      throw std::runtime_error("consume: " + rabbitmq::DescribeReply(reply));
    }
    if (envelope->channel != channel) continue;  // left over from an earlier Consume
    amqp_basic_ack(connection_->get(), channel, envelope->delivery_tag, 0);
    Received message;
    const amqp_basic_properties_t& p = envelope->message.properties;
    message.body = View(envelope->message.body);
    message.exchange = View(envelope->exchange);
    message.routing_key = View(envelope->routing_key);
    message.flags = p._flags;
    message.message_id = View(p.message_id);
    message.correlation_id = View(p.correlation_id);
    message.type = View(p.type);
    message.content_type = View(p.content_type);
    message.timestamp = p.timestamp;
    message.delivery_mode = p.delivery_mode;
    if ((p._flags & AMQP_BASIC_HEADERS_FLAG) != 0U) {
      for (int i = 0; i < p.headers.num_entries; ++i) {
        const amqp_table_entry_t& entry = p.headers.entries[i];
        const std::string key{View(entry.key)};
        message.header_kinds[key] = static_cast<char>(entry.value.kind);
        switch (entry.value.kind) {
          case AMQP_FIELD_KIND_UTF8:
          case AMQP_FIELD_KIND_BYTES:
            message.headers[key] = View(entry.value.value.bytes);
            break;
          case AMQP_FIELD_KIND_I64:
            message.headers[key] = std::to_string(entry.value.value.i64);
            break;
          case AMQP_FIELD_KIND_I32:
            message.headers[key] = std::to_string(entry.value.value.i32);
            break;
          default:
            message.headers[key] = "<kind " + std::to_string(entry.value.kind) + ">";
            break;
        }
      }
    }
    received.push_back(std::move(message));
  }
  amqp_channel_close(connection_->get(), channel, AMQP_REPLY_SUCCESS);
  return received;
}

void Admin::DeleteQueue(const std::string& name) {
  amqp_queue_delete(connection_->get(), 1, Bytes(name), 0, 0);
  connection_->CheckLastRpc(1, "queue.delete");
  std::erase(queues_, name);
}

void Admin::DeleteExchange(const std::string& name) {
  amqp_exchange_delete(connection_->get(), 1, Bytes(name), 0);
  connection_->CheckLastRpc(1, "exchange.delete");
  std::erase(exchanges_, name);
}

namespace {

std::string Rabbitmqctl() {
  return std::string{PROJECT_SOURCE_DIR} + "/scripts/services rabbitmqctl ";
}

}  // namespace

TemporaryUser::TemporaryUser(std::string name, const std::string& password,
                             const std::string& configure, const std::string& write,
                             const std::string& read)
    : name_(std::move(name)) {
  if (std::system((Rabbitmqctl() + "add_user " + name_ + " " + password + " >/dev/null").c_str()) !=
      0) {
    throw std::runtime_error("rabbitmqctl add_user " + name_ + " failed");
  }
  if (std::system((Rabbitmqctl() + "set_permissions -p / " + name_ + " '" + configure + "' '" +
                   write + "' '" + read + "' >/dev/null")
                      .c_str()) != 0) {
    (void)std::system((Rabbitmqctl() + "delete_user " + name_ + " >/dev/null").c_str());
    throw std::runtime_error("rabbitmqctl set_permissions " + name_ + " failed");
  }
}

TemporaryUser::~TemporaryUser() {
  (void)std::system((Rabbitmqctl() + "delete_user " + name_ + " >/dev/null").c_str());
}

}  // namespace outbox::testing
