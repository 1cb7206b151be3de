#include "duration.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace outbox::apps {
namespace {

constexpr std::int64_t kMaxDurationSeconds = 100LL * 366 * 86400;

}  // namespace

std::chrono::seconds ParseDuration(std::string_view text) {
  const std::string quoted = "'" + std::string{text} + "'";
  const std::string expected = ": expected a whole number and a unit, like 30s, 10m, 2h or 30d";
  if (!text.empty() && text.front() == '-') {
    throw std::invalid_argument("duration " + quoted + " must not be negative");
  }
  std::size_t digits = 0;
  std::int64_t value = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    value = value * 10 + (text[digits] - '0');
    if (value > kMaxDurationSeconds) {
      throw std::invalid_argument("duration " + quoted + " is too large (at most 100 years)");
    }
    ++digits;
  }
  if (digits == 0) throw std::invalid_argument("bad duration " + quoted + expected);
  const std::string_view unit = text.substr(digits);
  std::int64_t seconds_per_unit = 0;
  if (unit.empty() && value == 0) {
    seconds_per_unit = 1;
  } else if (unit == "s") {
    seconds_per_unit = 1;
  } else if (unit == "m") {
    seconds_per_unit = 60;
  } else if (unit == "h") {
    seconds_per_unit = 3600;
  } else if (unit == "d") {
    seconds_per_unit = 86400;
  } else {
    throw std::invalid_argument("bad duration " + quoted + expected);
  }
  if (value > kMaxDurationSeconds / seconds_per_unit) {
    throw std::invalid_argument("duration " + quoted + " is too large (at most 100 years)");
  }
  return std::chrono::seconds{value * seconds_per_unit};
}

}  // namespace outbox::apps
