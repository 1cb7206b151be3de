#pragma once
// Headers exactly at the header limits of `limits` (by default MessageLimits' defaults, which are
// also the PostgreSQL settings' defaults): max_header_count headers, one name of
// max_header_name_bytes with a value of max_header_value_bytes, correlation_id set, and names
// and values that add up to max_headers_bytes. Any one byte or header more breaks a limit.

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "outbox/core/message.h"

namespace outbox::testing {

inline Headers HeadersAtTheLimits(const MessageLimits& limits = {}) {
  Headers headers;
  const std::string longest(limits.max_header_name_bytes, 'n');
  headers[longest] = std::string(limits.max_header_value_bytes, 'v');
  headers[std::string{kCorrelationIdHeader}] = "";
  for (std::size_t i = headers.size(); i < limits.max_header_count; ++i) {
    std::string name = std::to_string(i);
    headers["x-" + std::string(3 - std::min<std::size_t>(3, name.size()), '0') + name] = "";
  }
  std::size_t used = 0;
  for (const auto& [name, value] : headers) used += name.size() + value.size();
  if (headers.size() != limits.max_header_count || used > limits.max_headers_bytes) {
    throw std::logic_error("HeadersAtTheLimits: the limits leave no room for it");
  }
  // Spread what is left of max_headers_bytes over the other values.
  std::size_t left = limits.max_headers_bytes - used;
  std::size_t others = headers.size() - 1;
  for (auto& [name, value] : headers) {
    if (name == longest) continue;
    const std::size_t share = (left + others - 1) / others;
    value.assign(share, name == kCorrelationIdHeader ? 'c' : 'h');
    left -= share;
    --others;
  }
  return headers;
}

}  // namespace outbox::testing
