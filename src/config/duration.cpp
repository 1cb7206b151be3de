#include "outbox/config/duration.h"

#include <array>
#include <charconv>
#include <cstdint>
#include <limits>

namespace outbox::config {

using std::chrono::milliseconds;

std::optional<milliseconds> ParseDuration(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 12) return std::nullopt;
  std::int64_t count = 0;
  std::from_chars(text.data(), text.data() + digits, count);
  const std::string_view unit = text.substr(digits);
  std::int64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60 * 1000;
  } else if (unit == "h") {
    scale = 60 * 60 * 1000;
  } else if (unit == "d") {
    scale = 24 * 60 * 60 * 1000;
  } else {
    return std::nullopt;
  }
  // 12 digits of milliseconds or seconds fit; of days they would not.
  if (count > std::numeric_limits<std::int64_t>::max() / scale) return std::nullopt;
  return milliseconds{count * scale};
}

std::string FormatDuration(milliseconds duration) {
  struct Unit {
    std::int64_t millis;
    std::string_view suffix;
  };
  static constexpr std::array<Unit, 4> kUnits{
      {{24 * 60 * 60 * 1000, "d"}, {60 * 60 * 1000, "h"}, {60 * 1000, "m"}, {1000, "s"}}};
  const std::int64_t count = duration.count();
  if (count == 0) return "0s";
  for (const Unit& unit : kUnits) {
    if (count % unit.millis == 0)
      return std::to_string(count / unit.millis) + std::string{unit.suffix};
  }
  return std::to_string(count) + "ms";
}

}  // namespace outbox::config
