#pragma once
// A plain rabbitmq-c client for tests: declares and deletes queues, and consumes as an
// independent consumer would, with manual acks, reconnecting when the broker restarts. It shares
// no code with the sink under test on purpose.

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "outbox/core/wire_names.h"

namespace outbox::testing {

inline std::string AmqpUrl() {
  const char* url = std::getenv("OUTBOX_TEST_AMQP_URL");
  return url != nullptr && url[0] != '\0' ? url : "amqp://guest:guest@127.0.0.1:5672/";
}

// The bytes of `text`, e.g. a name from wire_names.h (amqp_cstring_bytes needs a C string).
inline amqp_bytes_t AmqpBytes(std::string_view text) {
  return {text.size(), const_cast<char*>(text.data())};
}

struct AmqpConnDeleter {
  void operator()(amqp_connection_state_t conn) const noexcept {
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
  }
};
using AmqpConn = std::unique_ptr<amqp_connection_state_t_, AmqpConnDeleter>;

inline void CheckReply(amqp_rpc_reply_t reply, const char* what) {
  if (reply.reply_type != AMQP_RESPONSE_NORMAL)
    throw std::runtime_error(std::string{what} + " failed");
}

// Connects and opens channel 1; nullptr when the broker is not there (yet).
inline AmqpConn AmqpTryConnect() {
  std::string url = AmqpUrl();
  amqp_connection_info info{};
  if (amqp_parse_url(url.data(), &info) != AMQP_STATUS_OK) throw std::runtime_error("bad AMQP url");
  AmqpConn conn{amqp_new_connection()};
  amqp_socket_t* socket = amqp_tcp_socket_new(conn.get());
  timeval timeout{2, 0};
  if (amqp_socket_open_noblock(socket, info.host, info.port, &timeout) != AMQP_STATUS_OK)
    return nullptr;
  const char* vhost = info.vhost[0] == '\0' ? "/" : info.vhost;  // "amqp://host/" means "/"
  if (amqp_login(conn.get(), vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password)
          .reply_type != AMQP_RESPONSE_NORMAL) {
    return nullptr;
  }
  amqp_channel_open(conn.get(), 1);
  if (amqp_get_rpc_reply(conn.get()).reply_type != AMQP_RESPONSE_NORMAL) return nullptr;
  return conn;
}

inline AmqpConn AmqpConnect() {
  for (int i = 0; i < 300; ++i) {
    if (auto conn = AmqpTryConnect()) return conn;
    std::this_thread::sleep_for(std::chrono::milliseconds{100});
  }
  throw std::runtime_error("cannot connect to RabbitMQ at " + AmqpUrl());
}

// Declares a durable queue; `args` as x-arguments (string keys, int or string values).
inline void DeclareQueue(const std::string& name,
                         const std::vector<std::pair<std::string, std::string>>& string_args = {},
                         const std::vector<std::pair<std::string, std::int64_t>>& int_args = {}) {
  auto conn = AmqpConnect();
  std::vector<amqp_table_entry_t> entries;
  for (const auto& [key, value] : string_args) {
    amqp_table_entry_t entry{};
    entry.key = amqp_cstring_bytes(key.c_str());
    entry.value.kind = AMQP_FIELD_KIND_UTF8;
    entry.value.value.bytes = amqp_cstring_bytes(value.c_str());
    entries.push_back(entry);
  }
  for (const auto& [key, value] : int_args) {
    amqp_table_entry_t entry{};
    entry.key = amqp_cstring_bytes(key.c_str());
    entry.value.kind = AMQP_FIELD_KIND_I64;
    entry.value.value.i64 = value;
    entries.push_back(entry);
  }
  amqp_table_t table{static_cast<int>(entries.size()), entries.data()};
  amqp_queue_declare(conn.get(), 1, amqp_cstring_bytes(name.c_str()), 0, 1, 0, 0, table);
  CheckReply(amqp_get_rpc_reply(conn.get()), "queue.declare");
}

inline void DeleteQueue(const std::string& name) {
  if (auto conn = AmqpTryConnect()) {
    amqp_queue_delete(conn.get(), 1, amqp_cstring_bytes(name.c_str()), 0, 0);
  }
}

inline void DeleteExchange(const std::string& name) {
  if (auto conn = AmqpTryConnect()) {
    amqp_exchange_delete(conn.get(), 1, amqp_cstring_bytes(name.c_str()), 0);
  }
}

// Messages ready in `queue` (a passive declare), or nullopt when it does not exist.
inline std::optional<std::uint32_t> ReadyMessages(const std::string& queue) {
  auto conn = AmqpConnect();
  const auto* ok = amqp_queue_declare(conn.get(), 1, amqp_cstring_bytes(queue.c_str()),
                                      /*passive=*/1, 0, 0, 0, amqp_empty_table);
  if (ok == nullptr) return std::nullopt;
  return ok->message_count;
}

// Publishes `body` with `properties` straight to `queue` (the default exchange), with a
// publisher confirm: what a producer other than the outbox, or a broken one, might send.
inline void PublishRaw(const std::string& queue, const amqp_basic_properties_t& properties,
                       const std::string& body = "{}") {
  auto conn = AmqpConnect();
  amqp_confirm_select(conn.get(), 1);
  CheckReply(amqp_get_rpc_reply(conn.get()), "confirm.select");
  if (amqp_basic_publish(conn.get(), 1, amqp_empty_bytes, amqp_cstring_bytes(queue.c_str()),
                         /*mandatory=*/1, 0, &properties, AmqpBytes(body)) != AMQP_STATUS_OK) {
    throw std::runtime_error("basic.publish failed");
  }
  amqp_frame_t frame{};
  timeval timeout{5, 0};
  for (;;) {  // a basic.return (unroutable) comes before the ack
    if (amqp_simple_wait_frame_noblock(conn.get(), &frame, &timeout) != AMQP_STATUS_OK) {
      throw std::runtime_error("no publisher confirm");
    }
    if (frame.frame_type != AMQP_FRAME_METHOD) continue;
    if (frame.payload.method.id == AMQP_BASIC_RETURN_METHOD) {
      throw std::runtime_error("unroutable: no queue " + queue);
    }
    if (frame.payload.method.id == AMQP_BASIC_ACK_METHOD) return;
    if (frame.payload.method.id == AMQP_BASIC_NACK_METHOD) throw std::runtime_error("nacked");
  }
}

struct Delivery {
  std::string message_id;
  std::string stream_key;
  std::int64_t stream_seq = 0;
  std::string type;  // the type property
  std::string body;
  // Every header: strings as they are, integers in decimal, other kinds as "?".
  std::map<std::string, std::string> headers;
};

// Consumes `queue` on its own thread until Stop(), acking each delivery after recording it.
// With `on_delivery`, each delivery is handed to it (on the consumer's thread) instead of being
// kept: deliveries() stays empty and count() counts them (the chaos ledger, bench/chaos.cpp).
class Consumer {
 public:
  explicit Consumer(std::string queue, std::function<void(Delivery&&)> on_delivery = {})
      : queue_(std::move(queue)),
        on_delivery_(std::move(on_delivery)),
        thread_([this] { Loop(); }) {}
  ~Consumer() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<Delivery> deliveries() const {
    std::lock_guard lock(mutex_);
    return deliveries_;
  }
  std::size_t count() const {
    std::lock_guard lock(mutex_);
    return on_delivery_ ? handed_ : deliveries_.size();
  }
  int reconnects() const { return reconnects_; }

