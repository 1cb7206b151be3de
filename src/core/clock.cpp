#include "outbox/core/clock.h"

#include <array>
#include <cstdio>
#include <stdexcept>

namespace outbox {

const SystemClock& SystemClock::Instance() {
  static const SystemClock instance;
  return instance;
}

std::string FormatRfc3339(TimePoint time, int fraction_digits) {
  using std::chrono::microseconds;
  if (fraction_digits != 0 && fraction_digits != 3 && fraction_digits != 6) {
    throw std::invalid_argument("FormatRfc3339: fraction_digits must be 0, 3 or 6");
  }
  const auto micros = std::chrono::floor<microseconds>(time);  // floor: before 1970 too
  const auto day = std::chrono::floor<std::chrono::days>(micros);
  const std::chrono::year_month_day date{day};
  const std::chrono::hh_mm_ss<microseconds> clock_time{micros - day};
  std::array<char, 64> text{};
  int length = std::snprintf(
      text.data(), text.size(), "%04d-%02u-%02uT%02d:%02d:%02d", static_cast<int>(date.year()),
      static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
      static_cast<int>(clock_time.hours().count()), static_cast<int>(clock_time.minutes().count()),
      static_cast<int>(clock_time.seconds().count()));
  const auto fraction = clock_time.subseconds().count();  // microseconds
  if (fraction_digits == 3) {
    length += std::snprintf(text.data() + length, text.size() - static_cast<std::size_t>(length),
                            ".%03d", static_cast<int>(fraction / 1000));
  } else if (fraction_digits == 6) {
    length += std::snprintf(text.data() + length, text.size() - static_cast<std::size_t>(length),
                            ".%06d", static_cast<int>(fraction));
  }
  return std::string{text.data(), static_cast<std::size_t>(length)} + "Z";
}

}  // namespace outbox
