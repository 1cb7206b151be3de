#include "outbox/core/retry_policy.h"

#include <algorithm>
#include <cmath>

namespace outbox {

std::optional<std::string> RetryPolicy::Validate() const {
  if (initial_delay.count() < 0) return "initial_delay must not be negative";
  if (max_delay < initial_delay) return "max_delay must be at least initial_delay";
  if (!(multiplier >= 1.0) || !std::isfinite(multiplier)) {
    return "multiplier must be a finite number >= 1";
  }
  if (!(jitter >= 0.0 && jitter < 1.0)) return "jitter must be in [0, 1)";
  if (max_attempts < 1) return "max_attempts must be at least 1";
  return std::nullopt;
}

std::chrono::milliseconds RetryPolicy::BaseDelay(int failed_attempts) const {
  const double exponent = std::max(0, failed_attempts - 1);
  // Computed in double and capped before converting, so a large exponent cannot overflow.
  const double delay = static_cast<double>(initial_delay.count()) * std::pow(multiplier, exponent);
  const double capped = std::min(delay, static_cast<double>(max_delay.count()));
  return std::chrono::milliseconds{static_cast<std::chrono::milliseconds::rep>(capped)};
}

std::chrono::milliseconds RetryPolicy::Delay(int failed_attempts, UniformRandom& random) const {
  const double base = static_cast<double>(BaseDelay(failed_attempts).count());
  const double spread = jitter * (2.0 * random() - 1.0);  // in [-jitter, +jitter)
  return std::chrono::milliseconds{
      static_cast<std::chrono::milliseconds::rep>(std::llround(base * (1.0 + spread)))};
}

}  // namespace outbox