 private:
  void Loop() {
    while (!stop_) {
      AmqpConn conn = AmqpTryConnect();
      if (!conn) {
        std::this_thread::sleep_for(std::chrono::milliseconds{100});
        continue;
      }
      amqp_basic_qos(conn.get(), 1, 0, 500, 0);
      amqp_basic_consume(conn.get(), 1, amqp_cstring_bytes(queue_.c_str()), amqp_empty_bytes, 0, 0,
                         0, amqp_empty_table);
      if (amqp_get_rpc_reply(conn.get()).reply_type != AMQP_RESPONSE_NORMAL) {
        std::this_thread::sleep_for(std::chrono::milliseconds{100});
        continue;
      }
      while (!stop_) {
        amqp_maybe_release_buffers(conn.get());
        amqp_envelope_t envelope{};
        timeval timeout{0, 100000};
        const auto reply = amqp_consume_message(conn.get(), &envelope, &timeout, 0);
        if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            reply.library_error == AMQP_STATUS_TIMEOUT) {
          continue;
        }
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) break;  // connection lost: reconnect
        Record(envelope.message);
        amqp_basic_ack(conn.get(), 1, envelope.delivery_tag, 0);
        amqp_destroy_envelope(&envelope);
      }
      ++reconnects_;
    }
  }

  void Record(const amqp_message_t& message) {
    Delivery delivery;
    const auto& props = message.properties;
    if ((props._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0) {
      delivery.message_id.assign(static_cast<const char*>(props.message_id.bytes),
                                 props.message_id.len);
    }
    if ((props._flags & AMQP_BASIC_TYPE_FLAG) != 0) {
      delivery.type.assign(static_cast<const char*>(props.type.bytes), props.type.len);
    }
    delivery.body.assign(static_cast<const char*>(message.body.bytes), message.body.len);
    if ((props._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
      for (int i = 0; i < props.headers.num_entries; ++i) {
        const auto& entry = props.headers.entries[i];
        const std::string key(static_cast<const char*>(entry.key.bytes), entry.key.len);
        switch (entry.value.kind) {
          case AMQP_FIELD_KIND_UTF8:
          case AMQP_FIELD_KIND_BYTES:
            delivery.headers[key].assign(static_cast<const char*>(entry.value.value.bytes.bytes),
                                         entry.value.value.bytes.len);
            break;
          case AMQP_FIELD_KIND_I32:
            delivery.headers[key] = std::to_string(entry.value.value.i32);
            break;
          case AMQP_FIELD_KIND_I64:
            delivery.headers[key] = std::to_string(entry.value.value.i64);
            break;
          default:
            delivery.headers[key] = "?";
        }
        if (key == wire::kStreamKeyHeader && entry.value.kind == AMQP_FIELD_KIND_UTF8) {
          delivery.stream_key.assign(static_cast<const char*>(entry.value.value.bytes.bytes),
                                     entry.value.value.bytes.len);
        } else if (key == wire::kStreamSeqHeader) {
          delivery.stream_seq =
              entry.value.kind == AMQP_FIELD_KIND_I64
                  ? entry.value.value.i64
                  : std::atoll(std::string(static_cast<const char*>(entry.value.value.bytes.bytes),
                                           entry.value.value.bytes.len)
                                   .c_str());
        }
      }
    }
    if (on_delivery_) {
      on_delivery_(std::move(delivery));
      std::lock_guard lock(mutex_);
      ++handed_;
      return;
    }
    std::lock_guard lock(mutex_);
    deliveries_.push_back(std::move(delivery));
  }

  std::string queue_;
  std::function<void(Delivery&&)> on_delivery_;
  std::atomic<bool> stop_{false};
  std::atomic<int> reconnects_{0};
  mutable std::mutex mutex_;
  std::vector<Delivery> deliveries_;
  std::size_t handed_ = 0;  // to on_delivery_
  std::thread thread_;
};

}  // namespace outbox::testing
