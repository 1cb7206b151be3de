#pragma once
// Bounded polling on a condition, for tests that wait for a state instead of sleeping.

#include <chrono>
#include <functional>
#include <thread>

namespace outbox::testing {

// Polls `condition` every `every` until it holds; false once `limit` has passed without it.
inline bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds limit,
                      std::chrono::milliseconds every = std::chrono::milliseconds{20}) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(every);
  }
  return true;
}

}  // namespace outbox::testing
