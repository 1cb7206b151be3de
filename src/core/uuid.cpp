#include "outbox/core/uuid.h"

#include <random>

#include "outbox/core/percent_decode.h"

namespace outbox {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";
constexpr std::uint64_t kCounterBits = 12;
constexpr std::uint64_t kCounterMask = (1U << kCounterBits) - 1;

bool IsHyphenPosition(std::size_t i) { return i == 8 || i == 13 || i == 18 || i == 23; }

// 64 random bits per call; one engine per thread so generation never contends.
std::uint64_t RandomBits() {
  thread_local std::mt19937_64 engine{[] {
    std::random_device device;
    std::seed_seq seq{device(), device(), device(), device()};
    return std::mt19937_64{seq};
  }()};
  return engine();
}

}  // namespace

std::optional<Uuid> Uuid::Parse(std::string_view text) {
  if (text.size() != 36) return std::nullopt;
  Bytes bytes{};
  std::size_t nibble = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (IsHyphenPosition(i)) {
      if (text[i] != '-') return std::nullopt;
      continue;
    }
    const int value = HexDigitValue(text[i]);
    if (value < 0) return std::nullopt;
    auto& byte = bytes[nibble / 2];
    byte = static_cast<std::uint8_t>(nibble % 2 == 0 ? value << 4 : byte | value);
    ++nibble;
  }
  return Uuid{bytes};
}

std::string Uuid::ToString() const {
  std::string text;
  text.reserve(36);
  for (std::size_t i = 0; i < bytes_.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text.push_back('-');
    text.push_back(kHexDigits[bytes_[i] >> 4]);
    text.push_back(kHexDigits[bytes_[i] & 0x0FU]);
  }
  return text;
}

std::uint64_t Uuid::UnixMillis() const {
  std::uint64_t millis = 0;
  for (std::size_t i = 0; i < 6; ++i) millis = (millis << 8U) | bytes_[i];
  return millis;
}

Uuid UuidV7Generator::Next() {
  const auto now =
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_.Now().time_since_epoch())
          .count();
  const std::uint64_t floor = static_cast<std::uint64_t>(now < 0 ? 0 : now) << kCounterBits;
  // Strictly greater than the last value handed out by any thread: the next counter value in the
  // same millisecond, or counter 0 of a later one.
  std::uint64_t last = last_.load(std::memory_order_relaxed);
  std::uint64_t next = 0;
  do {
    next = floor > last ? floor : last + 1;
  } while (!last_.compare_exchange_weak(last, next, std::memory_order_relaxed));

  const std::uint64_t millis = next >> kCounterBits;
  const std::uint64_t counter = next & kCounterMask;
  const std::uint64_t random = RandomBits();
  Uuid::Bytes bytes{};
  for (std::size_t i = 0; i < 6; ++i) {
    bytes[i] = static_cast<std::uint8_t>(millis >> (8 * (5 - i)));
  }
  bytes[6] = static_cast<std::uint8_t>(0x70U | (counter >> 8U));  // version 7, counter high bits
  bytes[7] = static_cast<std::uint8_t>(counter);
  bytes[8] = static_cast<std::uint8_t>(0x80U | ((random >> 56U) & 0x3FU));  // RFC variant
  for (std::size_t i = 9; i < 16; ++i) {
    bytes[i] = static_cast<std::uint8_t>(random >> (8 * (15 - i)));
  }
  return Uuid{bytes};
}

Uuid NewUuidV7() {
  static UuidV7Generator generator;
  return generator.Next();
}

}  // namespace outbox

std::size_t std::hash<outbox::Uuid>::operator()(const outbox::Uuid& id) const noexcept {
  // The trailing 8 bytes of a UUIDv7 are random, so they make a good hash on their own.
  std::size_t value = 0;
  for (std::size_t i = 8; i < 16; ++i) value = (value << 8U) | id.bytes()[i];
  return value;
}
