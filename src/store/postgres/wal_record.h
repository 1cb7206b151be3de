#pragma once
// The WAL record: what outbox.enqueue emits in WAL mode (sql/012_wal_delivery.sql), one logical
// message per copy, and its decoder. The record is the content of the message; its prefix names
// the schema (WalPrefix).
//
// Version 1, integers big-endian:
//   u8  version (1)
//   16  id
//   16  event id (all zeros: none, the message went to one target)
//   i64 created_at, microseconds since 1970-01-01 UTC (the transaction's start, as the table's
//       created_at default)
//   i32 partition
//   u8  flags: bit 0 sequenced (stream_key set and a stream_seq wanted); other bits unused
//   str target, str topic, str? stream_key, str? type, str content_type, str headers (JSON object
//   text), bytes payload
// where str is an i32 byte length and that many UTF-8 bytes, str? the same with length -1 for
// NULL, bytes an i32 length and the raw bytes. Nothing follows the payload.
//
// A new field or meaning is a new version: this decoder refuses any other, and unknown flags.

#include <cstdint>
#include <string_view>

#include "outbox/store/wal.h"

namespace outbox::postgres {

inline constexpr std::uint8_t kWalRecordVersion = 1;
// The one-byte record a change of delivery emits in its transaction (switch_delivery,
// sql/014_delivery_switch.sql): no message, a mark in the stream.
inline constexpr std::uint8_t kWalSwitchRecord = 2;

// The message `record` holds (stream_seq unset, attempts and lease_epoch 0). Throws
// std::invalid_argument saying what is wrong and in which field for anything malformed: empty,
// another version, truncated, a negative length, bytes after the payload, text that is not UTF-8,
// headers that are not a JSON object.
WalMessage DecodeWalRecord(std::string_view record);

}  // namespace outbox::postgres
