#pragma once
// Backoff after consecutive failures.

#include <algorithm>
#include <chrono>

namespace outbox {

// The pause after consecutive failures, doubling from `first` up to `max`: the one backoff of the
// sinks (a reconnect, an HTTP host that cannot be reached) and of the relays (a database outage,
// a paused target's probe).
class Backoff {
 public:
  constexpr Backoff(std::chrono::milliseconds first, std::chrono::milliseconds max)
      : first_(first), max_(max) {}

  // One more failure: the pause before the next try (first, 2 × first, ..., max).
  std::chrono::milliseconds Failed() {
    current_ =
        current_ == std::chrono::milliseconds::zero() ? first_ : std::min(current_ * 2, max_);
    return current_;
  }
  void Succeeded() { current_ = std::chrono::milliseconds::zero(); }
  [[nodiscard]] std::chrono::milliseconds current() const { return current_; }

 private:
  std::chrono::milliseconds first_;
  std::chrono::milliseconds max_;
  std::chrono::milliseconds current_{0};
};

}  // namespace outbox
