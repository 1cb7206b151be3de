#include "format.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <stdexcept>

namespace outboxctl {
namespace {

std::size_t Utf8Length(std::string_view text) {
  std::size_t length = 0;
  for (const char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0U) != 0x80U) ++length;
  }
  return length;
}

}  // namespace

std::string FormatDuration(std::chrono::milliseconds duration) {
  const std::int64_t ms = duration.count();
  const std::string sign = ms < 0 ? "-" : "";
  const std::int64_t magnitude = ms < 0 ? -ms : ms;
  if (magnitude < 1000) return sign + std::to_string(magnitude) + "ms";
  const std::int64_t seconds = magnitude / 1000;
  if (seconds < 120) return sign + std::to_string(seconds) + "s";
  if (seconds < 120 * 60) return sign + std::to_string(seconds / 60) + "m";
  if (seconds < 48 * 3600) return sign + std::to_string(seconds / 3600) + "h";
  return sign + std::to_string(seconds / 86400) + "d";
}

std::string FormatRetention(std::chrono::seconds seconds) {
  const std::int64_t value = seconds.count();
  if (value == 0) return "0s";
  if (value % 86400 == 0) return std::to_string(value / 86400) + "d";
  if (value % 3600 == 0) return std::to_string(value / 3600) + "h";
  if (value % 60 == 0) return std::to_string(value / 60) + "m";
  return std::to_string(value) + "s";
}

std::string OneLine(std::string_view text, std::size_t max_chars) {
  std::string line;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    line += byte < 0x20U || byte == 0x7FU ? ' ' : c;
  }
  if (line.size() <= max_chars) return line;
  std::size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0U) == 0x80U) --cut;
  line.resize(cut);
  return line + "...";
}

std::string Table::Render() const {
  std::vector<std::size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (std::size_t column = 0; column < row.size(); ++column) {
      widths[column] = std::max(widths[column], Utf8Length(row[column]));
    }
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (std::size_t column = 0; column < row.size(); ++column) {
      line += row[column];
      if (column + 1 < row.size()) {
        line.append(widths[column] - Utf8Length(row[column]) + 2, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

}  // namespace outboxctl
