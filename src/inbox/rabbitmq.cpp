#include "outbox/inbox/rabbitmq.h"

#include <amqp.h>

#include <limits>
#include <string_view>

#include "decimal.h"
#include "outbox/core/wire_names.h"

namespace outbox::inbox {
namespace {

std::string_view View(const amqp_bytes_t& bytes) {
  return {static_cast<const char*>(bytes.bytes), bytes.len};
}

std::optional<std::int64_t> IntegerOf(const amqp_field_value_t& value) {
  switch (value.kind) {
    case AMQP_FIELD_KIND_I64:
      return value.value.i64;
    case AMQP_FIELD_KIND_U64:
      if (value.value.u64 > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
        return std::nullopt;
      }
      return static_cast<std::int64_t>(value.value.u64);
    case AMQP_FIELD_KIND_I32:
      return value.value.i32;
    case AMQP_FIELD_KIND_U32:
      return value.value.u32;
    case AMQP_FIELD_KIND_I16:
      return value.value.i16;
    case AMQP_FIELD_KIND_U16:
      return value.value.u16;
    case AMQP_FIELD_KIND_I8:
      return value.value.i8;
    case AMQP_FIELD_KIND_U8:
      return value.value.u8;
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
      return ParseDecimal(View(value.value.bytes));
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<Delivery> FromAmqp(const amqp_basic_properties_t_& properties, std::string* error) {
  const auto fail = [error](std::string message) -> std::optional<Delivery> {
    if (error != nullptr) *error = std::move(message);
    return std::nullopt;
  };
  if ((properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) == 0) {
    return fail("the message has no message_id property");
  }
  const auto id = Uuid::Parse(View(properties.message_id));
  if (!id)
    return fail("message_id '" + std::string{View(properties.message_id)} + "' is not a UUID");
  Delivery delivery{.id = *id};
  // An outbox header that is there but unreadable makes the delivery invalid (the first one
  // found is named), not foreign: its id is fine, and the inbox reports it as kInvalid.
  const auto malformed = [&delivery](std::string_view header, std::string_view what) {
    if (delivery.malformed.empty()) {
      delivery.malformed = "header " + std::string{header} + " " + std::string{what};
    }
  };
  if ((properties._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
    for (int i = 0; i < properties.headers.num_entries; ++i) {
      const auto& entry = properties.headers.entries[i];
      const auto key = View(entry.key);
      if (key == wire::kStreamKeyHeader) {
        if (entry.value.kind == AMQP_FIELD_KIND_UTF8 || entry.value.kind == AMQP_FIELD_KIND_BYTES) {
          delivery.stream_key = std::string{View(entry.value.value.bytes)};
        } else {
          malformed(key, "is not a string");
        }
      } else if (key == wire::kTargetHeader || key == wire::kDatabaseHeader) {
        if (entry.value.kind == AMQP_FIELD_KIND_UTF8 || entry.value.kind == AMQP_FIELD_KIND_BYTES) {
          (key == wire::kTargetHeader ? delivery.target : delivery.origin) =
              std::string{View(entry.value.value.bytes)};
        } else {
          malformed(key, "is not a string");
        }
      } else if (key == wire::kStreamSeqHeader) {
        delivery.stream_seq = IntegerOf(entry.value);
        if (!delivery.stream_seq) malformed(key, "is not an integer");
      } else if (key == wire::kStreamPrevSeqHeader) {
        delivery.stream_prev_seq = IntegerOf(entry.value);
        if (!delivery.stream_prev_seq) malformed(key, "is not an integer");
      }
    }
  }
  return delivery;
}

}  // namespace outbox::inbox
