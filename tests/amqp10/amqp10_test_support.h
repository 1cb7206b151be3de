#pragma once
// Helpers for tests against a real AMQP 1.0 broker: RabbitMQ's rabbitmq_amqp1_0 plugin from
// scripts/services, or the broker named by OUTBOX_TEST_AMQP10_URL. What arrived is read by a
// plain Proton receiver of its own (its own connection and decoding), never through the sink.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "outbox/inbox/inbox.h"

namespace outbox::testing {

// amqp://guest:guest@127.0.0.1:5672 unless OUTBOX_TEST_AMQP10_URL says otherwise.
std::string Amqp10Url();

// A message as the receiver decoded it.
struct Amqp10Message {
  std::string id;  // message-id (a string id as it is)
  std::optional<std::string> group_id;
  std::optional<std::int64_t> group_sequence;
  std::string subject;
  std::string content_type;
  std::string correlation_id;
  std::int64_t creation_time_ms = 0;
  bool durable = false;
  bool data_section = false;  // the body was a data section (not an amqp-value)
  std::string body;
  std::map<std::string, std::string> properties;      // strings as they are, integers in decimal
  std::map<std::string, std::string> property_types;  // "string", "long", "int", ...
  std::optional<std::string> partition_key;           // the x-opt-partition-key annotation
  // What the inbox reads from it (inbox/amqp10.h), or why it cannot.
  std::optional<inbox::Delivery> delivery;
  std::string delivery_error;
};

// Receives (and accepts) from `address` on the broker of `url` until at least `expected` messages
// came and none came for `idle`, or `limit` passed. Throws when it cannot connect or the broker
// refuses the link.
std::vector<Amqp10Message> ReceiveAmqp10(const std::string& url, const std::string& address,
                                         std::size_t expected, std::chrono::milliseconds limit,
                                         std::chrono::milliseconds idle);

}  // namespace outbox::testing
