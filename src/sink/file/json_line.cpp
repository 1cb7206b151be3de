#include "json_line.h"

#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "outbox/core/wire_names.h"

namespace outbox::file {
namespace {

using Json = nlohmann::ordered_json;

}  // namespace

void AppendJsonLine(const Envelope& envelope, std::string& out, EnvelopeStyle style) {
  const bool full = style == EnvelopeStyle::kFull;
  Json line = Json::object();
  line["id"] = envelope.id.ToString();
  line[wire::kEventId] = envelope.EventId().ToString();
  if (full) {
    line["topic"] = envelope.topic;
    line["stream_key"] = envelope.stream_key ? Json(*envelope.stream_key) : Json(nullptr);
    line["stream_seq"] = envelope.stream_seq ? Json(*envelope.stream_seq) : Json(nullptr);
    if (envelope.stream_prev_seq) line["stream_prev_seq"] = *envelope.stream_prev_seq;
    line["partition"] = envelope.partition;
    line["target"] = envelope.target;
    if (!envelope.database.empty()) line["database"] = envelope.database;
  }
  line["type"] = envelope.type ? Json(*envelope.type) : Json(nullptr);
  line["content_type"] = envelope.content_type;
  Json headers = Json::object();
  for (const auto& [name, value] : envelope.headers) {
    // The store refuses these names; left out like every sink does.
    if (!wire::IsReservedName(name)) headers[name] = value;
  }
  line["headers"] = std::move(headers);
  if (full) line["attempts"] = envelope.attempts;
  line["created_at"] = FormatRfc3339(envelope.created_at, 3);

  bool embedded = false;
  if (IsJsonContentType(envelope.content_type) && JsonPayloadIsEmbeddable(envelope.payload)) {
    Json parsed = Json::parse(envelope.payload, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) {
      line["payload"] = std::move(parsed);
      embedded = true;
    }
  }
  if (!embedded) {
    if (IsValidUtf8(envelope.payload)) {
      line["payload"] = envelope.payload;
    } else {
      line["payload_base64"] = Base64Encode(envelope.payload);
    }
  }
  out += line.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
  out += '\n';
}

}  // namespace outbox::file
