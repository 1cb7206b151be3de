#include "message_json.h"

#include <ctime>
#include <stdexcept>

#include "outbox/core/utf8.h"

namespace outbox::apps {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order written: id first

Json OptionalJson(const std::optional<std::string>& value) {
  return value ? Json(*value) : Json(nullptr);
}

Json OptionalTimeJson(const std::optional<TimePoint>& value) {
  return value ? Json(FormatTime(*value)) : Json(nullptr);
}

}  // namespace

std::string FormatTime(TimePoint time) { return FormatRfc3339(time, 6); }

MessageId ParseMessageId(std::string_view text) {
  if (auto id = MessageId::Parse(text)) return *id;
  throw std::invalid_argument("'" + std::string{text} +
                              "' is not a message id (expected a UUID such as "
                              "0192f4e0-7c1a-7b3e-9f00-1a2b3c4d5e6f)");
}

std::string Hex(std::string_view bytes, std::size_t per_line) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2 + (per_line > 0 ? bytes.size() / per_line : 0));
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (per_line > 0 && i > 0 && i % per_line == 0) hex += '\n';
    const auto byte = static_cast<unsigned char>(bytes[i]);
    hex += kDigits[byte >> 4U];
    hex += kDigits[byte & 0x0FU];
  }
  return hex;
}

Json SummaryJson(const MessageSummary& message) {
  return Json{
      {"id", message.id.ToString()},
      {"event_id", message.event_id.ToString()},
      {"topic", message.topic},
      {"stream_key", OptionalJson(message.stream_key)},
      {"stream_seq", message.stream_seq ? Json(*message.stream_seq) : Json(nullptr)},
      {"partition", message.partition},
      {"target", message.target},
      {"type", OptionalJson(message.type)},
      {"status", MessageStatusName(message.status)},
      {"attempts", message.attempts},
      {"holds_stream", message.holds_stream},
      {"available_at", FormatTime(message.available_at)},
      {"created_at", FormatTime(message.created_at)},
      {"last_error", OptionalJson(message.last_error)},
      {"lease_owner", OptionalJson(message.lease_owner)},
      {"lease_until", OptionalTimeJson(message.lease_until)},
      {"payload_bytes", message.payload_bytes},
  };
}

Json DetailJson(const MessageDetail& detail) {
  const bool text = IsPrintableUtf8(detail.payload);
  Json out = SummaryJson(detail.summary);
  out["content_type"] = detail.content_type;
  out["headers"] = Json(detail.headers);
  out["lease_epoch"] = detail.lease_epoch;
  out["published_at"] = OptionalTimeJson(detail.published_at);
  out["abandoned_at"] = OptionalTimeJson(detail.abandoned_at);
  out["payload_encoding"] = text ? "text" : "hex";
  out["payload"] = text ? detail.payload : Hex(detail.payload);
  return out;
}

}  // namespace outbox::apps
