#include "outbox/core/message.h"

#include <algorithm>
#include <cstdio>

#include "outbox/core/ascii.h"

namespace outbox {
namespace {

// Position of the first C0 control character or DEL, or npos.
std::size_t FindControl(std::string_view text) {
  const auto it = std::find_if(text.begin(), text.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte < 0x20 || byte == 0x7F;
  });
  return it == text.end() ? std::string_view::npos : static_cast<std::size_t>(it - text.begin());
}

std::string ControlError(std::string_view what, std::string_view text, std::size_t at) {
  char code[8];
  std::snprintf(code, sizeof code, "0x%02x", static_cast<unsigned char>(text[at]));
  return std::string{what} + " contains a control character (" + code + ")";
}

// "<what> is N bytes, over the limit of M (<limit>)"; without the parenthesis when `limit` is
// empty (a fixed limit rather than one of MessageLimits).
std::string SizeError(std::string_view what, std::size_t size, std::size_t max_bytes,
                      std::string_view limit = {}) {
  std::string error = std::string{what} + " is " + std::to_string(size) +
                      " bytes, over the limit of " + std::to_string(max_bytes);
  if (!limit.empty()) error += " (" + std::string{limit} + ")";
  return error;
}

std::string CheckText(std::string_view field, std::string_view text, std::size_t max_bytes,
                      std::string_view limit = {}) {
  if (text.empty()) return std::string{field} + " must not be empty";
  if (text.size() > max_bytes) return SizeError(field, text.size(), max_bytes, limit);
  if (const auto at = FindControl(text); at != std::string_view::npos) {
    return ControlError(field, text, at);
  }
  return {};
}

}  // namespace

std::string ValidateTargets(std::span<const std::string> targets) {
  if (targets.size() > kMaxTargets) {
    return "targets: " + std::to_string(targets.size()) + " targets, over the limit of " +
           std::to_string(kMaxTargets);
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (auto error = CheckText("target", targets[i], 255); !error.empty()) return error;
    for (std::size_t j = 0; j < i; ++j) {
      if (targets[j] == targets[i]) return "targets: '" + targets[i] + "' is named twice";
    }
  }
  return {};
}

std::string ValidateHeaders(const Headers& headers, const MessageLimits& limits) {
  if (headers.size() > limits.max_header_count) {
    return "headers: " + std::to_string(headers.size()) + " headers, over the limit of " +
           std::to_string(limits.max_header_count) + " (max_header_count)";
  }
  std::size_t total_bytes = 0;
  for (const auto& [name, value] : headers) {
    if (auto error =
            CheckText("header name", name, limits.max_header_name_bytes, "max_header_name_bytes");
        !error.empty()) {
      return error + (name.empty() ? "" : " ('" + name.substr(0, 64) + "')");
    }
    if (wire::IsReservedName(name)) {
      return "header '" + name + "' is reserved (message_id, event_id and names starting with '" +
             std::string{kReservedHeaderPrefix} + "' are set by the outbox)";
    }
    const std::string field = "header '" + name + "': value";
    if (value.size() > limits.max_header_value_bytes) {
      return SizeError(field, value.size(), limits.max_header_value_bytes,
                       "max_header_value_bytes");
    }
    if (const auto at = FindControl(value); at != std::string_view::npos) {
      return ControlError(field, value, at);
    }
    total_bytes += name.size() + value.size();
  }
  if (total_bytes > limits.max_headers_bytes) {
    return "headers: " + std::to_string(total_bytes) +
           " bytes of names and values, over the limit of " +
           std::to_string(limits.max_headers_bytes) + " (max_headers_bytes)";
  }
  return {};
}

std::string ValidateMessage(const NewMessage& message, const MessageLimits& limits) {
  if (auto error = CheckText("topic", message.topic, limits.max_topic_bytes); !error.empty()) {
    return error;
  }
  if (message.stream_key) {
    if (auto error = CheckText("stream_key", *message.stream_key, limits.max_stream_key_bytes);
        !error.empty()) {
      return error;
    }
  }
  if (message.payload.size() > limits.max_payload_bytes) {
    return SizeError("payload", message.payload.size(), limits.max_payload_bytes,
                     "max_payload_bytes");
  }
  if (auto error = CheckText("content_type", message.content_type, 255); !error.empty()) {
    return error;
  }
  if (auto error = ValidateTargets(message.targets); !error.empty()) return error;
  if (message.type) {
    if (auto error = CheckText("type", *message.type, 255); !error.empty()) return error;
  }
  return ValidateHeaders(message.headers, limits);
}

}  // namespace outbox
