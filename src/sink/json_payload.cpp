#include "outbox/sink/json_payload.h"

#include <charconv>
#include <cstdint>

namespace outbox {
namespace {

// Decimal digits a double is guaranteed to carry through text -> double -> text (DBL_DIG).
constexpr int kExactDecimalDigits = 15;
// Decimal exponents well inside the range of a normal double.
constexpr long kMaxDecimalExponent = 300;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Whether the number token `token` (as JSON writes it) keeps its value when parsed and rendered
// again by nlohmann::json: integers must fit 64 bits, decimals must have at most 15 significant
// digits and a moderate exponent.
bool NumberIsExact(std::string_view token) {
  const bool negative = !token.empty() && token.front() == '-';
  if (token.find_first_of(".eE") == std::string_view::npos) {
    const char* first = token.data();
    const char* last = token.data() + token.size();
    if (negative) {
      std::int64_t value = 0;
      return std::from_chars(first, last, value).ec == std::errc{};
    }
    std::uint64_t value = 0;
    return std::from_chars(first, last, value).ec == std::errc{};
  }
  std::string digits;  // the mantissa's digits, without sign and point
  std::size_t integer_digits = 0;
  bool seen_point = false;
  std::size_t at = negative ? 1 : 0;
  for (; at < token.size() && token[at] != 'e' && token[at] != 'E'; ++at) {
    if (token[at] == '.') {
      seen_point = true;
    } else {
      digits.push_back(token[at]);
      if (!seen_point) ++integer_digits;
    }
  }
  long exponent = 0;
  if (at < token.size()) {  // 'e' or 'E', an optional sign, digits
    ++at;
    bool exponent_negative = false;
    if (at < token.size() && (token[at] == '+' || token[at] == '-')) {
      exponent_negative = token[at] == '-';
      ++at;
    }
    for (; at < token.size(); ++at) {
      if (!IsDigit(token[at])) return false;
      exponent = exponent * 10 + (token[at] - '0');
      if (exponent > 100 * kMaxDecimalExponent) return false;
    }
    if (exponent_negative) exponent = -exponent;
  }
  const std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return true;  // zero
  const std::size_t last = digits.find_last_not_of('0');
  if (last - first + 1 > kExactDecimalDigits) return false;
  const long magnitude = static_cast<long>(integer_digits) - static_cast<long>(first) + exponent;
  return magnitude <= kMaxDecimalExponent && magnitude >= -kMaxDecimalExponent;
}

}  // namespace

bool JsonPayloadIsEmbeddable(std::string_view payload) {
  int depth = 0;
  for (std::size_t at = 0; at < payload.size();) {
    const char c = payload[at];
    if (c == '"') {  // skip the string, escapes included
      for (++at; at < payload.size() && payload[at] != '"'; ++at) {
        if (payload[at] == '\\') ++at;
      }
      ++at;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxEmbeddedJsonDepth) return false;
      ++at;
    } else if (c == ']' || c == '}') {
      --depth;
      ++at;
    } else if (c == '-' || IsDigit(c)) {
      const std::size_t start = at;
      while (at < payload.size() &&
             (IsDigit(payload[at]) || payload[at] == '.' || payload[at] == 'e' ||
              payload[at] == 'E' || payload[at] == '+' || payload[at] == '-')) {
        ++at;
      }
      if (!NumberIsExact(payload.substr(start, at - start))) return false;
    } else {
      ++at;
    }
  }
  return true;
}

bool IsJsonContentType(std::string_view content_type) {
  constexpr std::string_view kJson = "application/json";
  std::string_view media_type = content_type.substr(0, content_type.find(';'));
  while (!media_type.empty() && (media_type.back() == ' ' || media_type.back() == '\t')) {
    media_type.remove_suffix(1);
  }
  while (!media_type.empty() && (media_type.front() == ' ' || media_type.front() == '\t')) {
    media_type.remove_prefix(1);
  }
  if (media_type.size() != kJson.size()) return false;
  for (std::size_t i = 0; i < kJson.size(); ++i) {
    char c = media_type[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kJson[i]) return false;
  }
  return true;
}

std::string Base64Encode(std::string_view bytes) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t at = 0;
  for (; at + 3 <= bytes.size(); at += 3) {
    const std::uint32_t group = (std::uint32_t{static_cast<unsigned char>(bytes[at])} << 16U) |
                                (std::uint32_t{static_cast<unsigned char>(bytes[at + 1])} << 8U) |
                                std::uint32_t{static_cast<unsigned char>(bytes[at + 2])};
    out.push_back(kAlphabet[(group >> 18U) & 0x3FU]);
    out.push_back(kAlphabet[(group >> 12U) & 0x3FU]);
    out.push_back(kAlphabet[(group >> 6U) & 0x3FU]);
    out.push_back(kAlphabet[group & 0x3FU]);
  }
  const std::size_t rest = bytes.size() - at;
  if (rest > 0) {
    std::uint32_t group = std::uint32_t{static_cast<unsigned char>(bytes[at])} << 16U;
    if (rest == 2) group |= std::uint32_t{static_cast<unsigned char>(bytes[at + 1])} << 8U;
    out.push_back(kAlphabet[(group >> 18U) & 0x3FU]);
    out.push_back(kAlphabet[(group >> 12U) & 0x3FU]);
    out.push_back(rest == 2 ? kAlphabet[(group >> 6U) & 0x3FU] : '=');
    out.push_back('=');
  }
  return out;
}

}  // namespace outbox
