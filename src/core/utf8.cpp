#include "outbox/core/utf8.h"

#include <cstdint>

namespace outbox {
namespace {

// Decodes `text`, calling accept(code_point) for each character; false on malformed input or
// when accept says no.
template <typename Accept>
bool Decode(std::string_view text, Accept accept) {
  std::size_t at = 0;
  while (at < text.size()) {
    const auto lead = static_cast<unsigned char>(text[at]);
    std::size_t length = 1;
    std::uint32_t code_point = lead;
    std::uint32_t minimum = 0;
    if (lead >= 0x80U) {
      if ((lead & 0xE0U) == 0xC0U) {
        length = 2, code_point = lead & 0x1FU, minimum = 0x80;
      } else if ((lead & 0xF0U) == 0xE0U) {
        length = 3, code_point = lead & 0x0FU, minimum = 0x800;
      } else if ((lead & 0xF8U) == 0xF0U) {
        length = 4, code_point = lead & 0x07U, minimum = 0x10000;
      } else {
        return false;
      }
      if (text.size() - at < length) return false;
      for (std::size_t i = 1; i < length; ++i) {
        const auto continuation = static_cast<unsigned char>(text[at + i]);
        if ((continuation & 0xC0U) != 0x80U) return false;
        code_point = (code_point << 6U) | (continuation & 0x3FU);
      }
      if (code_point < minimum || code_point > 0x10FFFFU ||
          (code_point >= 0xD800U && code_point <= 0xDFFFU)) {
        return false;
      }
    }
    if (!accept(code_point)) return false;
    at += length;
  }
  return true;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  return Decode(text, [](std::uint32_t) { return true; });
}

bool IsPrintableUtf8(std::string_view text) {
  return Decode(text, [](std::uint32_t c) {
    const bool c0 = c < 0x20U && c != '\t' && c != '\n' && c != '\r';
    const bool del_or_c1 = c >= 0x7FU && c < 0xA0U;
    return !c0 && !del_or_c1;
  });
}

}  // namespace outbox
