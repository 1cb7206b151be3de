#pragma once
// Helpers for tests against a real RabbitMQ: the broker from scripts/services, or the one named
// by OUTBOX_TEST_AMQP_URL. Each test declares its own uniquely named queues and exchanges through
// an Admin connection of its own (rabbitmq-c, not the sink) and deletes them afterwards.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "connection.h"
#include "outbox/core/message.h"

namespace outbox::testing {

std::string AmqpUrl();

// A name no other test (or run) uses: "outbox-test-<pid>-<n>-<stem>".
std::string UniqueName(const std::string& stem);

// A message as a consumer received it.
struct Received {
  std::string body;
  std::string exchange;
  std::string routing_key;
  amqp_flags_t flags = 0;  // AMQP_BASIC_*_FLAG of the properties that were set
  std::string message_id;
  std::string correlation_id;
  std::string type;
  std::string content_type;
  std::uint64_t timestamp = 0;
  int delivery_mode = 0;
  std::map<std::string, std::string> headers;  // strings as they are, integers in decimal
  std::map<std::string, char> header_kinds;    // AMQP field kind: 'S', 'l', 'I', ...
};

// Envelope helpers.
Envelope MakeEnvelope(const std::string& topic, std::string payload = R"({"n":1})");
std::vector<Envelope> MakeEnvelopes(const std::string& topic, std::size_t count);
Deadline In(std::chrono::milliseconds duration);

// A broker user of the test's own (scripts/services rabbitmqctl add_user and set_permissions on
// vhost "/", with the regular expressions `configure`, `write` and `read`), deleted when this
// object dies. Throws when rabbitmqctl fails. The test binary defines PROJECT_SOURCE_DIR.
class TemporaryUser {
 public:
  TemporaryUser(std::string name, const std::string& password, const std::string& configure,
                const std::string& write, const std::string& read);
  ~TemporaryUser();
  TemporaryUser(const TemporaryUser&) = delete;
  TemporaryUser& operator=(const TemporaryUser&) = delete;
  [[nodiscard]] const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// An administrative connection on channel 1, for topology and for reading queues back.
class Admin {
 public:
  Admin();

  // A classic queue, not durable, deleted by the destructor; `arguments` are x-arguments with
  // string or integer values ("x-max-length" -> 0).
  void DeclareQueue(
      const std::string& name,
      const std::map<std::string, std::variant<std::string, std::int64_t>>& arguments = {},
      bool durable = false);
  void DeclareExchange(const std::string& name, const std::string& type);
  void Bind(const std::string& queue, const std::string& exchange, const std::string& key);
  // True when the exchange exists (a passive declare on a channel of its own).
  bool ExchangeExists(const std::string& name);
  // Messages ready in `queue` (a passive declare).
  std::uint32_t Count(const std::string& queue);
  // Deletes `exchange` (declared by someone else, e.g. the sink) when this object dies.
  void DeleteLater(const std::string& exchange) { exchanges_.push_back(exchange); }
  // Consumes (and acks) up to `max` messages in arrival order, waiting at most `timeout` for each.
  std::vector<Received> Consume(const std::string& queue, std::size_t max,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds{
                                    2000});

  void DeleteQueue(const std::string& name);
  void DeleteExchange(const std::string& name);
  ~Admin();
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  rabbitmq::Connection& connection() { return *connection_; }

 private:
  std::optional<rabbitmq::Connection> connection_;
  std::vector<std::string> queues_;
  std::vector<std::string> exchanges_;
  amqp_channel_t next_channel_ = 2;
};

}  // namespace outbox::testing
