#include "claim_cursor.h"

#include <algorithm>

namespace outbox::postgres {

Uuid ClaimCursor::Floor(TimePoint time) {
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
  Uuid::Bytes bytes{};
  const auto unsigned_millis = static_cast<std::uint64_t>(std::max<std::int64_t>(0, millis));
  for (int i = 0; i < 6; ++i) {
    bytes[static_cast<std::size_t>(i)] =
        static_cast<std::uint8_t>(unsigned_millis >> (8 * (5 - i)));
  }
  return Uuid{bytes};
}

bool ClaimCursor::Gained(const Partitions& partitions) const {
  if (!partitions) return partitions_.has_value();
  if (!partitions_) return true;
  return std::any_of(partitions->begin(), partitions->end(), [&](const PartitionLease& held) {
    return std::find(partitions_->begin(), partitions_->end(), held) == partitions_->end();
  });
}

bool ClaimCursor::Resumed(const std::vector<std::string>& paused) const {
  return std::any_of(paused_.begin(), paused_.end(), [&](const std::string& target) {
    return std::find(paused.begin(), paused.end(), target) == paused.end();
  });
}

Uuid ClaimCursor::Next(const Partitions& partitions, std::chrono::steady_clock::time_point now,
                       const std::vector<std::string>& paused) {
  const bool net = now - last_full_walk_ >= full_walk_interval_;
  if (first_ || Gained(partitions) || Resumed(paused) || net) {
    // Only a walk for the net alone tells whether the cursor missed something.
    before_net_walk_.reset();
    if (net && !first_ && !Gained(partitions) && !Resumed(paused) && !cursor_.IsNil()) {
      before_net_walk_ = cursor_;
    }
    cursor_ = Uuid{};
    last_full_walk_ = now;
    first_ = false;
  }
  partitions_ = partitions;
  paused_ = paused;
  return cursor_;
}

void ClaimCursor::Observe(const ClaimObservation& observation) {
  if (before_net_walk_) {
    if (observation.frontier && *observation.frontier < *before_net_walk_) {
      ++found_behind_;
      full_walk_interval_ = kFullWalkInterval;
    } else {
      full_walk_interval_ = std::min(2 * full_walk_interval_, kLongestFullWalkInterval);
    }
    before_net_walk_.reset();
  }
  if (last_database_now_ && observation.database_now < *last_database_now_) {
    // The database clock went back: ids written from now on may sort before the horizon.
    horizon_.reset();
    waiting_.clear();
  }
  last_database_now_ = observation.database_now;
  while (!waiting_.empty() && waiting_.front().xid < observation.oldest_running_xid) {
    horizon_ = waiting_.front().time;
    waiting_.pop_front();
  }
  if (observation.own_xid) {
    // Full: the newest entry is replaced by this later one, which only makes it more cautious.
    if (waiting_.size() >= kMaxWaiting) waiting_.pop_back();
    waiting_.push_back({observation.database_now, *observation.own_xid});
  }
  if (!horizon_) {
    cursor_ = Uuid{};
    return;
  }
  const Uuid horizon = Floor(*horizon_);
  cursor_ = observation.frontier ? std::min(*observation.frontier, horizon) : horizon;
}

}  // namespace outbox::postgres
