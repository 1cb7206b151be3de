#pragma once
// The inbox adapters' reading of an integer header sent as a decimal string (inbox/rabbitmq.h,
// inbox/amqp10.h).

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace outbox::inbox {

// `text` as a whole decimal int64, or nullopt.
inline std::optional<std::int64_t> ParseDecimal(std::string_view text) {
  std::int64_t parsed = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (error == std::errc{} && end == text.data() + text.size()) return parsed;
  return std::nullopt;
}

}  // namespace outbox::inbox
