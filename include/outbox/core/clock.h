#pragma once
// Time sources. Components take a `const Clock&` so tests can drive time by hand; database
// stores compare lease and retry times on the database's own clock, not this one.

#include <atomic>
#include <chrono>
#include <string>

namespace outbox {

using TimePoint = std::chrono::system_clock::time_point;
// Deadlines are measured on the monotonic clock so that wall-clock jumps cannot stretch a wait.
using Deadline = std::chrono::steady_clock::time_point;

// `time` in RFC 3339, UTC, with `fraction_digits` (0, 3 or 6) digits of the second, truncated:
// "2026-11-21T13:21:51.123Z". The one formatter for every timestamp outbox writes (the file sink,
// the admin API and outboxctl, the metrics' error log).
std::string FormatRfc3339(TimePoint time, int fraction_digits);

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time now. Thread-safe.
  [[nodiscard]] virtual TimePoint Now() const = 0;
};

// The real wall clock.
class SystemClock final : public Clock {
 public:
  [[nodiscard]] TimePoint Now() const override { return std::chrono::system_clock::now(); }
  // A process-wide instance, for defaults.
  static const SystemClock& Instance();
};

// A clock that only moves when told to; thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimePoint start = TimePoint{}) : now_(start.time_since_epoch().count()) {}
  [[nodiscard]] TimePoint Now() const override {
    return TimePoint{TimePoint::duration{now_.load(std::memory_order_acquire)}};
  }
  void Set(TimePoint t) { now_.store(t.time_since_epoch().count(), std::memory_order_release); }
  void Advance(TimePoint::duration d) { now_.fetch_add(d.count(), std::memory_order_acq_rel); }

 private:
  std::atomic<TimePoint::rep> now_;
};

}  // namespace outbox
