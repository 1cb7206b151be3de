#pragma once
// Durations as configuration writes them: a non-negative integer and a unit, "250ms", "30s",
// "5m", "1h", "7d". One reader for outboxd's file, the sinks' tables and the operators' tools.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace outbox::config {

inline constexpr std::string_view kDurationForm =
    "a duration such as \"250ms\", \"30s\", \"5m\", \"1h\" or \"7d\"";

// The duration `text` spells (units ms, s, m, h, d; at most 12 digits); nullopt when it is not one.
std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text);

// The largest unit that divides `duration` exactly: "2d", "90m", "1500ms", "0s".
std::string FormatDuration(std::chrono::milliseconds duration);

}  // namespace outbox::config
