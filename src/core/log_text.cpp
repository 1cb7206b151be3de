#include "outbox/core/log_text.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "outbox/core/secrets.h"

namespace outbox {
namespace {

constexpr std::string_view kHex = "0123456789abcdef";

// The length of the well-formed UTF-8 sequence at text[at] (Unicode's table 3-7: no overlong
// forms, surrogates or code points past U+10FFFF), 0 when the bytes there are not one. ASCII is 1.
std::size_t SequenceLength(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(text[at + i]); };
  const std::uint8_t lead = byte(0);
  if (lead < 0x80U) return 1;
  // The range of the second byte, which the lead byte narrows; later bytes are 80..BF.
  std::size_t length = 0;
  std::uint8_t low = 0x80U;
  std::uint8_t high = 0xBFU;
  if (lead >= 0xC2U && lead <= 0xDFU) {
    length = 2;
  } else if (lead >= 0xE0U && lead <= 0xEFU) {
    length = 3;
    low = lead == 0xE0U ? 0xA0U : low;
    high = lead == 0xEDU ? 0x9FU : high;
  } else if (lead >= 0xF0U && lead <= 0xF4U) {
    length = 4;
    low = lead == 0xF0U ? 0x90U : low;
    high = lead == 0xF4U ? 0x8FU : high;
  } else {
    return 0;
  }
  if (text.size() - at < length || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80U || byte(i) > 0xBFU) return 0;
  }
  return length;
}

// One character of `text` at `at` as it goes into the log: `length` bytes of the input, written as
// `escape` when that is not empty, as they are otherwise.
struct Piece {
  std::size_t length = 1;
  std::array<char, 6> escape{};
  std::size_t escape_size = 0;
};

Piece Escape(std::string_view text, std::size_t at) {
  Piece piece;
  const auto byte = static_cast<std::uint8_t>(text[at]);
  const auto put = [&piece](std::string_view escape) {
    for (const char c : escape) piece.escape[piece.escape_size++] = c;
  };
  const auto hex = [&put](std::string_view prefix, std::uint8_t value) {
    put(prefix);
    put(std::string_view{&kHex[value >> 4U], 1});
    put(std::string_view{&kHex[value & 0xFU], 1});
  };
  if (byte == '\n') {
    put("\\n");
  } else if (byte == '\r') {
    put("\\r");
  } else if (byte == '\t') {
    put("\\t");
  } else if (byte < 0x20U || byte == 0x7FU) {
    hex("\\x", byte);
  } else if (byte >= 0x80U) {
    piece.length = SequenceLength(text, at);
    if (piece.length == 0) {
      piece.length = 1;
      hex("\\x", byte);
    } else if (byte == 0xC2U && static_cast<std::uint8_t>(text[at + 1]) < 0xA0U) {
      hex("\\u00", static_cast<std::uint8_t>(text[at + 1]));  // C1: U+0080..U+009F
    }
  }
  return piece;
}

// True when SanitizeForLog has nothing to escape in `text`.
bool IsCleanForLog(std::string_view text) {
  for (std::size_t at = 0; at < text.size();) {
    const auto byte = static_cast<std::uint8_t>(text[at]);
    if (byte >= 0x20U && byte < 0x7FU) {
      ++at;
      continue;
    }
    const Piece piece = Escape(text, at);
    if (piece.escape_size != 0) return false;
    at += piece.length;
  }
  return true;
}

void AppendCutNote(std::string& out, std::size_t cut_bytes) {
  out += " …(";
  out += std::to_string(cut_bytes);
  out += " bytes cut)";
}

}  // namespace

std::string SanitizeForLog(std::string_view text, std::size_t max_bytes) {
  std::string redacted = RedactKnownSecrets(text);
  text = redacted;
  if (text.size() <= max_bytes && IsCleanForLog(text)) return redacted;
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 32);
  std::size_t at = 0;
  while (at < text.size()) {
    const Piece piece = Escape(text, at);
    const std::string_view written = piece.escape_size != 0
                                         ? std::string_view{piece.escape.data(), piece.escape_size}
                                         : text.substr(at, piece.length);
    if (out.size() + written.size() > max_bytes) break;
    out += written;
    at += piece.length;
  }
  if (at < text.size()) AppendCutNote(out, text.size() - at);
  return out;
}

std::string BoundForLog(std::string_view text, std::size_t max_bytes) {
  std::string redacted = RedactKnownSecrets(text);
  if (redacted.size() <= max_bytes) return redacted;
  text = redacted;
  // Back to the lead byte of a sequence the bound splits; invalid UTF-8 is cut anywhere.
  std::size_t end = max_bytes;
  while (end > 0 && max_bytes - end < 3 &&
         (static_cast<std::uint8_t>(text[end]) & 0xC0U) == 0x80U) {
    --end;
  }
  std::string out{text.substr(0, end)};
  AppendCutNote(out, text.size() - end);
  return out;
}

}  // namespace outbox
