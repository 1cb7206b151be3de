#pragma once
// The in-process fast path: a writer in the same process as the relay hands the ids of messages it
// has just committed straight to the relay, which claims them at once instead of waiting for a
// NOTIFY or a sweep. Bounded; an offer that does not fit is dropped and counted, which is safe
// because the messages are in the database and the relay's sweep finds them anyway.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "outbox/core/uuid.h"

namespace outbox {

class HandOffQueue {
 public:
  explicit HandOffQueue(std::size_t capacity = 65536) : capacity_(capacity) {}

  // Call only after the transaction that enqueued `ids` has committed: a relay may claim them at
  // once. Returns false (and counts the ids as dropped) when they do not all fit. Thread-safe.
  bool Offer(std::span<const MessageId> ids) {
    {
      std::lock_guard lock(mutex_);
      if (ids_.size() + ids.size() > capacity_) {
        dropped_ += ids.size();
        return false;
      }
      ids_.insert(ids_.end(), ids.begin(), ids.end());
    }
    ready_.notify_one();
    std::function<void()> listener;
    {
      std::lock_guard lock(mutex_);
      listener = listener_;
    }
    if (listener) listener();
    return true;
  }

  // Called (outside the queue's lock) after each successful Offer; a relay uses it to cut its
  // idle sleep short. Replaces any earlier listener; an empty function removes it.
  void SetListener(std::function<void()> listener) {
    std::lock_guard lock(mutex_);
    listener_ = std::move(listener);
  }

  // Takes up to `max` ids, waiting at most `timeout` for the first one. Thread-safe.
  std::vector<MessageId> Take(std::size_t max, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [this] { return !ids_.empty(); });
    const std::size_t count = std::min(max, ids_.size());
    std::vector<MessageId> taken(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(count));
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(count));
    return taken;
  }

  [[nodiscard]] std::uint64_t dropped() const {
    std::lock_guard lock(mutex_);
    return dropped_;
  }

 private:
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<MessageId> ids_;       // guarded by mutex_
  std::uint64_t dropped_ = 0;       // guarded by mutex_
  std::function<void()> listener_;  // guarded by mutex_
};

}  // namespace outbox
