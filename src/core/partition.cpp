#include "outbox/core/partition.h"

#include <stdexcept>
#include <string>

namespace outbox {

int PartitionOf(std::string_view key, int partition_count) {
  if (partition_count < 1 || partition_count > kMaxPartitionCount) {
    throw std::invalid_argument("partition count must be in [1, " +
                                std::to_string(kMaxPartitionCount) + "], got " +
                                std::to_string(partition_count));
  }
  return static_cast<int>(Fnv1a32(key) % static_cast<std::uint32_t>(partition_count));
}

int PartitionFor(const std::optional<std::string>& stream_key, const MessageId& id,
                 int partition_count) {
  if (stream_key) return PartitionOf(*stream_key, partition_count);
  return PartitionOf(id.ToString(), partition_count);
}

}  // namespace outbox
