#pragma once
// Printing for outboxctl: durations and aligned tables (messages are rendered by
// apps/common/message_json.h and durations parsed by apps/common/duration.h, shared with outboxd).

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"

namespace outboxctl {

// The shortest of "45s", "12m", "5h", "3d" that keeps two significant digits; negative
// durations get a leading '-'.
std::string FormatDuration(std::chrono::milliseconds duration);
// `seconds` the way apps::ParseDuration reads it, in the largest unit that divides it ("30d",
// "90m").
std::string FormatRetention(std::chrono::seconds seconds);

// `text` with control characters replaced by spaces and cut to `max_chars` bytes (at a UTF-8
// character boundary) with "..." when longer.
std::string OneLine(std::string_view text, std::size_t max_chars);

// Rows of cells printed with every column but the last padded to its widest cell (counted in
// UTF-8 characters), two spaces apart.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  [[nodiscard]] std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace outboxctl
