// LSN text as PostgreSQL's pg_lsn reads and prints it (outbox/store/wal.h).
#include "outbox/store/wal.h"

#include <charconv>
#include <cstdio>

namespace outbox {
namespace {

// One half of "X/Y": 1 to 8 hex digits (pg_lsn's limit), nothing else.
std::optional<std::uint32_t> ParseHalf(std::string_view text) {
  if (text.empty() || text.size() > 8) return std::nullopt;
  std::uint32_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::string FormatLsn(Lsn lsn) {
  char text[24];
  const int length = std::snprintf(text, sizeof text, "%X/%X", static_cast<unsigned>(lsn >> 32U),
                                   static_cast<unsigned>(lsn & 0xFFFFFFFFU));
  return {text, static_cast<std::size_t>(length)};
}

std::optional<Lsn> ParseLsn(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const auto high = ParseHalf(text.substr(0, slash));
  const auto low = ParseHalf(text.substr(slash + 1));
  if (!high || !low) return std::nullopt;
  return (static_cast<Lsn>(*high) << 32U) | *low;
}

}  // namespace outbox
