#include "outbox/inbox/amqp10.h"

#include <cstdint>
#include <limits>
#include <map>
#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <proton/scalar.hpp>
#include <proton/types.hpp>
#include <string_view>

#include "decimal.h"
#include "outbox/core/wire_names.h"

namespace outbox::inbox {
namespace {

std::optional<std::int64_t> IntegerOf(const proton::scalar& value) {
  switch (value.type()) {
    case proton::LONG:
      return proton::get<std::int64_t>(value);
    case proton::ULONG: {
      const auto number = proton::get<std::uint64_t>(value);
      if (number > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) return std::nullopt;
      return static_cast<std::int64_t>(number);
    }
    case proton::INT:
      return proton::get<std::int32_t>(value);
    case proton::UINT:
      return proton::get<std::uint32_t>(value);
    case proton::SHORT:
      return proton::get<std::int16_t>(value);
    case proton::USHORT:
      return proton::get<std::uint16_t>(value);
    case proton::BYTE:
      return proton::get<std::int8_t>(value);
    case proton::UBYTE:
      return proton::get<std::uint8_t>(value);
    case proton::STRING:
      return ParseDecimal(proton::get<std::string>(value));
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<Delivery> FromAmqp10(const proton::message& message, std::string* error) {
  const auto fail = [error](std::string text) -> std::optional<Delivery> {
    if (error != nullptr) *error = std::move(text);
    return std::nullopt;
  };
  const proton::message_id message_id = message.id();
  if (message_id.empty()) return fail("the message has no message-id");
  if (message_id.type() != proton::STRING) {
    return fail("message-id is a " + proton::type_name(message_id.type()) +
                ", not the outbox's string id");
  }
  const auto text = proton::get<std::string>(message_id);
  const auto id = Uuid::Parse(text);
  if (!id) return fail("message-id '" + text + "' is not a UUID");
  Delivery delivery{.id = *id};
  // An outbox property that is there but unreadable makes the delivery invalid (the first one
  // found is named), not foreign: its id is fine, and the inbox reports it as kInvalid.
  const auto malformed = [&delivery](std::string_view name, std::string_view what) {
    if (delivery.malformed.empty()) {
      delivery.malformed = "property " + std::string{name} + " " + std::string{what};
    }
  };
  if (message.properties().empty()) return delivery;
  std::map<std::string, proton::scalar> properties;
  proton::get(message.properties().value(), properties);
  for (const auto& [name, value] : properties) {
    if (name == wire::kStreamKeyHeader) {
      if (value.type() == proton::STRING) {
        delivery.stream_key = proton::get<std::string>(value);
      } else {
        malformed(name, "is not a string");
      }
    } else if (name == wire::kTargetHeader || name == wire::kDatabaseHeader) {
      if (value.type() == proton::STRING) {
        (name == wire::kTargetHeader ? delivery.target : delivery.origin) =
            proton::get<std::string>(value);
      } else {
        malformed(name, "is not a string");
      }
    } else if (name == wire::kStreamSeqHeader) {
      delivery.stream_seq = IntegerOf(value);
      if (!delivery.stream_seq) malformed(name, "is not an integer");
    } else if (name == wire::kStreamPrevSeqHeader) {
      delivery.stream_prev_seq = IntegerOf(value);
      if (!delivery.stream_prev_seq) malformed(name, "is not an integer");
    }
  }
  return delivery;
}

}  // namespace outbox::inbox
