#pragma once
// How long a relay gathers messages before its next round (a claim in table mode, a batch in WAL
// mode), from the rate they arrive at (issue #49). A round costs the database about one
// statement whatever it carries, and a message waits for its round: lingering trades latency for
// statements, and the trade is only worth making where the statements saved are many.
//
// The rule, with `cap` = relay.linger:
//   - the arrival rate r is the messages the rounds brought, averaged over about the last quarter
//     of a second (an exponentially weighted sum with a 250 ms time constant: a burst is seen
//     within a few dozen milliseconds, a quiet spell within about a second);
//   - below kLingerFromRate (200 messages a second) or when `cap` would gather fewer than two
//     messages (r * cap < 2), no linger: a round per wake-up costs at most a few hundred
//     statements a second, and each message goes within a round trip of its commit;
//   - above it, gather for as long as a full batch takes at that rate, never longer than `cap`:
//     at 1,000 messages a second and the defaults (25 ms, batch 200) that is 25 ms and about 25
//     messages a round; at 10,000 a second, 20 ms and a full batch.
// cap = 0 turns lingering off altogether.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace outbox {

class AdaptiveLinger {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kLingerFromRate = 200.0;  // messages per second
  static constexpr double kTimeConstantSeconds = 0.25;

  AdaptiveLinger(std::chrono::milliseconds cap, int batch_size)
      : cap_(cap), batch_size_(std::max(batch_size, 1)) {}

  // A round at `now` brought `messages`.
  void Observe(Clock::time_point now, std::size_t messages) {
    Decay(now);
    weighted_ += static_cast<double>(messages);
  }

  // Messages per second arriving, as of `now`.
  [[nodiscard]] double Rate(Clock::time_point now) {
    Decay(now);
    return weighted_ / kTimeConstantSeconds;
  }

  // How long the next round gathers (table mode: since the last claim; WAL mode: since the
  // batch's first transaction).
  [[nodiscard]] std::chrono::milliseconds Wait(Clock::time_point now) {
    if (cap_.count() <= 0) return std::chrono::milliseconds{0};
    const double rate = Rate(now);
    const double cap_seconds = std::chrono::duration<double>(cap_).count();
    if (rate < kLingerFromRate || rate * cap_seconds < 2.0) return std::chrono::milliseconds{0};
    const double fill_seconds = static_cast<double>(batch_size_) / rate;
    const auto fill = std::chrono::milliseconds{static_cast<std::int64_t>(fill_seconds * 1000.0)};
    return std::min(cap_, fill);
  }

 private:
  void Decay(Clock::time_point now) {
    if (now <= last_) return;
    if (last_ != Clock::time_point{}) {
      const double elapsed = std::chrono::duration<double>(now - last_).count();
      weighted_ *= std::exp(-elapsed / kTimeConstantSeconds);
    }
    last_ = now;
  }

  std::chrono::milliseconds cap_;
  int batch_size_;
  double weighted_ = 0;
  Clock::time_point last_{};
};

}  // namespace outbox
