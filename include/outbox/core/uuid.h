#pragma once
// 128-bit identifiers and UUIDv7 generation (RFC 9562, section 5.7).

#include <array>
#include <atomic>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "outbox/core/clock.h"

namespace outbox {

class Uuid {
 public:
  using Bytes = std::array<std::uint8_t, 16>;

  constexpr Uuid() = default;  // the nil UUID
  explicit constexpr Uuid(const Bytes& bytes) : bytes_(bytes) {}

  // Parses the canonical 8-4-4-4-12 hex form (either case); nullopt on anything else.
  static std::optional<Uuid> Parse(std::string_view text);

  // Canonical lower-case 8-4-4-4-12 form, 36 characters.
  [[nodiscard]] std::string ToString() const;
  [[nodiscard]] const Bytes& bytes() const { return bytes_; }
  [[nodiscard]] int version() const { return bytes_[6] >> 4; }
  // True for the RFC 9562 variant (bits 10xx in octet 8).
  [[nodiscard]] bool HasRfcVariant() const { return (bytes_[8] & 0xC0U) == 0x80U; }
  [[nodiscard]] bool IsNil() const { return *this == Uuid{}; }
  // The 48-bit Unix millisecond timestamp of a version-7 UUID.
  [[nodiscard]] std::uint64_t UnixMillis() const;

  // Byte-wise order, which for UUIDv7 is creation order.
  friend constexpr auto operator<=>(const Uuid&, const Uuid&) = default;

 private:
  Bytes bytes_{};
};

using MessageId = Uuid;

// Generates UUIDv7 values that are strictly increasing across all threads using one generator:
// 48-bit Unix milliseconds, then a 12-bit counter in `rand_a` that is reset each millisecond
// (RFC 9562 section 6.2, method 1), then 62 random bits. When the counter overflows within one
// millisecond, the timestamp is advanced by one; it never goes backwards, even if the clock does.
class UuidV7Generator {
 public:
  explicit UuidV7Generator(const Clock& clock = SystemClock::Instance()) : clock_(clock) {}
  UuidV7Generator(const UuidV7Generator&) = delete;
  UuidV7Generator& operator=(const UuidV7Generator&) = delete;

  // Thread-safe and lock-free.
  Uuid Next();

 private:
  const Clock& clock_;
  // (unix_millis << 12) | counter of the last id handed out.
  std::atomic<std::uint64_t> last_{0};
};

// A new UUIDv7 from a process-wide generator on the system clock.
Uuid NewUuidV7();

}  // namespace outbox

template <>
struct std::hash<outbox::Uuid> {
  std::size_t operator()(const outbox::Uuid& id) const noexcept;
};
