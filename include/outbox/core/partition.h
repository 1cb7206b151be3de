#pragma once
// Partition assignment. The hash is part of the wire contract: the SQL enqueue function, every
// store and every relay must agree on it forever, so it is a named, fixed function with test
// vectors, never std::hash.

#include <cstdint>
#include <optional>
#include <string_view>

#include "outbox/core/uuid.h"

namespace outbox {

// 32-bit FNV-1a (offset basis 2166136261, prime 16777619) over the raw bytes of `data`.
constexpr std::uint32_t Fnv1a32(std::string_view data) {
  std::uint32_t hash = 2166136261U;
  for (const char c : data) {
    hash ^= static_cast<std::uint8_t>(c);
    hash *= 16777619U;
  }
  return hash;
}

inline constexpr int kMaxPartitionCount = 4096;

// Fnv1a32(key) mod partition_count; partition_count must be in [1, kMaxPartitionCount].
int PartitionOf(std::string_view key, int partition_count);

// The partition of a message: keyed by its stream key (UTF-8 bytes) when it has one, otherwise by
// the canonical text form of its id, so unkeyed messages spread evenly.
int PartitionFor(const std::optional<std::string>& stream_key, const MessageId& id,
                 int partition_count);

}  // namespace outbox
