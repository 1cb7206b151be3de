#include "duration.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "outbox/config/duration.h"

namespace outbox::apps {
namespace {

constexpr std::chrono::seconds kMaxDuration{100LL * 366 * 86400};

}  // namespace

// config::ParseDuration reads the number and unit; what is added here is what an age needs:
// whole seconds, "0" without a unit, and messages for a person at a prompt.
std::chrono::seconds ParseDuration(std::string_view text) {
  const std::string quoted = "'" + std::string{text} + "'";
  const std::string expected = ": expected a whole number and a unit, like 30s, 10m, 2h or 30d";
  if (!text.empty() && text.front() == '-') {
    throw std::invalid_argument("duration " + quoted + " must not be negative");
  }
  if (text == "0") return std::chrono::seconds{0};
  const std::size_t digits = std::min(text.find_first_not_of("0123456789"), text.size());
  const std::string_view unit = text.substr(digits);
  if (digits == 0 || (unit != "s" && unit != "m" && unit != "h" && unit != "d")) {
    throw std::invalid_argument("bad duration " + quoted + expected);
  }
  // A number and a unit that config::ParseDuration still refuses is one too large for it.
  const auto parsed = config::ParseDuration(text);
  if (!parsed)
    throw std::invalid_argument("duration " + quoted + " is too large (at most 100 years)");
  const auto duration = std::chrono::duration_cast<std::chrono::seconds>(*parsed);
  if (duration > kMaxDuration) {
    throw std::invalid_argument("duration " + quoted + " is too large (at most 100 years)");
  }
  return duration;
}

}  // namespace outbox::apps
