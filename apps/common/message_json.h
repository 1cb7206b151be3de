#pragma once
// How outboxctl (--json) and outboxd's admin API show messages and read their ids: one way, so
// that the CLI and the HTTP API cannot drift apart.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "outbox/core/clock.h"
#include "outbox/store/admin.h"

namespace outbox::apps {

// RFC 3339 in UTC with microseconds: "2026-11-21T13:21:51.123456Z".
std::string FormatTime(TimePoint time);

// The message id `text` spells; std::invalid_argument naming it and the expected form otherwise.
MessageId ParseMessageId(std::string_view text);

// Lower-case hex, `per_line` bytes per line (0: one line).
std::string Hex(std::string_view bytes, std::size_t per_line = 0);

// Every column of a listed message but the payload.
nlohmann::ordered_json SummaryJson(const MessageSummary& message);

// A shown message: the summary plus content type, headers, lease epoch, published/abandoned
// times and the payload, as text when it is printable UTF-8 ("payload_encoding": "text") and
// as hex otherwise ("hex").
nlohmann::ordered_json DetailJson(const MessageDetail& detail);

}  // namespace outbox::apps
