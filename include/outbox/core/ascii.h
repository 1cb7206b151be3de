#pragma once
// ASCII case folding for names that are case-insensitive on the wire (HTTP and NATS header names,
// the outbox's reserved header names). Bytes outside A-Z are compared as they are: no locale.

#include <cstddef>
#include <string_view>

namespace outbox {

constexpr char AsciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

// `text` begins with `prefix`, A-Z and a-z taken as equal.
constexpr bool StartsWithNoCase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (AsciiLower(text[i]) != AsciiLower(prefix[i])) return false;
  }
  return true;
}

// `text` has a C0 control character or DEL (for names and values a person reads in a message).
constexpr bool HasControlCharacter(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '\x7f') return true;
  }
  return false;
}

// `a` and `b` are equal, A-Z and a-z taken as equal.
constexpr bool EqualsNoCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && StartsWithNoCase(a, b);
}

}  // namespace outbox
