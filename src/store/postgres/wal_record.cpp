#include "wal_record.h"

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include "connection.h"
#include "outbox/core/utf8.h"

namespace outbox::postgres {
namespace {

constexpr std::uint8_t kSequencedFlag = 0x01;

[[noreturn]] void Malformed(const std::string& what) {
  throw std::invalid_argument("WAL record: " + what);
}

// Reads the record front to back; every read names its field, for the error.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}

  std::string_view Take(std::size_t size, std::string_view field) {
    if (rest_.size() < size) {
      Malformed("truncated in field " + std::string{field} + " (" + std::to_string(size) +
                " bytes needed, " + std::to_string(rest_.size()) + " left)");
    }
    const auto taken = rest_.substr(0, size);
    rest_.remove_prefix(size);
    return taken;
  }

  std::uint8_t U8(std::string_view field) { return static_cast<std::uint8_t>(Take(1, field)[0]); }
  std::int32_t I32(std::string_view field) { return ReadInt32(Take(4, field).data()); }
  std::int64_t I64(std::string_view field) { return ReadInt64(Take(8, field).data()); }
  Uuid Id(std::string_view field) { return ReadUuid(Take(16, field).data()); }

  // str? (nullable) or bytes; -1 is NULL only where `nullable`.
  std::optional<std::string_view> Sized(std::string_view field, bool nullable) {
    const std::int32_t length = I32(field);
    if (length == -1 && nullable) return std::nullopt;
    if (length < 0) {
      Malformed("negative length " + std::to_string(length) + " in field " + std::string{field});
    }
    return Take(static_cast<std::size_t>(length), field);
  }

  std::optional<std::string> OptionalText(std::string_view field) {
    const auto bytes = Sized(field, /*nullable=*/true);
    if (!bytes) return std::nullopt;
    if (!IsValidUtf8(*bytes)) Malformed("field " + std::string{field} + " is not valid UTF-8");
    return std::string{*bytes};
  }

  std::string Text(std::string_view field) {
    const auto bytes = Sized(field, /*nullable=*/false);
    if (!IsValidUtf8(*bytes)) Malformed("field " + std::string{field} + " is not valid UTF-8");
    return std::string{*bytes};
  }

  std::string Bytes(std::string_view field) { return std::string{*Sized(field, false)}; }

  [[nodiscard]] std::size_t left() const { return rest_.size(); }

 private:
  std::string_view rest_;
};

}  // namespace

WalMessage DecodeWalRecord(std::string_view record) {
  if (record.empty()) Malformed("empty");
  Reader reader{record};
  const std::uint8_t version = reader.U8("version");
  if (version != kWalRecordVersion) {
    throw std::invalid_argument("WAL record version " + std::to_string(version) +
                                ": this build reads version " + std::to_string(kWalRecordVersion));
  }
  WalMessage message;
  Envelope& envelope = message.envelope;
  envelope.id = reader.Id("id");
  const Uuid event_id = reader.Id("event_id");
  if (!event_id.IsNil()) envelope.event_id = event_id;
  const std::chrono::microseconds created_at{reader.I64("created_at")};
  // TimePoint counts finer than microseconds: a value past its range would overflow.
  const auto limit =
      std::chrono::duration_cast<std::chrono::microseconds>(TimePoint::duration::max());
  if (created_at > limit || created_at < -limit) {
    Malformed("created_at " + std::to_string(created_at.count()) + " us is out of range");
  }
  envelope.created_at = TimePoint{std::chrono::duration_cast<TimePoint::duration>(created_at)};
  const std::int32_t partition = reader.I32("partition");
  if (partition < 0) Malformed("negative partition " + std::to_string(partition));
  envelope.partition = partition;
  const std::uint8_t flags = reader.U8("flags");
  if ((flags & ~kSequencedFlag) != 0) {
    Malformed("unknown flags " + std::to_string(flags) + " (version 1 knows bit 0, sequenced)");
  }
  envelope.target = reader.Text("target");
  envelope.topic = reader.Text("topic");
  envelope.stream_key = reader.OptionalText("stream_key");
  envelope.type = reader.OptionalText("type");
  envelope.content_type = reader.Text("content_type");
  auto headers = HeadersFromJson(reader.Text("headers"));
  if (!headers) Malformed("field headers is not a JSON object");
  envelope.headers = std::move(*headers);
  envelope.payload = reader.Bytes("payload");
  if (reader.left() != 0) {
    Malformed("trailing bytes after the payload (" + std::to_string(reader.left()) + ")");
  }
  message.sequenced = (flags & kSequencedFlag) != 0;
  if (message.sequenced && !envelope.stream_key)
    Malformed("flagged sequenced without a stream_key");
  return message;
}

}  // namespace outbox::postgres
