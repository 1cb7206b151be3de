#pragma once
// Which of the outbox's metadata a sink sends with each message: `envelope` in a [sinks.<name>]
// table. "external" is for consumers outside the service (a partner, an analytics pipeline) that
// need the event and its context but not how the outbox moved it; "cloudevents" is for consumers
// that read CloudEvents.

#include <cstdint>
#include <optional>
#include <string_view>

namespace outbox {

enum class EnvelopeStyle : std::uint8_t {
  // Everything: the message id, the event id (wire::kEventId), type, content type, the user's
  // headers, and the outbox's internal headers (outbox-topic, outbox-stream-key,
  // outbox-stream-seq, outbox-stream-prev-seq, outbox-partition, outbox-attempts, outbox-target,
  // outbox-database; wire_names.h).
  kFull,
  // The same without any outbox-* header: payload, message id, event id, type, content type and
  // the user's headers (correlation_id, causation_id, traceparent, ...).
  kExternal,
  // A CloudEvents 1.0 event in the protocol binding's binary (or, with cloudevents_mode =
  // "structured", structured) content mode: sink/cloudevents.h, docs/cloudevents.md. No outbox-*
  // header, no message_id / event_id header (the id and eventid attributes carry them).
  kCloudEvents,
};

inline constexpr std::string_view kEnvelopeKey = "envelope";

constexpr std::string_view EnvelopeStyleName(EnvelopeStyle style) {
  return style == EnvelopeStyle::kExternal      ? "external"
         : style == EnvelopeStyle::kCloudEvents ? "cloudevents"
                                                : "full";
}

constexpr std::optional<EnvelopeStyle> ParseEnvelopeStyle(std::string_view name) {
  if (name == "full") return EnvelopeStyle::kFull;
  if (name == "external") return EnvelopeStyle::kExternal;
  if (name == "cloudevents") return EnvelopeStyle::kCloudEvents;
  return std::nullopt;
}

}  // namespace outbox
