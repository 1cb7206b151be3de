#include "headers.h"

#include <algorithm>
#include <array>

#include "outbox/core/ascii.h"
#include "outbox/core/wire_names.h"

namespace outbox::webhook {

bool ReservedHeaderName(std::string_view name) {
  static constexpr std::array<std::string_view, 10> kExact{
      "content-type", "content-length", "host", "transfer-encoding", "connection",
      "keep-alive",   "upgrade",        "te",   "trailer",           "expect"};
  for (const std::string_view reserved : kExact) {
    if (EqualsNoCase(name, reserved)) return true;
  }
  return StartsWithNoCase(name, "proxy-") || StartsWithNoCase(name, "webhook-") ||
         wire::IsReservedName(name);
}

bool IsHeaderName(std::string_view name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    return std::string_view{"!#$%&'*+-.^_`|~"}.find(c) != std::string_view::npos;
  });
}

bool IsHeaderValue(std::string_view value) {
  return value.find_first_of(std::string_view{"\r\n\0", 3}) == std::string_view::npos;
}

}  // namespace outbox::webhook
