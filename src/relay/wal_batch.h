#pragma once
// What the WAL relay's parts pass between them: the messages read from the slot, as a batch from
// its reading to its commit.

#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <set>
#include <vector>

#include "outbox/core/message.h"
#include "outbox/sink/sink.h"
#include "outbox/store/wal.h"

namespace outbox::relay {

// A message's (target, stream), when it has a stream key.
inline std::optional<WalStream> WalStreamOf(const Envelope& envelope) {
  if (!envelope.stream_key) return std::nullopt;
  return WalStream{envelope.target, *envelope.stream_key};
}

struct Item {
  Envelope envelope;
  bool sequenced = false;
};

// A batch from its reading to its commit. While it publishes (on a thread of its own) the next
// batch is read and prepared, and while that one publishes, this one is committed: the broker
// is kept busy through the database's round trips.
struct Batch {
  std::vector<Item> items;
  std::size_t transactions = 0;
  WalCommit commit;  // the position and seqs at once; what is parked once the outcomes are in
  // Streams whose messages here are parked, not published: waiting in the table when the batch
  // was read, or left broken by the batch before it (whose commit was not yet made).
  std::set<WalStream> broken;
  std::vector<std::size_t> to_publish;  // indexes into items
  std::future<std::vector<PublishOutcome>> outcomes;
  std::chrono::steady_clock::time_point started;
  std::uint64_t published = 0;
  // Destroying a batch waits for its publish (std::async's future), so a sink is never used by
  // two threads at once and nothing it reads goes away under it.
};

}  // namespace outbox::relay
